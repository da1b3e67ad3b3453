"""The msrun launcher: a failing rank is named with its error; a hung job is killed in time."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from mf_parallel.errors import PlanError
from mf_parallel.launch import LaunchError, free_port, msrun_command, run_ranks

WORKERS = Path(__file__).resolve().parent / "workers"


def test_msrun_command(tmp_path) -> None:
    pytest.importorskip("mindspore")
    command = msrun_command("train.py", 4, log_dir=tmp_path, port=1234, args=["--x", "1"])
    assert command[1:] == ["--worker_num=4", "--local_worker_num=4", "--master_addr=127.0.0.1",
                           "--master_port=1234", "--cluster_time_out=120",
                           f"--log_dir={tmp_path}", "--join=True", "train.py", "--x", "1"]
    with pytest.raises(PlanError, match="must be >= 1, got 0"):
        msrun_command("train.py", 0, log_dir=tmp_path, port=1)


def test_free_port_is_bindable() -> None:
    import socket

    port = free_port()
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", port))


def _workers_alive(log_dir: Path) -> list[int]:
    """PIDs of processes still running our worker script."""
    out = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True).stdout
    return [int(line.split()[0]) for line in out.splitlines()
            if "failing_worker.py" in line and str(log_dir) not in line and "ps -eo" not in line]


@pytest.mark.ranks
def test_a_failing_rank_ends_the_job_with_its_error(tmp_path) -> None:
    pytest.importorskip("mindspore")
    start = time.monotonic()
    with pytest.raises(LaunchError) as exc:
        run_ranks(WORKERS / "failing_worker.py", 2, log_dir=tmp_path, timeout=180,
                  args=["raise"])
    assert str(exc.value).startswith(
        "rank 1 failed: ValueError: rank 1 stops here on purpose (log: ")
    assert time.monotonic() - start < 180
    assert _workers_alive(tmp_path) == []


@pytest.mark.ranks
def test_a_hung_job_is_killed_at_the_deadline(tmp_path) -> None:
    pytest.importorskip("mindspore")
    start = time.monotonic()
    with pytest.raises(LaunchError, match="did not finish in 40 s and was killed"):
        run_ranks(WORKERS / "failing_worker.py", 2, log_dir=tmp_path, timeout=40,
                  args=["hang"])
    assert time.monotonic() - start < 40 + 15
    leftovers = _workers_alive(tmp_path)
    for pid in leftovers:  # never leave processes behind, even when the assertion fails
        os.kill(pid, signal.SIGKILL)
    assert leftovers == []
