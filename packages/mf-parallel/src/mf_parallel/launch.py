"""Start ranks on this host with msrun, watch them, and say which rank failed.

msrun (installed with MindSpore) starts one scheduler and N workers and sets the environment
`mindspore.communication.init()` reads. This module adds what a job runner needs around it:
a free port on 127.0.0.1; a watch on the workers while msrun runs, which ends the whole job
as soon as one rank has failed and names that rank with its error (msrun alone kills the
other workers but then waits about 30 s for the scheduler's heartbeat timeout); a deadline
after which every process of the job is killed (a worker blocked in a collective can outlive
msrun's own timeout); and, on request, one rank's log echoed to a stream as it grows.

Pure Python: it starts MindSpore in other processes but never imports it here.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import BinaryIO, TextIO

import attrs

from .errors import PlanError

#: Seconds between two looks at the workers (their logs and /proc) while the job runs.
POLL_SECONDS = 0.2
#: Seconds a process has to exit after SIGTERM before it gets SIGKILL.
KILL_GRACE_SECONDS = 3.0


class LaunchError(RuntimeError):
    """A multi-rank job failed or ran out of time; the message names the rank and its error."""


@attrs.frozen(kw_only=True)
class LaunchResult:
    """A finished job: exit status, where the logs are, how long it took."""

    returncode: int
    log_dir: Path
    seconds: float

    def worker_log(self, rank: int) -> Path:
        """The log file of one worker rank."""
        return self.log_dir / f"worker_{rank}.log"


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def msrun_command(script: str | Path, nproc: int, *, log_dir: Path, port: int,
                  args: Sequence[str] = (), cluster_timeout: int = 120) -> list[str]:
    """The msrun command line for `nproc` ranks on this host."""
    if nproc < 1:
        raise PlanError(f"the number of processes must be >= 1, got {nproc}")
    msrun = shutil.which("msrun", path=_path_with_interpreter())
    if msrun is None:
        raise LaunchError("msrun is not installed beside this Python (it comes with mindspore)")
    return [msrun, f"--worker_num={nproc}", f"--local_worker_num={nproc}",
            "--master_addr=127.0.0.1", f"--master_port={port}",
            f"--cluster_time_out={cluster_timeout}", f"--log_dir={log_dir}", "--join=True",
            str(script), *args]


def run_ranks(script: str | Path, nproc: int, *, log_dir: str | Path, timeout: float,
              args: Sequence[str] = (), env: dict[str, str] | None = None,
              echo_rank: int | None = None, echo_to: TextIO | None = None) -> LaunchResult:
    """Run `script` on `nproc` ranks and wait for them.

    `LaunchError` as soon as one rank has failed (the message names it, with its error or the
    signal that killed it, and its log; every process of the job is killed), or once
    `timeout` seconds have passed.

    With `echo_rank`, that rank's log lines are copied to `echo_to` (default: sys.stdout) while
    the job runs, each prefixed `[rank N] `, and the ranks run with PYTHONUNBUFFERED=1 (unless
    the environment sets it) so that their prints reach the log when they happen.
    """
    log_dir = Path(log_dir)
    if echo_rank is not None and not 0 <= echo_rank < nproc:
        raise ValueError(f"echo_rank must be a rank of the job (0 to {nproc - 1}), "
                         f"got {echo_rank}")
    msrun_log = _open_log_dir(log_dir, nproc)
    with msrun_log, _echoing(log_dir, echo_rank, echo_to):
        command = msrun_command(script, nproc, log_dir=log_dir, port=free_port(), args=args,
                                cluster_timeout=max(30, int(timeout)))
        start = time.monotonic()
        process = subprocess.Popen(command, stdout=msrun_log, stderr=subprocess.STDOUT,
                                   env=_child_env(env, echo=echo_rank is not None),
                                   start_new_session=True)
        try:
            failure = _watch(process, log_dir, nproc, deadline=start + timeout)
        finally:
            _kill_group(process)  # the other ranks, and workers left behind by msrun, if any
    if failure == _TIMED_OUT:
        raise LaunchError(f"{nproc}-rank job {Path(script).name} did not finish in "
                          f"{timeout:.0f} s and was killed; logs in {log_dir}")
    if failure is not None:
        raise LaunchError(failure)
    result = LaunchResult(returncode=process.returncode, log_dir=log_dir,
                          seconds=time.monotonic() - start)
    if result.returncode != 0:
        raise LaunchError(failure_message(result, nproc))
    return result


def failure_message(result: LaunchResult, nproc: int) -> str:
    """Which rank failed first (by its log), and the last line of its traceback."""
    for rank in range(nproc):
        error = _traceback_tail(result.worker_log(rank))
        if error:
            return f"rank {rank} failed: {error} (log: {result.worker_log(rank)})"
    return (f"the {nproc}-rank job exited with status {result.returncode}; no rank logged a "
            f"Python error; see {result.log_dir}")


def rank_failure_message(rank: int, returncode: int | None, log: Path) -> str:
    """One line on how `rank` ended: the signal that killed it, else its Python error, else
    its exit status (`returncode` as subprocess gives it: -N for signal N; None if unknown)."""
    if returncode is not None and returncode < 0:
        return f"rank {rank} was killed by {_signal_name(-returncode)} (log: {log})"
    error = _traceback_tail(log)
    if error:
        return f"rank {rank} failed: {error} (log: {log})"
    status = "an unknown status" if returncode is None else f"status {returncode}"
    return f"rank {rank} exited with {status} and logged no Python error (log: {log})"


# --- the log directory ------------------------------------------------------------------------

def _open_log_dir(log_dir: Path, nproc: int) -> BinaryIO:
    """Create `log_dir`, remove the worker logs of an earlier run there, open msrun.log.

    msrun would overwrite those worker logs anyway; removing them first keeps the watch from
    reading an old run's traceback before msrun has started the new ranks.
    """
    try:
        log_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise LaunchError(f"cannot create the log directory {log_dir}: "
                          f"{_why_unwritable(log_dir, exc)}; choose a log directory in a "
                          "place you can write to") from None
    try:
        for rank in range(nproc):
            (log_dir / f"worker_{rank}.log").unlink(missing_ok=True)
        return open(log_dir / "msrun.log", "wb")  # closed by run_ranks
    except OSError as exc:
        raise LaunchError(f"cannot write to the log directory {log_dir}: "
                          f"{_why_unwritable(log_dir, exc)}; choose a log directory you can "
                          "write to") from None


def _why_unwritable(path: Path, exc: OSError) -> str:
    """The reason in words: a file where a directory must be, else the system's reason."""
    for ancestor in (path, *path.parents):
        if ancestor.exists():
            if not ancestor.is_dir():
                return f"{ancestor} is a file, not a directory"
            break
    return exc.strerror or str(exc)


def _child_env(env: dict[str, str] | None, *, echo: bool) -> dict[str, str]:
    """The ranks' environment: msrun starts a bare `python`, so this interpreter's directory
    comes first on PATH; when echoing, unbuffered output unless the caller says otherwise."""
    base = {"PYTHONUNBUFFERED": "1"} if echo else {}
    return {**base, **os.environ, **(env or {}), "PATH": _path_with_interpreter()}


# --- watching the ranks -----------------------------------------------------------------------

_TIMED_OUT = "timed out"
# what msrun logs (with its own PID) when it finds a worker exited with a non-zero code
_MSRUN_WORKER_EXIT = (r"^\[ERROR\] ME\({pid}:.*Worker process (\d+) exit with exception\. "
                      r"Error code: (-?\d+)")


def _watch(process: subprocess.Popen[bytes], log_dir: Path, nproc: int, *,
           deadline: float) -> str | None:
    """Wait for msrun; stop early with the first failed rank's message, or `_TIMED_OUT`.

    None means msrun exited by itself (its status says whether the job succeeded).
    """
    ranks = _RankWatch(process.pid, log_dir, nproc)
    while process.poll() is None:
        failure = ranks.failure()
        if failure is not None:
            return failure
        if time.monotonic() >= deadline:
            return _TIMED_OUT
        time.sleep(POLL_SECONDS)
    return None


class _RankWatch:
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

    def __init__(self, msrun_pid: int, log_dir: Path, nproc: int) -> None:
        self.msrun_pid = msrun_pid
        self.log_dir = log_dir
        self.nproc = nproc
        self.pid_rank: dict[int, int] = {}
        self.logs = [_LogScan(log_dir / f"worker_{rank}.log") for rank in range(nproc)]
        self.log_rank = {str(log.path.resolve()): rank for rank, log in enumerate(self.logs)}
        # msrun's own log lines carry its PID; its copies of the worker logs do not
        self.msrun_log = _Lines(log_dir / "msrun.log")
        self.msrun_exit = re.compile(_MSRUN_WORKER_EXIT.format(pid=msrun_pid))
        self.reported: list[tuple[int, int]] = []

    def failure(self) -> str | None:
        """The message of the first failed rank found now, or None while all is well."""
        if len(self.pid_rank) < self.nproc:
            self._find_workers()
        reported = self._msrun_reported_exits()
        if reported:
            pid, returncode = reported[0]
            return self._message(self.pid_rank.get(pid), returncode, pid)
        for pid, rank in sorted(self.pid_rank.items(), key=lambda item: item[1]):
            returncode = _zombie_returncode(pid)
            if returncode:
                return self._message(rank, returncode, pid)
        for rank, log in enumerate(self.logs):
            if log.uncaught_traceback():
                return rank_failure_message(rank, None, log.path)
        return None

    def _find_workers(self) -> None:
        """msrun's children whose output goes to a worker log are the ranks (msrun's other
        children, the scheduler and `tail -f` of each log, write elsewhere)."""
        for pid in _children(self.msrun_pid):
            with contextlib.suppress(OSError):
                rank = self.log_rank.get(os.readlink(f"/proc/{pid}/fd/1"))
                if rank is not None:
                    self.pid_rank[pid] = rank

    def _msrun_reported_exits(self) -> list[tuple[int, int]]:
        for line in self.msrun_log.new_lines():
            found = self.msrun_exit.match(line)
            if found:
                self.reported.append((int(found[1]), int(found[2])))
        return self.reported

    def _message(self, rank: int | None, returncode: int, pid: int) -> str:
        if rank is not None:
            return rank_failure_message(rank, returncode, self.logs[rank].path)
        for rank, log in enumerate(self.logs):  # a worker that ended before it was seen
            if _traceback_tail(log.path):
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


class _LogScan:
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


def _zombie_returncode(pid: int) -> int | None:
    """A process that has exited but is not yet reaped: its status as subprocess gives it
    (-N for signal N). None while it runs or once it is gone."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    if fields[0] != "Z" or len(fields) < 50:
        return None
    return os.waitstatus_to_exitcode(int(fields[49]))  # field 52 of stat: the exit code


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


# --- echoing a rank's log -------------------------------------------------------------------

@contextlib.contextmanager
def _echoing(log_dir: Path, rank: int | None, stream: TextIO | None) -> Iterator[None]:
    """Follow `rank`'s log while the block runs; on leaving, copy what remains and stop."""
    if rank is None:
        yield
        return
    follower = _Follower(log_dir / f"worker_{rank}.log", stream or sys.stdout,
                         prefix=f"[rank {rank}] ")
    follower.start()
    try:
        yield
    finally:
        follower.stop()


class _Follower(threading.Thread):
    """Copies each line a growing file gains to a stream (`tail -f`, polling)."""

    def __init__(self, path: Path, stream: TextIO, *, prefix: str) -> None:
        super().__init__(name=f"follow {path.name}", daemon=True)
        self.path, self.stream, self.prefix = path, stream, prefix
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
            self.stream.write(f"{self.prefix}{text}\n")
        if lines:
            self.stream.flush()


# --- processes --------------------------------------------------------------------------------

_EXCEPTION_LINE = re.compile(r"^(\w+(?:\.\w+)*(?:Error|Exception|Interrupt)\b.*)$", re.M)


def _traceback_tail(log: Path) -> str | None:
    if not log.exists():
        return None
    text = log.read_text(encoding="utf-8", errors="replace")
    if "Traceback (most recent call last)" not in text:
        return None
    after = text[text.rindex("Traceback (most recent call last)"):]
    found = _EXCEPTION_LINE.findall(after)
    return found[0].strip() if found else after.splitlines()[-1].strip()


def _kill_group(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM, then SIGKILL, to msrun and every process below it.

    msrun puts its workers in sessions of their own, so killing msrun's process group is not
    enough: the descendants are found by parent PID (from /proc) before anything is killed.
    """
    victims = [process.pid, *_descendants(process.pid)]
    for sig in (signal.SIGTERM, signal.SIGKILL):
        alive = [pid for pid in victims if _signal(pid, sig)]
        if not alive:
            break
        deadline = time.monotonic() + KILL_GRACE_SECONDS
        while time.monotonic() < deadline and any(_signal(pid, 0) for pid in alive):
            process.poll()  # reap msrun itself
            time.sleep(0.1)
    process.poll()


def _signal(pid: int, sig: int) -> bool:
    """Send `sig`; False when the process no longer exists (or is a zombie)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
            if stat.read().rsplit(")", 1)[1].split()[0] == "Z":
                return False
    except OSError:
        pass
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def _parents() -> dict[int, list[int]]:
    """Every process's children, by parent PID, read from /proc (Linux)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text(encoding="ascii").rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(entry.name))
    return children


def _children(pid: int) -> list[int]:
    """The direct children of `pid`: from the kernel's list when it keeps one, else /proc."""
    try:
        listed = Path(f"/proc/{pid}/task/{pid}/children").read_text(encoding="ascii")
    except OSError:
        return _parents().get(pid, [])
    return [int(child) for child in listed.split()]


def _descendants(root: int) -> list[int]:
    """PIDs of every process below `root`."""
    children = _parents()
    found, stack = [], [root]
    while stack:
        for child in children.get(stack.pop(), []):
            found.append(child)
            stack.append(child)
    return found


def _path_with_interpreter() -> str:
    here = str(Path(sys.executable).parent)
    return os.pathsep.join([here, os.environ.get("PATH", "")])
