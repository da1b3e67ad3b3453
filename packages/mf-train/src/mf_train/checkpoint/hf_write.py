"""Writing a Hugging Face model directory: `config.json` and the weights as safetensors.

One `model.safetensors`, or, when the weights exceed `max_shard_size`, files
`model-00001-of-0000N.safetensors` filled in order (a tensor larger than the limit gets a
file of its own, as transformers does) with `model.safetensors.index.json` mapping each
weight to its file. Every file carries the `{"format": "pt"}` metadata transformers checks.

bfloat16 is not a numpy dtype (without ml_dtypes, which is not installed here), so bfloat16
weights are rounded from float32 by bit arithmetic (round to nearest, ties to even: add
0x7FFF plus the lowest kept bit, keep the upper 16 bits; NaN stays a quiet NaN) and handed
to safetensors' numpy-free `serialize_file` as raw 16-bit words.

The directory is built under a temporary sibling name and renamed into place at the end, so
a reader sees no directory or a whole one; a non-empty directory is replaced only when asked.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from safetensors import TensorSpec, serialize_file

from .atomic import commit_file, fsync_dir, remove_tree, write_json
from .errors import CheckpointError
from .hf import INDEX

SINGLE = "model.safetensors"
DTYPES = {"float32": "float32", "bfloat16": "bfloat16", "float16": "float16"}
"""Export dtypes and the name safetensors and `config.json`'s `torch_dtype` give them."""
_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
          "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}


def parse_size(text: str | int) -> int:
    """Bytes of a size as transformers' `max_shard_size` writes it: `5GB` (10^9),
    `500MiB` (2^20), or a plain number of bytes."""
    if isinstance(text, int):
        size = text
    else:
        match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", str(text))
        unit = match.group(2).upper() if match else None
        if match is None or unit not in _UNITS:
            raise CheckpointError(f"--max-shard-size {text!r}: expected a size such as 5GB, "
                                  "500MB, 2GiB or a number of bytes")
        size = int(float(match.group(1)) * _UNITS[unit])
    if size <= 0:
        raise CheckpointError(f"--max-shard-size {text!r}: must be more than 0 bytes")
    return size


def bfloat16_bits(values: np.ndarray) -> np.ndarray:
    """The bfloat16 nearest each float32 value (ties to even), as uint16 bit patterns."""
    bits = np.ascontiguousarray(values, np.float32).view(np.uint32)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
    nan = np.isnan(values)
    rounded[nan] = ((bits[nan] >> 16) | 0x0040).astype(np.uint16)
    return rounded


def encoded(values: np.ndarray, dtype: str) -> np.ndarray:
    """`values` as the contiguous array whose bytes are the `dtype` tensor's."""
    if dtype == "bfloat16":
        return bfloat16_bits(values)
    return np.ascontiguousarray(np.asarray(values, np.float32).astype(np.dtype(dtype)))


def shard_plan(sizes: Mapping[str, int], max_bytes: int) -> list[list[str]]:
    """The weights of each file, in order: consecutive weights while they fit `max_bytes`."""
    files: list[list[str]] = []
    used = 0
    for name, size in sizes.items():
        if not files or (used + size > max_bytes and files[-1]):
            files.append([])
            used = 0
        files[-1].append(name)
        used += size
    return files


def check_output(output: str | os.PathLike[str], force: bool) -> Path:
    """`output` as a Path, or CheckpointError when it is a file, or a non-empty directory
    and not `force` (checked before any work, and again when writing)."""
    output = Path(output)
    if output.exists() and not output.is_dir():
        raise CheckpointError(f"--output {output} exists and is not a directory")
    if output.is_dir() and any(output.iterdir()) and not force:
        raise CheckpointError(f"--output {output} is not empty; choose another directory or "
                              "pass --force to replace it")
    return output


def write_hf_directory(output: str | os.PathLike[str], weights: Mapping[str, np.ndarray],
                       config: Mapping[str, Any], *, dtype: str, max_shard_size: str | int,
                       force: bool = False, copies: Sequence[Path] = ()) -> Path:
    """Write `config.json` and `weights` (HF names, float32 values) cast to `dtype` into the
    directory `output`, atomically, with a copy of each file of `copies` (the tokenizer's);
    a non-empty `output` is replaced only with `force`.

    Returns:
        The directory written.
    """
    if dtype not in DTYPES:
        raise CheckpointError(f"--dtype {dtype!r}: expected one of {', '.join(DTYPES)}")
    limit = parse_size(max_shard_size)
    output = check_output(output, force)
    output.parent.mkdir(parents=True, exist_ok=True)
    staging = output.with_name(f".{output.name}.tmp-{os.getpid()}")
    if staging.exists():
        shutil.rmtree(staging)
    staging.mkdir()
    try:
        _write_weights(staging, {name: encoded(value, dtype) for name, value in weights.items()},
                       dtype, limit)
        write_json(staging / "config.json", dict(config))
        for copied in copies:
            shutil.copyfile(copied, staging / copied.name)
        fsync_dir(staging)
        if output.exists():
            remove_tree(output, ".del-")
        os.replace(staging, output)
        fsync_dir(output.parent)
    finally:
        if staging.exists():
            shutil.rmtree(staging)
    return output


def _write_weights(directory: Path, arrays: dict[str, np.ndarray], dtype: str,
                   limit: int) -> None:
    files = shard_plan({name: array.nbytes for name, array in arrays.items()}, limit)
    if len(files) == 1:
        _write_file(directory / SINGLE, {name: arrays[name] for name in files[0]}, dtype)
        return
    weight_map = {}
    for number, names in enumerate(files, 1):
        file_name = f"model-{number:05d}-of-{len(files):05d}.safetensors"
        _write_file(directory / file_name, {name: arrays[name] for name in names}, dtype)
        weight_map.update(dict.fromkeys(names, file_name))
    total = sum(array.nbytes for array in arrays.values())
    write_json(directory / INDEX, {"metadata": {"total_size": total},
                                   "weight_map": dict(sorted(weight_map.items()))})


def _write_file(path: Path, arrays: dict[str, np.ndarray], dtype: str) -> None:
    specs = {name: TensorSpec(dtype=DTYPES[dtype], shape=list(array.shape),
                               data_ptr=array.ctypes.data, data_len=array.nbytes)
             for name, array in arrays.items()}
    part = path.with_name(f"{path.name}.part")
    serialize_file(specs, str(part), metadata={"format": "pt"})
    commit_file(part, path)
