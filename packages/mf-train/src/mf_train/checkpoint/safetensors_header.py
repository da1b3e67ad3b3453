"""The header of a safetensors file, checked: each tensor's dtype, shape and bytes.

A safetensors file is: 8 bytes (little-endian u64) header length N, N bytes of JSON header
`{name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {...}}`, then the
data buffer the offsets index into (little-endian, row-major). Reading the header alone tells
every tensor's name, shape and place, so a checkpoint can be checked whole (missing, repeated
or mis-shaped tensors) before any tensor is read, and then read tensor by tensor.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .errors import CheckpointError

NUMPY_DTYPES = {
    "F64": "<f8", "F32": "<f4", "F16": "<f2", "I64": "<i8", "I32": "<i4", "I16": "<i2",
    "I8": "i1", "U64": "<u8", "U32": "<u4", "U16": "<u2", "U8": "u1", "BOOL": "?",
}
"""safetensors dtypes numpy reads as they are (bfloat16 and float8 need more)."""
ITEMSIZE = {"BF16": 2, "F8_E4M3": 1,
            **{name: np.dtype(code).itemsize for name, code in NUMPY_DTYPES.items()}}


@dataclass(frozen=True)
class TensorEntry:
    """One tensor as a file's header describes it; `start` is its first byte in the file."""

    file: Path
    name: str
    dtype: str
    shape: tuple[int, ...]
    start: int

    @property
    def where(self) -> str:
        return f"{self.file}: tensor {self.name}"


def read_header(path: Path) -> dict[str, TensorEntry]:
    """Every tensor of the safetensors file at `path`, checked against the file's size.

    Raises:
        CheckpointError: not a safetensors file, an unreadable header, an unsupported dtype,
            or a tensor whose bytes are not where or what its header says.
    """
    header, data_start = _raw_header(path)
    data_size = path.stat().st_size - data_start
    return {name: _entry(path, name, info, data_start, data_size)
            for name, info in header.items() if name != "__metadata__"}


def _raw_header(path: Path) -> tuple[dict, int]:
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


def _entry(path: Path, name: str, info: dict, data_start: int, data_size: int) -> TensorEntry:
    where = f"{path}: tensor {name}"
    try:
        dtype, shape, (begin, end) = info["dtype"], tuple(info["shape"]), info["data_offsets"]
    except (KeyError, TypeError, ValueError):
        raise CheckpointError(f"{where}: malformed header entry {info!r}") from None
    if dtype not in ITEMSIZE:
        raise CheckpointError(f"{where}: dtype {dtype} is not supported (supported: "
                              f"{', '.join(ITEMSIZE)})")
    expected = math.prod(shape) * ITEMSIZE[dtype]
    if end - begin != expected or not 0 <= begin <= end <= data_size:
        raise CheckpointError(f"{where}: data_offsets [{begin}, {end}] do not hold {dtype} "
                              f"{list(shape)} ({expected} bytes) within {data_size} data bytes")
    return TensorEntry(path, name, dtype, shape, data_start + begin)
