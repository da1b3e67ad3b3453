"""The msrun command for N ranks on this host (one node of a job, or the whole job), and ending
every process it started.

msrun (installed with MindSpore) starts one scheduler and N workers and sets the environment
`mindspore.communication.init()` reads. It puts its workers in sessions of their own, so
ending a job means finding every process below msrun (from /proc, Linux) and signalling each.

Pure Python: it starts MindSpore in other processes but never imports it here.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from .errors import LaunchError, PlanError
from .nodes import Nodes

#: Seconds a process has to exit after SIGTERM before it gets SIGKILL.
KILL_GRACE_SECONDS = 3.0


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def msrun_command(script: str | Path, nproc: int, *, log_dir: Path, port: int,
                  args: Sequence[str] = (), cluster_timeout: int = 120,
                  nodes: Nodes | None = None) -> list[str]:
    """The msrun command line for `nproc` ranks on this host.

    Args:
        script: what each rank runs: a Python file (msrun runs `python script args`).
        nproc: the ranks of this host.
        port: the scheduler's port (on `nodes.master_addr`).
        nodes: this host's place in a job over several hosts (default: the only node, on
            127.0.0.1); the job then has `nodes.count * nproc` ranks.
    """
    if nproc < 1:
        raise PlanError(f"the number of processes must be >= 1, got {nproc}")
    nodes = nodes or Nodes()
    msrun = shutil.which("msrun", path=path_with_interpreter())
    if msrun is None:
        raise LaunchError("msrun is not installed beside this Python (it comes with mindspore)")
    node_rank = [f"--node_rank={nodes.rank}"] if nodes.count > 1 else []
    return [msrun, f"--worker_num={nodes.count * nproc}", f"--local_worker_num={nproc}",
            *node_rank, f"--master_addr={nodes.master_addr}", f"--master_port={port}",
            f"--cluster_time_out={cluster_timeout}", f"--log_dir={log_dir}", "--join=True",
            str(script), *args]


ONE_NODE_HEARTBEAT = {"MS_RETRY_INTERVAL_LOWER": "1", "MS_RETRY_INTERVAL_UPPER": "1"}
"""Seconds between a worker's heartbeats to its scheduler (and between its retries to
register or reconnect) in a job of one node (MindSpore's default: 3 to 5). A worker ending
waits for its heartbeat thread's sleep, so each job ended 2-4 s after its last line; a beat a
second costs a few ranks nothing. Jobs over several nodes keep MindSpore's default (a
heartbeat from each of thousands of ranks every second would load the scheduler), and so does
an environment that sets either variable (MindSpore lowers the lower bound to the upper)."""


CPU_COLLECTIVE_WAIT = {"MS_CPU_COMM_OP_TIMEOUT": "1800"}
"""Seconds a collective of MindSpore's CPU backend waits for a peer's message before it fails
with a bare "AllReduce failed" (MindSpore's default: 30). A rank still compiling its layers or
loading weights while its peers wait in their first collective can take longer than 30 s on a
loaded host, and a stopped rank is found by the launcher's hang watch (`--hang-timeout`,
default 600 s), which names it; so the wait is longer than the watch's, unless the
environment sets it. Other backends do not read the variable."""


def child_env(env: dict[str, str] | None, *, echo: bool, one_node: bool = False
              ) -> dict[str, str]:
    """The ranks' environment: msrun starts a bare `python`, so this interpreter's directory
    comes first on PATH; when echoing, unbuffered output unless the caller says otherwise;
    `CPU_COLLECTIVE_WAIT` and, in a job of `one_node`, `ONE_NODE_HEARTBEAT`, unless the caller
    sets those variables."""
    base = {"PYTHONUNBUFFERED": "1"} if echo else {}
    base.update(CPU_COLLECTIVE_WAIT)
    given = {**os.environ, **(env or {})}
    if one_node and not ONE_NODE_HEARTBEAT.keys() & given.keys():
        base.update(ONE_NODE_HEARTBEAT)
    return {**base, **given, "PATH": path_with_interpreter()}


def path_with_interpreter() -> str:
    """PATH with this interpreter's directory first (where msrun and `python` are)."""
    here = str(Path(sys.executable).parent)
    return os.pathsep.join([here, os.environ.get("PATH", "")])


def kill_group(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM, then SIGKILL, to msrun and every process below it.

    msrun puts its workers in sessions of their own, so killing msrun's process group is not
    enough: the descendants are found by parent PID (from /proc) before anything is killed.
    msrun's group (it leads one: it is started in a session of its own) is signalled too:
    once msrun itself is gone (`kill -9`), its `tail -f` helpers belong to init, and only
    their group still says whose they are.
    """
    victims = [process.pid, *_descendants(process.pid), *_group(process.pid)]
    for sig in (signal.SIGTERM, signal.SIGKILL):
        alive = [pid for pid in dict.fromkeys(victims) if _signal(pid, sig)]
        if not alive:
            break
        deadline = time.monotonic() + KILL_GRACE_SECONDS
        while time.monotonic() < deadline and any(_signal(pid, 0) for pid in alive):
            process.poll()  # reap msrun itself
            time.sleep(0.1)
    process.poll()


def _group(pgid: int) -> list[int]:
    """The processes of process group `pgid` (from /proc): none when no group has that id."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            fields = proc_stat(int(entry.name))
            if len(fields) > 4 and fields[4] == str(pgid):
                found.append(int(entry.name))
    return found


def children(pid: int) -> list[int]:
    """The direct children of `pid`: from the kernel's list when it keeps one, else /proc."""
    try:
        listed = Path(f"/proc/{pid}/task/{pid}/children").read_text(encoding="ascii")
    except OSError:
        return _parents().get(pid, [])
    return [int(child) for child in listed.split()]


def _signal(pid: int, sig: int) -> bool:
    """Send `sig`; False when the process no longer exists (or is a zombie)."""
    if proc_stat(pid)[2:3] == ["Z"]:
        return False
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def proc_stat(pid: int) -> list[str]:
    """/proc/<pid>/stat as fields: the PID, the command name (without its parentheses), the
    state letter (`Z`: exited, not yet reaped), the parent's PID, ...; [] once the process is
    gone. (psutil does not give a zombie's exit status, field 52.)"""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as stat:
            text = stat.read()
    except OSError:
        return []
    head, _, rest = text.rpartition(")")
    number, _, command = head.partition(" (")
    return [number, command, *rest.split()]


def _parents() -> dict[int, list[int]]:
    """Every process's children, by parent PID, read from /proc (Linux)."""
    found: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and len(fields := proc_stat(int(entry.name))) > 3:
            found.setdefault(int(fields[3]), []).append(int(entry.name))
    return found


def _descendants(root: int) -> list[int]:
    """PIDs of every process below `root`."""
    below = _parents()
    found, stack = [], [root]
    while stack:
        for child in below.get(stack.pop(), []):
            found.append(child)
            stack.append(child)
    return found
