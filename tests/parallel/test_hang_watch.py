"""The hang watch on real processes: two "ranks" record their progress (`rank_progress`), one
is stopped with SIGSTOP; the watch reports it behind, with its step and phase, and every
rank's Python stacks are dumped (faulthandler) into the report directory; a failure of the
other rank is blamed on the stopped one first."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mf_parallel.hang_watch import HangReport, HangWatch
from mf_parallel.msrun import proc_stat
from mf_parallel.rank_progress import read

RANK = """
import sys, time
from mf_parallel import rank_progress
rank = int(sys.argv[2])
rank_progress.start_recording(rank, sys.argv[1])
rank_progress.step(3)
rank_progress.phase("forward_backward")
if rank == 0:
    rank_progress.phase("reduction")
    rank_progress.collective("all_reduce", "data")
print("ready", flush=True)
def waiting_in_a_collective():
    time.sleep(600)
waiting_in_a_collective()
"""


@pytest.fixture
def ranks(tmp_path: Path):
    """Two recording processes (rank 0 in a collective, rank 1 stopped), by PID."""
    progress = tmp_path / "progress"
    started = [subprocess.Popen([sys.executable, "-c", RANK, str(progress), str(rank)],
                                stdout=subprocess.PIPE, text=True) for rank in (0, 1)]
    try:
        for process in started:
            assert process.stdout.readline() == "ready\n"
        os.kill(started[1].pid, signal.SIGSTOP)
        while proc_stat(started[1].pid)[2] != "T":  # the kernel stops it a moment later
            time.sleep(0.01)
        yield progress, {process.pid: rank for rank, process in enumerate(started)}
    finally:
        for process in started:
            process.kill()
            process.wait(timeout=30)


def test_a_stopped_rank_is_reported_with_every_ranks_stacks(ranks, tmp_path: Path) -> None:
    progress, pid_rank = ranks
    watch = HangWatch(progress, [0, 1], timeout=1.0, report_dir=tmp_path / "hang")
    assert watch.check(pid_rank) is None  # the records changed: progress, the clock starts
    start = time.monotonic()
    while (report := watch.check(pid_rank)) is None:
        assert time.monotonic() - start < 10
        time.sleep(0.1)
    assert time.monotonic() - start >= 1.0
    assert isinstance(report, HangReport)
    lines = report.splitlines()
    assert lines[0].endswith("the job is hung; behind: rank 1")
    assert lines[1] == ("  rank 0 (waiting, sleeping): step 3, phase reduction, last "
                        "collective all_reduce(data)#1")
    assert lines[2] == ("  rank 1 (behind, stopped (SIGSTOP or a debugger)): step 3, phase "
                        "forward_backward, last collective -")
    for rank in (0, 1):
        dumped = (tmp_path / "hang" / f"rank_{rank}.txt").read_text()
        assert dumped.startswith(f"rank {rank}: step 3, phase ")
        assert "in waiting_in_a_collective" in dumped  # the main thread's stack


def test_a_failure_names_the_stopped_rank_first(ranks, tmp_path: Path) -> None:
    progress, pid_rank = ranks
    watch = HangWatch(progress, [0, 1], timeout=0, report_dir=tmp_path / "hang")
    assert watch.check(pid_rank) is None  # timeout 0: never hung
    failed = "rank 0 failed: RuntimeError: AllReduce (log: worker_0.log)"
    assert watch.blame(failed, pid_rank) == (
        "rank 1 is behind (stopped (SIGSTOP or a debugger); step 3, phase forward_backward, "
        f"last collective -); then, most likely as a consequence, {failed}")
    running = {pid: rank for pid, rank in pid_rank.items() if rank == 0}
    assert watch.blame(failed, running) == failed  # no rank stopped, none stale


def test_a_half_written_record_is_not_read(tmp_path: Path) -> None:
    (tmp_path / "rank_0.progress").write_bytes(b"7 2 data - 1.000 6\n" + b" " * 100)
    assert read(tmp_path, 0) is None
    (tmp_path / "rank_0.progress").write_bytes(b"7 2 data - 1.000 7\n" + b" " * 100)
    assert read(tmp_path, 0).phase == "data"


def test_a_report_never_writes_through_a_symbolic_link(tmp_path: Path) -> None:
    """A rank's report file planted as a link (to a file of someone else's) is left alone:
    the report is written without following it (mf-train also refuses such a link before
    a run starts); the other rank's report is written."""
    (tmp_path / "hang").mkdir()
    (tmp_path / "precious.txt").write_text("precious")
    (tmp_path / "hang" / "rank_0.txt").symlink_to(tmp_path / "precious.txt")
    watch = HangWatch(tmp_path / "progress", [0, 1], timeout=1.0, report_dir=tmp_path / "hang")
    watch.report({})
    assert (tmp_path / "precious.txt").read_text() == "precious"
    assert (tmp_path / "hang" / "rank_1.txt").read_text().startswith("rank 1: ")
