"""Start ranks on this host with msrun, watch them, and say which rank failed: `run_ranks`.

The ranks are the whole job, or this host's share of a job over several hosts (`Nodes`: msrun
then runs on every host with the same master address and port, and a different node rank).

msrun (installed with MindSpore) starts one scheduler and N workers and sets the environment
`mindspore.communication.init()` reads. `run_ranks` adds what a job runner needs around it:
a free port on 127.0.0.1 (`msrun`); a watch on the workers while msrun runs, which ends the
whole job as soon as one rank has failed and names that rank with its error (`rank_watch`;
msrun alone kills the other workers but then waits about 30 s for the scheduler's heartbeat
timeout); in a job of one node, an end as soon as every rank has exited with status 0
(MindSpore's scheduler takes up to 5 s more to notice, and msrun waits for it); a deadline
after which every process of the job is killed (a worker blocked in a
collective can outlive msrun's own timeout); and, on request, one rank's log echoed to a
stream as it grows (`log_echo`); on request, a signal forwarded to every worker (the
launcher's way to ask the ranks to stop at their next step); and a job that never outlives its
launcher: msrun is started so that the kernel sends it SIGINT when the launcher dies, even by
`kill -9` (`parent_death`), and msrun's SIGINT handler kills its workers and scheduler before
it exits (the ranks, for their part, die with msrun: `mf_train.launch.rank_worker`).

Pure Python: it starts MindSpore in other processes but never imports it here.
"""

from __future__ import annotations

import errno
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import BinaryIO, TextIO

import attrs

from .errors import JobHung, LaunchError
from .hang_watch import HangReport, HangWatch
from .log_echo import echoing
from .msrun import child_env, free_port, kill_group, msrun_command
from .nodes import Nodes
from .parent_death import command as dying_with_this_process
from .rank_progress import DIRECTORY_ENV as PROGRESS_DIR
from .rank_progress import JOINING
from .rank_progress import read as read_progress
from .rank_watch import TIMED_OUT, WORKERS_ENDED, logs_errors, traceback_tail, watch

__all__ = ["Forward", "HangSettings", "JobHung", "LaunchError", "LaunchResult", "Nodes",
           "failure_message", "run_ranks"]


@attrs.frozen(kw_only=True)
class LaunchResult:
    """A finished job: exit status, where the logs are, how long it took."""

    returncode: int
    log_dir: Path
    seconds: float

    def worker_log(self, rank: int) -> Path:
        """The log file of one worker rank."""
        return self.log_dir / f"worker_{rank}.log"


@attrs.frozen
class Forward:
    """A signal to send every worker of the job once `requested()` is true (asked every
    `rank_watch.POLL_SECONDS`): each worker gets it once, as soon as it has installed its
    handler for it (so that it never ends a worker still starting)."""

    signum: int
    requested: Callable[[], bool]


@attrs.frozen
class HangSettings:
    """When a job counts as hung (`hang_watch`): no rank progressed for `timeout` seconds
    (0: never); its report's files go to `report_dir`."""

    timeout: float
    report_dir: Path


def run_ranks(script: str | Path, nproc: int, *, log_dir: str | Path, timeout: float,
              args: Sequence[str] = (), env: dict[str, str] | None = None,
              echo_rank: int | None = None, echo_to: TextIO | None = None,
              nodes: Nodes | None = None, forward: Forward | None = None,
              hold_fds: Sequence[int] = (),
              echo_drop: re.Pattern[str] | None = None,
              hang: HangSettings | None = None) -> LaunchResult:
    """Run `script` on `nproc` ranks of this host through msrun and wait for them.

    Args:
        script: the Python script each rank runs, with `args` as its arguments.
        nproc: the number of ranks of this host.
        log_dir: where msrun writes `msrun.log` and `worker_<rank>.log` (created if needed).
        timeout: seconds after which every process of the job is killed.
        env: variables the ranks get on top of this process's environment.
        echo_rank: a rank whose log lines are copied to `echo_to` while the job runs, each
            prefixed `[rank N] `; the ranks then run with PYTHONUNBUFFERED=1 (unless the
            environment sets it) so that their prints reach the log when they happen.
        echo_to: the stream for `echo_rank` (default: sys.stdout).
        echo_drop: `echo_rank`'s lines it matches stay in its log but are not echoed
            (`log_echo.MINDSPORE_INFO`: MindSpore's C++ INFO lines).
        nodes: this host's place in a job over several hosts (default: the only node, on
            127.0.0.1 and a free port). Its ranks are `nodes.local_ranks(nproc)`; `echo_rank`
            must be one of them.
        forward: a signal to send every worker when the caller asks for it (`Forward`).
        hold_fds: file descriptors msrun inherits and keeps open until it exits (a lock the
            caller holds for the job then stays held while msrun and its workers run, even
            if the caller is killed).
        hang: when the job is hung (`HangSettings`; default: never judged hung). Either way
            each rank records its progress (`rank_progress`, in a directory of its own that
            is removed afterwards), so that a rank that fails because another is stopped or
            behind does not take the blame alone (`HangWatch.blame`).

    Returns:
        The finished job: exit status 0, log directory, seconds taken.

    Raises:
        LaunchError: as soon as one rank has failed (named, with its error or the signal
            that killed it, and its log; every process of the job is killed), once `timeout`
            seconds have passed, or when the log directory cannot be written.
        JobHung: no rank progressed for `hang.timeout` seconds (the message is the report;
            every process of the job is killed).
    """
    log_dir = Path(log_dir)
    nodes = nodes or Nodes()
    ranks = nodes.local_ranks(nproc)
    if echo_rank is not None and echo_rank not in ranks:
        raise ValueError(f"echo_rank must be a rank of this host ({ranks[0]} to "
                         f"{ranks[-1]}), got {echo_rank}")
    _check_master_port(nodes)
    progress = Path(tempfile.mkdtemp(prefix="mf-rank-progress-"))
    try:
        watch_hang = HangWatch(progress, ranks, timeout=hang.timeout if hang else 0.0,
                               report_dir=hang.report_dir if hang else log_dir)
        failure, returncode, seconds = _run_msrun(
            script, nproc, log_dir, timeout, args, {**(env or {}), PROGRESS_DIR: str(progress)},
            (echo_rank, echo_to, echo_drop), nodes, forward, hold_fds, watch_hang)
        if failure not in (None, TIMED_OUT) and _still_joining(nodes, progress, ranks):
            raise LaunchError(_not_joined_message(nodes, seconds, log_dir))
    finally:
        shutil.rmtree(progress, ignore_errors=True)
    if isinstance(failure, HangReport):
        raise JobHung(failure)
    if failure == TIMED_OUT:
        raise LaunchError(f"{nproc}-rank job {Path(script).name} did not finish in "
                          f"{timeout:.0f} s and was killed; logs in {log_dir}")
    if failure is not None:
        raise LaunchError(failure)
    if returncode != 0 and _only_this_hosts_scheduler_failed(log_dir / nodes.msrun_log, nodes):
        returncode = 0
    result = LaunchResult(returncode=returncode, log_dir=log_dir, seconds=seconds)
    if result.returncode != 0:
        raise LaunchError(failure_message(result, ranks))
    return result


def _run_msrun(script: str | Path, nproc: int, log_dir: Path, timeout: float,
               args: Sequence[str], env: dict[str, str] | None,
               echo: tuple[int | None, TextIO | None, re.Pattern[str] | None], nodes: Nodes,
               forward: Forward | None = None, hold_fds: Sequence[int] = (),
               hang: HangWatch | None = None) -> tuple[str | None, int, float]:
    """Run msrun until it exits, a rank fails or the time is up, then end every process of
    the job. Returns the watch's failure (see `rank_watch.watch`), msrun's exit status and
    the seconds since msrun started. In a job of one node, the job ends as soon as every
    worker has exited with status 0 (the status is then 0: msrun's own, once its scheduler
    is ended, would not be; the scheduler's own status is not looked at)."""
    ranks = nodes.local_ranks(nproc)
    msrun_log = _open_log_dir(log_dir, ranks, nodes.msrun_log)
    port = nodes.master_port if nodes.master_port is not None else free_port()
    with msrun_log, echoing(log_dir, *echo):
        # over several nodes, a rank waits for the scheduler no longer than the hang watch
        # would (a node 0 that never starts, or a port another program holds there)
        joining = timeout if nodes.count == 1 or not hang or hang.timeout <= 0 else min(
            timeout, hang.timeout)
        command = msrun_command(script, nproc, log_dir=log_dir, port=port, args=args,
                                cluster_timeout=max(30, int(joining)), nodes=nodes)
        one_node = nodes.count == 1
        environment = child_env(env, echo=echo[0] is not None, one_node=one_node)
        start = time.monotonic()
        process = subprocess.Popen(dying_with_this_process(signal.SIGINT, command),
                                   stdout=msrun_log, stderr=subprocess.STDOUT,
                                   env=environment, start_new_session=True,
                                   pass_fds=tuple(hold_fds))
        try:
            failure = watch(process, log_dir, ranks, deadline=start + timeout,
                            msrun_log=nodes.msrun_log,
                            forward=None if forward is None else
                            lambda: forward.signum if forward.requested() else None,
                            until_workers_end=one_node,
                            msrun_logs_errors=logs_errors(environment), hang=hang)
        finally:
            kill_group(process)  # the other ranks, and workers left behind by msrun, if any
    if failure == WORKERS_ENDED:  # every rank succeeded; msrun and its scheduler were ended
        return None, 0, time.monotonic() - start
    return failure, process.returncode, time.monotonic() - start


def _only_this_hosts_scheduler_failed(msrun_log: Path, nodes: Nodes) -> bool:
    """Whether msrun failed only because of a scheduler it started on a node other than 0.

    msrun starts a scheduler on every node whose addresses include the master address. When
    several nodes of a job share one host, each does: node 0's scheduler takes the port and
    serves the job, the others cannot bind it and exit with an error, and msrun reports that
    after its workers have all succeeded. Such a node did its part.
    """
    if nodes.rank == 0:
        return False
    try:
        text = msrun_log.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return False
    # msrun's own error lines (its log also holds copies of the worker logs)
    return (re.search(_MSRUN_ERROR.format("Scheduler"), text, re.M) is not None
            and re.search(_MSRUN_ERROR.format("Worker"), text, re.M) is None)


_MSRUN_ERROR = r"^\[ERROR\] ME\(\d+:.* {} process \d+ exit with exception"


def _still_joining(nodes: Nodes, progress: Path, ranks: Sequence[int]) -> bool:
    """Whether, in a job over several nodes, every rank of this host is still joining the
    job's group (`rank_progress.JOINING`): its scheduler never answered."""
    if nodes.count == 1:
        return False
    records = [read_progress(progress, rank) for rank in ranks]
    return all(record is not None and record.phase == JOINING for record in records)


def _not_joined_message(nodes: Nodes, seconds: float, log_dir: Path) -> str:
    """One line for ranks that found no scheduler to join, naming its address and port."""
    return (f"node {nodes.rank}: the ranks found no scheduler answering at "
            f"{nodes.master_addr}:{nodes.master_port} in {seconds:.0f} s (node 0 not started, "
            "or the port in use by another program there); start every node with the same "
            f"--master-addr and --master-port, choosing a free port; logs in {log_dir}")


def failure_message(result: LaunchResult, ranks: Sequence[int]) -> str:
    """Which of this host's `ranks` failed first (by its log), and the last line of its
    traceback."""
    for rank in ranks:
        error = traceback_tail(result.worker_log(rank))
        if error:
            return f"rank {rank} failed: {error} (log: {result.worker_log(rank)})"
    return (f"the {len(ranks)}-rank job exited with status {result.returncode}; no rank logged "
            f"a Python error; see {result.log_dir}")


def _check_master_port(nodes: Nodes) -> None:
    """On the node that runs the scheduler (node 0), a master port already in use is one
    line before anything starts: msrun's scheduler would fail at once ("Failed to init the
    tcp server") while the ranks retried its port for minutes. An address that is not this
    host's, or that cannot be bound for another reason, is left to msrun."""
    if nodes.rank != 0 or nodes.master_port is None:
        return
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as a server binds
        try:
            probe.bind((nodes.master_addr, nodes.master_port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise LaunchError(
                    f"the master port {nodes.master_port} is in use on {nodes.master_addr} "
                    "(another job's scheduler, or another program); choose another "
                    "--master-port") from None


def _open_log_dir(log_dir: Path, ranks: Sequence[int], msrun_log: str) -> BinaryIO:
    """Create `log_dir`, remove the worker logs of an earlier run there, open msrun's log.

    msrun would overwrite those worker logs anyway; removing them first keeps the watch from
    reading an old run's traceback before msrun has started the new ranks.
    """
    try:
        log_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise LaunchError(f"cannot create the log directory {log_dir}: "
                          f"{_why_unwritable(log_dir, exc)}; choose a log directory in a "
                          "place you can write to") from None
    path = log_dir / msrun_log
    try:
        for rank in ranks:
            (log_dir / f"worker_{rank}.log").unlink(missing_ok=True)
        # never through a symbolic link: it would truncate whatever the link points to
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC,
                     0o666)
        return os.fdopen(fd, "wb")  # closed by run_ranks
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise LaunchError(f"{path} is a symbolic link, which mf never follows there; "
                              "remove it (the launcher creates a plain file)") from None
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
