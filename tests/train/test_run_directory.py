"""A run owns its output directory: one run at a time, an earlier run resumed or refused but
never overwritten, metrics appended, every fault one clear line; and a run ends with a
summary. The lock covers every directory the run writes (the checkpoint directory too), a run
never removes what it did not write, and its lock files and metrics are never opened through a
symbolic link."""

from __future__ import annotations

import errno
import json
import os
import re
import resource
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import psutil
import pytest

pytest.importorskip("mindspore")

from checkpoint_samples import config, save
from safetensors.numpy import load_file

from mf_config import CheckpointConfig
from mf_config.validate import config_from_source, load_source
from mf_data.indexed import IndexedDataset
from mf_memory.estimate import size
from mf_train.checkpoint import CheckpointManager, writer
from mf_train.checkpoint.atomic import write_text
from mf_train.checkpoint.errors import CheckpointError
from mf_train.checkpoint.layout import iteration_name
from mf_train.launch.cli import run
from mf_train.launch.host_memory import estimated_bytes, host_limit
from mf_train.monitor.metrics import MetricsWriter
from mf_train.no_follow import LinkRefused
from mf_train.observe.callbacks import TrainContext
from mf_train.preflight.run_directory import RunDirectoryError, claim

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "qwen3_tiny.yaml"
HOLD = """
import sys, time
from mf_config import CheckpointConfig
from mf_train.preflight.run_directory import claim
saves = {"save_path": sys.argv[2]} if len(sys.argv) > 2 else {}  # else <output>/checkpoint
held = claim(sys.argv[1], CheckpointConfig(**saves))  # kept: the lock lives with it
print("claimed", flush=True)
time.sleep(600)
"""


def small(prefix: str, output: Path, steps: int, *more: str) -> list[str]:
    sets = [f"train_dataset.dataloader.config.data_path=['1','{prefix}']",
            f"training.steps={steps}", "model.hidden_size=32", "model.intermediate_size=64",
            "model.head_dim=8", "train_dataset.dataloader.config.seq_length=32",
            "model.max_position_embeddings=32", "recompute.mode=None",
            "recompute.select_module=null", "lr_scheduler.warmup_steps=1",
            "checkpoint.save_interleaved_steps=2", *more]
    return ["--config", str(EXAMPLE), "--output-dir", str(output),
            *[arg for value in sets for arg in ("--set", value)]]


def lines(output: Path) -> list[dict]:
    return [json.loads(line) for line in (output / "metrics.jsonl").read_text().splitlines()]


def test_a_second_run_into_a_directory_in_use_fails_at_once(data_prefix, tmp_path: Path,
                                                            capsys) -> None:
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(tmp_path)],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "claimed"
        with pytest.raises(RunDirectoryError) as busy:
            claim(tmp_path, CheckpointConfig())
        assert str(busy.value).startswith(f"{tmp_path} is in use by another run (PID "
                                          f"{holder.pid} on ")
        assert str(busy.value).endswith("; wait for it to finish, or choose another "
                                        "--output-dir")
        assert run(small(data_prefix, tmp_path, 1)) == 2
        assert f"mf-train: {tmp_path} is in use by another run (PID {holder.pid}" in \
            capsys.readouterr().err
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=30)
    claim(tmp_path, CheckpointConfig()).release()  # kill -9 left the lock to the system


def test_an_earlier_run_without_checkpoints_is_not_overwritten(tmp_path: Path) -> None:
    """A run that failed or stopped before its first save left metrics and logs only: the
    same command starts afresh (appending), and says so; beside a file no run writes, the
    directory is refused."""
    (tmp_path / "metrics.jsonl").write_text('{"event": "start", "step": 0}\n'
                                            '{"step": 1, "loss": 5.0}\n{"step": 2, "loss": 4.0}\n')
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "train.log").write_text("the earlier run's log\n")
    afresh = claim(tmp_path, CheckpointConfig())
    afresh.release()
    assert afresh.note == (f"{tmp_path} holds an earlier run that saved no checkpoint "
                           "(metrics.jsonl logs 2 steps): starting afresh; its lines stay in "
                           "metrics.jsonl, before this run's")
    assert afresh.checkpoint.load_path == ""
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(RunDirectoryError) as refused:
        claim(tmp_path, CheckpointConfig())
    assert str(refused.value) == (
        f"{tmp_path} holds an earlier run (metrics.jsonl logs 2 steps) but no checkpoint to "
        f"resume from in {tmp_path / 'checkpoint'}, beside files no run wrote (notes.txt); "
        f"choose another --output-dir, or remove {tmp_path}")
    assert (tmp_path / "metrics.jsonl").read_text().count("\n") == 3


def test_an_unusable_output_directory_is_one_line(data_prefix, tmp_path: Path, capsys) -> None:
    (tmp_path / "file").write_text("not a directory")
    assert run(small(data_prefix, tmp_path / "file" / "out", 1)) == 2
    err = capsys.readouterr().err
    assert err.strip().splitlines()[-1] == (
        f"mf-train: cannot use {tmp_path / 'file' / 'out'} as the output directory: Not a "
        "directory; choose a writable --output-dir")
    assert "Traceback" not in err


def test_runs_one_after_the_other_resume_and_append(data_prefix, tmp_path: Path,
                                                    capsys) -> None:
    """The same command twice with more steps: the second resumes from the first's last
    checkpoint, metrics.jsonl keeps every line, the tracker only moves forward; loading
    another checkpoint into a directory holding this run's is refused."""
    out = tmp_path / "out"
    resident_before = psutil.Process().memory_info().rss
    assert run(small(data_prefix, out, 3)) == 0
    first = capsys.readouterr().err.splitlines()
    assert first[-3].startswith("mf-train: finished steps 1-3 of 3 (3 in this run) in ")
    # the run is this process: its peak so far, as the steps saw it, is at least what it held
    # before and at most its peak now; it never falls; the summary gives the last one
    peaks = [line["peak_memory_gib"] for line in lines(out) if "event" not in line]
    peak_now = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 2**30
    assert resident_before / 2**30 - 0.01 <= peaks[0] <= peaks[1] <= peaks[2] <= peak_now + 0.01
    assert first[-3].endswith(f"; peak memory {peaks[-1]:.2f} GiB")
    assert all("peak_memory_rank" not in line for line in lines(out))  # one process
    assert first[-2] == f"mf-train: checkpoints: {out / 'checkpoint'} (newest: iteration_00000003)"
    assert first[-1] == (f"mf-train: metrics: {out / 'metrics.jsonl'}; TensorBoard: "
                         f"{out / 'tensorboard'}; logs: {out / 'logs'}")
    assert run(small(data_prefix, out, 4)) == 0
    second = capsys.readouterr().err
    assert (f"mf-train: {out} holds an earlier run: resuming from its checkpoint "
            f"{out / 'checkpoint' / 'iteration_00000003'}") in second
    assert "finished steps 4-4 of 4 (1 in this run)" in second
    events = [(line.get("event", "step"), line["step"]) for line in lines(out)]
    assert events == [("start", 0), ("step", 1), ("step", 2), ("save", 2), ("step", 3),
                      ("save", 3), ("resume", 3), ("step", 4), ("save", 4)]
    assert (out / "checkpoint" / "latest_checkpointed_iteration.txt").read_text() == "4"
    assert run(small(data_prefix, out, 4)) == 0
    assert "nothing to do: the run in" in capsys.readouterr().err
    elsewhere = small(data_prefix, out, 6, f"checkpoint.load_path={tmp_path / 'other'}")
    (tmp_path / "other").mkdir()
    assert run(elsewhere) == 2
    assert (f"{out / 'checkpoint'} holds checkpoints of an earlier run (newest: "
            "iteration_00000004), and this run loads") in capsys.readouterr().err
    # a run that starts from another's checkpoint, then is run again (after a stop, or with
    # more steps): it continues from its own checkpoints, not from its load_path again
    tuned = tmp_path / "tuned"
    from_out = f"checkpoint.load_path={out / 'checkpoint'}"
    assert run(small(data_prefix, tuned, 5, from_out)) == 0
    assert "finished steps 5-5 of 5" in capsys.readouterr().err
    assert run(small(data_prefix, tuned, 6, from_out)) == 0
    again = capsys.readouterr().err
    assert (f"mf-train: {tuned} holds this run's checkpoints (it started from "
            f"{out / 'checkpoint'}): resuming from {tuned / 'checkpoint' / 'iteration_00000005'}"
            ) in again
    assert "finished steps 6-6 of 6 (1 in this run)" in again


FAILING_SAVE = """
import sys
import mf_train.checkpoint.writer as writer
from mf_train.launch.cli import run

real = writer.write_safetensors_streamed

def write(path, tensors, metadata=None):  # the disk fills up during step N's save
    if f"iteration_{int(sys.argv[1]):08d}" in str(path):
        raise OSError(28, "No space left on device")
    return real(path, tensors, metadata)

writer.write_safetensors_streamed = write
sys.exit(run(sys.argv[2:]))
"""


def full_disk_line(root: Path, step: int, needed: int) -> re.Pattern:
    """The line a save that found the disk full ends with: the directory, the bytes this
    rank's files need (`needed`) and those free."""
    return re.compile(
        re.escape(f"{root / iteration_name(step)}.tmp-") + r"\d+ \(No space left on device\): "
        + re.escape(f"this rank's files of the checkpoint need {needed / 2**20:.1f} MiB, free "
                    "there: ") + r"\d+\.\d MiB; free some space and run the same command")


def tensor_bytes(directory: Path) -> int:
    """The bytes of the tensors in a checkpoint's safetensors files."""
    return sum(array.nbytes for path in directory.glob("*.safetensors")
               for array in load_file(str(path)).values())


def test_a_failed_async_save_stops_the_run_at_the_next_step(data_prefix, tmp_path) -> None:
    out = tmp_path / "out"
    args = small(data_prefix, out, 8, "checkpoint.async_save=true")
    result = subprocess.run([sys.executable, "-c", FAILING_SAVE, "4", *args],
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 1
    last = result.stderr.strip().splitlines()[-1]
    head = (f"mf-train: the asynchronous save of checkpoint step 4 to {out / 'checkpoint'} "
            "failed: no space left in ")
    tail = f"; the newest complete checkpoint is {out / 'checkpoint' / 'iteration_00000002'}"
    assert last.startswith(head) and last.endswith(tail), last
    needed = tensor_bytes(out / "checkpoint" / "iteration_00000002")  # step 4's: the same
    assert full_disk_line(out / "checkpoint", 4, needed).fullmatch(
        last[len(head):-len(tail)]), last
    assert "Traceback" not in result.stderr
    saves = [line["step"] for line in lines(out) if line.get("event") == "save"]
    steps = [line["step"] for line in lines(out) if "event" not in line]
    assert saves == [2]  # no event for the save that did not complete
    # reported as soon as the step that started it, or the next one, is over
    assert steps in ([1, 2, 3, 4], [1, 2, 3, 4, 5])


def test_a_full_disk_at_the_first_save_then_the_same_command(data_prefix, tmp_path,
                                                             capsys, monkeypatch) -> None:
    """The disk is full at the first checkpoint: one line naming the directory and the bytes
    needed; once there is space, the same command starts afresh (there was nothing to
    resume) and finishes."""
    out = tmp_path / "out"
    args = small(data_prefix, out, 3)

    def full(path, tensors, metadata=None):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(writer, "write_safetensors_streamed", full)
    assert run(args) == 1
    monkeypatch.undo()
    err = capsys.readouterr().err
    last = err.strip().splitlines()[-1]
    head = (f"mf-train: saving checkpoint step 2 to {out / 'checkpoint'} failed on rank 0: "
            "no space left in ")
    tail = f"; no complete checkpoint is left in {out / 'checkpoint'}"
    assert last.startswith(head) and last.endswith(tail), last
    assert "Traceback" not in err
    assert run(args) == 0  # the same command, with space
    assert (f"mf-train: {out} holds an earlier run that saved no checkpoint (metrics.jsonl "
            "logs 2 steps): starting afresh") in capsys.readouterr().err
    needed = tensor_bytes(out / "checkpoint" / "iteration_00000002")
    assert full_disk_line(out / "checkpoint", 2, needed).fullmatch(
        last[len(head):-len(tail)]), last
    assert sorted(path.name for path in (out / "checkpoint").iterdir()) == [
        ".mf-run.lock", "iteration_00000002", "iteration_00000003",
        "latest_checkpointed_iteration.txt"]  # the failed save's directory cleaned up


# ------------------------------------------------------------------ what the lock covers

def holding(output: Path, save_path: Path | None = None) -> subprocess.Popen:
    """A process holding the claim of a run into `output` (checkpoints in `save_path`) until
    it is killed."""
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(output),
                               *([str(save_path)] if save_path else [])],
                              stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "claimed"
    return holder


def test_two_runs_cannot_share_a_save_path(data_prefix, tmp_path: Path, capsys) -> None:
    """Different output directories, one checkpoint.save_path: the second run would resume
    from the first's checkpoints while they are written; it is refused in one line."""
    shared = tmp_path / "shared"
    holder = holding(tmp_path / "first", shared)
    try:
        assert (shared / ".mf-run.lock").is_file()
        second = small(data_prefix, tmp_path / "second", 1, f"checkpoint.save_path={shared}")
        assert run(second) == 2
        err = capsys.readouterr().err
        assert err.strip().splitlines()[-1].startswith(
            f"mf-train: {shared} is in use by another run (PID {holder.pid} on ")
        assert err.strip().splitlines()[-1].endswith(
            "; wait for it to finish, or choose another checkpoint.save_path")
        assert "Traceback" not in err
        assert not (shared / "iteration_00000001").exists()
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=30)
    claim(tmp_path / "second", CheckpointConfig(save_path=str(shared))).release()


@pytest.mark.parametrize("option", ["monitor.tensorboard.output_dir", "profiler.output_path"])
def test_two_runs_cannot_share_a_tensorboard_or_profiler_directory(option: str, data_prefix,
                                                                   tmp_path: Path,
                                                                   capsys) -> None:
    """Different output directories, one TensorBoard (or profiler) directory elsewhere: the
    second run is refused in one line while the first holds it, and takes it afterwards."""
    shared = tmp_path / "shared"
    profiling = ["profiler.enable_profiling=true"] if option.startswith("profiler") else []
    first = claim(tmp_path / "first", CheckpointConfig(), also=[(shared, option)])
    try:
        assert (shared / ".mf-run.lock").is_file()
        assert run(small(data_prefix, tmp_path / "second", 1, f"{option}={shared}",
                         *profiling)) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert err[-1].startswith(f"mf-train: {shared} is in use by another run (PID ")
        assert err[-1].endswith(f"; wait for it to finish, or choose another {option}")
        assert not (tmp_path / "second" / "metrics.jsonl").exists()
    finally:
        first.release()
    inside = claim(tmp_path / "third", CheckpointConfig(),
                   also=[(tmp_path / "third" / "tensorboard", option)])
    assert len(inside.locks) == 2  # the output and checkpoint directories: inside is covered
    inside.release()


def test_a_users_directory_under_the_save_path_is_kept(data_prefix, tmp_path: Path,
                                                       capsys) -> None:
    """`iteration_00000001/notes.txt` in the save path is not a checkpoint: a save of step 1
    would have replaced it, so the run is refused, and the notes stay."""
    notes = tmp_path / "ckpt" / "iteration_00000001" / "notes.txt"
    notes.parent.mkdir(parents=True)
    notes.write_text("mine")
    args = small(data_prefix, tmp_path / "out", 2, f"checkpoint.save_path={tmp_path / 'ckpt'}",
                 "checkpoint.save_interleaved_steps=1")
    assert run(args) == 2
    err = capsys.readouterr().err
    assert err.strip().splitlines()[-1] == (
        f"mf-train: {notes.parent} is not a checkpoint mf-train wrote (it has no common.json "
        f"of its format), and saving into {tmp_path / 'ckpt'} could replace or delete it; "
        "move it elsewhere, or choose another checkpoint.save_path")
    assert notes.read_text() == "mine"


def test_the_checkpoint_writer_keeps_what_it_did_not_write(tmp_path: Path) -> None:
    """Below the run's own check: a save over a directory mf-train did not write is not
    committed, and rotation (save_max) deletes only mf-train's checkpoints and leftovers."""
    root = tmp_path / "ckpt"
    (root / "iteration_00000001").mkdir(parents=True)
    (root / "iteration_00000001" / "notes.txt").write_text("mine")
    (root / "data.tmp-1").mkdir()  # named like a save's temporary directory, but not one
    manager = CheckpointManager(config(root, save_max=1))
    with pytest.raises(CheckpointError, match="iteration_00000001 is not a checkpoint mf-train "
                                              "wrote; it is kept, and this save is not "
                                              "committed: move it elsewhere"):
        save(manager, 1)
    for step in (2, 3):
        save(manager, step)
    assert sorted(path.name for path in root.iterdir() if path.is_dir()) == [
        "data.tmp-1", "iteration_00000001", "iteration_00000003"]
    assert (root / "iteration_00000001" / "notes.txt").read_text() == "mine"


@pytest.mark.parametrize("where", ["output", "save_path"])
def test_a_symlinked_lock_file_is_refused(data_prefix, tmp_path: Path, capsys,
                                          where: str) -> None:
    """A `.mf-run.lock` planted as a symbolic link (to a file of someone else's) is never
    opened: the run is refused in one line and the file it points to is untouched."""
    target = tmp_path / "precious.txt"
    target.write_text("precious")
    directory = tmp_path / ("out" if where == "output" else "ckpt")
    directory.mkdir()
    (directory / ".mf-run.lock").symlink_to(target)
    args = small(data_prefix, tmp_path / "out", 1, f"checkpoint.save_path={tmp_path / 'ckpt'}")
    assert run(args) == 2
    err = capsys.readouterr().err
    assert err.strip().splitlines()[-1] == (
        f"mf-train: {directory / '.mf-run.lock'} is a symbolic link, which mf-train never "
        "follows there; remove it (the run creates a plain file)")
    assert "Traceback" not in err
    assert target.read_text() == "precious"


def test_a_symlinked_train_log_is_refused(data_prefix, tmp_path: Path, capsys) -> None:
    """logs/train.log is appended to, never through a link (a resumed run would append to
    whatever it points to): refused in one line, and the file it points to is untouched."""
    target = tmp_path / "precious.txt"
    target.write_text("precious")
    (tmp_path / "out" / "logs").mkdir(parents=True)
    (tmp_path / "out" / "logs" / "train.log").symlink_to(target)
    assert run(small(data_prefix, tmp_path / "out", 1)) == 2
    err = capsys.readouterr().err
    assert err.strip().splitlines()[-1] == (
        f"mf-train: {tmp_path / 'out' / 'logs' / 'train.log'} is a symbolic link, which "
        "mf-train never follows there; remove it (the run appends to a plain file)")
    assert target.read_text() == "precious"
    # a checkpoint's files are written to a `.part-<pid>` file, then renamed: never a link
    tracker = tmp_path / "ckpt" / "latest_checkpointed_iteration.txt"
    tracker.parent.mkdir()
    tracker.with_name(f"{tracker.name}.part-{os.getpid()}").symlink_to(target)
    with pytest.raises(LinkRefused, match=r"\.txt\.part-\d+ is a symbolic link"):
        write_text(tracker, "8")
    assert target.read_text() == "precious"


def test_a_symlinked_metrics_file_is_refused(tmp_path: Path) -> None:
    """metrics.jsonl is appended to, never through a link: the run is refused before it
    starts, and the writer itself opens it with O_NOFOLLOW."""
    target = tmp_path / "elsewhere.jsonl"
    target.write_text("")
    (tmp_path / "metrics.jsonl").symlink_to(target)
    with pytest.raises(RunDirectoryError, match=r"metrics\.jsonl is a symbolic link"):
        claim(tmp_path, CheckpointConfig())
    with pytest.raises(LinkRefused, match=r"metrics\.jsonl is a symbolic link"):
        MetricsWriter().on_train_begin(TrainContext(output_dir=tmp_path, total_steps=1))
    assert target.read_text() == ""


# ------------------------------------------------------------------ a diverged run

def test_a_diverged_run_keeps_its_finite_checkpoint_and_stops(data_prefix, tmp_path: Path,
                                                              capsys) -> None:
    """A learning rate that overflows float32 from step 3 on: step 3's state (loss and norm
    still finite) is not saved, steps 4-5 are not finite, the run stops at the second of
    them with status 1 and one line, and the one finite checkpoint (save_max 1) is kept and
    tracked; the same command with a sane learning rate continues from it."""
    out = tmp_path / "out"
    every_step = ("checkpoint.save_interleaved_steps=1", "checkpoint.save_max=1")
    assert run(small(data_prefix, out, 2, *every_step)) == 0
    capsys.readouterr()
    diverging = small(data_prefix, out, 6, *every_step, "lr_scheduler.learning_rate=1e39",
                      "training.max_nonfinite_steps=2")
    assert run(diverging) == 1
    err = capsys.readouterr().err
    assert err.strip().splitlines()[-1] == (
        "mf-train: diverged at step 4: loss nan, gradient norm nan; stopped at step 5 after 2 "
        "steps not finite (training.max_nonfinite_steps 2), none of them saved; the newest "
        f"complete checkpoint is {out / 'checkpoint' / 'iteration_00000002'}: lower the "
        "learning rate and run the same command to continue from it")
    assert sorted(path.name for path in (out / "checkpoint").iterdir()) == [
        ".mf-run.lock", "iteration_00000002", "latest_checkpointed_iteration.txt"]
    assert (out / "checkpoint" / "latest_checkpointed_iteration.txt").read_text() == "2"
    assert [line["step"] for line in lines(out) if line.get("event") == "save"] == [1, 2]
    assert run(small(data_prefix, out, 6, *every_step)) == 0
    assert "finished steps 3-6 of 6 (4 in this run)" in capsys.readouterr().err
    resumed = [line for line in lines(out) if "event" not in line][-4:]
    assert [line["step"] for line in resumed] == [3, 4, 5, 6]
    assert all(np.isfinite(line["loss"]) for line in resumed)


# ------------------------------------------------------------------ what a resume reads

def test_an_edited_common_json_is_named_and_the_run_falls_back(data_prefix, tmp_path: Path,
                                                              capsys, caplog) -> None:
    """common.json records the SHA-256 of its own content: one edited by hand (another
    consumed_samples) is not resumed; the run falls back to the newest intact checkpoint with
    one line naming the file, and goes on from there as the uninterrupted run did."""
    out = tmp_path / "out"
    assert run(small(data_prefix, out, 3, "checkpoint.save_interleaved_steps=1")) == 0
    common = out / "checkpoint" / "iteration_00000003" / "common.json"
    edited = json.loads(common.read_text())
    edited["consumed_samples"] += 4
    common.write_text(json.dumps(edited, indent=2, sort_keys=True) + "\n")
    first = {line["step"]: line for line in lines(out) if "event" not in line}
    capsys.readouterr()
    assert run(small(data_prefix, out, 3, "checkpoint.save_interleaved_steps=1")) == 0
    warned = [record.getMessage() for record in caplog.records
              if record.levelname == "WARNING" and "common.json" in record.getMessage()]
    assert warned == [
        f"{out / 'checkpoint' / 'latest_checkpointed_iteration.txt'} names iteration 3, which "
        f"is not usable ({common}: its content does not match the SHA-256 it records (edited "
        "or damaged after it was written)); loading the newest complete checkpoint "
        f"{out / 'checkpoint' / 'iteration_00000002'}"]
    resumed = [line for line in lines(out) if line.get("event") == "resume"]
    assert [line["step"] for line in resumed] == [2]
    again = [line for line in lines(out) if "event" not in line][-1]
    assert (again["step"], again["consumed_samples"]) == (3, first[3]["consumed_samples"])
    assert again["loss"] == first[3]["loss"]
    assert json.loads(common.read_text())["consumed_samples"] == first[3]["consumed_samples"]


def test_a_load_path_without_a_checkpoint_is_refused_unless_it_is_the_save_path(
        data_prefix, tmp_path: Path, capsys) -> None:
    """A load_path at a directory with no checkpoint trained from scratch with a warning and
    exit 0: a wrong directory went unnoticed. Refused in one line now; at the run's own save
    path (the MindFormers way to resume whenever there is something), it starts."""
    (tmp_path / "empty").mkdir()
    out = tmp_path / "out"
    assert run(small(data_prefix, out, 1, f"checkpoint.load_path={tmp_path / 'empty'}")) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"mf-train: checkpoint.load_path {tmp_path / 'empty'} holds no checkpoint (no complete "
        "iteration_* directory, no Hugging Face weights); point it at one, leave it empty to "
        "start from scratch, or set it to this run's checkpoint.save_path "
        f"({out / 'checkpoint'}) to start from scratch now and resume from there later")
    assert not (out / "metrics.jsonl").exists()
    claim(out, CheckpointConfig(load_path=str(out / "checkpoint"))).release()  # allowed


def test_a_token_outside_the_vocabulary_is_found_before_launch(data_prefix, tmp_path,
                                                                capsys) -> None:
    """The byte corpus ends documents with EOD 256: a 256-token model would stop at the first
    sample holding one (and every resume again at that step); `--scan-tokens` reads every
    dataset first and names the sequence, before anything is built."""
    args = small(data_prefix, tmp_path / "out", 2, "model.vocab_size=256")
    assert run([*args, "--scan-tokens"]) == 2
    err = capsys.readouterr().err
    dataset = IndexedDataset(data_prefix)
    sequence = next(index for index in range(len(dataset)) if dataset[index].max() >= 256)
    assert f"{data_prefix}.bin: sequence {sequence} holds token id 256, outside the model's " \
           "vocabulary: model.vocab_size is 256 (ids 0 to 255)" in err
    assert "Traceback" not in err and not (tmp_path / "out" / "metrics.jsonl").exists()


# ------------------------------------------------------------------ memory

def test_a_model_too_large_for_the_host_is_refused_before_building(data_prefix, tmp_path,
                                                                  capsys) -> None:
    """vocab_size two billion: refused in one line with mf-memory's estimate beside the
    host's limit, before the model is built (numpy's traceback came minutes later)."""
    out = tmp_path / "out"
    huge = small(data_prefix, out, 2, "model.vocab_size=2000000000")
    assert run(huge) == 2
    err = capsys.readouterr().err
    config = config_from_source(load_source(str(EXAMPLE), huge[huge.index("--set"):][1::2]))
    limit, what = host_limit()
    needed = estimated_bytes(config, 1, [0])
    assert needed > limit
    assert err.strip().splitlines()[-1] == (
        f"mf-train: mf-memory estimates {size(needed)} for rank 0's step, more than {what} "
        f"allows ({size(limit)}); make the model smaller, or spread it over more ranks or "
        "hosts")
    assert "Traceback" not in err and not (out / "metrics.jsonl").exists()


LIMITED = """
import resource, sys
resource.setrlimit(resource.RLIMIT_AS, (2**30, resource.RLIM_INFINITY))
from mf_train.launch.cli import run
sys.exit(run(sys.argv[1:]))
"""


@pytest.mark.slow  # a process of its own (about 8 s): the limit cannot be set in pytest's
def test_an_address_space_limit_is_one_line(data_prefix, tmp_path) -> None:
    """`ulimit -v 1048576`: the build fails to allocate; one line with the limit and the
    estimate, no traceback."""
    result = subprocess.run([sys.executable, "-c", LIMITED,
                             *small(data_prefix, tmp_path / "out", 2)],
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 1, result.stderr[-2000:]
    last = result.stderr.strip().splitlines()[-1]
    assert re.fullmatch(r"mf-train: out of memory on rank 0 \(.+\): the address-space limit "
                        r"\(ulimit -v\) allows 1\.00 GiB; mf-memory estimates [\d.]+ MiB for "
                        r"rank 0's step \(MindSpore and Python need more beside it\); raise "
                        r"the limit, or make the run smaller", last), last
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("link", [
    "tensorboard", "tensorboard/events.out.tfevents.1.host.0", "profile",
    "profile/rank_0/host_1_ascend_ms/trace.json", "hang", "hang/rank_0.txt",
    "logs/scheduler.log", "logs/worker_0.log", "moe_tokens/rank_0.jsonl"])
def test_a_symlink_where_the_run_or_mindspore_writes_is_refused(tmp_path: Path,
                                                                link: str) -> None:
    """TensorBoard's events, the profiler's trees, the hang reports, msrun's and the ranks'
    logs, the MoE counts: written by the run, tensorboardX, MindSpore or msrun, which would
    follow a link and write over (or append to) what it points to. A link at such a place, or
    at one of those directories, is refused before anything starts; its target is kept."""
    target = tmp_path / "precious"
    target.mkdir()
    (target / "keep.txt").write_text("precious")
    planted = tmp_path / "out" / link
    planted.parent.mkdir(parents=True, exist_ok=True)
    planted.symlink_to(target if "." not in planted.name else target / "keep.txt")
    with pytest.raises(RunDirectoryError) as exc:
        claim(tmp_path / "out", CheckpointConfig(),
              also=[(tmp_path / "out" / "tensorboard", "monitor.tensorboard.output_dir")])
    assert str(exc.value).startswith(f"{planted} is a symbolic link")
    assert str(exc.value).endswith(")") and "\n" not in str(exc.value)
    assert (target / "keep.txt").read_text() == "precious"
    assert [p.name for p in target.iterdir()] == ["keep.txt"]


@pytest.mark.parametrize(("option", "link", "refused"), [
    ("monitor.tensorboard.output_dir", "events.out.tfevents.1.host.0", True),
    ("monitor.tensorboard.output_dir", "notes.txt", False),
    ("profiler.output_path", "rank_1", True),
    ("profiler.output_path", "rank_0/trace.json", True),
    ("profiler.output_path", "elsewhere", False)])
def test_links_in_a_chosen_directory_are_refused_where_the_run_writes(
        tmp_path: Path, option: str, link: str, refused: bool) -> None:
    """A TensorBoard or profiler directory the user chose may be a link, and may hold the
    user's own links; only where the run writes in it (event files, `rank_<r>`) is a link
    refused."""
    chosen = tmp_path / "chosen"
    planted = chosen / link
    planted.parent.mkdir(parents=True)
    (tmp_path / "target.txt").write_text("precious")
    planted.symlink_to(tmp_path / "target.txt")
    also = [(chosen, option)]
    if refused:
        with pytest.raises(RunDirectoryError, match=f"^{re.escape(str(planted))} is a "):
            claim(tmp_path / "out", CheckpointConfig(), also=also)
    else:
        claim(tmp_path / "out", CheckpointConfig(), also=also).release()
    assert (tmp_path / "target.txt").read_text() == "precious"


def test_a_symlinked_tensorboard_event_file_stops_mf_train(data_prefix, tmp_path: Path,
                                                           capsys) -> None:
    """Through the command: a link among the event files of monitor.tensorboard.output_dir is
    one line, status 2, before any rank starts."""
    events = tmp_path / "events"
    events.mkdir()
    (tmp_path / "target.txt").write_text("precious")
    (events / "events.out.tfevents.1.host.0").symlink_to(tmp_path / "target.txt")
    assert run(small(data_prefix, tmp_path / "out", 1,
                     f"monitor.tensorboard.output_dir={events}")) == 2
    err = capsys.readouterr().err
    assert err.strip().splitlines()[-1] == (
        f"mf-train: {events / 'events.out.tfevents.1.host.0'} is a symbolic link where the "
        "run writes, which mf-train never follows; remove it (the run and MindSpore create "
        "plain files there)")
    assert (tmp_path / "target.txt").read_text() == "precious"
    assert not (tmp_path / "out" / "metrics.jsonl").exists()


@pytest.mark.parametrize(("files", "mine"), [
    ({"common.json": "{not json", "qwen3_tiny-sums-0000000-0000001.json": "{}"}, True),
    ({"sums-0000001-0000002.json": "{}"}, True),
    ({"common.json": "{not json", "notes.txt": "mine"}, False),
    ({"sums.json": "{}"}, False)])
def test_a_checkpoint_with_a_garbled_common_json_is_still_the_runs(tmp_path: Path, files,
                                                                   mine: bool) -> None:
    """A checkpoint whose common.json was garbled or lost is still mf-train's (its ranks'
    checksum files say so): the run falls back from it rather than refusing the save path;
    a directory of the user's stays refused."""
    directory = tmp_path / "ckpt" / iteration_name(4)
    directory.mkdir(parents=True)
    for name, text in files.items():
        (directory / name).write_text(text)
    if mine:
        claim(tmp_path / "out", CheckpointConfig(save_path=str(tmp_path / "ckpt"))).release()
    else:
        with pytest.raises(RunDirectoryError, match="is not a checkpoint mf-train wrote"):
            claim(tmp_path / "out", CheckpointConfig(save_path=str(tmp_path / "ckpt")))
