"""Qwen3 on 2 real tensor-parallel ranks (msrun on 127.0.0.1) equals the single-process
model: loss, logits and every gradient, with and without sequence parallelism."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("mindspore")

from mf_parallel.launch import run_ranks

WORKER = Path(__file__).resolve().parent / "workers" / "qwen3_tp_worker.py"
pytestmark = pytest.mark.ranks
TOLERANCE = 1e-5
CASES = ("sequence_parallel_untied", "plain_tied")


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> list[dict]:
    out = tmp_path_factory.mktemp("qwen3_tp")
    run_ranks(WORKER, 2, log_dir=out / "logs", timeout=300, args=[str(out)])
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]


@pytest.mark.parametrize("case", CASES)
def test_loss_and_logits_equal_the_single_process_model(ranks, case) -> None:
    for rank in ranks:
        result = rank[case]
        assert result["loss"] == pytest.approx(result["twin_loss"], abs=TOLERANCE)
        assert result["logits_diff"] < TOLERANCE


@pytest.mark.parametrize("case", CASES)
def test_every_gradient_equals_the_single_process_gradient_shard(ranks, case) -> None:
    for rank in ranks:
        result = rank[case]
        assert result["grad_scale"] > 1e-3  # the comparison is not between zeros
        bad = {name: diff for name, diff in result["grad_diff"].items() if diff > TOLERANCE}
        assert not bad
