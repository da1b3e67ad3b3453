"""Files that appear whole or not at all: write beside the target, then rename over it.

`os.replace` within one directory is atomic, so a reader (or a crashed writer's successor)
never sees half an `.idx`, `.bin` or index cache. Temporary names start with a dot and end in
`.tmp`; a failed write removes its temporary file.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

import numpy as np


def temporary_beside(path: str | os.PathLike) -> tuple[int, str]:
    """A fresh temporary file (descriptor, name) in the directory of `path`.

    Created with mode 0o666, so the umask decides the final permissions, as for open().
    """
    directory, name = os.path.split(os.path.abspath(path))
    while True:
        temporary = os.path.join(directory, f".{name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
        try:
            return os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666), temporary
        except FileExistsError:
            continue


def write_atomically(path: str | os.PathLike, write: Callable[[BinaryIO], object]) -> None:
    """Call `write(stream)` on a temporary file, then rename it to `path`."""
    descriptor, temporary = temporary_beside(path)
    try:
        with os.fdopen(descriptor, "wb") as stream:
            write(stream)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def save_array_atomically(path: str | os.PathLike, array: np.ndarray) -> None:
    """`numpy.save` (format 1.0, as Megatron writes its index caches), atomically."""
    write_atomically(path, lambda stream: np.save(stream, array, allow_pickle=True))
