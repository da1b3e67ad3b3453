"""Faults on real ranks: a rank killed with SIGKILL at a random point of a 2-rank run ends the
job with that rank named, and running the same command again resumes from the newest complete
checkpoint and ends with the losses of an uninterrupted run, bit for bit."""

from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("mindspore")

from runs import losses

from mf_train.monitor.metrics import read_steps

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "qwen3_tiny.yaml"
STEPS = 6
pytestmark = pytest.mark.ranks


def command(prefix: str, output: Path) -> list[str]:
    sets = [f"train_dataset.dataloader.config.data_path=['1','{prefix}']",
            f"training.steps={STEPS}", "model.hidden_size=32", "model.intermediate_size=64",
            "model.head_dim=8", "train_dataset.dataloader.config.seq_length=32",
            "model.max_position_embeddings=32", "recompute.mode=None",
            "recompute.select_module=null", "lr_scheduler.warmup_steps=1",
            "checkpoint.save_interleaved_steps=2", "parallelism.data_parallel_shard=1"]
    return [sys.executable, "-m", "mf_train.launch.cli", "--config", str(EXAMPLE), "--output-dir",
            str(output), "--nproc", "2", "--timeout", "600",
            *[arg for value in sets for arg in ("--set", value)]]


def logged(output: Path) -> tuple[int, int]:
    """(steps logged, newest checkpoint saved) so far."""
    path = output / "metrics.jsonl"
    if not path.is_file():
        return 0, 0
    entries = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    saves = [entry["step"] for entry in entries if entry.get("event") == "save"]
    return sum("event" not in entry for entry in entries), max(saves, default=0)


def rank_pid(output: Path, rank: int) -> int | None:
    """The PID of the rank worker of this job (found in /proc by its arguments and RANK_ID)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().split(b"\0")
            environ = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if (any(part.endswith(b"/mf-train-rank") for part in cmdline)
                and str(output).encode() in cmdline
                and f"RANK_ID={rank}".encode() in environ):
            return int(entry.name)
    return None


def kill_at(output: Path, after_step: int, delay: float, job: subprocess.Popen) -> int:
    """SIGKILL rank 1 `delay` seconds after step `after_step` is logged and a checkpoint is
    complete (before it, a rerun has nothing to resume and is refused), or as soon as the
    last step but one is logged, whichever comes first (on a fast machine the last steps
    take less than the delay, and the job must still be running); its PID."""
    deadline, pid = time.monotonic() + 600, None
    while (steps := logged(output))[0] < after_step or steps[1] == 0:
        assert job.poll() is None, "the job ended before the kill"
        assert time.monotonic() < deadline
        pid = pid or rank_pid(output, 1)
        time.sleep(0.2)
    end = time.monotonic() + delay
    while time.monotonic() < end and logged(output)[0] < STEPS - 1:
        time.sleep(0.05)
    pid = pid or rank_pid(output, 1)
    assert pid is not None, "rank 1 not found"
    assert job.poll() is None, "the job ended before the kill"
    os.kill(pid, signal.SIGKILL)
    return pid


@pytest.fixture(scope="module")
def whole_run(data_prefix, tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    output = tmp_path_factory.mktemp("whole") / "out"
    result = subprocess.run(command(data_prefix, output), capture_output=True, text=True,
                            timeout=900)
    assert result.returncode == 0, result.stderr
    return output, result


@pytest.fixture(scope="module")
def uninterrupted(whole_run) -> dict[int, float]:
    found = losses(whole_run[0])
    assert sorted(found) == list(range(1, STEPS + 1))
    return found


def test_the_console_shows_rank_0_live_and_a_summary(whole_run) -> None:
    output, result = whole_run
    steps = [line for line in result.stdout.splitlines()
             if line.startswith("[rank 0] ") and " step [" in line]
    assert [line.split(" step [")[1].split("]")[0] for line in steps] == [
        f"{step}/{STEPS}" for step in range(1, STEPS + 1)]
    summary = result.stderr.strip().splitlines()[-3:]
    assert summary[0].startswith(f"mf-train: finished steps 1-{STEPS} of {STEPS} ({STEPS} in "
                                 "this run) in ")
    assert summary[1] == (f"mf-train: checkpoints: {output / 'checkpoint'} (newest: "
                          f"iteration_{STEPS:08d})")


@pytest.mark.parametrize("seed", [pytest.param(0),
                                  pytest.param(1, marks=pytest.mark.slow),
                                  pytest.param(2, marks=pytest.mark.slow)])
def test_sigkill_of_a_rank_then_the_same_command_again(uninterrupted, data_prefix,
                                                       tmp_path: Path, seed: int) -> None:
    chance = random.Random(seed)
    after_step, delay = chance.randint(2, STEPS - 2), chance.uniform(0.0, 2.0)
    output = tmp_path / "out"
    job = subprocess.Popen(command(data_prefix, output), stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True)
    try:
        killed = kill_at(output, after_step, delay, job)
        _, err = job.communicate(timeout=600)
    finally:
        if job.poll() is None:
            job.kill()
    assert job.returncode == 1, err
    assert "rank 1" in err.splitlines()[-1], (killed, err)
    again = subprocess.run(command(data_prefix, output), capture_output=True, text=True,
                           timeout=900)
    assert again.returncode == 0, again.stderr
    assert "holds an earlier run: resuming from its checkpoint" in again.stderr
    assert losses(output) == uninterrupted


HANG_TIMEOUT = 15
"""The stopped-rank test's `--hang-timeout` (seconds)."""


def test_a_stopped_rank_is_reported_and_the_same_command_runs_again(
        uninterrupted, data_prefix, tmp_path: Path) -> None:
    """SIGSTOP rank 1 after step 1 (before the run's only checkpoint, at its last step): the
    launcher names rank 1 (stopped) with its step and phase, and rank 0's pending collective,
    within the hang timeout + 10 s, with each rank's stacks in hang/; the same command then
    starts afresh and trains the uninterrupted run's losses."""
    output = tmp_path / "out"
    hung = [*command(data_prefix, output), "--set", f"checkpoint.save_interleaved_steps={STEPS}",
            "--hang-timeout", str(HANG_TIMEOUT)]
    job = subprocess.Popen(hung, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    pid = None
    try:
        deadline = time.monotonic() + 600
        while logged(output)[0] < 1:
            assert job.poll() is None and time.monotonic() < deadline, "the job ended early"
            pid = pid or rank_pid(output, 1)
            time.sleep(0.1)
        pid = pid or rank_pid(output, 1)
        assert pid is not None, "rank 1 not found"
        os.kill(pid, signal.SIGSTOP)
        stopped = time.monotonic()
        _, err = job.communicate(timeout=HANG_TIMEOUT + 120)
        took = time.monotonic() - stopped
    finally:
        if job.poll() is None:
            job.kill()
        if pid is not None and rank_pid(output, 1) == pid:
            os.kill(pid, signal.SIGKILL)
    assert job.returncode == 3, err
    assert took < HANG_TIMEOUT + 10, (took, err)
    report = err[err.index("mf-train: no rank progressed"):].splitlines()
    assert report[0].endswith("the job is hung; behind: rank 1"), err
    rank_1 = re.fullmatch(r"  rank 1 \(behind, stopped \(SIGSTOP or a debugger\)\): step (\d+), "
                          r"phase (\w+), last collective (\S+)", report[2])
    assert rank_1 is not None, report
    assert 1 <= int(rank_1[1]) <= 3 and rank_1[2] != "starting", report
    rank_0 = re.fullmatch(r"  rank 0 \(waiting, \w[^)]*\): step (\d+), phase (\w+), last "
                          r"collective (\S+)", report[1])
    assert rank_0 is not None and rank_0[3] != "-", report
    for rank in (0, 1):
        dumped = (output / "hang" / f"rank_{rank}.txt").read_text()
        assert dumped.startswith(f"rank {rank}: step "), dumped
        assert 'File "' in dumped and "most recent call first" in dumped, dumped
    # the same command again, rank 1's data loading slowed by SLOW_DATA seconds a step
    slowed = tmp_path / "slow_data"
    slowed.mkdir()
    (slowed / "sitecustomize.py").write_text(SLOW_RANK_1_DATA)
    again = subprocess.run(hung, capture_output=True, text=True, timeout=900,
                           env={**os.environ, "PYTHONPATH": os.pathsep.join(
                               [str(slowed), os.environ.get("PYTHONPATH", "")])})
    assert again.returncode == 0, again.stderr
    assert "saved no checkpoint" in again.stderr and "starting afresh" in again.stderr
    assert losses(output) == uninterrupted
    # every step names rank 1 as the one slowest at its data (`time/slowest_rank` weighs all
    # of a rank's own work, which the other jobs on a loaded machine can outweigh)
    for record in read_steps(output / "metrics.jsonl"):
        assert record["time/data_rank"] == 1, record
        assert record["time/data"] >= SLOW_DATA > 10 * record["time/data_min"]


SLOW_DATA = 0.8
"""Seconds rank 1's data loading is slowed by, each micro-batch (`SLOW_RANK_1_DATA`)."""
SLOW_RANK_1_DATA = f"""
import os
if os.environ.get("RANK_ID") == "1" and os.environ.get("MS_ROLE") == "MS_WORKER":
    import time
    from mf_train.step.micro_batches import MicroBatchStream

    real = MicroBatchStream.__next__

    def slowed(self):
        time.sleep({SLOW_DATA})
        return real(self)

    MicroBatchStream.__next__ = slowed
"""


def test_a_killed_rank_is_restarted_and_the_run_ends_as_an_uninterrupted_one(
        uninterrupted, data_prefix, tmp_path: Path) -> None:
    """SIGKILL rank 1 after step 2's checkpoint, under --max-restarts 2: the launcher starts
    the job again from that checkpoint by itself, and the run ends with an uninterrupted
    run's losses and one `restart` event naming the cause."""
    output = tmp_path / "out"
    job = subprocess.Popen([*command(data_prefix, output), "--max-restarts", "2"],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        kill_at(output, 2, 0.0, job)
        _, err = job.communicate(timeout=600)
    finally:
        if job.poll() is None:
            job.kill()
    assert job.returncode == 0, err
    events = [json.loads(line) for line in (output / "metrics.jsonl").read_text().splitlines()]
    [restart] = [event for event in events if event.get("event") == "restart"]
    assert restart["attempt"] == 1 and restart["wait_s"] == 1.0
    assert restart["cause"].startswith("rank 1 was killed by SIGKILL"), restart
    resumed = [event for event in events if event.get("event") == "resume"]
    assert [event["step"] for event in resumed] == [restart["step"] - restart["step"] % 2]
    assert "mf-train: restart 1 of 2 after 1 s, from " in err
    assert losses(output) == uninterrupted
