"""A job whose ranks stopped progressing: found, explained, and which rank to blame.

Every rank of the launcher's job records its progress (`rank_progress`). `HangWatch.check`,
called at each look of the launcher (`rank_watch.watch`), finds the job hung when no rank's
record has changed for `timeout` seconds. It then has every rank dump its Python stacks
(`rank_progress.STACKS_SIGNAL`; a stopped rank is continued for that), writes
`<report_dir>/rank_<r>.txt` for each (its record, its process state, its stacks) and returns
one report: the ranks that are behind (stopped by a signal, or at an earlier step, or fewer
collectives in), their step, phase and last collective, and the other ranks' pending
collective.

`blame` serves a rank's failure: when a rank fails in a collective because another rank is
stopped or behind (MindSpore ends a collective whose peer stopped answering with an error on
the healthy rank), the message names the rank that is stopped or behind first.

Pure Python (and Linux's /proc): it never imports MindSpore.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Mapping
from pathlib import Path

from .msrun import proc_stat
from .rank_progress import STACKS_SIGNAL, Progress, read, stacks_path

BLAME_STALE_SECONDS = 5.0
"""A rank whose last record is this much older than another rank's is behind it (`blame`)."""
STACKS_WAIT_SECONDS = 5.0
"""How long the launcher waits for the ranks' stacks once it has asked for them."""


class HangReport(str):
    """What `HangWatch.check` returns for a hung job: its report."""


class HangWatch:
    """The progress of one host's ranks, as the launcher's looks see it.

    Args:
        directory: where the ranks record (`rank_progress.DIRECTORY_ENV`).
        ranks: this host's ranks.
        timeout: seconds without any rank progressing after which the job is hung (0: never
            judged hung; `blame` still works).
        report_dir: where the hang's files go (`rank_<r>.txt`).
    """

    def __init__(self, directory: Path, ranks: range | list[int], *, timeout: float,
                 report_dir: Path) -> None:
        self.directory = directory
        self.ranks = list(ranks)
        self.timeout = timeout
        self.report_dir = report_dir
        self.seen: dict[int, int] = {}
        self.changed = time.monotonic()

    def check(self, pid_rank: Mapping[int, int]) -> str | None:
        """None while some rank progresses (or the timeout is off); once none has for
        `timeout` seconds, the report (after writing the rank files)."""
        if self.timeout <= 0:
            return None
        now = time.monotonic()
        for rank in self.ranks:
            record = read(self.directory, rank)
            beats = record.beats if record is not None else self.seen.get(rank, 0)
            if beats != self.seen.get(rank, 0):
                self.seen[rank] = beats
                self.changed = now
        if now - self.changed < self.timeout:
            return None
        return self.report(pid_rank)

    def report(self, pid_rank: Mapping[int, int]) -> str:
        """Dump every rank's stacks, write the rank files, and return the one report."""
        records = {rank: read(self.directory, rank) for rank in self.ranks}
        states = {rank: _state(pid) for pid, rank in pid_rank.items()}
        behind = _behind(records, states)
        self._dump_stacks(pid_rank, states)
        with contextlib.suppress(OSError):
            self.report_dir.mkdir(parents=True, exist_ok=True)
        for rank in self.ranks:
            self._write(rank, records[rank], states.get(rank, "not found"))
        waited = time.monotonic() - self.changed
        lines = [f"no rank progressed for {waited:.0f} s (--hang-timeout {self.timeout:g}): "
                 f"the job is hung; behind: {', '.join(f'rank {r}' for r in behind) or 'none'}"]
        for rank in self.ranks:
            mark = "behind" if rank in behind else "waiting"
            lines.append(f"  rank {rank} ({mark}, {states.get(rank, 'not found')}): "
                         f"{_described(records[rank])}")
        lines.append(f"  stacks and records: {self.report_dir}/rank_<r>.txt")
        return HangReport("\n".join(lines))

    def blame(self, failure: str, pid_rank: Mapping[int, int]) -> str:
        """`failure` (one rank's error), led by the ranks that are stopped by a signal or
        whose record is `BLAME_STALE_SECONDS` older than every other rank's newest: the
        failure is then most likely their consequence."""
        records = {rank: read(self.directory, rank) for rank in self.ranks}
        states = {rank: _state(pid) for pid, rank in pid_rank.items()}
        behind = [rank for rank, state in sorted(states.items()) if state.startswith("stopped")]
        if not behind:
            times = {rank: record.wall_time for rank, record in records.items()
                     if record is not None}
            behind = [rank for rank, when in sorted(times.items())
                      if len(times) > 1 and when + BLAME_STALE_SECONDS
                      < max(other for peer, other in times.items() if peer != rank)]
        if not behind:
            return failure
        named = "; ".join(f"rank {rank} is behind ({states.get(rank, 'not found')}; "
                          f"{_described(records.get(rank))})" for rank in behind)
        return f"{named}; then, most likely as a consequence, {failure}"

    def _dump_stacks(self, pid_rank: Mapping[int, int], states: Mapping[int, str]) -> None:
        for pid, rank in pid_rank.items():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, STACKS_SIGNAL)
                if states.get(rank, "").startswith("stopped"):
                    os.kill(pid, signal.SIGCONT)  # the pending signal is handled on waking
        deadline = time.monotonic() + STACKS_WAIT_SECONDS
        sizes: dict[int, int] = {}
        waiting = set(pid_rank.values())
        while waiting and time.monotonic() < deadline:
            time.sleep(0.2)
            for rank in list(waiting):  # written and no longer growing
                size = _size(stacks_path(self.directory, rank))
                if size and sizes.get(rank) == size:
                    waiting.discard(rank)
                sizes[rank] = size

    def _write(self, rank: int, record: Progress | None, state: str) -> None:
        try:
            stacks = stacks_path(self.directory, rank).read_text(encoding="utf-8",
                                                                 errors="replace")
        except OSError:
            stacks = ""
        when = "-" if record is None else time.strftime(
            "%Y-%m-%d %H:%M:%S", time.localtime(record.wall_time))
        text = (f"rank {rank}: {_described(record)}\nprocess: {state}\n"
                f"last record at: {when}\n\n"
                f"{stacks or 'no Python stacks were dumped (the process did not answer)'}\n")
        with contextlib.suppress(OSError):  # never through a symbolic link (ELOOP)
            fd = os.open(self.report_dir / f"rank_{rank}.txt", os.O_WRONLY | os.O_CREAT
                         | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666)
            with os.fdopen(fd, "w", encoding="utf-8") as report:
                report.write(text)


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _described(record: Progress | None) -> str:
    return "no progress recorded" if record is None else record.describe()


def _state(pid: int) -> str:
    """`running`, `stopped (SIGSTOP or a debugger)`, `exited` ... from /proc."""
    fields = proc_stat(pid)
    letter = fields[2] if len(fields) > 2 else ""
    return {"R": "running", "S": "sleeping", "D": "in an uninterruptible wait",
            "T": "stopped (SIGSTOP or a debugger)", "t": "stopped (traced)",
            "Z": "exited", "": "exited"}.get(letter, f"state {letter}")


def _behind(records: Mapping[int, Progress | None], states: Mapping[int, str]) -> list[int]:
    """The ranks stopped by a signal, else those at an earlier step or with fewer records
    than the most advanced one."""
    stopped = [rank for rank, state in states.items() if state.startswith("stopped")]
    if stopped:
        return sorted(stopped)
    known = [(record.step, record.beats) for record in records.values() if record is not None]
    if not known:
        return []
    ahead = max(known)
    return sorted(rank for rank, record in records.items()
                  if record is None or (record.step, record.beats) < ahead)
