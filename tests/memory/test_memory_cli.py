"""`mf-memory estimate` end to end, in subprocesses: text, JSON, exit codes, no MindSpore."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

SKELETON = Path(__file__).resolve().parents[2] / "examples" / "spec_skeleton.yaml"
CONFIG = """\
model:
  model_type: qwen3
  vocab_size: 50
  hidden_size: 24
  intermediate_size: 40
  num_hidden_layers: 2
  num_attention_heads: 4
  num_key_value_heads: 2
  seq_length: 8
train_dataset:
  dataloader:
    type: Mock
training:
  local_batch_size: 3
  global_batch_size: 6
"""


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "mf_memory", *args], capture_output=True,
                          text=True, timeout=60)


@pytest.fixture
def config_file(tmp_path: Path) -> str:
    path = tmp_path / "train.yaml"
    path.write_text(CONFIG)
    return str(path)


def test_json_has_the_components_in_bytes(config_file: str) -> None:
    result = run("estimate", "--config", config_file, "--world-size", "2", "--json")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    parts = ("params", "grads", "optimizer", "gathered_params", "activations", "logits")
    assert data["backward_peak"] == sum(data[key] for key in parts)
    assert data["step_peak"] == data["params"] + data["optimizer"] + data["step"] > 0  # FSDP
    assert data["total"] == max(data["backward_peak"], data["step_peak"])
    assert data["held_params"] == sum(-(-size // 2) for size in (4668, 4668, 1200 + 24 + 1200))
    assert data["parameter_count"] == 1200 + 2 * 4668 + 24 + 1200
    assert len(data["layer_activations"]) == 2 and data["fits"] is None


def test_text_verdict_and_what_to_turn(config_file: str) -> None:
    result = run("estimate", "--config", config_file, "--world-size", "1",
                 "--set", "context.max_device_memory=0.0001GB")
    assert result.returncode == 0, result.stderr
    assert "does NOT fit in 104.9 KiB" in result.stdout
    assert "model.use_flash_attention: true saves" in result.stdout
    fits = run("estimate", "--config", config_file, "--world-size", "1",
               "--set", "context.max_device_memory=1GB")
    assert "fits in 1.00 GiB" in fits.stdout and "total" in fits.stdout


def test_rank_selects_its_pipeline_stage(config_file: str) -> None:
    result = run("estimate", "--config", config_file, "--world-size", "2", "--rank", "1",
                 "--json", "--set", "parallelism.pipeline_parallel=2")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert (data["stage"], data["layers"]) == (1, [1])
    assert data["logits"] > 0


def test_exit_codes(config_file: str, tmp_path: Path) -> None:
    bad = run("estimate", "--config", config_file, "--world-size", "3",
              "--set", "parallelism.tensor_parallel=2")
    assert bad.returncode == 1 and "not divisible" in bad.stderr
    typo = run("estimate", "--config", config_file, "--world-size", "1",
               "--set", "model.n_routed_experts=8")  # a Qwen3 has no experts
    assert typo.returncode == 1 and "model.n_routed_experts: Unknown configuration keys for " \
        "model type 'qwen3'" in typo.stderr
    invalid = run("estimate", "--config", config_file, "--world-size", "1",
                  "--set", "training.local_batch_size=0")
    assert invalid.returncode == 1 and "training.local_batch_size" in invalid.stderr
    assert run("estimate", "--config", str(tmp_path / "missing.yaml"),
               "--world-size", "1").returncode == 2
    assert run("estimate", "--world-size", "1").returncode == 2
    assert run().returncode == 2


def test_the_spec_skeleton_gets_a_moe_breakdown_as_written() -> None:
    result = run("estimate", "--config", str(SKELETON), "--world-size", "8")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    for row in ("    MLA (latent attention)", "    routed experts", "    shared experts",
                "    router", "  dispatch (tokens to and from the experts)",
                "  routed experts", "  MLA (latent attention)"):
        assert f"\n{row} " in out, row
    assert "routed experts: 256 per MoE layer, 256 here (expert_parallel 1" in out
    assert "model defaults used (not in the config): n_routed_experts 256" in out
    assert "warning: model.intermediate_size: not given, but the first 3 layer(s) are dense" \
        in out


def test_expert_parallel_divides_the_routed_experts() -> None:
    one, eight = (json.loads(run("estimate", "--config", str(SKELETON), "--world-size", "8",
                                 "--json", "--set", f"parallelism.expert_parallel={ep}").stdout)
                  for ep in (1, 8))
    assert one["routed_experts"] == {"per_layer": 256, "per_device": 256,
                                     "sliced_over": 8}
    assert eight["routed_experts"] == {"per_layer": 256, "per_device": 32,
                                       "sliced_over": 1}
    # FSDP slices the whole experts over 8 ranks, or EP holds 1/8 of them unsliced: the
    # same bytes; FSDP gathers them around their use, EP does not
    experts = "routed experts"
    assert one["parameter_parts"][experts] == eight["parameter_parts"][experts]
    assert one["gathered_params"] > eight["gathered_params"]
    assert "32 here (expert_parallel 8, whole experts)" in run(
        "estimate", "--config", str(SKELETON), "--world-size", "8",
        "--set", "parallelism.expert_parallel=8").stdout


def test_estimate_never_imports_mindspore(config_file: str) -> None:
    code = ("import sys; from mf_memory.cli import main; main(['estimate', '--config', "
            f"{config_file!r}, '--world-size', '1', '--json']); "
            "print(sorted(m for m in ('mindspore', 'numpy') if m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=60, check=True)
    assert result.stdout.strip().endswith("[]")


def test_the_world_size_defaults_to_the_smallest_the_layout_fits(config_file: str) -> None:
    """Tensor parallel 2 x pipeline 2 needs 4 ranks: without --world-size the estimate is that
    of 4, said on stderr (stdout stays the JSON); a layout no world fits is one line."""
    layout = ["--set", "parallelism.tensor_parallel=2", "--set", "parallelism.pipeline_parallel=2"]
    given = run("estimate", "--config", config_file, "--world-size", "4", "--json", *layout)
    default = run("estimate", "--config", config_file, "--json", *layout)
    assert default.returncode == 0, default.stderr
    assert json.loads(default.stdout) == json.loads(given.stdout)
    assert default.stderr == ("world size 4: the smallest the layout fits (--world-size N for "
                              "another)\n")
    # shards of 4 need 4 data-parallel ranks of 3 samples each: a batch of 6 fits no world
    none = run("estimate", "--config", config_file, "--set", "parallelism.data_parallel_shard=4")
    assert none.returncode == 1
    assert none.stderr.strip().endswith("no world size up to 65536 fits the parallel layout; "
                                        "give the job's with --world-size N")
