"""DeepSeek-V3 on 2 real tensor-parallel ranks (msrun on 127.0.0.1) equals the single-process
model: loss (balance loss included), logits and every gradient, with compressed or plain
queries, tied or untied head, with and without sequence parallelism."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("mindspore")

from mf_parallel.launch import run_ranks

WORKER = Path(__file__).resolve().parent / "workers" / "deepseek_tp_worker.py"
pytestmark = pytest.mark.ranks
TOLERANCE = 1e-5
CASES = ("sequence_parallel_lora_untied", "sequence_parallel_plain_tied", "tensor_parallel_lora")


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> list[dict]:
    out = tmp_path_factory.mktemp("deepseek_tp")
    run_ranks(WORKER, 2, log_dir=out / "logs", timeout=300, args=[str(out)])
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]


@pytest.mark.parametrize("case", CASES)
def test_loss_balance_loss_and_logits_equal_the_single_process_model(ranks, case) -> None:
    for rank in ranks:
        result = rank[case]
        assert result["loss"] == pytest.approx(result["twin_loss"], abs=TOLERANCE)
        assert result["balance"] == pytest.approx(result["twin_balance"], abs=TOLERANCE)
        assert result["twin_balance"] > 0.1  # aux_loss_alpha 0.5: the term weighs
        assert result["logits_diff"] < TOLERANCE


@pytest.mark.parametrize("case", CASES)
def test_every_gradient_equals_the_single_process_gradient_shard(ranks, case) -> None:
    for rank in ranks:
        result = rank[case]
        assert result["grad_scale"] > 1e-3  # the comparison is not between zeros
        bad = {name: diff for name, diff in result["grad_diff"].items() if diff > TOLERANCE}
        assert not bad


def test_heads_and_mlps_are_split_and_the_experts_are_not(ranks) -> None:
    """Rank shapes of the 4-head, vocabulary-64 model on 2 ranks: the up projections keep
    2 heads' rows, o_proj half its columns, the dense and shared MLPs half their width; the
    down projections, the router and the routed experts are whole."""
    shapes = ranks[0]["sequence_parallel_lora_untied"]["shapes"]
    layer = "decoder_layers.1."
    assert shapes["embedding.weight"] == shapes["head.weight"] == [32, 32]
    assert shapes[layer + "attention.q_a_proj.weight"] == [12, 32]
    assert shapes[layer + "attention.q_b_proj.weight"] == [2 * 12, 12]
    assert shapes[layer + "attention.kv_a_proj_with_mqa.weight"] == [16 + 4, 32]
    assert shapes[layer + "attention.kv_b_proj.weight"] == [2 * 16, 16]
    assert shapes[layer + "attention.o_proj.weight"] == [32, 2 * 8]
    assert shapes["decoder_layers.0.mlp.gate_up.weight"] == [48, 32]
    assert shapes[layer + "mlp.shared_experts.down.weight"] == [32, 8]
    assert shapes[layer + "mlp.router.weight"] == [4, 32]
    assert shapes[layer + "mlp.experts.3.gate_up.weight"] == [32, 32]
