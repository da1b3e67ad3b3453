"""`mf-train --nproc 2` on real msrun ranks: data parallel equals the single-process run, and a
failing rank stops the job with that rank's error."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("mindspore")

from mf_train.cli import run

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "qwen3_tiny.yaml"
pytestmark = pytest.mark.ranks



def arguments(prefix: str, output: Path) -> list[str]:
    sets = [f"train_dataset.dataloader.config.data_path=['1','{prefix}']", "training.steps=4",
            "model.hidden_size=32", "model.intermediate_size=64", "model.head_dim=8",
            "train_dataset.dataloader.config.seq_length=32", "model.max_position_embeddings=32",
            "recompute.mode=None", "recompute.select_module=null",
            "lr_scheduler.warmup_steps=1", "checkpoint.enable_save=false"]
    return ["--config", str(EXAMPLE), "--output-dir", str(output),
            *[arg for value in sets for arg in ("--set", value)]]


def losses(output: Path) -> list[float]:
    lines = [json.loads(line) for line in (output / "metrics.jsonl").read_text().splitlines()]
    return [line["loss"] for line in lines if "event" not in line]


def test_two_rank_data_parallel_matches_one_process(data_prefix, tmp_path) -> None:
    """Replicated data parallelism (data_parallel_shard 1; the sharded strategies are
    test_train_sharded.py's)."""
    assert run([*arguments(data_prefix, tmp_path / "one")]) == 0
    assert run([*arguments(data_prefix, tmp_path / "two"), "--set",
                "parallelism.data_parallel_shard=1", "--nproc", "2", "--timeout", "300"]) == 0
    one, two = losses(tmp_path / "one"), losses(tmp_path / "two")
    assert len(one) == len(two) == 4
    assert two == pytest.approx(one, rel=1e-5)
    assert one[-1] < one[0]
    assert (tmp_path / "two" / "logs" / "worker_1.log").exists()


def test_two_rank_tensor_parallel_matches_one_process(data_prefix, tmp_path) -> None:
    """Tensor parallel 2 with sequence parallelism (vocabulary-parallel embedding and loss,
    column/row-parallel attention and MLP) against the single-process run."""
    assert run([*arguments(data_prefix, tmp_path / "one")]) == 0
    assert run([*arguments(data_prefix, tmp_path / "tp"), "--set",
                "parallelism.tensor_parallel=2", "--nproc", "2", "--timeout", "300"]) == 0
    one, tp = losses(tmp_path / "one"), losses(tmp_path / "tp")
    assert tp == pytest.approx(one, rel=1e-5)
    norms = [json.loads(line)["grad_norm"] for line in
             (tmp_path / "tp" / "metrics.jsonl").read_text().splitlines() if "event" not in line]
    single = [json.loads(line)["grad_norm"] for line in
              (tmp_path / "one" / "metrics.jsonl").read_text().splitlines() if "event" not in line]
    assert norms == pytest.approx(single, rel=1e-5)


def test_a_failing_rank_stops_the_job_with_its_error(data_prefix, tmp_path, capsys) -> None:
    args = arguments(data_prefix, tmp_path)
    args += ["--set", f"train_dataset.dataloader.config.data_path=['1','{tmp_path}/missing']",
             "--nproc", "2", "--timeout", "300"]
    assert run(args) == 1
    err = capsys.readouterr().err
    assert "failed: " in err and "missing.idx" in err and "worker_" in err
