"""Reading Hugging Face safetensors checkpoints into float32 numpy arrays.

A safetensors file is: 8 bytes (little-endian u64) header length N, N bytes of JSON header
`{name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {...}}`, then the
data buffer the offsets index into (little-endian, row-major). The file is parsed here
rather than through `safetensors.numpy`, because numpy has no bfloat16: safetensors' numpy
loader fails on BF16 tensors (it asks numpy for a "bfloat16" dtype, which exists only while
MindSpore's own is registered). A bfloat16 value is the upper 16 bits of the float32 with the
same sign, exponent and leading mantissa bits, so `uint32(bits) << 16` viewed as float32 is
its exact value. FP8 tensors (`F8_E4M3`, DeepSeek-V3's checkpoint) are read as raw bytes and
dequantised with their `_scale_inv` block scales once every file is read (`fp8.py`: a scale
may sit in another file than its weight).

The mapping of HF names to mf parameter names is the models' business
(`mf_train.models.hf_weights.load_hf_state`).
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import numpy as np

from . import layout
from .errors import CheckpointError
from .fp8 import FP8_E4M3, SCALE_SUFFIX, dequantize_fp8, weight_block_size
from .reading import read_files

INDEX = "model.safetensors.index.json"
_NUMPY_DTYPES = {
    "F64": "<f8", "F32": "<f4", "F16": "<f2", "I64": "<i8", "I32": "<i4", "I16": "<i2",
    "I8": "i1", "U64": "<u8", "U32": "<u4", "U16": "<u2", "U8": "u1", "BOOL": "?",
}
_ITEMSIZE = {"BF16": 2, "F8_E4M3": 1,
             **{name: np.dtype(code).itemsize for name, code in _NUMPY_DTYPES.items()}}


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


def load_hf_weights(path: str | os.PathLike[str], workers: int = 1) -> dict[str, np.ndarray]:
    """Every tensor of a Hugging Face checkpoint (a `.safetensors` file, or a directory with
    `model.safetensors.index.json` or plain `*.safetensors` files) by its HF name; floating
    tensors as float32 (FP8 ones dequantised with their block scales, which are consumed:
    `fp8.dequantize_fp8`), others in their own dtype. `workers` files are read at a time."""
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"Hugging Face checkpoint {path} does not exist")
    tensors = _load_all(path, workers)
    if any(value.dtype == FP8_E4M3 or name.endswith(SCALE_SUFFIX)
           for name, value in tensors.items()):
        return dequantize_fp8(tensors, weight_block_size(path))
    return tensors


def _load_all(path: Path, workers: int) -> dict[str, np.ndarray]:
    """Every tensor of the checkpoint as read (FP8 still raw)."""
    if path.is_file():
        return read_safetensors(path)
    if (path / INDEX).is_file():
        return _load_indexed(path, workers)
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise CheckpointError(f"{path} holds no *.safetensors files (nor {INDEX})")
    tensors: dict[str, np.ndarray] = {}
    for file, part in zip(files, read_files(read_safetensors, files, workers), strict=True):
        repeated = sorted(tensors.keys() & part.keys())
        if repeated:
            raise CheckpointError(f"{file} repeats tensors of an earlier file: "
                                  + ", ".join(repeated[:10]))
        tensors.update(part)
    return tensors


def _load_indexed(directory: Path, workers: int = 1) -> dict[str, np.ndarray]:
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
    tensors: dict[str, np.ndarray] = {}
    for part in read_files(read_safetensors, [directory / name for name in files], workers):
        tensors.update(part)
    absent = sorted(name for name in weight_map if name not in tensors)
    if absent:
        raise CheckpointError(f"{index_path} maps tensors its files do not hold: "
                              + ", ".join(absent[:10]))
    return tensors


def read_safetensors(path: Path) -> dict[str, np.ndarray]:
    """One safetensors file's tensors (floating ones as float32, FP8 ones as raw bytes in the
    `fp8.FP8_E4M3` dtype), parsed from its header."""
    header, data_start = _read_header(path)
    size = path.stat().st_size - data_start
    data = (np.memmap(path, dtype=np.uint8, mode="r", offset=data_start) if size > 0
            else np.zeros(0, np.uint8))
    return {name: _tensor(path, name, info, data) for name, info in header.items()
            if name != "__metadata__"}


def _read_header(path: Path) -> tuple[dict, int]:
    with open(path, "rb") as handle:
        prefix = handle.read(8)
        length = int.from_bytes(prefix, "little") if len(prefix) == 8 else -1
        if not 0 < length <= path.stat().st_size - 8:
            raise CheckpointError(f"{path}: not a safetensors file (bad header length)")
        raw = handle.read(length)
    try:
        header = json.loads(raw)
    except ValueError as exc:
        raise CheckpointError(f"{path}: unreadable safetensors header ({exc})") from None
    if not isinstance(header, dict):
        raise CheckpointError(f"{path}: the safetensors header is not a JSON object")
    return header, 8 + length


def _tensor(path: Path, name: str, info: dict, data: np.ndarray) -> np.ndarray:
    where = f"{path}: tensor {name}"
    try:
        dtype, shape, (begin, end) = info["dtype"], list(info["shape"]), info["data_offsets"]
    except (KeyError, TypeError, ValueError):
        raise CheckpointError(f"{where}: malformed header entry {info!r}") from None
    if dtype not in _ITEMSIZE:
        raise CheckpointError(f"{where}: dtype {dtype} is not supported (supported: "
                              f"{', '.join(_ITEMSIZE)})")
    expected = math.prod(shape) * _ITEMSIZE[dtype]
    if end - begin != expected or not 0 <= begin <= end <= data.size:
        raise CheckpointError(f"{where}: data_offsets [{begin}, {end}] do not hold {dtype} "
                              f"{shape} ({expected} bytes) within {data.size} data bytes")
    raw = data[begin:end]
    if dtype == "F8_E4M3":
        return np.array(raw).view(FP8_E4M3).reshape(shape)
    if dtype == "BF16":
        bits = raw.view("<u2").astype(np.uint32) << 16
        return bits.view(np.float32).reshape(shape)
    value = raw.view(_NUMPY_DTYPES[dtype]).reshape(shape)
    if value.dtype.kind == "f":
        return value.astype(np.float32)
    return value.astype(value.dtype.newbyteorder("="))
