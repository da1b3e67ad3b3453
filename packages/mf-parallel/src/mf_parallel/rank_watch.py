"""Watching msrun's ranks while they run, and saying in one line which rank failed and how.

msrun alone, when a worker fails, kills the other workers but then waits about 30 s for its
scheduler's heartbeat timeout. The watch looks at the workers (their logs, msrun's log and
/proc) every `POLL_SECONDS`, so that the job can be ended as soon as one rank has failed, with
that rank named, or, in a job of one node, as soon as every rank has succeeded.

Pure Python (and Linux's /proc): it never imports MindSpore.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from .hang_watch import HangWatch
from .msrun import children, proc_stat

#: Seconds between two looks at the workers (their logs and /proc) while the job runs.
POLL_SECONDS = 0.2
#: What `watch` returns when the deadline has passed.
TIMED_OUT = "timed out"
#: What `watch` returns, with `until_workers_end`, once every worker has exited with status 0.
WORKERS_ENDED = "workers ended"
# what msrun logs (with its own PID) when it finds a worker exited with a non-zero code
_MSRUN_WORKER_EXIT = (r"\[ERROR\] ME\({pid}:.*Worker process (\d+) exit with exception\. "
                      r"Error code: (-?\d+)")
_EXCEPTION_LINE = re.compile(r"^(\w+(?:\.\w+)*(?:Error|Exception|Interrupt)\b.*)$", re.M)


def watch(process: subprocess.Popen[bytes], log_dir: Path, ranks: Sequence[int], *,
          deadline: float, msrun_log: str = "msrun.log",
          forward: Callable[[], int | None] | None = None,
          until_workers_end: bool = False, msrun_logs_errors: bool = True,
          hang: HangWatch | None = None) -> str | None:
    """Wait for msrun; stop early with the first failed rank's message, or `TIMED_OUT`.

    `ranks` are the global ranks msrun runs on this host; `msrun_log` names msrun's own log in
    `log_dir`. `forward`, asked at every look, returns a signal to send every worker (None:
    none yet): each worker gets it once, as soon as it has a handler for it (`RankWatch.send`).
    None means msrun exited by itself (its status says whether the job succeeded).

    With `until_workers_end` (a job of one node), `WORKERS_ENDED` once every worker has
    exited with status 0 (`RankWatch.all_succeeded`): the scheduler has no one left to serve,
    and MindSpore's scheduler only notices the last worker's departure after up to 5 s of
    sleep, then msrun after up to 1 s more. `msrun_logs_errors`: whether msrun's environment
    lets its error lines reach its log (`logs_errors`).

    `hang`, when given, is asked at every look whether the job is hung (its report, a
    `HangReport`, is returned), and names the ranks stopped or behind in a failure's message
    (`HangWatch.blame`).
    """
    workers = RankWatch(process.pid, log_dir, ranks, msrun_log=msrun_log,
                        msrun_logs_errors=msrun_logs_errors)
    while process.poll() is None:
        failure = workers.failure()
        if failure is not None:
            return failure if hang is None else hang.blame(failure, workers.pid_rank)
        if hang is not None and (report := hang.check(workers.pid_rank)) is not None:
            return report
        if until_workers_end and workers.all_succeeded():
            return workers.failure() or WORKERS_ENDED  # what msrun logged as it reaped them
        signum = forward() if forward is not None else None
        if signum is not None:
            workers.send(signum)
        if time.monotonic() >= deadline:
            return TIMED_OUT
        time.sleep(POLL_SECONDS)
    return None


def logs_errors(env: Mapping[str, str]) -> bool:
    """Whether a MindSpore process with environment `env` writes its Python logger's error
    lines to stderr (msrun's to its log), as mindspore/log.py reads glog's settings: the
    logger's level (`GLOG_v`) first, then, when the console is not the log's place
    (`GLOG_logtostderr=0`), the console's threshold. Empty values are unset; values are
    stripped."""
    def setting(name: str, default: str) -> str:
        return (env.get(name) or "").strip() or default

    if setting("GLOG_v", "2") not in ("0", "1", "2", "3"):
        return False
    return (setting("GLOG_logtostderr", "1") != "0"
            or setting("GLOG_stderrthreshold", "2") in ("0", "1", "2", "3"))


def rank_failure_message(rank: int, returncode: int | None, log: Path) -> str:
    """One line on how `rank` ended: the signal that killed it, else its Python error, else
    its exit status (`returncode` as subprocess gives it: -N for signal N; None if unknown)."""
    if returncode is not None and returncode < 0:
        return f"rank {rank} was killed by {_signal_name(-returncode)} (log: {log})"
    error = traceback_tail(log)
    if error:
        return f"rank {rank} failed: {error} (log: {log})"
    status = "an unknown status" if returncode is None else f"status {returncode}"
    return f"rank {rank} exited with {status} and logged no Python error (log: {log})"


def traceback_tail(log: Path) -> str | None:
    """The exception line of the last traceback in `log` (`ValueError: bad batch`), if any."""
    if not log.exists():
        return None
    text = log.read_text(encoding="utf-8", errors="replace")
    if "Traceback (most recent call last)" not in text:
        return None
    after = text[text.rindex("Traceback (most recent call last)"):]
    for line in after.splitlines()[1:]:  # the frames are indented; the exception line is not
        if line.strip() and not line[0].isspace() and not line.startswith("["):
            return line.strip()  # (MindSpore's own log lines, `[INFO] ...`, may follow it)
    found = _EXCEPTION_LINE.findall(after)
    return found[0].strip() if found else after.splitlines()[-1].strip()


class RankWatch:
    """What can be seen of msrun's workers while they run: who they are, how they ended.

    A rank has failed when (first found wins, in this order):
    - msrun logged that its worker process exited with a non-zero code;
    - its process is a zombie (exited, not yet reaped by msrun) with a non-zero status or a
      signal: this is how a rank killed by SIGKILL is seen;
    - its log ends with the traceback of an exception that reached the script's top level
      (the traceback's outermost frame is `in <module>`): the rank is dying, and MindSpore
      may take several seconds to let its process exit. A traceback printed by a thread or by
      `logging.exception` inside a function does not count.
    """

    def __init__(self, msrun_pid: int, log_dir: Path, ranks: Sequence[int], *,
                 msrun_log: str = "msrun.log", msrun_logs_errors: bool = True) -> None:
        self.msrun_pid = msrun_pid
        self.log_dir = log_dir
        self.pid_rank: dict[int, int] = {}
        self.logs = {rank: LogScan(log_dir / f"worker_{rank}.log") for rank in ranks}
        self.log_rank = {str(log.path.resolve()): rank for rank, log in self.logs.items()}
        # msrun's own log lines carry its PID; its copies of the worker logs do not
        self.msrun_log = _Lines(log_dir / msrun_log)
        self.msrun_exit = re.compile(_MSRUN_WORKER_EXIT.format(pid=msrun_pid))
        self.reported: list[tuple[int, int]] = []
        self.sent: set[int] = set()
        """The workers `send` has signalled."""
        self.exited_ok: set[int] = set()
        """Workers seen exited with status 0 before msrun reaped them."""
        self.tails: set[int] = set()
        """msrun's `tail -f` of each worker log, seen so far (see `all_succeeded`)."""
        self.msrun_logs_errors = msrun_logs_errors

    def send(self, signum: int) -> None:
        """Send `signum` once to each worker seen so far, as soon as it has a handler for it
        (a worker still starting would be ended by it, or let it pass), while it is still
        msrun's child (a PID msrun has reaped may be another process's by now)."""
        alive = set(children(self.msrun_pid))
        for pid in self.pid_rank:
            if pid not in self.sent and pid in alive and _catches(pid, signum):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signum)
                self.sent.add(pid)

    def failure(self) -> str | None:
        """The message of the first failed rank found now, or None while all is well."""
        if len(self.pid_rank) < len(self.logs):
            self._find_workers()
        reported = self._msrun_reported_exits()
        if reported:
            pid, returncode = reported[0]
            return self._message(self.pid_rank.get(pid), returncode, pid)
        for pid, rank in sorted(self.pid_rank.items(), key=lambda item: item[1]):
            returncode = _zombie_returncode(pid, parent=self.msrun_pid)
            if returncode:
                return self._message(rank, returncode, pid)
            if returncode == 0:
                self.exited_ok.add(pid)
        for rank, log in self.logs.items():
            if log.uncaught_traceback():
                return rank_failure_message(rank, None, log.path)
        return None

    def all_succeeded(self) -> bool:
        """Whether every rank's worker has exited with status 0, on either evidence:
        - each was seen exited with status 0 before msrun reaped it; or
        - msrun has ended its `tail -f` of each worker's log, which it does once every worker
          has exited with status 0, or right after logging the one that did not (then
          `failure` finds that line): only where msrun's error lines reach its log
          (`msrun_logs_errors`).
        Call `failure` first: a failed worker is reported there."""
        if len(self.pid_rank) < len(self.logs):
            return False
        if self.exited_ok >= self.pid_rank.keys():
            return True
        if not self.msrun_logs_errors:
            return False
        below = children(self.msrun_pid)
        if any(proc_stat(pid)[2:3] not in ([], ["Z"]) for pid in self.pid_rank if pid in below):
            return False  # a worker still runs (its helper may have died on its own)
        for pid in below:
            if proc_stat(pid)[1:2] == ["tail"]:
                self.tails.add(pid)
        return len(self.tails) >= len(self.logs) and all(
            proc_stat(pid)[2:3] in ([], ["Z"]) for pid in self.tails)

    def _find_workers(self) -> None:
        """msrun's children whose output goes to a worker log are the ranks (msrun's other
        children, the scheduler and `tail -f` of each log, write elsewhere)."""
        for pid in children(self.msrun_pid):
            with contextlib.suppress(OSError):
                rank = self.log_rank.get(os.readlink(f"/proc/{pid}/fd/1"))
                if rank is not None:
                    self.pid_rank[pid] = rank

    def _msrun_reported_exits(self) -> list[tuple[int, int]]:
        for line in self.msrun_log.new_lines():
            found = self.msrun_exit.search(line)  # after a worker's unended line too
            if found:
                self.reported.append((int(found[1]), int(found[2])))
        return self.reported

    def _message(self, rank: int | None, returncode: int, pid: int) -> str:
        if rank is not None:
            return rank_failure_message(rank, returncode, self.logs[rank].path)
        for rank, log in self.logs.items():  # a worker that ended before it was seen
            if traceback_tail(log.path):
                return rank_failure_message(rank, None, log.path)
        how = (f"was killed by {_signal_name(-returncode)}" if returncode < 0
               else f"exited with status {returncode}")
        return f"a worker (pid {pid}) {how} and no rank logged a Python error; see {self.log_dir}"


class _Lines:
    """The whole lines a growing file has gained since the last call."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0

    def new_lines(self) -> list[str]:
        try:
            with open(self.path, "rb") as log:
                log.seek(self.offset)
                data = log.read()
        except OSError:
            return []
        whole = data[:data.rfind(b"\n") + 1]
        self.offset += len(whole)
        return whole.decode("utf-8", errors="replace").splitlines()


class LogScan:
    """Reads a growing log in pieces, remembering where the last traceback starts."""

    MARKER = b"Traceback (most recent call last):"

    def __init__(self, path: Path) -> None:
        self.path = path
        self.size = 0
        self.traceback_at: int | None = None

    def uncaught_traceback(self) -> bool:
        """Whether the log's last traceback is complete and went through `<module>`."""
        self._scan()
        if self.traceback_at is None:
            return False
        try:
            with open(self.path, "rb") as log:
                log.seek(self.traceback_at)
                text = log.read(64 * 1024).decode("utf-8", errors="replace")
        except OSError:
            return False
        lines = text.split("\n")[1:-1]  # whole lines after the marker's
        frames = [line for line in lines if line.lstrip().startswith("File ")]
        complete = any(line and not line[0].isspace() for line in lines)  # the exception line
        return complete and bool(frames) and frames[0].rstrip().endswith(", in <module>")

    def _scan(self) -> None:
        try:
            with open(self.path, "rb") as log:
                start = max(0, self.size - len(self.MARKER))  # a marker cut by the last read
                log.seek(start)
                data = log.read()
        except OSError:
            return
        found = data.rfind(self.MARKER)
        if found >= 0:
            self.traceback_at = start + found
        self.size = start + len(data)


def _catches(pid: int, signum: int) -> bool:
    """Whether process `pid` has installed a handler for `signum` (its `SigCgt` mask in
    /proc/<pid>/status)."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("SigCgt:"):
                    return bool(int(line.split()[1], 16) >> (signum - 1) & 1)
    except (OSError, ValueError):
        pass
    return False


def _zombie_returncode(pid: int, parent: int | None = None) -> int | None:
    """A process that has exited but is not yet reaped (a child of `parent`, when given: a
    PID reused by another process does not count): its status as subprocess gives it (-N
    for signal N). None while it runs or once it is gone."""
    fields = proc_stat(pid)
    if fields[2:3] != ["Z"] or len(fields) < 52:
        return None
    if parent is not None and fields[3] != str(parent):
        return None
    return os.waitstatus_to_exitcode(int(fields[51]))  # field 52 of stat: the exit code


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"
