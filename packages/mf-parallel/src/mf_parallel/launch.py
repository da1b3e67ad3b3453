"""Start ranks on this host with msrun, wait with a deadline, and say which rank failed.

msrun (installed with MindSpore) starts one scheduler and N workers and sets the environment
`mindspore.communication.init()` reads. This module adds what a job runner needs around it:
a free port on 127.0.0.1, a deadline after which the whole process group is killed (a worker
blocked in a collective can outlive msrun's own timeout), and, when the job fails, the first
rank whose log holds a Python traceback, with that traceback's last line.

Pure Python: it starts MindSpore in other processes but never imports it here.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import attrs

from .errors import PlanError


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
              args: Sequence[str] = (), env: dict[str, str] | None = None) -> LaunchResult:
    """Run `script` on `nproc` ranks; `LaunchError` if any rank fails or time runs out."""
    log_dir = Path(log_dir)
    log_dir.mkdir(parents=True, exist_ok=True)
    command = msrun_command(script, nproc, log_dir=log_dir, port=free_port(), args=args,
                            cluster_timeout=max(30, int(timeout)))
    # msrun starts a bare `python`: this interpreter's directory must come first on PATH.
    child_env = {**os.environ, **(env or {}), "PATH": _path_with_interpreter()}
    start = time.monotonic()
    with open(log_dir / "msrun.log", "wb") as msrun_log:
        process = subprocess.Popen(command, stdout=msrun_log, stderr=subprocess.STDOUT,
                                   env=child_env, start_new_session=True)
        try:
            returncode = process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            _kill_group(process)
            raise LaunchError(f"{nproc}-rank job {Path(script).name} did not finish in "
                              f"{timeout:.0f} s and was killed; logs in {log_dir}") from None
        finally:
            _kill_group(process)  # workers left behind by msrun, if any
    result = LaunchResult(returncode=returncode, log_dir=log_dir,
                          seconds=time.monotonic() - start)
    if returncode != 0:
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
            return
        deadline = time.monotonic() + 5
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


def _descendants(root: int) -> list[int]:
    """PIDs of every process below `root`, read from /proc (Linux)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text(encoding="ascii").rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(entry.name))
    found, stack = [], [root]
    while stack:
        for child in children.get(stack.pop(), []):
            found.append(child)
            stack.append(child)
    return found


def _path_with_interpreter() -> str:
    here = str(Path(sys.executable).parent)
    return os.pathsep.join([here, os.environ.get("PATH", "")])
