"""The trainer end to end on the tiny example: real data built by mf-data, real model and
optimizer; the loss falls, samples are consumed in order, and the launcher validates first."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("mindspore")

from mf_config import load_config
from mf_train.launch.cli import run
from mf_train.trainer import Trainer

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "qwen3_tiny.yaml"



def overrides(prefix: str, steps: int, *more: str) -> list[str]:
    return [*more, f"train_dataset.dataloader.config.data_path=['1','{prefix}']",
            f"training.steps={steps}", "model.hidden_size=32",
            "model.intermediate_size=64", "model.head_dim=8",
            "train_dataset.dataloader.config.seq_length=32",
            "model.max_position_embeddings=32", "recompute.mode=None",
            "lr_scheduler.warmup_steps=1"]


def test_the_loss_falls_and_samples_are_consumed(data_prefix, tmp_path) -> None:
    config = load_config(EXAMPLE, overrides(data_prefix, 6, "checkpoint.save_path=''"))
    trainer = Trainer(config, output_dir=tmp_path)
    outcomes = trainer.train()
    assert len(outcomes) == 6 and trainer.step_count == 6
    assert trainer.consumed_samples == 6 * config.training.global_batch_size
    assert outcomes[-1].loss < outcomes[0].loss - 0.05
    assert all(o.tokens == 4 * 32 for o in outcomes)  # global batch 4 x seq 32, one process
    lines = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    steps = [line for line in lines if "event" not in line]
    assert [line["step"] for line in steps] == [1, 2, 3, 4, 5, 6]
    assert [line["loss"] for line in steps] == [o.loss for o in outcomes]
    assert {"lr", "grad_norm", "step_time", "tokens_per_s"} <= set(steps[0])
    assert steps[0]["lr"] == 0.0  # warm-up of 1 step from 0
    assert steps[1]["lr"] == pytest.approx(config.lr_scheduler.learning_rate)
    assert list((tmp_path / "tensorboard").iterdir())
    # an empty save_path means <output-dir>/checkpoint; saved at step 6 (the last)
    assert (tmp_path / "checkpoint" / "latest_checkpointed_iteration.txt").read_text() == "6"


def test_two_runs_are_bit_identical(data_prefix, tmp_path) -> None:
    losses = []
    for name in ("a", "b"):
        config = load_config(EXAMPLE, overrides(data_prefix, 3, "checkpoint.enable_save=false"))
        losses.append([o.loss for o in Trainer(config, output_dir=tmp_path / name).train()])
    assert losses[0] == losses[1]


def test_launcher_rejects_a_bad_file_before_touching_anything(tmp_path, capsys) -> None:
    bad = tmp_path / "train.yaml"
    bad.write_text(EXAMPLE.read_text().replace("local_batch_size: 2", "local_batch_size: 8"))
    assert run(["--config", str(bad), "--output-dir", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    line = bad.read_text().splitlines().index("  local_batch_size: 8") + 1
    assert f"{bad}:{line}: training.local_batch_size" in err
    assert not (tmp_path / "out").exists()


def test_launcher_damaged_data_is_one_line(data_prefix, tmp_path, capsys) -> None:
    """Data that is there but damaged (the corpus' index beside an empty .bin) is found before
    any rank starts, as missing data is (test_input_checks.py): status 2 and one line at the
    prefix's value."""
    Path(f"{tmp_path}/truncated.idx").write_bytes(Path(f"{data_prefix}.idx").read_bytes())
    Path(f"{tmp_path}/truncated.bin").write_bytes(b"")
    code = run(["--config", str(EXAMPLE), "--output-dir", str(tmp_path / "out"),
                *[arg for o in overrides(f"{tmp_path}/truncated", 1) for arg in ("--set", o)]])
    assert code == 2
    err = capsys.readouterr().err
    assert "train_dataset.dataloader.config.data_path[1]: " in err
    assert "truncated.bin: sizes disagree" in err
    assert "Traceback" not in err


def test_launcher_unknown_lr_key(tmp_path, capsys, data_prefix) -> None:
    code = run(["--config", str(EXAMPLE), "--output-dir", str(tmp_path),
                "--set", "lr_scheduler.min_lr=1e-5",
                *[arg for o in overrides(data_prefix, 1) for arg in ("--set", o)]])
    assert code == 2
    assert "lr_scheduler.min_lr" in capsys.readouterr().err


@pytest.mark.parametrize("compiled", [False, True], ids=["pynative", "compiled"])
def test_stopped_and_resumed_equals_uninterrupted(data_prefix, tmp_path, compiled) -> None:
    """6 steps straight against 3 steps, a checkpoint, and 3 more in a new trainer: the same
    losses, bit for bit, and the same final weights; compiled too (the resumed run's graphs
    hold its loaded parameters and take its loaded moments)."""
    compile_ = f"context.compile={str(compiled).lower()}"
    straight = load_config(EXAMPLE, overrides(data_prefix, 6, compile_,
                                               f"checkpoint.save_path={tmp_path / 'a'}"))
    whole = Trainer(straight, output_dir=tmp_path / "a_out")
    losses = [o.loss for o in whole.train()]
    first = load_config(EXAMPLE, overrides(data_prefix, 6, compile_,
                                           f"checkpoint.save_path={tmp_path / 'b'}",
                                           "checkpoint.save_interleaved_steps=3"))
    part = Trainer(first, output_dir=tmp_path / "b_out")
    stream = part.stream()
    head = [part.run_step(stream).loss for _ in range(3)]
    part.save_checkpoint()
    part.checkpoints.wait()
    again = load_config(EXAMPLE, overrides(data_prefix, 6, compile_,
                                           f"checkpoint.save_path={tmp_path / 'c'}",
                                           f"checkpoint.load_path={tmp_path / 'b'}"))
    resumed = Trainer(again, output_dir=tmp_path / "c_out")
    assert (resumed.step_count, resumed.consumed_samples) == (3, 12)
    tail = [o.loss for o in resumed.train()]
    assert head + tail == losses
    for (name, a), (_, b) in zip(whole.model.parameters_and_names(),
                                 resumed.model.parameters_and_names(), strict=True):
        assert (a.asnumpy() == b.asnumpy()).all(), name
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == [
        "iteration_00000006", "latest_checkpointed_iteration.txt"]


KILLED_DURING_SAVE = """
import os, signal, sys
import mf_train.checkpoint.writer as writer
from mf_config import load_config
from mf_train.trainer import Trainer, seed_everything

saving = {"step": 0}
original = writer.CheckpointManager.save

def save(self, step, *args, **kwargs):
    saving["step"] = step
    return original(self, step, *args, **kwargs)

def reached(stage):
    if saving["step"] == 4 and stage == "common":  # files written, not yet renamed into place
        os.kill(os.getpid(), signal.SIGKILL)

writer.CheckpointManager.save, writer._reached = save, reached
Trainer(load_config(sys.argv[1], sys.argv[3:]), output_dir=sys.argv[2]).train()
"""


def test_killed_during_a_save_resumes_from_the_last_complete_one(data_prefix, tmp_path) -> None:
    """kill -9 while step 4's checkpoint is being written: step 2's is loaded, and the resumed
    run's losses equal those of an uninterrupted run."""
    save = [f"checkpoint.save_path={tmp_path / 'ckpt'}", "checkpoint.save_interleaved_steps=2"]
    run = subprocess.run([sys.executable, "-c", KILLED_DURING_SAVE, str(EXAMPLE),
                          str(tmp_path / "killed"), *overrides(data_prefix, 6, *save)],
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == -9, run.stderr[-2000:]
    left = sorted(p.name for p in (tmp_path / "ckpt").iterdir())
    assert left[0] == "iteration_00000002" and any(".tmp-" in name for name in left)
    resumed = Trainer(load_config(EXAMPLE, overrides(
        data_prefix, 6, f"checkpoint.load_path={tmp_path / 'ckpt'}",
        f"checkpoint.save_path={tmp_path / 'ckpt2'}")), output_dir=tmp_path / "resumed")
    assert resumed.step_count == 2
    tail = [o.loss for o in resumed.train()]
    no_save = overrides(data_prefix, 6, "checkpoint.enable_save=false")
    straight = Trainer(load_config(EXAMPLE, no_save), output_dir=tmp_path / "straight")
    assert tail == [o.loss for o in straight.train()][2:]


def test_profiling_steps_two_to_three(data_prefix, tmp_path) -> None:
    config = load_config(EXAMPLE, overrides(
        data_prefix, 3, "checkpoint.enable_save=false", "profiler.enable_profiling=true",
        "profiler.start_step=2", "profiler.end_step=3"))
    Trainer(config, output_dir=tmp_path).train()
    runs = list((tmp_path / "profile" / "rank_0").iterdir())
    assert len(runs) == 1
    ops = (runs[0] / "FRAMEWORK" / "cpu_op_type_info_0.csv").read_text()
    assert "MatMul" in ops


def deepseek_overrides(prefix: str, steps: int, *more: str) -> list[str]:
    return [f"train_dataset.dataloader.config.data_path=['1','{prefix}']",
            f"training.steps={steps}", "train_dataset.dataloader.config.seq_length=32",
            "model.seq_length=32", "model.max_position_embeddings=32",
            "lr_scheduler.warmup_steps=1", *more]


def test_deepseek_v3_example_trains_and_moves_the_expert_bias(data_prefix, tmp_path) -> None:
    """Two micro-batches a step: the tokens per expert of every step (metrics) sum all of the
    step's tokens, and the routers' bias after 3 steps is the sum of rate * sign(mean -
    counts) over those steps (the monitor counts independently of the bias update)."""
    config = load_config(ROOT / "examples" / "deepseek_v3_tiny.yaml", deepseek_overrides(
        data_prefix, 3, "checkpoint.enable_save=false",
        "monitor.moe_monitor.save_tokens_per_expert_interval=1",
        "monitor.moe_monitor.target_layers=null", "model.moe_router_bias_update_rate=0.01"))
    trainer = Trainer(config, output_dir=tmp_path)
    outcomes = trainer.train()
    assert len(outcomes) == 3 and all(math.isfinite(o.loss) for o in outcomes)
    lines = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    steps = [line for line in lines if "step" in line and "event" not in line]
    for layer in (1, 2):
        expected = np.zeros(4, np.float32)
        for step in steps:
            counts = np.array([step[f"moe/layer{layer}/expert{e}"] for e in range(4)])
            # every token of the step (4 samples x 32) picks 2 of the 4 routed experts
            assert counts.sum() == 4 * 32 * 2
            expected += np.float32(0.01) * np.sign(counts.mean() - counts).astype(np.float32)
        bias = trainer.model.decoder_layers[layer].mlp.router.e_score_correction_bias
        np.testing.assert_allclose(bias.asnumpy(), expected, atol=1e-7)
        assert np.abs(expected).max() > 0


def test_deepseek_v3_expert_bias_is_updated_on_skipped_steps_and_can_be_off(data_prefix,
                                                                           tmp_path) -> None:
    skipping = deepseek_overrides(data_prefix, 1, "checkpoint.enable_save=false",
                                  "training.use_skip_step_on_nan=true",
                                  "monitor.health_checkpoint.global_norm_skip_threshold=1e-9")
    trainer = Trainer(load_config(ROOT / "examples" / "deepseek_v3_tiny.yaml", skipping),
                      output_dir=tmp_path / "skip")
    assert all(o.skipped for o in trainer.train())
    assert np.abs(trainer.model.decoder_layers[1].mlp.router.e_score_correction_bias.asnumpy()
                  ).max() > 0
    for off in ("model.moe_router_enable_expert_bias=false",
                "model.moe_router_bias_update_rate=0"):
        config = load_config(ROOT / "examples" / "deepseek_v3_tiny.yaml", deepseek_overrides(
            data_prefix, 1, "checkpoint.enable_save=false", off))
        trainer = Trainer(config, output_dir=tmp_path / off[-3:])
        trainer.train()
        assert not trainer.model.decoder_layers[1].mlp.router.e_score_correction_bias.asnumpy(
        ).any(), off


def test_deepseek_v3_resumes_the_expert_bias_bit_for_bit(data_prefix, tmp_path) -> None:
    """4 steps straight against 2, a checkpoint and 2 more: the same losses and weights,
    the moved bias included."""
    example = ROOT / "examples" / "deepseek_v3_tiny.yaml"
    whole = Trainer(load_config(example, deepseek_overrides(
        data_prefix, 4, "checkpoint.enable_save=false")), output_dir=tmp_path / "a")
    losses = [o.loss for o in whole.train()]
    part = Trainer(load_config(example, deepseek_overrides(
        data_prefix, 4, f"checkpoint.save_path={tmp_path / 'b'}",
        "checkpoint.save_interleaved_steps=2")), output_dir=tmp_path / "b_out")
    stream = part.stream()
    head = [part.run_step(stream).loss for _ in range(2)]
    part.save_checkpoint()
    part.checkpoints.wait()
    resumed = Trainer(load_config(example, deepseek_overrides(
        data_prefix, 4, "checkpoint.enable_save=false",
        f"checkpoint.load_path={tmp_path / 'b'}")), output_dir=tmp_path / "c_out")
    assert resumed.step_count == 2
    assert head + [o.loss for o in resumed.train()] == losses
    biases = 0
    for (name, a), (_, b) in zip(whole.model.parameters_and_names(),
                                 resumed.model.parameters_and_names(), strict=True):
        assert (a.asnumpy() == b.asnumpy()).all(), name
        biases += name.endswith("e_score_correction_bias") and bool(a.asnumpy().any())
    assert biases == 2


def test_too_many_skipped_steps_stop_the_run(data_prefix, tmp_path, capsys) -> None:
    """Every norm is above a tiny spike threshold: each step is skipped (weights unchanged)
    and the run stops after global_norm_skip_time of them, with a one-line reason."""
    args = ["--config", str(EXAMPLE), "--output-dir", str(tmp_path)]
    for value in overrides(data_prefix, 6, "checkpoint.enable_save=false",
                           "training.use_skip_step_on_nan=true",
                           "monitor.health_checkpoint.global_norm_skip_threshold=1e-9",
                           "monitor.health_checkpoint.global_norm_skip_time=2"):
        args += ["--set", value]
    assert run(args) == 1
    err = capsys.readouterr().err
    assert "mf-train: 2 steps in a row were skipped" in err and "stopping at step 2" in err
    lines = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [line["skipped"] for line in lines if "event" not in line] == [True, True]
    assert "step [1/6]" in (tmp_path / "logs" / "train.log").read_text()


def test_recompute_and_swap_in_the_trainer_leave_the_losses_unchanged(data_prefix,
                                                                      tmp_path) -> None:
    """The example's select recompute, then full recompute, then swap of every layer: the
    same losses, bit for bit, as without them."""
    variants = {"none": [], "select": ["recompute.mode=select"],
                "full": ["recompute.mode=full", "recompute.full_recompute_layer=['0-3']",
                         "recompute.select_module=null"],
                "swap": ["swap.enable=true", "swap.layer_swap=[{layers: ['0-3']}]"]}
    losses = {}
    for name, extra in variants.items():
        base = [v for v in overrides(data_prefix, 2, "checkpoint.enable_save=false")
                if not v.startswith("recompute.mode")]
        config = load_config(EXAMPLE, base + (extra or ["recompute.mode=None"]))
        losses[name] = [o.loss for o in Trainer(config, output_dir=tmp_path / name).train()]
    assert losses["select"] == losses["none"]
    assert losses["full"] == losses["none"]
    assert losses["swap"] == losses["none"]


def test_the_spec_skeleton_adapted_to_cpu_trains(data_prefix, tmp_path, caplog) -> None:
    """examples/spec_skeleton_cpu.yaml: bfloat16 and flash attention say what runs instead."""
    config = load_config(ROOT / "examples" / "spec_skeleton_cpu.yaml", [
        f"train_dataset.dataloader.config.data_path=['1','{data_prefix}']", "training.steps=1",
        "training.global_batch_size=2", "train_dataset.dataloader.config.seq_length=32",
        "model.seq_length=32", "model.max_position_embeddings=32",
        "checkpoint.enable_save=false"])
    with caplog.at_level("WARNING"):
        outcomes = Trainer(config, output_dir=tmp_path).train()
    assert len(outcomes) == 1 and math.isfinite(outcomes[0].loss)
    assert "model.compute_dtype: bfloat16 is not computed on the CPU backend" in caplog.text



def test_deterministic_kernels_come_without_mindspores_deprecation_warning() -> None:
    """`training.deterministic` asks MindSpore through its current API, in a process of its
    own (the setting lasts as long as the process): deterministic is on, a second trainer in
    the process finds it on, and nothing reaches the console (set_context's spelling prints
    a deprecation warning)."""
    code = ("import mindspore as ms\n"
            "from mf_train.trainer import seed_everything\n"
            "seed_everything(7, True)\nseed_everything(7, True)\n"
            "print(ms.get_context('deterministic'))\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=120, check=False)
    assert (result.returncode, result.stdout, result.stderr) == (0, "ON\n", "")
