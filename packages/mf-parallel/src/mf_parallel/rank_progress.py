"""Where each rank is, in a place its launcher can read while the rank runs: its step, the
phase of the step it is in, and the last collective it entered (operation, group and that
group's sequence number).

A rank records (`step`, `phase`, `collective`) into a small memory-mapped file the launcher
gave it (`DIRECTORY_ENV`: `<dir>/rank_<r>.progress`): a record is a few memory writes, no
system call, so it costs microseconds, and the launcher reads every rank's record at each of
its looks (`read`). No thread keeps it fresh: a rank that stops progressing (stopped, in a
deadlock, in a collective another rank never joins) leaves its record as it was, and its
count of records (`beats`) stops growing. `hang_watch` in the launcher reads that.

A rank that records here also dumps the Python stacks of all its threads into
`<dir>/rank_<r>.stacks` on `STACKS_SIGNAL` (`faulthandler`: C code, so it answers while the
rank's main thread is blocked inside a kernel or a collective).

Without `DIRECTORY_ENV` (one process, a rank started by hand) nothing is written: each call
is one test of a module global.

Every rank, recording or not, also adds up the seconds it spends in each phase
(`phase_seconds`: a `time.perf_counter()` reading and a dict update per phase change), from
which the trainer reports where a step's time goes.

Pure Python: it never imports MindSpore.
"""

from __future__ import annotations

import faulthandler
import mmap
import os
import signal
import time
from pathlib import Path
from typing import IO

import attrs

DIRECTORY_ENV = "MF_RANK_PROGRESS_DIR"
"""The directory of the records, set by the launcher for its ranks."""
STACKS_SIGNAL = signal.SIGUSR2
"""The signal on which a recording rank writes its threads' Python stacks."""
SIZE = 512
"""Bytes of one record's file."""
JOINING = "init_communication"
"""The phase of a rank joining the job's group (registering with msrun's scheduler)."""


def record_path(directory: Path, rank: int) -> Path:
    return directory / f"rank_{rank}.progress"


def stacks_path(directory: Path, rank: int) -> Path:
    return directory / f"rank_{rank}.stacks"


@attrs.frozen
class Progress:
    """One rank's record as the launcher reads it."""

    beats: int
    """How many times the rank has recorded: grows while it progresses."""
    step: int
    """The step it runs (1-based: the step being worked on; 0 before the first)."""
    phase: str
    collective: str
    """Its last collective: `all_reduce(data) #12`, or `-` before the first."""
    wall_time: float
    """`time.time()` of its last record."""

    def describe(self) -> str:
        return f"step {self.step}, phase {self.phase}, last collective {self.collective}"


class _Recorder:
    """This rank's record file, mapped, and what it holds so far."""

    def __init__(self, directory: Path, rank: int) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        path = record_path(directory, rank)
        with open(path, "wb") as blank:
            blank.write(b" " * SIZE)
        with open(path, "r+b") as handle:
            self.map = mmap.mmap(handle.fileno(), SIZE)
        # open for the process's life: faulthandler writes to it from its signal handler
        self.stacks: IO[str] = open(stacks_path(directory, rank), "w",  # noqa: SIM115
                                    encoding="utf-8")
        faulthandler.register(STACKS_SIGNAL, file=self.stacks, all_threads=True, chain=False)
        self.beats = 0
        self.step = 0
        self.phase = "starting"
        self.collective = "-"
        self.sequence: dict[str, int] = {}
        self.write()

    def write(self) -> None:
        self.beats += 1
        beats = self.beats
        text = (f"{beats} {self.step} {self.phase} {self.collective.replace(' ', '_')} "
                f"{time.time():.3f} {beats}\n").encode()
        self.map[:len(text)] = text


class _PhaseClock:
    """Seconds spent in each phase since the last `take`."""

    def __init__(self) -> None:
        self.name = "starting"
        self.since = time.perf_counter()
        self.spent: dict[str, float] = {}

    def enter(self, name: str) -> None:
        now = time.perf_counter()
        self.spent[self.name] = self.spent.get(self.name, 0.0) + now - self.since
        self.name, self.since = name, now

    def take(self) -> dict[str, float]:
        self.enter(self.name)
        spent, self.spent = self.spent, {}
        return spent


_recorder: _Recorder | None = None
_clock = _PhaseClock()


def start_recording(rank: int, directory: str | None = None) -> bool:
    """Record this rank's progress in `directory` (default: `DIRECTORY_ENV`, when set);
    returns whether it does."""
    global _recorder
    directory = directory or os.environ.get(DIRECTORY_ENV)
    if not directory:
        return False
    _recorder = _Recorder(Path(directory), rank)
    return True


def step(number: int) -> None:
    """This rank starts working on step `number`."""
    if _recorder is not None:
        _recorder.step = number
        _recorder.write()


def phase(name: str) -> None:
    """This rank enters phase `name` (`data`, `forward_backward`, `reduction`, ...)."""
    _clock.enter(name)
    if _recorder is not None:
        _recorder.phase = name
        _recorder.write()


def phase_seconds() -> dict[str, float]:
    """The seconds this process spent in each phase since the last call (or since it
    started), the phase it is in counted up to now; the count starts again."""
    return _clock.take()


def collective(operation: str, group: str | None) -> None:
    """This rank enters `operation` over `group` (a group kind or name; None: the world)."""
    if _recorder is not None:
        group = group or "world"
        number = _recorder.sequence.get(group, 0) + 1
        _recorder.sequence[group] = number
        _recorder.collective = f"{operation}({group})#{number}"
        _recorder.write()


def read(directory: Path, rank: int) -> Progress | None:
    """A rank's record (None before it wrote one, or when a read met a half-written one:
    the count at both ends differs)."""
    try:
        with open(record_path(directory, rank), "rb") as handle:
            fields = handle.read(SIZE).decode(errors="replace").split("\n")[0].split()
    except OSError:
        return None
    if len(fields) != 6 or fields[0] != fields[5]:
        return None
    try:
        return Progress(beats=int(fields[0]), step=int(fields[1]), phase=fields[2],
                        collective=fields[3], wall_time=float(fields[4]))
    except ValueError:
        return None
