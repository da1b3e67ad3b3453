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


def metrics(output: Path) -> list[dict]:
    return [line for line in map(json.loads, (output / "metrics.jsonl").read_text().splitlines())
            if "event" not in line]


def test_summed_and_averaged_gradients_give_the_same_update(data_prefix, tmp_path) -> None:
    """`disable_gradient_division` true (the default, MindFormers'): gradients summed over the
    ranks, each rank's loss divided by 2 first; false: the reduced gradients averaged. With
    two ranks both scalings are exact powers of two, so the runs agree bit for bit."""
    for division in ("true", "false"):
        assert run([*arguments(data_prefix, tmp_path / division), "--set",
                    "parallelism.data_parallel_shard=1", "--set",
                    f"parallelism.disable_gradient_division={division}", "--nproc", "2",
                    "--timeout", "300"]) == 0
    summed, averaged = metrics(tmp_path / "true"), metrics(tmp_path / "false")
    assert len(summed) == 4
    assert [(m["loss"], m["grad_norm"]) for m in summed] == \
        [(m["loss"], m["grad_norm"]) for m in averaged]
    # what differs is each rank's gradient before the reduction: half as large when summed
    assert [m["embedding_local_norm"] for m in summed] == pytest.approx(
        [m["embedding_local_norm"] / 2 for m in averaged], rel=1e-6)


def test_a_failing_rank_stops_the_job_with_its_error(data_prefix, tmp_path, capsys) -> None:
    args = arguments(data_prefix, tmp_path)
    args += ["--set", f"train_dataset.dataloader.config.data_path=['1','{tmp_path}/missing']",
             "--nproc", "2", "--timeout", "300"]
    assert run(args) == 1
    err = capsys.readouterr().err
    assert "failed: " in err and "missing.idx" in err and "worker_" in err
