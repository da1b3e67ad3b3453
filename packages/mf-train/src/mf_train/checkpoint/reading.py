"""Reading several checkpoint files or tensors at once: `checkpoint.load_worker_number`
threads.

A rank reads its model and optimizer files, or the tensors of a Hugging Face checkpoint. The
reads are file I/O and copies that release the GIL (numpy, safetensors), so threads overlap
them; one worker reads one after the other. Results come back in the order of the items, and
at most `workers` are read ahead of the one being used, so streaming a checkpoint through
more workers holds a few tensors at a time, not the whole model.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")
Item = TypeVar("Item")


def read_ahead(read: Callable[[Item], T], items: Iterable[Item], workers: int = 1,
               ) -> Iterator[T]:
    """`read(item)` for each item in order, up to `workers` reads running at a time."""
    if workers < 1:
        raise ValueError(f"load_worker_number must be >= 1, got {workers}")
    if workers == 1:
        yield from map(read, items)
        return
    with ThreadPoolExecutor(workers, thread_name_prefix="mf-ckpt-read") as pool:
        pending: deque[Future[T]] = deque()
        for item in items:
            pending.append(pool.submit(read, item))
            if len(pending) >= workers:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()


def read_files(read: Callable[[Path], T], paths: Sequence[Path], workers: int = 1) -> list[T]:
    """`[read(path) for path in paths]`, with up to `workers` reads at a time."""
    return list(read_ahead(read, paths, workers))
