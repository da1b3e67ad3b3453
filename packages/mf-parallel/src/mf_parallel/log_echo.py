"""One rank's log copied to a stream while the job runs, as torchrun shows its workers' output.

Each line is prefixed (`[rank 0] `) so that rank output is told from the launcher's own lines.
Lines matching `drop` are left in the log but not echoed: `MINDSPORE_INFO`, MindSpore's C++
INFO and DEBUG lines, a few of which (`[INFO] DISTRIBUTED(...) Event base dispatch success!`
when the communication shuts down) are written whatever `GLOG_v` says.
"""

from __future__ import annotations

import contextlib
import re
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO, TextIO

#: Seconds between two looks at the followed log.
POLL_SECONDS = 0.2
MINDSPORE_INFO = re.compile(r"^\[(?:INFO|DEBUG)\] [A-Z_]+\(\d+,")
"""A line of MindSpore's C++ logger at INFO or DEBUG level (`[INFO] DISTRIBUTED(29457,...`)."""


@contextlib.contextmanager
def echoing(log_dir: Path, rank: int | None, stream: TextIO | None,
            drop: re.Pattern[str] | None = None) -> Iterator[None]:
    """Follow `rank`'s log while the block runs; on leaving, copy what remains and stop.

    Args:
        log_dir: msrun's log directory (the log is `worker_<rank>.log` there).
        rank: the rank to follow; None follows nothing.
        stream: where to copy the lines (None: sys.stdout).
        drop: lines it matches (`search`) are not copied (None: every line is).
    """
    if rank is None:
        yield
        return
    follower = _Follower(log_dir / f"worker_{rank}.log", stream or sys.stdout,
                         prefix=f"[rank {rank}] ", drop=drop)
    follower.start()
    try:
        yield
    finally:
        follower.stop()


class _Follower(threading.Thread):
    """Copies each line a growing file gains to a stream (`tail -f`, polling)."""

    def __init__(self, path: Path, stream: TextIO, *, prefix: str,
                 drop: re.Pattern[str] | None = None) -> None:
        super().__init__(name=f"follow {path.name}", daemon=True)
        self.path, self.stream, self.prefix, self.drop = path, stream, prefix, drop
        self.done = threading.Event()
        self.file: BinaryIO | None = None
        self.partial = b""

    def run(self) -> None:
        try:
            while not self.done.wait(POLL_SECONDS):
                self._copy(final=False)
            self._copy(final=True)
        except (OSError, ValueError):  # the stream was closed: stop echoing, not the job
            pass
        finally:
            if self.file is not None:
                self.file.close()

    def stop(self) -> None:
        """Copy what is left (a last line without a newline too) and end the thread."""
        self.done.set()
        self.join(timeout=10)

    def _copy(self, *, final: bool) -> None:
        if self.file is None:
            try:
                self.file = open(self.path, "rb")  # noqa: SIM115 (closed in run)
            except FileNotFoundError:
                return
        *lines, self.partial = (self.partial + self.file.read()).split(b"\n")
        if final and self.partial:
            lines.append(self.partial)
            self.partial = b""
        for line in lines:
            text = line.rstrip(b"\r").decode("utf-8", errors="replace")
            if self.drop is not None and self.drop.search(text):
                continue
            self.stream.write(f"{self.prefix}{text}\n")
        if lines:
            self.stream.flush()
