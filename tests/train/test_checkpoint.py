"""Checkpoints: bit-identical round trips, MindFormers' layout, rotation, asynchronous saves,
saves killed with SIGKILL at every stage, clear errors, and Hugging Face bf16 safetensors."""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
import signal
import struct
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import mindspore as ms
import numpy as np
import pytest
from checkpoint_samples import SHAPES, arrays, config, optimizer_state, save, train_state
from hypothesis import given, settings
from hypothesis import strategies as st
from mindspore import Parameter, Tensor
from safetensors import safe_open
from safetensors_files import write_safetensors_by_hand

from mf_config import CheckpointConfig, ConfigError, ModelConfig, OptimizerConfig
from mf_train.checkpoint import (
    CheckpointError,
    CheckpointManager,
    CorruptCheckpointError,
    RunProgress,
    apply_model_params,
    candidates,
    capture_rng_state,
    check_complete,
    find_checkpoint,
    is_hf_checkpoint,
    load_checkpoint,
    load_hf_weights,
    model_arrays,
    read_tracker,
    restore_rng_state,
    resume,
    writer,
)
from mf_train.checkpoint.atomic import make_owned_dir
from mf_train.checkpoint.pieces import Piece, PieceIndex
from mf_train.checkpoint.reader import load_pieces
from mf_train.models import build_model, hf_state, load_hf_state
from mf_train.optim import build_optimizer

ms.set_context(mode=ms.PYNATIVE_MODE)


def assert_same_bits(left: dict[str, np.ndarray], right: dict[str, np.ndarray]) -> None:
    assert sorted(left) == sorted(right)
    for name in left:
        assert left[name].dtype == right[name].dtype, name
        assert left[name].shape == right[name].shape, name
        assert left[name].tobytes() == right[name].tobytes(), name


def whole(index: PieceIndex) -> dict[str, np.ndarray]:
    """Every tensor of a sharded checkpoint's index, whole."""
    with index:
        return {name: index.read_whole(name) for name in index.names()}


def halves(tensors: dict[str, np.ndarray], rank: int) -> dict[Piece, np.ndarray]:
    """Rank `rank`'s half of each tensor (flat), as a ZeRO or FSDP rank of 2 saves it."""
    pieces = {}
    for name, array in tensors.items():
        flat = array.reshape(-1)
        low, high = (0, flat.size // 2) if rank == 0 else (flat.size // 2, flat.size)
        if high > low:  # a one-element tensor is rank 1's alone
            pieces[Piece(name, array.shape, low, high)] = flat[low:high]
    return pieces


def files_of(directory: Path) -> dict[str, bytes]:
    return {path.name: path.read_bytes() for path in sorted(directory.iterdir())}


# ----- round trip and layout -----

def test_round_trip_is_bit_identical_and_uses_mindformers_layout(tmp_path):
    manager = CheckpointManager(config(tmp_path, prefix="qwen3"))
    save(manager, 3)
    directory = tmp_path / "iteration_00000003"
    assert sorted(os.listdir(tmp_path)) == ["iteration_00000003",
                                            "latest_checkpointed_iteration.txt"]
    assert (tmp_path / "latest_checkpointed_iteration.txt").read_text() == "3"
    assert sorted(os.listdir(directory)) == [
        "common.json", "qwen3-model-0000000-0000001.safetensors",
        "qwen3-opt-0000000-0000001.safetensors", "qwen3-rng-0000000-0000001.json",
        "qwen3-sums-0000000-0000001.json"]
    common = json.loads((directory / "common.json").read_text())
    assert {key: common[key] for key in ("epoch_num", "step_num", "global_step", "loss_scale",
                                         "global_batch_size", "consumed_samples")} == {
        "epoch_num": 0, "step_num": 100, "global_step": 3, "loss_scale": 1.0,
        "global_batch_size": 8, "consumed_samples": 24}
    assert common["world_size"] == 1 and common["has_optimizer"] is True
    model_file = directory / "qwen3-model-0000000-0000001.safetensors"
    assert common["files"][model_file.name] == {
        "bytes": model_file.stat().st_size,
        "sha256": hashlib.sha256(model_file.read_bytes()).hexdigest(),
        "pieces": [[name, list(array.shape), 0, array.size, None]
                   for name, array in arrays(3).items()]}  # each tensor whole, one piece
    assert common["version"] == 3

    model, optim, state = load_checkpoint(tmp_path)
    assert_same_bits(model, arrays(3))
    assert_same_bits(optim, optimizer_state(3))
    assert state == train_state(3)


def test_prefix_empty_and_invalid(tmp_path):
    save(CheckpointManager(config(tmp_path, prefix="")), 1)
    assert "model-0000000-0000001.safetensors" in os.listdir(tmp_path / "iteration_00000001")
    with pytest.raises(ConfigError, match=r"checkpoint\.prefix: 'a/b' must be a file name"):
        CheckpointManager(config(tmp_path, prefix="a/b"))


def test_model_parameters_round_trip_including_bfloat16(tmp_path):
    rng = np.random.default_rng(0)
    source = [("w", Parameter(Tensor(rng.standard_normal((3, 4)).astype(np.float32)), name="w")),
              ("b", Parameter(Tensor(rng.standard_normal((4,)).astype(np.float32))
                              .astype(ms.bfloat16), name="b"))]
    saved = model_arrays(source)
    assert saved["b"].dtype == np.float32  # bfloat16 is stored widened (exact)
    CheckpointManager(config(tmp_path, no_save_optim=True)).save(
        1, saved, None, train_state(1))
    target = [("w", Parameter(Tensor(np.zeros((3, 4), np.float32)), name="w2")),
              ("b", Parameter(Tensor(np.zeros(4, np.float32)).astype(ms.bfloat16), name="b2"))]
    model, _, _ = load_checkpoint(tmp_path, load_optimizer=False)
    apply_model_params(target, model)
    assert target[1][1].dtype == ms.bfloat16
    for (_, before), (_, after) in zip(source, target, strict=True):
        assert before.astype(ms.float32).asnumpy().tobytes() == \
            after.astype(ms.float32).asnumpy().tobytes()


def test_resumed_adamw_run_continues_bit_identically(tmp_path):
    def params():
        rng = np.random.default_rng(1)
        return [(name, Parameter(Tensor(rng.standard_normal(shape).astype(np.float32)),
                                 name=name)) for name, shape in SHAPES.items()]

    def grads(step):
        rng = np.random.default_rng(50 + step)
        return [Tensor(rng.standard_normal(shape).astype(np.float32))
                for shape in SHAPES.values()]

    opt_config = OptimizerConfig(type="AdamW", weight_decay=0.1)
    named = params()
    optimizer = build_optimizer(opt_config, named)
    for step in range(2):
        optimizer.step(grads(step), 1e-2)
    CheckpointManager(config(tmp_path)).save(2, model_arrays(named), optimizer.state_dict(),
                                             train_state(2))
    for step in range(2, 4):
        optimizer.step(grads(step), 1e-2)

    resumed_named = [(name, Parameter(Tensor(np.zeros(shape, np.float32)), name=name + "_r"))
                     for name, shape in SHAPES.items()]
    resumed = build_optimizer(opt_config, resumed_named)
    model, optim, state = load_checkpoint(tmp_path)
    apply_model_params(resumed_named, model)
    resumed.load_state_dict(optim)
    assert resumed.global_step == state.global_step == 2
    for step in range(2, 4):
        resumed.step(grads(step), 1e-2)
    assert_same_bits(model_arrays(named), model_arrays(resumed_named))


def test_rng_state_restores_python_numpy_and_mindspore(tmp_path):
    random.seed(5)
    np.random.seed(6)
    ms.manual_seed(7)
    state = capture_rng_state()
    first = (random.random(), np.random.standard_normal(3).tolist(), random.gauss(0, 1))
    ms.set_rng_state(Tensor(np.arange(16, dtype=np.uint8)))
    CheckpointManager(config(tmp_path)).save(1, arrays(1), optimizer_state(1),
                                             train_state(1, rng=state))
    loaded = load_checkpoint(tmp_path).state.rng
    assert loaded == json.loads(json.dumps(state))
    restore_rng_state(loaded)
    assert (random.random(), np.random.standard_normal(3).tolist(), random.gauss(0, 1)) == first
    assert ms.get_rng_state().asnumpy().tolist() == [7] + [0] * 15  # seed 7, offset 0


def test_save_captures_rng_when_state_has_none(tmp_path):
    np.random.seed(11)
    expected = np.random.get_state()[1].tolist()
    state = RunProgress(global_step=1, consumed_samples=4, global_batch_size=4)
    CheckpointManager(config(tmp_path)).save(1, arrays(1), optimizer_state(1), state)
    assert load_checkpoint(tmp_path).state.rng["numpy"]["keys"] == expected


def test_train_state_rescaled_follows_mindformers_rule():
    state = RunProgress(global_step=10, consumed_samples=80, global_batch_size=8)
    assert state.rescaled(16) == RunProgress(global_step=5, consumed_samples=80,
                                            global_batch_size=16)
    assert state.rescaled(3).global_step == int(10 * 8 / 3)
    assert RunProgress.from_common({"global_step": 4, "global_batch_size": 8}, None,
                                  "x").consumed_samples == 32  # MindFormers' fallback


# ----- when and how many -----

def test_should_save_interval_last_and_never_twice(tmp_path):
    manager = CheckpointManager(config(tmp_path, save_interleaved_steps=3))
    assert [s for s in range(0, 8) if manager.should_save(s)] == [3, 6]
    assert manager.should_save(7, last=True)
    save(manager, 6)
    assert not manager.should_save(6, last=True)
    off = CheckpointManager(config(tmp_path, enable_save=False, save_interleaved_steps=1))
    assert not off.should_save(1, last=True)


def test_save_max_keeps_newest_and_cleans_leftovers(tmp_path):
    """Leftovers of a killed save or deletion (marked as mf-train's) are cleaned up; a user's
    directories named like them are kept, with what they hold."""
    manager = CheckpointManager(config(tmp_path, save_max=2))
    for name in ("iteration_00000009.tmp-999", "iteration_00000001.del-999"):  # killed
        make_owned_dir(tmp_path / name)
        (tmp_path / name / "part.safetensors").write_text("half")
    for name in ("iteration_00000009.tmp-mine", "iteration_00000002.del-notes"):  # a user's
        (tmp_path / name).mkdir()
        (tmp_path / name / "notes.txt").write_text("mine")
    for step in range(1, 6):
        save(manager, step)
    assert sorted(os.listdir(tmp_path)) == [
        "iteration_00000002.del-notes", "iteration_00000004", "iteration_00000005",
        "iteration_00000009.tmp-mine", "latest_checkpointed_iteration.txt"]
    assert (tmp_path / "iteration_00000009.tmp-mine" / "notes.txt").read_text() == "mine"
    assert (tmp_path / "iteration_00000002.del-notes" / "notes.txt").read_text() == "mine"
    assert find_checkpoint(tmp_path) == tmp_path / "iteration_00000005"


def test_save_max_never_deletes_the_checkpoint_just_written(tmp_path):
    """A run resumed from step 2 while a diverged earlier run left steps 7 and 8."""
    save(CheckpointManager(config(tmp_path, save_max=5)), 7)
    save(CheckpointManager(config(tmp_path, save_max=5)), 8)
    manager = CheckpointManager(config(tmp_path, save_max=2))
    save(manager, 3)
    assert sorted(p.name for p in tmp_path.glob("iteration_*")) == [
        "iteration_00000003", "iteration_00000008"]
    assert read_tracker(tmp_path) == 3
    assert find_checkpoint(tmp_path) == tmp_path / "iteration_00000003"


@pytest.mark.parametrize("async_save", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("kind", ["model", "optimizer"])
def test_a_state_not_finite_is_never_committed(tmp_path, kind, async_save):
    """A diverged step's state (a NaN or an infinity in any tensor) is written, found and
    thrown away: the finite checkpoint stays the newest, kept by save_max 1, and tracked."""
    manager = CheckpointManager(config(tmp_path, save_max=1, async_save=async_save))
    save(manager, 2)
    model, state = arrays(3), optimizer_state(3)
    (model if kind == "model" else state)[f"{'' if kind == 'model' else 'adam_m.'}"
                                          "norm.weight"][3] = np.inf
    manager.save(3, model, state, train_state(3))
    manager.wait()
    assert manager.poll() == [(2, tmp_path / "iteration_00000002")]
    assert sorted(os.listdir(tmp_path)) == ["iteration_00000002",
                                            "latest_checkpointed_iteration.txt"]
    assert read_tracker(tmp_path) == 2
    save(manager, 4)  # a finite state again is saved as ever
    manager.wait()
    assert find_checkpoint(tmp_path) == tmp_path / "iteration_00000004"


def test_saving_a_step_again_replaces_it(tmp_path):
    manager = CheckpointManager(config(tmp_path))
    save(manager, 2)
    CheckpointManager(config(tmp_path)).save(2, arrays(9), optimizer_state(9), train_state(2))
    assert_same_bits(load_checkpoint(tmp_path).model_params, arrays(9))
    assert [p.name for p in tmp_path.iterdir() if p.is_dir()] == ["iteration_00000002"]


def test_no_save_optim_and_no_load_optim(tmp_path):
    manager = CheckpointManager(config(tmp_path, no_save_optim=True))
    manager.save(1, arrays(1), optimizer_state(1), train_state(1))
    assert not list((tmp_path / "iteration_00000001").glob("*-opt-*"))
    message = (f"no_load_optim is False but no optimizer checkpoint found in "
               f"{tmp_path / 'iteration_00000001'}")
    with pytest.raises(CheckpointError, match=message.replace(".", r"\.")):
        load_checkpoint(tmp_path)
    with pytest.raises(CheckpointError, match="no_load_optim is False"):
        resume(CheckpointConfig(load_path=str(tmp_path)))
    resumed = resume(CheckpointConfig(load_path=str(tmp_path), no_load_optim=True))
    assert resumed.kind == "pieces" and resumed.optimizer_state is None
    assert_same_bits(whole(resumed.model_params), arrays(1))
    with pytest.raises(ValueError, match="no_save_optim is False but no optimizer state"):
        CheckpointManager(config(tmp_path)).save(2, arrays(2), None, train_state(2))


# ----- asynchronous saving -----

def test_async_save_writes_the_same_files_as_sync(tmp_path):
    sync, asyn = tmp_path / "sync", tmp_path / "async"
    save(CheckpointManager(config(sync)), 4)
    manager = CheckpointManager(config(asyn, async_save=True))
    save(manager, 4)
    manager.wait()
    assert files_of(sync / "iteration_00000004") == files_of(asyn / "iteration_00000004")
    assert read_tracker(asyn) == 4


def test_async_save_returns_while_the_write_is_still_running(tmp_path, monkeypatch):
    release, events = threading.Event(), []
    real_write = writer.write_safetensors_streamed

    def gated_write(path, tensors, metadata=None):
        events.append("writer started")
        assert release.wait(timeout=30)
        events.append("writer finished")
        return real_write(path, tensors, metadata)

    monkeypatch.setattr(writer, "write_safetensors_streamed", gated_write)
    manager = CheckpointManager(config(tmp_path, async_save=True))
    model = arrays(1)
    manager.save(1, model, optimizer_state(1), train_state(1))
    events.append("save returned")
    # The caller runs on while the writer is blocked: nothing is committed yet ...
    assert not (tmp_path / "iteration_00000001").exists()
    assert read_tracker(tmp_path) is None
    model["embed.weight"][:] = 123.0  # ... and the next step may change the arrays freely.
    release.set()
    manager.wait()
    assert events.index("save returned") < events.index("writer finished")
    assert_same_bits(load_checkpoint(tmp_path).model_params, arrays(1))


def test_async_error_is_raised_by_the_next_call(tmp_path, monkeypatch):
    def failing_write(path, tensors, metadata=None):
        raise OSError("No space left on device")

    manager = CheckpointManager(config(tmp_path, async_save=True))
    monkeypatch.setattr(writer, "write_safetensors_streamed", failing_write)
    save(manager, 1)
    with pytest.raises(CheckpointError, match=r"asynchronous save of checkpoint step 1 .*"
                                              r"No space left on device"):
        manager.wait()
    manager.wait()  # reported once
    save(manager, 2)
    monkeypatch.undo()
    with pytest.raises(CheckpointError, match="step 2"):
        save(manager, 3)  # the next save reports the failure before starting
    save(manager, 4)
    manager.wait()
    assert find_checkpoint(tmp_path) == tmp_path / "iteration_00000004"


# ----- several ranks -----

def run_ranks(world: int, body) -> list[BaseException]:
    """Run `body(rank, barrier)` for each rank in its own thread; the exceptions raised. A
    rank that skips a barrier makes the others fail after 30 s instead of hanging."""
    errors: list[BaseException] = []
    gate = threading.Barrier(world, timeout=30)

    def one(rank):
        try:
            body(rank, gate.wait)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=one, args=(rank,)) for rank in range(world)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return errors


@pytest.mark.parametrize("async_save", [False, True])
def test_two_ranks_write_one_checkpoint(tmp_path, async_save):
    seen_before_wait = []

    """Each rank writes its half of every tensor; one process reads them whole, and a rank
    reading a range across the halves gets it from both files."""
    def body(rank, barrier):
        manager = CheckpointManager(config(tmp_path, async_save=async_save), rank, 2, barrier)
        manager.save(5, halves(arrays(5), rank), halves(optimizer_state(5), rank),
                     train_state(5))
        seen_before_wait.append((tmp_path / "iteration_00000005").exists())
        manager.wait()

    assert run_ranks(2, body) == []
    # with several ranks an asynchronous save is committed in wait(), not by the thread
    assert seen_before_wait == [not async_save] * 2
    directory = tmp_path / "iteration_00000005"
    common = json.loads((directory / "common.json").read_text())
    assert common["world_size"] == 2 and len(common["files"]) == 8  # 4 files per rank
    for rank in range(2):  # each file holds its rank's halves only
        with safe_open(str(directory / f"checkpoint-model-{rank:07d}-0000002.safetensors"),
                       "numpy") as file:
            keys = list(file.keys())  # a safe_open handle is not iterable
            assert {key: file.get_tensor(key).size for key in keys} == {
                piece.key: piece.stop - piece.start for piece in halves(arrays(5), rank)}
    loaded = load_checkpoint(tmp_path)
    assert_same_bits(loaded.model_params, arrays(5))
    assert_same_bits(loaded.optimizer_state, optimizer_state(5))
    model, _, state = load_pieces(directory, rank=0, world_size=3, load_optimizer=False)
    assert state.rng is None  # another world size: the generators are not restored
    with model:
        flat = arrays(5)["embed.weight"].reshape(-1)
        assert np.array_equal(model.read_range("embed.weight", 7, 33), flat[7:33])


@pytest.mark.parametrize("async_save", [False, True])
def test_a_failing_rank_blocks_the_commit_without_hanging_the_others(tmp_path, monkeypatch,
                                                                     async_save):
    real_write = writer.write_safetensors_streamed

    def write(path, tensors, metadata=None):
        if "-0000001-" in path.name:
            raise OSError("rank 1 disk failure")
        return real_write(path, tensors, metadata)

    monkeypatch.setattr(writer, "write_safetensors_streamed", write)

    def body(rank, barrier):
        manager = CheckpointManager(config(tmp_path, async_save=async_save), rank, 2, barrier)
        manager.save(1, arrays(rank), optimizer_state(rank), train_state(1))
        manager.wait()

    errors = run_ranks(2, body)
    assert sorted(str(e).split(":")[0] for e in errors) == [
        f"saving checkpoint step 1 to {tmp_path} failed on rank 0",
        f"saving checkpoint step 1 to {tmp_path} failed on rank 1"]
    assert "(rank 1 did not finish), not committed" in " ".join(map(str, errors))
    assert find_checkpoint(tmp_path) is None


# ----- crashes -----

def test_tracker_only_ever_names_a_complete_checkpoint(tmp_path, monkeypatch):
    observed = []

    def check(stage):
        tracked = read_tracker(tmp_path)
        observed.append((stage, tracked))
        assert find_checkpoint(tmp_path / f"iteration_{tracked:08d}")  # complete, loads

    manager = CheckpointManager(config(tmp_path, save_max=1))
    save(manager, 1)
    monkeypatch.setattr(writer, "_reached", check)
    save(manager, 2)
    assert observed == [("rank_files", 1), ("common", 1), ("renamed", 1), ("tracker", 2),
                        ("rotated", 2)]


KILL_WORKER = textwrap.dedent("""
    import os, shutil, sys, time
    import numpy as np
    from mf_config import CheckpointConfig
    from mf_train.checkpoint import CheckpointManager, RunProgress, atomic, writer

    root, stop_at = sys.argv[1], sys.argv[2]

    def stop(where):
        print("STOPPED", where, flush=True)
        time.sleep(60)

    def arrays(seed):
        rng = np.random.default_rng(seed)
        return {"w": rng.standard_normal((64, 64)).astype(np.float32)}

    manager = CheckpointManager(CheckpointConfig(save_path=root, save_max=1))
    state = lambda step: RunProgress(global_step=step, consumed_samples=step,
                                    global_batch_size=1, rng={})
    manager.save(1, arrays(1), {"global_step": np.array([1])}, state(1))
    if stop_at == "mid_file":
        def half_file(part, path):  # the first file's bytes half on disk, not renamed
            with open(part, "r+b") as handle:
                handle.truncate(os.path.getsize(part) // 2)
            stop("mid_file")
        atomic.commit_file = half_file
    elif stop_at == "deleting":
        renamed = atomic.os.replace

        def replace(source, target):  # killed once the doomed directory has its .del- name
            renamed(source, target)
            if ".del-" in str(target):
                stop("deleting")
        atomic.os.replace = replace
    else:
        writer._reached = lambda stage: stage == stop_at and stop(stage)
    manager.save(2, arrays(2), {"global_step": np.array([2])}, state(2))
    print("FINISHED", flush=True)
""")


def arrays_w(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((64, 64)).astype(np.float32)


def test_sigkill_at_any_stage_leaves_a_complete_checkpoint(tmp_path):
    # where the save is killed -> the step find_checkpoint must then return
    cases = {"mid_file": 1, "rank_files": 1, "common": 1, "renamed": 1, "deleting": 2}
    script = tmp_path / "worker.py"
    script.write_text(KILL_WORKER)
    workers = {}
    for stage in cases:
        with open(tmp_path / f"{stage}.err", "w") as stderr:
            workers[stage] = subprocess.Popen(
                [sys.executable, str(script), str(tmp_path / stage), stage],
                stdout=subprocess.PIPE, stderr=stderr, text=True)
    try:
        for stage, worker in workers.items():
            line = worker.stdout.readline().strip()
            assert line == f"STOPPED {stage}", (tmp_path / f"{stage}.err").read_text()[-3000:]
            os.kill(worker.pid, signal.SIGKILL)
            worker.wait(timeout=30)
    finally:
        for worker in workers.values():
            if worker.poll() is None:
                worker.kill()
                worker.wait()
            worker.stdout.close()
    for stage, step in cases.items():
        root = tmp_path / stage
        leftovers = [p.name for p in root.iterdir() if ".tmp-" in p.name or ".del-" in p.name]
        if stage == "renamed":  # killed between the rename and the tracker
            assert (root / "iteration_00000002").is_dir() and read_tracker(root) == 1
        else:
            assert leftovers, stage  # the kill really happened mid-save
        found = find_checkpoint(root)
        assert found == root / f"iteration_{step:08d}", stage
        model, optim, state = load_checkpoint(root)
        assert_same_bits(model, {"w": arrays_w(step)})
        assert state.global_step == step and int(optim["global_step"][0]) == step
    # the next save of a restarted run cleans the leftovers up (they hold the mark of a save
    # or a deletion)
    for stage in ("mid_file", "deleting"):
        manager = CheckpointManager(config(tmp_path / stage, save_max=1))
        save(manager, 3)
        assert sorted(os.listdir(tmp_path / stage)) == ["iteration_00000003",
                                                        "latest_checkpointed_iteration.txt"]


# ----- finding and errors -----

def logged(caplog: pytest.LogCaptureFixture) -> list[str]:
    """The WARNING lines mf_train.checkpoint logged (one line each, no source line)."""
    return [record.getMessage() for record in caplog.records
            if record.name.startswith("mf_train.checkpoint") and record.levelname == "WARNING"]


def test_find_checkpoint_paths_and_errors(tmp_path, caplog):
    root = tmp_path / "ckpt"
    assert find_checkpoint(tmp_path) is None  # an existing directory without checkpoints
    manager = CheckpointManager(config(root))
    save(manager, 1)
    save(manager, 2)
    assert find_checkpoint(root / "iteration_00000001") == root / "iteration_00000001"
    with pytest.raises(CheckpointError, match="does not exist"):
        find_checkpoint(tmp_path / "nowhere")
    (root / "iteration_00000003.tmp-77").mkdir()
    with pytest.raises(CheckpointError, match=r"unfinished or discarded save and is never "
                                              r"loaded; load .*ckpt to get"):
        find_checkpoint(root / "iteration_00000003.tmp-77")

    model_file = root / "iteration_00000002" / "checkpoint-model-0000000-0000001.safetensors"
    model_file.write_bytes(model_file.read_bytes()[:-4])
    with pytest.raises(CheckpointError, match=r"iteration_00000002 is not a complete checkpoint"
                                              r":\n  .*model-0000000-0000001\.safetensors: "
                                              r"\d+ bytes, common\.json records \d+"):
        find_checkpoint(root / "iteration_00000002")
    caplog.clear()
    assert find_checkpoint(root) == root / "iteration_00000001"
    assert logged(caplog) == [f"{root / 'latest_checkpointed_iteration.txt'} names iteration 2, "
                              f"which is not usable ({model_file}: {model_file.stat().st_size} "
                              f"bytes, common.json records {model_file.stat().st_size + 4}); "
                              "loading the newest complete checkpoint "
                              f"{root / 'iteration_00000001'}"]
    model_file.unlink()
    assert [p.endswith("model-0000000-0000001.safetensors: missing")
            for p in check_complete(root / "iteration_00000002")] == [True]
    # a garbled tracker is set aside, with one line saying what happens
    (root / "latest_checkpointed_iteration.txt").write_text("banana")
    caplog.clear()
    assert find_checkpoint(root) == root / "iteration_00000001"
    assert candidates(root) == [root / "iteration_00000001"]
    assert logged(caplog)[0] == (
        f"{root / 'latest_checkpointed_iteration.txt'}: expected an iteration number, got "
        "'banana'; it is set aside: loading the newest complete checkpoint (the next save "
        "rewrites it)")


def test_unreadable_files_are_named(tmp_path):
    save(CheckpointManager(config(tmp_path)), 1)
    directory = tmp_path / "iteration_00000001"
    common = directory / "common.json"
    data = json.loads(common.read_text())
    opt = directory / "checkpoint-opt-0000000-0000001.safetensors"
    opt.write_bytes(b"\xff" * opt.stat().st_size)  # same size, garbage content
    with pytest.raises(CorruptCheckpointError, match=r"opt-0000000-0000001\.safetensors: its "
                                                     r"bytes do not match the SHA-256"):
        load_checkpoint(tmp_path)
    version_1 = {**data, "version": 1,  # sizes only: the garbage is found by the parser
                 "files": {name: entry["bytes"] for name, entry in data["files"].items()}}
    del version_1["sha256"]  # nor did version 1 record common.json's own
    common.write_text(json.dumps(version_1))
    with pytest.raises(CheckpointError, match=r"opt-0000000-0000001\.safetensors: cannot read "
                                              r"it as safetensors"):
        load_checkpoint(tmp_path)
    common.write_text(json.dumps({**data, "format": "other"}))
    with pytest.raises(CheckpointError, match='not an mf checkpoint'):
        load_checkpoint(directory)
    common.write_text("{")
    with pytest.raises(CheckpointError, match=r"common\.json: cannot read it as JSON"):
        load_checkpoint(directory)


def test_apply_model_params_names_every_mismatch():
    named = [(name, Parameter(Tensor(np.zeros(shape, np.float32)), name=name))
             for name, shape in SHAPES.items()]
    values = arrays(0)
    del values["norm.weight"]
    values["embed.weight"] = np.zeros((10, 5), np.float32)
    values["lm_head.weight"] = np.zeros((10, 4), np.float32)
    before = named[1][1].asnumpy().copy()
    with pytest.raises(CheckpointError) as info:
        apply_model_params(named, values)
    assert str(info.value) == (
        "checkpoint does not fit the model (3 problems):\n"
        "  norm.weight: missing (parameter of shape (4,))\n"
        "  lm_head.weight: not a parameter of the model\n"
        "  embed.weight: shape (10, 5), the model's is (10, 4)")
    assert np.array_equal(named[1][1].asnumpy(), before)  # nothing changed


def test_unusable_save_path_is_reported(tmp_path):
    (tmp_path / "file").write_text("")
    manager = CheckpointManager(config(tmp_path / "file" / "ckpt"))
    with pytest.raises(CheckpointError, match=r"cannot create the checkpoint directory "
                                              r".*iteration_00000001\.tmp-\d+: "):
        save(manager, 1)


def test_config_errors(tmp_path, caplog):
    with pytest.raises(ConfigError, match=r"checkpoint\.save_path: save_path must be provided"):
        CheckpointManager(CheckpointConfig())
    CheckpointManager(CheckpointConfig(enable_save=False))  # loading only: fine
    with pytest.raises(ValueError, match="needs a barrier"):
        CheckpointManager(config(tmp_path), rank=1, world_size=2)
    with pytest.raises(ConfigError, match=r"checkpoint\.load_path: .*nowhere does not exist"):
        resume(CheckpointConfig(load_path=str(tmp_path / "nowhere")))
    assert resume(CheckpointConfig()) is None
    caplog.clear()
    assert resume(CheckpointConfig(load_path=str(tmp_path))) is None
    assert logged(caplog) == [f"checkpoint.load_path {tmp_path} holds no complete checkpoint "
                              "yet; training starts from scratch"]
    with pytest.raises(CheckpointError, match="RNG state lacks mindspore"):
        restore_rng_state({"python": {}, "numpy": {}})


# ----- Hugging Face safetensors -----

def bf16_value(bits: int) -> float:
    """bfloat16 decoded from its fields: sign, 8 exponent bits (bias 127), 7 mantissa bits."""
    sign = -1.0 if bits >> 15 else 1.0
    exponent, mantissa = (bits >> 7) & 0xFF, bits & 0x7F
    if exponent == 0:
        return sign * 2.0 ** -126 * mantissa / 128
    return sign * 2.0 ** (exponent - 127) * (1 + mantissa / 128)


def test_hf_bf16_f16_f32_shards_are_read_as_float32(tmp_path):
    bits = [0x3F80, 0xC020, 0x4049, 0x0001, 0x7F7F, 0x8000]  # 1, -2.5, 3.140625, tiny, max, -0
    f16 = np.array([0.5, -1.25], dtype="<f2")
    f32 = np.arange(6, dtype="<f4").reshape(2, 3) / 7
    write_safetensors_by_hand(tmp_path / "model-00001-of-00002.safetensors", {
        "model.embed_tokens.weight": ("BF16", (2, 3), struct.pack("<6H", *bits)),
        "model.norm.weight": ("F16", (2,), f16.tobytes())})
    write_safetensors_by_hand(tmp_path / "model-00002-of-00002.safetensors", {
        "lm_head.weight": ("F32", (2, 3), f32.tobytes())})
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {
        "model.embed_tokens.weight": "model-00001-of-00002.safetensors",
        "model.norm.weight": "model-00001-of-00002.safetensors",
        "lm_head.weight": "model-00002-of-00002.safetensors"}}))
    assert is_hf_checkpoint(tmp_path)
    tensors = load_hf_weights(tmp_path)
    assert all(value.dtype == np.float32 for value in tensors.values())
    embed = tensors["model.embed_tokens.weight"]
    assert embed.shape == (2, 3)
    assert [float(v) for v in embed.ravel()] == [bf16_value(b) for b in bits]
    assert np.signbit(embed.ravel()[5])
    assert tensors["model.norm.weight"].tolist() == [0.5, -1.25]
    assert np.array_equal(tensors["lm_head.weight"], f32)

    resumed = resume(CheckpointConfig(load_path=str(tmp_path), no_load_optim=True))
    assert resumed.kind == "hf" and resumed.state is None
    assert sorted(resumed.model_params.names) == sorted(tensors)
    with pytest.raises(ConfigError, match=r"checkpoint\.no_load_optim: Resume training "
                                          r"\(no_load_optim=False\) is not supported for "
                                          r"HuggingFace checkpoints"):
        resume(CheckpointConfig(load_path=str(tmp_path)))


def test_hf_errors_name_the_file_and_tensor(tmp_path):
    bad = tmp_path / "fp8.safetensors"
    write_safetensors_by_hand(bad, {"w": ("F8_E5M2", (2,), b"\x01\x02")})
    with pytest.raises(CheckpointError, match=r"fp8\.safetensors: tensor w: dtype F8_E5M2 is "
                                              r"not supported"):
        load_hf_weights(bad)
    write_safetensors_by_hand(bad, {"w": ("F8_E4M3", (1, 2), b"\x01\x02")})
    with pytest.raises(CheckpointError, match=r"w: an FP8 \(F8_E4M3\) weight without "
                                              r"w_scale_inv"):
        load_hf_weights(bad)
    short = tmp_path / "short" / "model.safetensors"
    short.parent.mkdir()
    write_safetensors_by_hand(short, {"w": ("F32", (3,), b"\x00" * 8)})
    with pytest.raises(CheckpointError, match=r"tensor w: data_offsets \[0, 8\] do not hold "
                                              r"F32 \[3\] \(12 bytes\)"):
        load_hf_weights(short.parent)
    (tmp_path / "idx").mkdir()
    (tmp_path / "idx" / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {"w": "model-1.safetensors"}}))
    with pytest.raises(CheckpointError, match="lists files that are missing: model-1"):
        load_hf_weights(tmp_path / "idx")
    (tmp_path / "empty").mkdir()
    with pytest.raises(CheckpointError, match=r"holds no \*\.safetensors files"):
        load_hf_weights(tmp_path / "empty")
    assert not is_hf_checkpoint(tmp_path / "empty")
    save(CheckpointManager(config(tmp_path / "mf")), 1)
    assert not is_hf_checkpoint(tmp_path / "mf")


def test_tiny_qwen3_through_hf_bf16_and_mf_checkpoints(tmp_path):
    sizes = {"vocab_size": 32, "hidden_size": 16, "intermediate_size": 24,
             "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1,
             "head_dim": 8, "max_position_embeddings": 16}
    source = build_model(ModelConfig(model_type="qwen3", extras=sizes), seed=1)
    full = hf_state(source)
    bits = {name: (value.view(np.uint32) >> 16).astype("<u2") for name, value in full.items()}
    write_safetensors_by_hand(tmp_path / "model.safetensors", {
        name: ("BF16", value.shape, value.tobytes()) for name, value in bits.items()})
    hf_model = build_model(ModelConfig(model_type="qwen3", extras=sizes), seed=2)
    load_hf_state(hf_model, load_hf_weights(tmp_path / "model.safetensors"))
    truncated = {name: (b.astype(np.uint32) << 16).view(np.float32) for name, b in bits.items()}
    assert_same_bits(hf_state(hf_model), truncated)  # bf16 = the float32's upper 16 bits

    CheckpointManager(config(tmp_path / "mf", no_save_optim=True)).save(
        1, model_arrays(hf_model.parameters_and_names()), None, train_state(1))
    copy = build_model(ModelConfig(model_type="qwen3", extras=sizes), seed=3)
    model, _, _ = load_checkpoint(tmp_path / "mf", load_optimizer=False)
    apply_model_params(copy.parameters_and_names(), model)
    ids = Tensor(np.arange(8, dtype=np.int32).reshape(1, 8))
    assert copy.logits(ids).asnumpy().tobytes() == hf_model.logits(ids).asnumpy().tobytes()


# ----------------------------------------------------------------- checksums and async faults


def flip_a_byte(path: Path) -> None:
    """Change one byte in the middle of `path`, keeping its size (damage sizes do not see)."""
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def test_a_corrupt_checkpoint_falls_back_to_the_newest_valid_one(tmp_path, caplog):
    manager = CheckpointManager(config(tmp_path))
    for step in (1, 2, 3):
        save(manager, step)
    flip_a_byte(tmp_path / "iteration_00000003" / "checkpoint-opt-0000000-0000001.safetensors")
    flip_a_byte(tmp_path / "iteration_00000002" / "checkpoint-rng-0000000-0000001.json")
    assert find_checkpoint(tmp_path) == tmp_path / "iteration_00000003"  # sizes are intact
    resumed = resume(config(tmp_path, load_path=str(tmp_path)))
    assert resumed.path == tmp_path / "iteration_00000001"
    assert resumed.state.global_step == 1
    assert_same_bits(whole(resumed.model_params), arrays(1))
    messages = logged(caplog)
    assert messages[0].startswith(f"{tmp_path / 'iteration_00000003'} is corrupt (")
    assert "opt-0000000-0000001.safetensors: its bytes do not match the SHA-256" in messages[0]
    assert messages[0].endswith("): it is not resumed; trying the next newest complete "
                                "checkpoint")
    assert messages[1].startswith(f"{tmp_path / 'iteration_00000002'} is corrupt (")
    named = tmp_path / "iteration_00000003"  # asked for by name: no fallback
    with pytest.raises(CorruptCheckpointError, match="its bytes do not match"):
        resume(config(tmp_path, load_path=str(named)))


def test_every_rank_falls_back_when_one_finds_its_file_corrupt(tmp_path):
    """Rank 1's file of step 2 is damaged; rank 0's are fine: both load step 1."""
    def body(rank, barrier):
        manager = CheckpointManager(config(tmp_path), rank, 2, barrier)
        for step in (1, 2):
            manager.save(step, arrays(step + rank), optimizer_state(step), train_state(step))

    assert run_ranks(2, body) == []
    flip_a_byte(tmp_path / "iteration_00000002" / "checkpoint-model-0000001-0000002.safetensors")
    votes: list[bool] = []
    gate = threading.Barrier(2, timeout=30)
    chosen: dict[int, Path] = {}

    def agree(ok: bool) -> bool:  # an all-reduce of the two ranks' verdicts
        votes.append(ok)
        gate.wait()
        verdict = all(votes[-2:])
        gate.wait()
        return verdict

    def load(rank, _barrier):
        chosen[rank] = resume(config(tmp_path, load_path=str(tmp_path)), rank, 2,
                              agree=agree).path

    assert run_ranks(2, load) == []
    assert chosen == {0: tmp_path / "iteration_00000001", 1: tmp_path / "iteration_00000001"}


def test_a_failed_async_save_is_reported_by_the_next_poll(tmp_path, monkeypatch):
    real_write = writer.write_safetensors_streamed

    def write(path, tensors, metadata=None):
        if "iteration_00000002" in str(path):
            raise OSError(28, "No space left on device")
        return real_write(path, tensors, metadata)

    monkeypatch.setattr(writer, "write_safetensors_streamed", write)
    manager = CheckpointManager(config(tmp_path, async_save=True))
    save(manager, 1)
    manager.wait()
    assert manager.poll() == [(1, tmp_path / "iteration_00000001")]
    save(manager, 2)
    manager._thread.join()  # the write is over: the next step's poll must say it failed
    with pytest.raises(CheckpointError) as failed:
        manager.poll()
    assert re.fullmatch(  # the directory, this rank's bytes (552: 68 + 68 float32, 1 int64)
        re.escape(f"the asynchronous save of checkpoint step 2 to {tmp_path} failed: no space "
                  f"left in {tmp_path / 'iteration_00000002'}.tmp-{os.getpid()} (No space left "
                  f"on device): this rank's files of the checkpoint need {552 / 2**20:.1f} MiB, "
                  "free there: ") + r"[\d.]+ MiB" + re.escape(
            "; free some space and run the same command; the newest complete checkpoint is "
            f"{tmp_path / 'iteration_00000001'}"), str(failed.value)), str(failed.value)
    assert manager.poll() == []  # reported once; nothing was saved


@pytest.fixture(scope="module")
def saved_once(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("corrupt")
    save(CheckpointManager(config(root)), 1)
    return root / "iteration_00000001"


@settings(max_examples=25, deadline=None)
@given(kind=st.sampled_from(["model", "opt", "rng"]), where=st.floats(0, 1), bit=st.integers(0, 7))
def test_any_flipped_bit_of_a_file_is_found(saved_once, kind, where, bit) -> None:
    """Whichever file and bit: the load fails with the file named, never a silent load."""
    suffix = "json" if kind == "rng" else "safetensors"
    path = saved_once / f"checkpoint-{kind}-0000000-0000001.{suffix}"
    original = path.read_bytes()
    damaged = bytearray(original)
    damaged[min(int(where * len(damaged)), len(damaged) - 1)] ^= 1 << bit
    path.write_bytes(bytes(damaged))
    try:
        with pytest.raises(CorruptCheckpointError, match=f"{kind}-0000000-0000001"):
            load_checkpoint(saved_once)
    finally:
        path.write_bytes(original)
