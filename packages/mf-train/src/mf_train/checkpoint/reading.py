"""Reading several checkpoint files at once: `checkpoint.load_worker_number` threads.

A rank reads its model and optimizer files, a Hugging Face checkpoint its shards. The reads
are file I/O and copies that release the GIL (numpy, safetensors), so threads overlap them;
one worker reads the files one after the other. Results come back in the order of the paths.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")


def read_files(read: Callable[[Path], T], paths: Sequence[Path], workers: int = 1) -> list[T]:
    """`[read(path) for path in paths]`, with up to `workers` reads at a time."""
    if workers < 1:
        raise ValueError(f"load_worker_number must be >= 1, got {workers}")
    if workers == 1 or len(paths) < 2:
        return [read(path) for path in paths]
    with ThreadPoolExecutor(min(workers, len(paths)), thread_name_prefix="mf-ckpt-read") as pool:
        return list(pool.map(read, paths))
