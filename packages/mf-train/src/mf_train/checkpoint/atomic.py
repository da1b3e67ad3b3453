"""Crash-safe file writes: write a sibling `.part` file, flush it to disk, then rename it over
the target (`os.replace` is atomic on POSIX), so a reader sees the old file or the new one,
never a torn one. Directory entries are fsynced too, so a rename survives a power loss, not
only a killed process.

Every file gets the mode any file this process creates gets (0666 less the umask: 0644 under
the usual 022), as `torch.save` gives Megatron's checkpoints; safetensors alone writes 0600,
which would hide a run's checkpoints from the group that may read its directory.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from ..no_follow import open_no_follow


def fsync_dir(directory: Path) -> None:
    """Flush `directory`'s entries (renames, creations) to disk."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def file_digest(path: Path) -> str:
    """The SHA-256 of a file's bytes, hex (1.7 GB/s here: a 200 MB checkpoint file in about
    0.1 s)."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def bytes_digest(data: bytes) -> str:
    """The SHA-256 of `data`, hex."""
    return hashlib.sha256(data).hexdigest()


def _part_path(path: Path) -> Path:
    return path.with_name(f"{path.name}.part-{os.getpid()}")


def _open_part(part: Path) -> BinaryIO:
    """`part` opened for writing afresh, never through a symbolic link (`no_follow`)."""
    return os.fdopen(open_no_follow(part, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), "wb")


def commit_file(part: Path, path: Path) -> None:
    """Flush `part` to disk, give it the usual file mode and rename it to `path`."""
    with open(part, "rb+") as handle:
        os.fsync(handle.fileno())
    os.chmod(part, 0o666 & ~_umask())
    os.replace(part, path)


def _umask() -> int:
    """The process's umask, read without changing it (`os.umask` can only be read by setting
    it, which would race with the files other threads create meanwhile)."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except OSError:
        pass
    return _UMASK_AT_IMPORT


def _umask_at_import() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


_UMASK_AT_IMPORT = _umask_at_import()
"""The umask when this module was imported: for systems without /proc/self/status."""


SAFETENSORS_DTYPES = {np.dtype(name): code for name, code in (
    ("float64", "F64"), ("float32", "F32"), ("float16", "F16"), ("int64", "I64"),
    ("int32", "I32"), ("int16", "I16"), ("int8", "I8"), ("uint64", "U64"), ("uint32", "U32"),
    ("uint16", "U16"), ("uint8", "U8"), ("bool", "BOOL"))}
"""numpy dtype -> safetensors' dtype code."""


@dataclass(frozen=True)
class Streamed:
    """One tensor of a streamed safetensors file: its key, dtype and element count known up
    front, its values produced only when the writer reaches it (`read`: a flat array)."""

    key: str
    dtype: np.dtype
    numel: int
    read: Callable[[], np.ndarray]


def write_safetensors_streamed(path: Path, tensors: Sequence[Streamed],
                               metadata: dict[str, str] | None = None) -> str:
    """A 1-D tensor per entry as a safetensors file at `path`, atomically, holding one
    tensor's values in memory at a time: the header is written from the keys, dtypes and
    sizes, then each tensor's bytes as it is read. Returns the file's SHA-256 (hex), computed
    as it is written.

    Raises:
        ValueError: a tensor read with another dtype or size than announced, or a dtype
            safetensors has no code for.
    """
    header: dict[str, Any] = {"__metadata__": metadata} if metadata else {}
    offset = 0
    for tensor in tensors:
        if tensor.dtype not in SAFETENSORS_DTYPES:
            raise ValueError(f"{tensor.key}: cannot store dtype {tensor.dtype}")
        size = tensor.numel * tensor.dtype.itemsize
        header[tensor.key] = {"dtype": SAFETENSORS_DTYPES[tensor.dtype],
                              "shape": [tensor.numel], "data_offsets": [offset, offset + size]}
        offset += size
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # the data starts 8-byte aligned, as safetensors writes
    digest = hashlib.sha256()
    part = _part_path(path)
    with _open_part(part) as handle:
        for chunk in (struct.pack("<Q", len(text)), text):
            handle.write(chunk)
            digest.update(chunk)
        for tensor in tensors:
            values = np.ascontiguousarray(tensor.read()).reshape(-1)
            if values.dtype != tensor.dtype or values.size != tensor.numel:
                raise ValueError(f"{tensor.key}: read {values.size} values of {values.dtype}, "
                                 f"announced {tensor.numel} of {tensor.dtype}")
            data = memoryview(values.astype(values.dtype.newbyteorder("<"), copy=False)
                              ).cast("B")
            handle.write(data)
            digest.update(data)
            del values, data
    commit_file(part, path)
    return digest.hexdigest()


def write_text(path: Path, text: str) -> None:
    """`text` (UTF-8) at `path`, atomically."""
    part = _part_path(path)
    with _open_part(part) as handle:
        handle.write(text.encode("utf-8"))
    commit_file(part, path)


def write_json(path: Path, data: Any) -> None:
    """`data` as indented JSON at `path`, atomically."""
    write_text(path, json.dumps(data, indent=2, sort_keys=True) + "\n")


OWNED = ".mf-owned"
"""An empty file in each directory mf-train creates for a save, and in each it deletes: the
mark that lets a later run finish a killed save's or deletion's work on that directory, and
on nothing else named like it."""


def make_owned_dir(directory: Path) -> None:
    """Create `directory` (its parent exists) holding the `OWNED` mark."""
    directory.mkdir()
    (directory / OWNED).touch()


def owned(directory: Path) -> bool:
    """Whether `directory` (not a symbolic link) holds the `OWNED` mark."""
    return not directory.is_symlink() and (directory / OWNED).is_file()


def remove_tree(directory: Path, mark: str) -> None:
    """Delete `directory`, which the caller knows mf-train wrote, so no reader ever sees it
    half-deleted: mark it `OWNED`, rename it to an unused `<name><mark><pid>` (atomic), then
    remove what it holds and the mark last, so a deletion killed midway leaves a directory
    still marked."""
    (directory / OWNED).touch()
    doomed = directory.with_name(f"{directory.name}{mark}{os.getpid()}")
    suffix = 0
    while doomed.exists() or doomed.is_symlink():  # never another's: a name of its own
        suffix += 1
        doomed = directory.with_name(f"{directory.name}{mark}{os.getpid()}-{suffix}")
    os.replace(directory, doomed)
    for entry in doomed.iterdir():
        if entry.name == OWNED:
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()
    (doomed / OWNED).unlink()
    doomed.rmdir()
