"""The sample-index walk as compiled C, built with the system's C compiler at first use.

numpy needs six or seven passes over the document index to place the samples; a C loop needs
one, and megatron-core's own walk is C++. Like Megatron (which compiles its helpers with
`make` at run time), mf-data compiles `sample_walk.c` once per machine into a cache directory
(`$MF_DATA_CACHE`, else `$XDG_CACHE_HOME/mf-data`, else `~/.cache/mf-data`), under a name
keyed by the source's hash, written to a temporary name and renamed. Without a compiler (or
with `MF_DATA_COMPILE=0`) `walker()` returns None and `gpt_indices` uses its numpy path,
which gives the same arrays; the choice is logged once.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import shutil
import subprocess
import sys
import sysconfig
from collections.abc import Callable
from pathlib import Path

import numpy as np

from .atomic_files import temporary_beside

logger = logging.getLogger(__name__)
SOURCE = Path(__file__).with_name("sample_walk.c")
Walk = Callable[[np.ndarray, np.ndarray, int, int, np.ndarray], None]
_LOADED: list[Walk | None] = []


def walker() -> Walk | None:
    """The compiled walk, or None when it cannot be had here (once per process)."""
    if not _LOADED:
        _LOADED.append(_load())
    return _LOADED[0]


def cache_dir() -> Path:
    if os.environ.get("MF_DATA_CACHE"):
        return Path(os.environ["MF_DATA_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "mf-data"


def _load() -> Walk | None:
    if os.environ.get("MF_DATA_COMPILE", "1") == "0":
        logger.info("MF_DATA_COMPILE=0: the sample index uses numpy")
        return None
    try:
        library = ctypes.CDLL(str(_compiled()))
    except (OSError, subprocess.SubprocessError) as error:
        logger.warning("mf-data could not compile %s (%s); the sample index uses numpy, "
                       "which gives the same arrays about half as fast", SOURCE.name, error)
        return None
    functions = {np.dtype(np.int32): library.mf_sample_walk_int32,
                 np.dtype(np.int64): library.mf_sample_walk_int64}
    int32s = np.ctypeslib.ndpointer(dtype=np.int32, flags="C_CONTIGUOUS")
    for dtype, function in functions.items():
        out = np.ctypeslib.ndpointer(dtype=dtype, ndim=2, flags="C_CONTIGUOUS")
        function.argtypes = [int32s, int32s, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64,
                             ctypes.c_int64, out]
        function.restype = None

    def walk(lengths: np.ndarray, document_index: np.ndarray, seq_length: int, extra: int,
             out: np.ndarray) -> None:
        """Fill every row of `out` (int32 or int64, shape (rows, 2))."""
        functions[out.dtype](np.ascontiguousarray(lengths, dtype=np.int32),
                             np.ascontiguousarray(document_index, dtype=np.int32),
                             len(document_index), seq_length, extra, len(out), out)

    return walk


def _compiled() -> Path:
    """The shared library for this source and interpreter, compiling it if needed."""
    source = SOURCE.read_bytes()
    key = hashlib.sha256(source + sys.version.encode() + sysconfig.get_platform().encode())
    target = cache_dir() / f"sample_walk-{key.hexdigest()[:16]}.so"
    if target.exists():
        return target
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        raise OSError("no C compiler (cc or gcc) on PATH")
    target.parent.mkdir(parents=True, exist_ok=True)
    descriptor, temporary = temporary_beside(target)
    os.close(descriptor)
    try:
        subprocess.run([compiler, "-O2", "-shared", "-fPIC", "-o", temporary, str(SOURCE)],
                       check=True, capture_output=True, timeout=120)
        os.replace(temporary, target)
    finally:
        Path(temporary).unlink(missing_ok=True)
    return target
