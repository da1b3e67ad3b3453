"""Reading Hugging Face safetensors checkpoints tensor by tensor, slice by slice.

`HFCheckpoint` opens a checkpoint (a `.safetensors` file, or a directory with
`model.safetensors.index.json` or plain `*.safetensors` files) by reading the headers alone,
which checks it whole before any tensor is read: missing files, tensors repeated across
files, bad byte ranges, FP8 weights without their scales. A rank then reads only what it
holds: `read(name, region)` takes one tensor, or one slice of it (a tensor-parallel rank's
rows or columns), through safetensors' `safe_open(...).get_slice(name)`, and returns floating
values as float32. Loading therefore never holds the whole model in float32, nor reads the
other ranks' slices.

bfloat16 is readable because MindSpore registers a numpy `bfloat16` dtype, which safetensors'
numpy reader asks for (without it, safetensors fails on BF16 tensors); the values are then
exact in float32. FP8 tensors (`F8_E4M3`, DeepSeek-V3's checkpoint), which safetensors'
numpy reader cannot return, are read as raw bytes from the file and dequantised with their
`_scale_inv` block scales (`fp8.py`: a scale may sit in another file than its weight).

The mapping of HF names to mf parameter names is the models' business
(`mf_train.models.hf_weights.load_hf_state`).
"""

from __future__ import annotations

import json
import logging
import math
import os
import threading
from collections.abc import Iterable
from pathlib import Path
from types import TracebackType

import numpy as np
from safetensors import SafetensorError, safe_open

from . import layout
from .errors import CheckpointError
from .fp8 import SCALE_SUFFIX, check_scales, dequantize_region, weight_block_size
from .reading import read_ahead
from .safetensors_header import ITEMSIZE, TensorEntry, read_header

LOG = logging.getLogger(__name__)
INDEX = "model.safetensors.index.json"
Region = tuple[slice, ...]


def _numpy_reads_bfloat16() -> bool:
    """Whether numpy knows bfloat16, which MindSpore registers when `np_dtype` is imported
    (here, when a checkpoint holds bfloat16 tensors, so that importing this module, as
    mf-train's launcher does, imports no MindSpore)."""
    from mindspore.common import np_dtype

    return hasattr(np_dtype, "bfloat16")


def is_hf_checkpoint(path: str | os.PathLike[str]) -> bool:
    """Whether `path` is a safetensors file or a directory of them that is not an mf
    checkpoint (no tracker, no `common.json`, no `iteration_*` directories)."""
    path = Path(path)
    if path.is_file():
        return path.suffix == ".safetensors"
    if not path.is_dir() or (path / layout.TRACKER).exists() or (path / layout.COMMON).exists():
        return False
    if layout.iteration_dirs(path):
        return False
    return (path / INDEX).is_file() or any(path.glob("*.safetensors"))


class HFCheckpoint:
    """A Hugging Face checkpoint opened for reading tensor by tensor (module docstring).

    Args:
        path: a `.safetensors` file or a directory of them.

    Raises:
        CheckpointError: the checkpoint is missing or malformed (every header is checked).
    """

    def __init__(self, path: str | os.PathLike[str]):
        self.path = Path(path)
        if not self.path.exists():
            raise CheckpointError(f"Hugging Face checkpoint {self.path} does not exist")
        entries = _entries(self.path)
        scales = {name: entry for name, entry in entries.items() if name.endswith(SCALE_SUFFIX)}
        fp8 = {name: entry.shape for name, entry in entries.items() if entry.dtype == "F8_E4M3"}
        self.block = weight_block_size(self.path) if fp8 or scales else (0, 0)
        if fp8 or scales:
            check_scales(fp8, {name: entry.shape for name, entry in scales.items()},
                         self.block)
            LOG.info("%d FP8 (e4m3fn) weights: dequantised to float32 as they are read, with "
                     "their %dx%d block scales (%d _scale_inv tensors consumed)", len(fp8),
                     *self.block, len(scales))
        self._scales = scales
        self._entries = {name: entry for name, entry in entries.items() if name not in scales}
        bfloat16 = next((entry for entry in entries.values() if entry.dtype == "BF16"), None)
        if bfloat16 is not None and not _numpy_reads_bfloat16():
            raise CheckpointError(f"{bfloat16.where}: bfloat16 needs MindSpore's numpy "
                                  "bfloat16 dtype, which this MindSpore build does not register")
        self._handles: dict[Path, safe_open] = {}
        self._lock = threading.Lock()
        self.bytes_read = 0
        """Bytes of tensor data read so far (in the files' dtypes)."""

    @property
    def nbytes(self) -> int:
        """Bytes of tensor data of all the weights (in the files' dtypes)."""
        return sum(math.prod(entry.shape) * ITEMSIZE[entry.dtype]
                   for entry in self._entries.values())

    @property
    def names(self) -> frozenset[str]:
        """The weights' HF names (FP8 block scales, consumed, are not among them)."""
        return frozenset(self._entries)

    def shape(self, name: str) -> tuple[int, ...]:
        return self._entry(name).shape

    def read(self, name: str, region: Region | None = None) -> np.ndarray:
        """Tensor `name`, or only its `region` (one slice per leading axis); floating values
        as float32, others in their own dtype."""
        entry = self._entry(name)
        try:
            value = (self._read_fp8(entry, region) if entry.dtype == "F8_E4M3"
                     else self._read_plain(entry, region))
        except SafetensorError as exc:
            raise CheckpointError(f"{entry.where}: cannot be read ({exc})") from None
        with self._lock:
            self.bytes_read += value.size * ITEMSIZE[entry.dtype]
        if value.dtype.kind == "f" or entry.dtype == "BF16":
            return value.astype(np.float32)
        return value.astype(value.dtype.newbyteorder("="))

    def close(self) -> None:
        with self._lock:
            handles, self._handles = list(self._handles.values()), {}
        for handle in handles:
            handle.__exit__(None, None, None)

    def __enter__(self) -> HFCheckpoint:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self.close()

    def _entry(self, name: str) -> TensorEntry:
        try:
            return self._entries[name]
        except KeyError:
            raise CheckpointError(f"{self.path} holds no tensor {name}") from None

    def _read_plain(self, entry: TensorEntry, region: Region | None) -> np.ndarray:
        handle = self._handle(entry.file)
        if region is None or not entry.shape:
            return handle.get_tensor(entry.name)
        return handle.get_slice(entry.name)[region]

    def _read_fp8(self, entry: TensorEntry, region: Region | None) -> np.ndarray:
        region = _full(region, entry.shape)
        raw = np.memmap(entry.file, dtype=np.uint8, mode="r", offset=entry.start,
                        shape=entry.shape)[region]
        scale = self._read_plain(self._scales[entry.name + SCALE_SUFFIX], None)
        start = tuple(axis.indices(size)[0] for axis, size in zip(region, entry.shape,
                                                                  strict=True))
        return dequantize_region(np.array(raw), scale, self.block, start)

    def _handle(self, file: Path) -> safe_open:
        with self._lock:
            if file not in self._handles:
                self._handles[file] = safe_open(str(file), framework="numpy")
            return self._handles[file]


def load_hf_weights(path: str | os.PathLike[str], workers: int = 1) -> dict[str, np.ndarray]:
    """Every weight of a Hugging Face checkpoint, whole, by its HF name (floating ones as
    float32, FP8 ones dequantised): for tools and tests; training streams through
    `HFCheckpoint`. `workers` tensors are read at a time."""
    with HFCheckpoint(path) as checkpoint:
        names = sorted(checkpoint.names)
        return dict(zip(names, read_ahead(checkpoint.read, names, workers), strict=True))


def _full(region: Region | None, shape: tuple[int, ...]) -> Region:
    """`region` with a whole slice for each axis it leaves out."""
    region = tuple(region or ())
    return region + (slice(None),) * (len(shape) - len(region))


def _entries(path: Path) -> dict[str, TensorEntry]:
    """Every tensor of the checkpoint, from its headers."""
    if path.is_file():
        return read_header(path)
    if (path / INDEX).is_file():
        return _indexed(path)
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise CheckpointError(f"{path} holds no *.safetensors files (nor {INDEX})")
    return _merged(files)


def _merged(files: Iterable[Path]) -> dict[str, TensorEntry]:
    entries: dict[str, TensorEntry] = {}
    for file in files:
        part = read_header(file)
        repeated = sorted(entries.keys() & part.keys())
        if repeated:
            raise CheckpointError(f"{file} repeats tensors of an earlier file: "
                                  + ", ".join(repeated[:10]))
        entries.update(part)
    return entries


def _indexed(directory: Path) -> dict[str, TensorEntry]:
    index_path = directory / INDEX
    try:
        weight_map = json.loads(index_path.read_text(encoding="utf-8"))["weight_map"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise CheckpointError(f"{index_path}: no readable \"weight_map\" ({exc!r})") from None
    files = sorted(set(weight_map.values()))
    missing = [name for name in files if not (directory / name).is_file()]
    if missing:
        raise CheckpointError(f"{index_path} lists files that are missing: "
                              + ", ".join(missing))
    entries = _merged(directory / name for name in files)
    absent = sorted(name for name in weight_map if name not in entries)
    if absent:
        raise CheckpointError(f"{index_path} maps tensors its files do not hold: "
                              + ", ".join(absent[:10]))
    return entries
