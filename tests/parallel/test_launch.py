"""The msrun launcher: a failed or killed rank ends the job at once and is named with its error;
a job whose ranks have all succeeded ends without waiting for its scheduler; a hung job is
killed at the deadline; an unwritable log directory is one clear error; rank 0's
lines can be followed while the job runs; msrun, started through `parent_death`, dies with the
process that started it."""

from __future__ import annotations

import contextlib
import io
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mf_parallel.errors import PlanError
from mf_parallel.launch import LaunchError, run_ranks
from mf_parallel.log_echo import MINDSPORE_INFO, echoing
from mf_parallel.msrun import ONE_NODE_HEARTBEAT, child_env, free_port, kill_group, msrun_command
from mf_parallel.nodes import Nodes
from mf_parallel.rank_watch import (
    TIMED_OUT,
    WORKERS_ENDED,
    LogScan,
    RankWatch,
    logs_errors,
    rank_failure_message,
    watch,
)

WORKERS = Path(__file__).resolve().parent / "workers"


def test_msrun_command(tmp_path) -> None:
    pytest.importorskip("mindspore")
    command = msrun_command("train.py", 4, log_dir=tmp_path, port=1234, args=["--x", "1"])
    assert command[1:] == ["--worker_num=4", "--local_worker_num=4", "--master_addr=127.0.0.1",
                           "--master_port=1234", "--cluster_time_out=120",
                           f"--log_dir={tmp_path}", "--join=True", "train.py", "--x", "1"]
    with pytest.raises(PlanError, match="must be >= 1, got 0"):
        msrun_command("train.py", 0, log_dir=tmp_path, port=1)


def test_msrun_command_for_one_node_of_several(tmp_path) -> None:
    """Node 1 of 2 with 2 ranks each: msrun gets the whole job's size, this host's share and
    the node rank; this host's ranks are 2 and 3, and msrun's log is named for the node."""
    pytest.importorskip("mindspore")
    nodes = Nodes(count=2, rank=1, master_addr="10.0.0.1", master_port=8118)
    command = msrun_command("train.py", 2, log_dir=tmp_path, port=8118, nodes=nodes)
    assert command[1:] == ["--worker_num=4", "--local_worker_num=2", "--node_rank=1",
                           "--master_addr=10.0.0.1", "--master_port=8118",
                           "--cluster_time_out=120", f"--log_dir={tmp_path}", "--join=True",
                           "train.py"]
    assert list(nodes.local_ranks(2)) == [2, 3]
    assert nodes.msrun_log == "msrun_node1.log"


@pytest.mark.parametrize(("fields", "message"), [
    ({"count": 0}, "the number of nodes must be >= 1, got 0"),
    ({"count": 2, "rank": 2, "master_port": 1}, "the node rank must be between 0 and 1 (a job "
                                                "of 2 nodes), got 2"),
    ({"count": 2, "rank": 1}, "a job over several nodes needs a master port every node knows"),
    ({"master_port": 70000}, "the master port must be between 1 and 65535, got 70000"),
])
def test_nodes_refuse_a_place_that_cannot_be(fields, message) -> None:
    with pytest.raises(ValueError) as exc:
        Nodes(**fields)
    assert str(exc.value) == message


STARTER = """
import subprocess, sys, time
from mf_parallel.parent_death import command
child = subprocess.Popen(command(int(sys.argv[1]), ["sleep", "60"]))
print(child.pid, flush=True)
time.sleep(60)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="prctl is Linux's")
def test_a_command_dies_with_the_process_that_started_it() -> None:
    """`parent_death.command`: the kernel signals the command when its starter dies, even by
    SIGKILL (how msrun, and with it every rank, ends with mf-train's launcher)."""
    psutil = pytest.importorskip("psutil")
    starter = subprocess.Popen([sys.executable, "-c", STARTER, str(int(signal.SIGTERM))],
                               stdout=subprocess.PIPE, text=True)
    child = None
    try:
        child = psutil.Process(int(starter.stdout.readline()))
        deadline = time.monotonic() + 10
        while child.name() != "sleep":  # the wrapper becomes the command
            assert time.monotonic() < deadline, child.cmdline()
            time.sleep(0.05)
        starter.kill()
        starter.wait(timeout=30)
        deadline = time.monotonic() + 10
        while not _ended(psutil, child):
            assert time.monotonic() < deadline, "the command outlived its starter"
            time.sleep(0.05)
    finally:
        if starter.poll() is None:
            starter.kill()
        if child is not None and child.is_running():
            child.kill()


def _ended(psutil, process) -> bool:
    """Whether `process` has exited (a zombie not yet reaped counts)."""
    try:
        return process.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


HELPER = """
import subprocess, sys, time
tail = subprocess.Popen(["tail", "-f", "/dev/null"])  # as msrun's log helpers: its group
print(tail.pid, flush=True)
time.sleep(600)
"""


def test_helpers_of_a_killed_msrun_die_with_its_job() -> None:
    """msrun killed with SIGKILL leaves its `tail -f` helpers to init: ending the job kills
    them too (they are in msrun's process group)."""
    psutil = pytest.importorskip("psutil")
    msrun = subprocess.Popen([sys.executable, "-c", HELPER], stdout=subprocess.PIPE,
                             text=True, start_new_session=True)
    tail = psutil.Process(int(msrun.stdout.readline()))
    try:
        msrun.kill()
        msrun.wait(timeout=30)
        assert tail.is_running() and tail.ppid() != msrun.pid  # left to init, still running
        kill_group(msrun)
        tail.wait(timeout=10)
        assert not tail.is_running()
    finally:
        msrun.stdout.close()
        with contextlib.suppress(psutil.Error):
            tail.kill()


def test_free_port_is_bindable() -> None:
    import socket

    port = free_port()
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", port))


def _job_processes(tmp_path: Path) -> list[int]:
    """PIDs of processes still running with this test's directory on their command line: the
    test's own job and nothing else (another checkout may run the same worker scripts)."""
    out = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True).stdout
    return [int(line.split()[0]) for line in out.splitlines()
            if str(tmp_path) in line and "ps -eo" not in line]


def _assert_none_left(tmp_path: Path) -> None:
    """No process of the job is left; any that is gets killed, even when the assertion fails."""
    leftovers = _job_processes(tmp_path)
    for pid in leftovers:
        os.kill(pid, signal.SIGKILL)
    assert leftovers == []


@pytest.mark.ranks
@pytest.mark.parametrize(("mode", "message"), [
    ("raise", "rank 1 failed: ValueError: rank 1 stops here on purpose (log: "),
    ("kill", "rank 1 was killed by SIGKILL (log: "),
    ("exit", "rank 1 exited with status 3 and logged no Python error (log: "),
])
def test_a_failed_rank_ends_the_job_at_once_with_its_error(tmp_path, mode, message) -> None:
    """Rank 0 waits in an all-reduce for rank 1, which fails: the launcher ends the job itself
    and names rank 1, long before the deadline or MindSpore's heartbeat timeout would."""
    pytest.importorskip("mindspore")
    try:
        with pytest.raises(LaunchError) as exc:
            run_ranks(WORKERS / "failing_worker.py", 2, log_dir=tmp_path, timeout=300,
                      args=[mode, str(tmp_path)])
    finally:
        _assert_none_left(tmp_path)
    assert str(exc.value) == f"{message}{tmp_path / 'worker_1.log'})"
    # the scheduler never got to declare rank 1 dead: the launcher stopped the job first
    assert "is timed out" not in (tmp_path / "scheduler.log").read_text(errors="replace")


@pytest.mark.ranks
def test_a_hung_job_is_killed_at_the_deadline(tmp_path) -> None:
    """Rank 1 sleeps, rank 0 waits for it: nothing fails, so only the deadline ends the job,
    and it leaves no process behind. The deadline leaves the ranks time to start (about 5 s
    here) and rank 1 must have reached its sleep: the job killed was a running one. On a
    loaded machine the ranks' cluster can take longer than that to form (MindSpore retries
    its topology build); then the job runs once more with a deadline of 60 s."""
    pytest.importorskip("mindspore")
    for deadline in (20, 60):
        logs = tmp_path / f"deadline_{deadline}"
        try:
            with pytest.raises(LaunchError,
                               match=f"did not finish in {deadline} s and was killed"):
                run_ranks(WORKERS / "failing_worker.py", 2, log_dir=logs, timeout=deadline,
                          args=["hang", str(tmp_path)])
        finally:
            _assert_none_left(tmp_path)
        if "rank 1 fails at " in (logs / "worker_1.log").read_text(errors="replace"):
            return
    pytest.fail(f"rank 1 never reached its sleep within 60 s; see {logs / 'worker_1.log'}")


@pytest.mark.ranks
def test_a_job_ends_when_every_rank_has_succeeded(tmp_path) -> None:
    """Every worker exits with status 0 while the scheduler lingers (MindSpore's looks for
    leaving workers every 5 s): the job succeeds without waiting for it, and the scheduler
    is ended, not left behind. Before, only the deadline would have ended this job."""
    pytest.importorskip("mindspore")  # msrun comes with it
    try:
        result = run_ranks(WORKERS / "lingering_scheduler.py", 2, log_dir=tmp_path / "logs",
                           timeout=60, args=[str(tmp_path)])
    finally:
        _assert_none_left(tmp_path)
    assert result.returncode == 0
    assert [(tmp_path / "logs" / f"worker_{rank}.log").read_text() for rank in (0, 1)] == [
        "rank 0 done\n", "rank 1 done\n"]


@pytest.mark.ranks
def test_a_rank_late_to_its_first_collective_by_more_than_30_s_is_waited_for(tmp_path) -> None:
    """Rank 1 reaches the first all-reduce 35 s after rank 0 (a rank compiling its layers on
    a loaded host): with MindSpore's CPU default (30 s) rank 0 fails with "AllReduce failed";
    the launcher's ranks wait `CPU_COLLECTIVE_WAIT` and both sum."""
    pytest.importorskip("mindspore")
    try:
        run_ranks(WORKERS / "late_rank.py", 2, log_dir=tmp_path, timeout=150, args=["35"])
    finally:
        _assert_none_left(tmp_path)
    sums = [[line for line in (tmp_path / f"worker_{rank}.log").read_text().splitlines()
             if line.startswith("sum ")] for rank in (0, 1)]
    assert sums == [["sum 2"], ["sum 2"]]


def test_the_cpu_collective_wait_is_the_launchers_unless_the_environment_sets_it(
        monkeypatch) -> None:
    monkeypatch.delenv("MS_CPU_COMM_OP_TIMEOUT", raising=False)
    assert child_env(None, echo=False)["MS_CPU_COMM_OP_TIMEOUT"] == "1800"
    monkeypatch.setenv("MS_CPU_COMM_OP_TIMEOUT", "45")
    assert child_env(None, echo=False)["MS_CPU_COMM_OP_TIMEOUT"] == "45"


@pytest.mark.ranks
def test_a_rank_that_fails_as_it_ends_still_fails_the_job(tmp_path) -> None:
    """Rank 1 exits with status 3 as rank 0 exits with 0: the job does not count as ended
    well, and rank 1 is named."""
    pytest.importorskip("mindspore")
    try:
        with pytest.raises(LaunchError) as exc:
            run_ranks(WORKERS / "lingering_scheduler.py", 2, log_dir=tmp_path, timeout=120,
                      args=[str(tmp_path), "3"])
    finally:
        _assert_none_left(tmp_path)
    assert str(exc.value) == ("rank 1 exited with status 3 and logged no Python error (log: "
                              f"{tmp_path / 'worker_1.log'})")


def test_ranks_of_one_node_beat_every_second_unless_told_otherwise(monkeypatch) -> None:
    """A worker's heartbeat thread sleeps between beats, and a worker ending waits for it:
    in a job of one node the ranks beat every second; over several nodes, or when the
    environment sets either bound, MindSpore's own setting stands."""
    monkeypatch.delenv("MS_RETRY_INTERVAL_LOWER", raising=False)
    monkeypatch.delenv("MS_RETRY_INTERVAL_UPPER", raising=False)
    assert {name: child_env(None, echo=False, one_node=True)[name] for name in
            ONE_NODE_HEARTBEAT} == {"MS_RETRY_INTERVAL_LOWER": "1", "MS_RETRY_INTERVAL_UPPER": "1"}
    assert not ONE_NODE_HEARTBEAT.keys() & child_env(None, echo=False).keys()
    given = child_env({"MS_RETRY_INTERVAL_LOWER": "2"}, echo=False, one_node=True)
    assert (given["MS_RETRY_INTERVAL_LOWER"], "MS_RETRY_INTERVAL_UPPER" in given) == ("2", False)
    monkeypatch.setenv("MS_RETRY_INTERVAL_UPPER", "7")
    given = child_env(None, echo=False, one_node=True)
    assert (given["MS_RETRY_INTERVAL_UPPER"], "MS_RETRY_INTERVAL_LOWER" in given) == ("7", False)


@pytest.mark.parametrize(("mode", "errors_logged", "outcome"), [
    ("zombies", False, WORKERS_ENDED),  # every status seen: no need of msrun's log
    ("reaped", True, WORKERS_ENDED),
    ("reaped", False, TIMED_OUT),  # statuses unseen, and msrun's errors would not be logged
    ("reaped-failed", True, "rank 1 exited with status 3 and logged no Python error (log: "),
    ("tails-died", True, TIMED_OUT),  # within the deadline the workers still run
])
def test_a_one_node_job_ends_early_only_on_evidence_that_every_rank_succeeded(
        tmp_path, mode, errors_logged, outcome) -> None:
    """workers/fake_msrun.py decides what the watch can see: the workers' exit statuses
    before they are reaped, or only msrun's log and the end of its `tail -f` helpers."""
    with open(tmp_path / "msrun.log", "wb") as log:
        msrun = subprocess.Popen([sys.executable, str(WORKERS / "fake_msrun.py"), str(tmp_path),
                                  mode], stdout=log, stderr=subprocess.STDOUT)
    try:
        # tails-died: looked at while the workers still run (each lives 3 s)
        wait = 2 if mode == "tails-died" else 12
        got = watch(msrun, tmp_path, range(2), deadline=time.monotonic() + wait,
                    until_workers_end=True, msrun_logs_errors=errors_logged)
    finally:
        kill_group(msrun)
    assert got.startswith(outcome)


@pytest.mark.parametrize(("env", "logged"), [
    ({}, True), ({"GLOG_v": "3"}, True), ({"GLOG_v": "4"}, False),
    ({"GLOG_logtostderr": "0"}, True),
    ({"GLOG_logtostderr": "0", "GLOG_stderrthreshold": "4"}, False),
    ({"GLOG_logtostderr": "0", "GLOG_v": "4"}, False),
    ({"GLOG_logtostderr": " 0", "GLOG_stderrthreshold": "4"}, False), ({"GLOG_v": ""}, True),
])
def test_which_environments_let_msrun_log_its_errors(env, logged) -> None:
    assert logs_errors(env) is logged


class _Console(io.StringIO):
    """A console that creates `go` once it has shown rank 0's third line."""

    def __init__(self, go: Path) -> None:
        super().__init__()
        self.go = go

    def write(self, text: str) -> int:
        written = super().write(text)
        if "[rank 0] echo 3\n" in self.getvalue():
            self.go.touch()
        return written


@pytest.mark.ranks
def test_rank_0_is_echoed_while_the_job_runs(tmp_path) -> None:
    """Rank 0 waits for a file the console creates when it sees rank 0's third line: the job
    can only finish if the lines were echoed while it ran. The last line, cut short without a
    newline, is still shown when the job ends; rank 1's lines are not."""
    pytest.importorskip("mindspore")  # msrun comes with it
    console = _Console(tmp_path / "go")
    try:
        run_ranks(WORKERS / "echo_worker.py", 2, log_dir=tmp_path / "logs", timeout=180,
                  args=[str(tmp_path / "go")], echo_rank=0, echo_to=console)
    finally:
        _assert_none_left(tmp_path)
    lines = console.getvalue().splitlines()
    assert [line for line in lines if "echo" in line] == [
        "[rank 0] echo 1", "[rank 0] echo 2", "[rank 0] echo 3", "[rank 0] echo 4",
        "[rank 0] echo 5 without a newline"]
    assert all(line.startswith("[rank 0] ") for line in lines)
    assert console.getvalue().endswith("\n")
    assert "rank 1 has nothing to say" in (tmp_path / "logs" / "worker_1.log").read_text()


def test_echo_rank_must_be_a_rank_of_the_job(tmp_path) -> None:
    with pytest.raises(ValueError,
                       match=r"echo_rank must be a rank of this host \(0 to 1\), got 2"):
        run_ranks("train.py", 2, log_dir=tmp_path, timeout=10, echo_rank=2)


def test_a_log_directory_under_a_file_is_one_clear_error(tmp_path) -> None:
    (tmp_path / "some_file").write_text("not a directory")
    with pytest.raises(LaunchError) as exc:
        run_ranks("train.py", 2, log_dir=tmp_path / "some_file" / "logs", timeout=10)
    assert str(exc.value) == (
        f"cannot create the log directory {tmp_path}/some_file/logs: {tmp_path}/some_file is "
        "a file, not a directory; choose a log directory in a place you can write to")


def test_a_log_directory_that_cannot_be_created_is_one_clear_error() -> None:
    with pytest.raises(LaunchError) as exc:
        run_ranks("train.py", 2, log_dir="/proc/x/logs", timeout=10)
    assert str(exc.value) == (
        "cannot create the log directory /proc/x/logs: No such file or directory; choose a "
        "log directory in a place you can write to")


def test_a_master_port_in_use_is_one_line_before_the_launch(tmp_path) -> None:
    """msrun's scheduler would fail at once on a busy port while the ranks retried it for
    minutes: the launcher finds it first, and starts nothing."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(LaunchError) as exc:
            run_ranks("train.py", 2, log_dir=tmp_path / "logs", timeout=10,
                      nodes=Nodes(master_port=port))
    assert str(exc.value) == (f"the master port {port} is in use on 127.0.0.1 (another job's "
                              "scheduler, or another program); choose another --master-port")
    assert not (tmp_path / "logs").exists()


def test_a_symlinked_msrun_log_is_refused(tmp_path) -> None:
    """msrun.log is written afresh, never through a link: the file it points to is kept."""
    (tmp_path / "precious.txt").write_text("precious")
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "msrun.log").symlink_to(tmp_path / "precious.txt")
    with pytest.raises(LaunchError) as exc:
        run_ranks("train.py", 2, log_dir=tmp_path / "logs", timeout=10)
    assert str(exc.value) == (
        f"{tmp_path / 'logs' / 'msrun.log'} is a symbolic link, which mf never follows there; "
        "remove it (the launcher creates a plain file)")
    assert (tmp_path / "precious.txt").read_text() == "precious"


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes to a read-only directory")
def test_a_read_only_log_directory_is_one_clear_error(tmp_path) -> None:
    logs = tmp_path / "logs"
    logs.mkdir(mode=0o500)
    try:
        with pytest.raises(LaunchError) as exc:
            run_ranks("train.py", 2, log_dir=logs, timeout=10)
    finally:
        logs.chmod(0o700)
    assert str(exc.value) == (
        f"cannot write to the log directory {logs}: Permission denied; choose a log "
        "directory you can write to")


UNCAUGHT = """[WARNING] ME(1): starting
Traceback (most recent call last):
  File "/work/train.py", line 16, in <module>
    main()
  File "/work/train.py", line 9, in main
    raise ValueError("bad batch")
ValueError: bad batch
"""


@pytest.mark.parametrize(("text", "fatal"), [
    (UNCAUGHT, True),
    (UNCAUGHT[:UNCAUGHT.index("ValueError: bad")], False),  # still being written
    (UNCAUGHT.replace("ValueError: bad batch\n", "ValueError: bad"), False),  # line cut short
    ("Exception in thread Thread-1 (load):\nTraceback (most recent call last):\n"
     '  File "/usr/lib/python3.11/threading.py", line 1045, in _bootstrap_inner\n'
     "    self.run()\nOSError: disk full\n", False),  # a thread died, the rank goes on
    ("ERROR:root:retrying\nTraceback (most recent call last):\n"
     '  File "/work/train.py", line 5, in fetch\n    get()\nTimeoutError: slow\n',
     False),  # logging.exception in a function
    ("no traceback at all\n", False),
])
def test_which_tracebacks_mean_a_rank_is_dying(tmp_path, text, fatal) -> None:
    """Only an exception that reached the script's top level ends a rank; others are logged
    by ranks that go on, and must not stop the job."""
    log = tmp_path / "worker_0.log"
    log.write_text(text)
    assert LogScan(log).uncaught_traceback() is fatal


def test_a_traceback_is_found_when_it_arrives_in_pieces(tmp_path) -> None:
    log = tmp_path / "worker_0.log"
    scan = LogScan(log)
    log.write_text("x" * 100 + UNCAUGHT[:30])
    assert not scan.uncaught_traceback()
    with open(log, "a") as more:
        more.write(UNCAUGHT[30:])
    assert scan.uncaught_traceback()


def test_how_a_rank_ended_in_one_line(tmp_path) -> None:
    log = tmp_path / "worker_2.log"
    log.write_text(UNCAUGHT)
    assert rank_failure_message(2, 1, log) == f"rank 2 failed: ValueError: bad batch (log: {log})"
    assert rank_failure_message(2, -9, log) == f"rank 2 was killed by SIGKILL (log: {log})"
    assert rank_failure_message(2, -15, log) == f"rank 2 was killed by SIGTERM (log: {log})"
    log.write_text(  # an exception named as no Error, MindSpore's teardown lines after it
        'Traceback (most recent call last):\n  File "/work/t.py", line 3, in <module>\n'
        '    raise TrainingDiverged("diverged at step 4")\n'
        "mf_train.trainer.TrainingDiverged: diverged at step 4\n"
        "[INFO] DISTRIBUTED(9151,7fa8,python):2026-12-07 [tcp_server.cc:314] Start] Event base "
        "dispatch success!\n")
    assert rank_failure_message(2, 1, log) == (
        f"rank 2 failed: mf_train.trainer.TrainingDiverged: diverged at step 4 (log: {log})")
    log.write_text("Segmentation fault\n")
    assert rank_failure_message(2, 139, log) == (
        f"rank 2 exited with status 139 and logged no Python error (log: {log})")


MSRUN_LOG = (
    "Start worker process with rank id:1, log file:/x/worker_1.log. Execute command: python t\n"
    "[ERROR] ME(777:1234,MainProcess):2026-12-03-09:00:00.000.000 [x] Worker process 4896 "
    "exit with exception. Error code: 1.\n"
    "[ERROR] ME(4865:140419189255040,MainProcess):2026-12-03-09:00:08.290.000 [mindspore/"
    "parallel/cluster/process_entity/_api.py:365] Worker process 4897 exit with exception. "
    "Error code: -9.\n")


def test_msrun_reports_a_worker_the_watch_never_saw(tmp_path) -> None:
    """A worker can end and be reaped by msrun between two looks at /proc: then msrun's own
    line (recorded from msrun 2.10; a line in a copied worker log, with another PID, does not
    count) says how it ended, and the logs say which rank it was."""
    (tmp_path / "msrun.log").write_text(MSRUN_LOG)
    watch = RankWatch(4865, tmp_path, range(2))
    assert watch.failure() == (
        f"a worker (pid 4897) was killed by SIGKILL and no rank logged a Python error; "
        f"see {tmp_path}")
    (tmp_path / "worker_1.log").write_text(UNCAUGHT)
    assert watch.failure() == (
        f"rank 1 failed: ValueError: bad batch (log: {tmp_path / 'worker_1.log'})")


def test_the_echo_leaves_out_mindspore_info_lines(tmp_path) -> None:
    """MindSpore's C++ INFO lines stay in the rank's log but are not echoed; its warnings and
    every other line are."""
    (tmp_path / "worker_0.log").write_text(
        "step [1/4] loss 6.1\n"
        "[INFO] DISTRIBUTED(29457,7fc17affd6c0,python):2026-12-05-16:15:48.868.700 "
        "[tcp_client.cc:367] Start] Event base dispatch success!\n"
        "[WARNING] ME(29457,7fc1,python):2026-12-05 [ops.cc:1] kept\n"
        "[INFO] is how a user's line may start\n")
    console = io.StringIO()
    with echoing(tmp_path, 0, console, drop=MINDSPORE_INFO):
        pass
    assert console.getvalue().splitlines() == [
        "[rank 0] step [1/4] loss 6.1", "[rank 0] [WARNING] ME(29457,7fc1,python):2026-12-05 "
        "[ops.cc:1] kept", "[rank 0] [INFO] is how a user's line may start"]
