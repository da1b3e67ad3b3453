"""`make_plan` and the `mf-parallel plan` command."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from mf_config import ParallelismConfig, TrainingConfig
from mf_parallel.errors import PlanError
from mf_parallel.plan import make_plan, plan_summary

ROOT = Path(__file__).resolve().parents[2]
SKELETON = ROOT / "examples" / "spec_skeleton.yaml"
SCRIPT = Path(sys.executable).parent / "mf-parallel"
QWEN3 = """model:
  model_type: qwen3
  architectures: Qwen3ForCausalLM
  vocab_size: 129280
  seq_length: 4096
  hidden_size: 1792
  intermediate_size: 4096
  num_hidden_layers: 12
  num_attention_heads: 8
  use_flash_attention: True
  compute_dtype: "bfloat16"
"""


@pytest.fixture(scope="module")
def skeleton(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The spec's skeleton with a Qwen3 model of its size in place of DeepSeek-V3, which has
    no tensor parallelism yet (these layouts use it)."""
    text = SKELETON.read_text(encoding="utf-8")
    start = text.index("model:\n")
    end = text.index("\n# =====", start)
    path = tmp_path_factory.mktemp("plan") / "skeleton_qwen3.yaml"
    # a Qwen3 has no MoE layers to monitor (validation would warn that the monitor is idle)
    rest = text[end:].replace("save_tokens_per_expert_interval: 100",
                              "save_tokens_per_expert_interval: null")
    path.write_text(text[:start] + QWEN3 + rest, encoding="utf-8")
    return path


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(SCRIPT), *args], capture_output=True, text=True, timeout=60)


def test_plan_of_a_pipeline_layout() -> None:
    plan = make_plan(ParallelismConfig(pipeline_parallel=2, tensor_parallel=2),
                     TrainingConfig(global_batch_size=16, local_batch_size=1), 8,
                     num_layers=12, seq_length=4096)
    summary = plan_summary(plan, rank=5)
    assert summary["data_parallel"] == 2 and summary["num_accumulation_steps"] == 8
    assert summary["stage_layers"] == [[list(range(0, 6))], [list(range(6, 12))]]
    assert summary["rank"]["coordinates"] == {"pipeline": 1, "replicate": 0, "shard": 0,
                                              "context": 0, "tensor": 1}
    assert summary["rank"]["groups"]["pipeline"] == [1, 5]
    # 1F1B, 2 stages, 8 micro-batches: bubble (p - 1) / (m + p - 1) = 1 / 9
    assert summary["pipeline_bubble_fraction"] == round(1 / 9, 4)
    assert summary["pipeline_dxdw_split"] is False
    split = make_plan(ParallelismConfig(pipeline_parallel=2, tensor_parallel=2,
                                        pipeline_parallel_enable_dxdw_split=True),
                      TrainingConfig(global_batch_size=16, local_batch_size=1), 8,
                      num_layers=12, seq_length=4096)
    # ZB-H1 with t_f = t_b = t_w: (p - 1)(t_f + t_b - t_w) idle per stage over m (3 t_f)
    assert split.split_backward
    assert plan_summary(split)["pipeline_bubble_fraction"] == round(1 / 25, 4)


BATCH_KEYS = ("num_accumulation_steps", "global_batch_size", "effective_global_batch_size",
              "final_num_accumulation_steps", "final_global_batch_size",
              "final_effective_global_batch_size")


def megatron_rampup_steps(start: int, increment: int, samples: int, target: int,
                          micro_step: int) -> int:
    """Optimizer steps below `target`, one at a time, with Megatron-LM's formula written out
    here: each step consumes the global batch at its start, rounded down to `micro_step`."""
    per_increment = samples / ((target - start) // increment)
    consumed = steps = 0
    while consumed < samples:
        gbs = min(target, start + int(consumed / per_increment) * increment)
        if gbs == target:
            break
        consumed += gbs // micro_step * micro_step
        steps += 1
    return steps


def test_plan_summary_of_a_ramp() -> None:
    """dp 2 x micro 4: 16 (2 accumulation steps) at step 0, 64 (8) once 3000 samples are in."""
    plan = make_plan(ParallelismConfig(), TrainingConfig(
        global_batch_size=64, local_batch_size=4, rampup_batch_size=[16, 16, 3000]), 2)
    summary = plan_summary(plan)
    assert {k: summary[k] for k in BATCH_KEYS} == {
        "num_accumulation_steps": 2, "global_batch_size": 16, "effective_global_batch_size": 16,
        "final_num_accumulation_steps": 8, "final_global_batch_size": 64,
        "final_effective_global_batch_size": 64}
    steps = megatron_rampup_steps(16, 16, 3000, 64, 8)
    assert steps == 115  # 63 steps of 16, 31 of 32, 21 of 48
    assert summary["rampup"] == {"start": 16, "increment": 16, "samples": 3000, "steps": steps}


def test_plan_summary_without_a_ramp_keeps_its_meaning() -> None:
    """Step 0 and final agree; the configured 20 still shows, with the effective 16 it uses."""
    plan = make_plan(ParallelismConfig(), TrainingConfig(global_batch_size=20,
                                                         local_batch_size=2), 4)
    summary = plan_summary(plan)
    assert {k: summary[k] for k in BATCH_KEYS} == {
        "num_accumulation_steps": 2, "global_batch_size": 20, "effective_global_batch_size": 16,
        "final_num_accumulation_steps": 2, "final_global_batch_size": 20,
        "final_effective_global_batch_size": 16}
    assert "rampup" not in summary


def test_plan_errors_are_plan_errors() -> None:
    with pytest.raises(PlanError, match="seq_length 100 must be a multiple of"):
        make_plan(ParallelismConfig(tensor_parallel=8), TrainingConfig(global_batch_size=8),
                  8, seq_length=100)
    with pytest.raises(PlanError, match="global_batch_size"):
        make_plan(ParallelismConfig(), TrainingConfig(global_batch_size=4), 8)


def test_cli_text(tmp_path, skeleton) -> None:
    result = run("plan", "--config", str(skeleton), "--world-size", "8", "--rank", "3",
                 "--set", "parallelism.tensor_parallel=2",
                 "--set", "parallelism.pipeline_parallel=2",
                 "--set", "training.global_batch_size=8")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == ("world 8 = pipeline 2 x data 2 (replicate 1 x shard 2) x context 1 x "
                        "tensor 2")
    assert lines[2] == ("batch: micro-batch 1 x data parallel 2 x 4 accumulation steps = "
                        "global batch 8")
    assert lines[3].startswith("pipeline: 2 stages, schedule 1f1b, bubble 20.0%")
    split = run("plan", "--config", str(skeleton), "--world-size", "8",
                "--set", "parallelism.tensor_parallel=2",
                "--set", "parallelism.pipeline_parallel=2",
                "--set", "parallelism.pipeline_parallel_enable_dxdw_split=true",
                "--set", "training.global_batch_size=8")
    assert split.stdout.splitlines()[3] == (
        "pipeline: 2 stages, schedule 1f1b with the backward split (ZB-H1), bubble 7.7% "
        "(simulated, input and weight gradients = forward each)")
    assert not any(line.startswith("batch ramp-up") for line in lines)
    assert "rank 3: pipeline 0, replicate 0, shard 1, context 0, tensor 1" in lines
    assert "  tensor group          [2, 3]" in lines


RAMP = ("--set", "parallelism.tensor_parallel=4", "--set", "training.global_batch_size=64",
        "--set", "training.rampup_batch_size=[16, 16, 1000]")


def test_cli_text_of_a_ramp(skeleton) -> None:
    """Growths every 1000 / 3 samples (Megatron-LM's float spacing); dp 2 x micro 1."""
    result = run("plan", "--config", str(skeleton), "--world-size", "8", *RAMP)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    steps = megatron_rampup_steps(16, 16, 1000, 64, 2)
    assert steps == 39  # 21 steps of 16 (to 336 samples), 11 of 32 (to 688), 7 of 48 (to 1024)
    assert lines[2:4] == [
        "batch: micro-batch 1 x data parallel 2 x 32 accumulation steps = global batch 64",
        f"batch ramp-up: global batch 16 -> 64, +16 every 333.3 samples (1000 samples, {steps} "
        "steps); accumulation steps 8 -> 32"]


def test_cli_text_of_a_ramp_that_changes_nothing(skeleton) -> None:
    result = run("plan", "--config", str(skeleton), "--world-size", "8", *RAMP,
                 "--set", "training.rampup_batch_size=[16, 16, 0]")
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[3] == (
        "batch ramp-up: rampup_batch_size [16, 16, 0] has no effect; every step uses global "
        "batch 64")


def test_cli_json_of_a_ramp(skeleton) -> None:
    result = run("plan", "--config", str(skeleton), "--world-size", "8", "--json", *RAMP)
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    assert {k: summary[k] for k in BATCH_KEYS} == {
        "num_accumulation_steps": 8, "global_batch_size": 16, "effective_global_batch_size": 16,
        "final_num_accumulation_steps": 32, "final_global_batch_size": 64,
        "final_effective_global_batch_size": 64}
    assert summary["rampup"] == {"start": 16, "increment": 16, "samples": 1000,
                                 "steps": megatron_rampup_steps(16, 16, 1000, 64, 2)}


def test_cli_json_has_the_promised_keys(skeleton) -> None:
    result = run("plan", "--config", str(skeleton), "--world-size", "4", "--json",
                 "--set", "parallelism.data_parallel_shard=2")
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    assert {k: summary[k] for k in ("data_parallel", "data_parallel_shard",
                                     "data_parallel_replicate", "num_accumulation_steps")} == {
        "data_parallel": 4, "data_parallel_shard": 2, "data_parallel_replicate": 2,
        "num_accumulation_steps": 2}
    assert {k: summary[k] for k in BATCH_KEYS} == {
        "num_accumulation_steps": 2, "global_batch_size": 8, "effective_global_batch_size": 8,
        "final_num_accumulation_steps": 2, "final_global_batch_size": 8,
        "final_effective_global_batch_size": 8}
    assert "rampup" not in summary


def test_cli_invalid_layout_exits_1_with_the_reason(skeleton) -> None:
    result = run("plan", "--config", str(skeleton), "--world-size", "6",
                 "--set", "parallelism.tensor_parallel=4")
    assert result.returncode == 1
    assert result.stderr == (f"{skeleton}: invalid parallel layout: world size 6 is not "
                             "divisible by tensor_parallel (4) x context_parallel (1) x "
                             "pipeline_parallel (1) = 4\n")


def test_cli_invalid_config_and_usage(tmp_path, skeleton) -> None:
    result = run("plan", "--config", str(skeleton), "--world-size", "8",
                 "--set", "training.global_batch_size=0")
    assert result.returncode == 1 and "must be positive" in result.stderr
    assert run("plan", "--config", str(tmp_path / "none.yaml"), "--world-size", "8"
               ).returncode == 2
    assert run("plan", "--world-size", "8").returncode == 2
    assert run().returncode == 2
    result = run("plan", "--config", str(skeleton), "--world-size", "8", "--rank", "8")
    assert result.returncode == 1 and "rank 8 is outside the world (0..7)" in result.stderr
