"""Start ranks on this host with msrun, watch them, and say which rank failed: `run_ranks`.

msrun (installed with MindSpore) starts one scheduler and N workers and sets the environment
`mindspore.communication.init()` reads. `run_ranks` adds what a job runner needs around it:
a free port on 127.0.0.1 (`msrun`); a watch on the workers while msrun runs, which ends the
whole job as soon as one rank has failed and names that rank with its error (`rank_watch`;
msrun alone kills the other workers but then waits about 30 s for the scheduler's heartbeat
timeout); a deadline after which every process of the job is killed (a worker blocked in a
collective can outlive msrun's own timeout); and, on request, one rank's log echoed to a
stream as it grows (`log_echo`).

Pure Python: it starts MindSpore in other processes but never imports it here.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from typing import BinaryIO, TextIO

import attrs

from .errors import LaunchError
from .log_echo import echoing
from .msrun import child_env, free_port, kill_group, msrun_command
from .rank_watch import TIMED_OUT, traceback_tail, watch

__all__ = ["LaunchError", "LaunchResult", "failure_message", "run_ranks"]


@attrs.frozen(kw_only=True)
class LaunchResult:
    """A finished job: exit status, where the logs are, how long it took."""

    returncode: int
    log_dir: Path
    seconds: float

    def worker_log(self, rank: int) -> Path:
        """The log file of one worker rank."""
        return self.log_dir / f"worker_{rank}.log"


def run_ranks(script: str | Path, nproc: int, *, log_dir: str | Path, timeout: float,
              args: Sequence[str] = (), env: dict[str, str] | None = None,
              echo_rank: int | None = None, echo_to: TextIO | None = None) -> LaunchResult:
    """Run `script` on `nproc` ranks of this host through msrun and wait for them.

    Args:
        script: the Python script each rank runs, with `args` as its arguments.
        nproc: the number of ranks.
        log_dir: where msrun writes `msrun.log` and `worker_<rank>.log` (created if needed).
        timeout: seconds after which every process of the job is killed.
        env: variables the ranks get on top of this process's environment.
        echo_rank: a rank whose log lines are copied to `echo_to` while the job runs, each
            prefixed `[rank N] `; the ranks then run with PYTHONUNBUFFERED=1 (unless the
            environment sets it) so that their prints reach the log when they happen.
        echo_to: the stream for `echo_rank` (default: sys.stdout).

    Returns:
        The finished job: exit status 0, log directory, seconds taken.

    Raises:
        LaunchError: as soon as one rank has failed (named, with its error or the signal
            that killed it, and its log; every process of the job is killed), once `timeout`
            seconds have passed, or when the log directory cannot be written.
    """
    log_dir = Path(log_dir)
    if echo_rank is not None and not 0 <= echo_rank < nproc:
        raise ValueError(f"echo_rank must be a rank of the job (0 to {nproc - 1}), "
                         f"got {echo_rank}")
    failure, returncode, seconds = _run_msrun(script, nproc, log_dir, timeout, args, env,
                                              echo_rank, echo_to)
    if failure == TIMED_OUT:
        raise LaunchError(f"{nproc}-rank job {Path(script).name} did not finish in "
                          f"{timeout:.0f} s and was killed; logs in {log_dir}")
    if failure is not None:
        raise LaunchError(failure)
    result = LaunchResult(returncode=returncode, log_dir=log_dir, seconds=seconds)
    if result.returncode != 0:
        raise LaunchError(failure_message(result, nproc))
    return result


def _run_msrun(script: str | Path, nproc: int, log_dir: Path, timeout: float,
               args: Sequence[str], env: dict[str, str] | None, echo_rank: int | None,
               echo_to: TextIO | None) -> tuple[str | None, int, float]:
    """Run msrun until it exits, a rank fails or the time is up, then end every process of
    the job. Returns the watch's failure (see `rank_watch.watch`), msrun's exit status and
    the seconds since msrun started."""
    msrun_log = _open_log_dir(log_dir, nproc)
    with msrun_log, echoing(log_dir, echo_rank, echo_to):
        command = msrun_command(script, nproc, log_dir=log_dir, port=free_port(), args=args,
                                cluster_timeout=max(30, int(timeout)))
        start = time.monotonic()
        process = subprocess.Popen(command, stdout=msrun_log, stderr=subprocess.STDOUT,
                                   env=child_env(env, echo=echo_rank is not None),
                                   start_new_session=True)
        try:
            failure = watch(process, log_dir, nproc, deadline=start + timeout)
        finally:
            kill_group(process)  # the other ranks, and workers left behind by msrun, if any
    return failure, process.returncode, time.monotonic() - start


def failure_message(result: LaunchResult, nproc: int) -> str:
    """Which rank failed first (by its log), and the last line of its traceback."""
    for rank in range(nproc):
        error = traceback_tail(result.worker_log(rank))
        if error:
            return f"rank {rank} failed: {error} (log: {result.worker_log(rank)})"
    return (f"the {nproc}-rank job exited with status {result.returncode}; no rank logged a "
            f"Python error; see {result.log_dir}")


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
