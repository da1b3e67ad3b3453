"""Tensor-parallel layers on 2 real ranks equal their unsharded twins, forward and backward; the
ranks run workers/scenario_tensor_parallel.py in the runtime suite's 2-rank job
(rank_jobs.py)."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("mindspore")

pytestmark = pytest.mark.ranks
TOLERANCE = 1e-5


@pytest.fixture(scope="module", params=[False, True], ids=["plain", "sequence_parallel"])
def ranks(request, runtime_suite) -> list[dict]:
    scenario = "tensor_parallel_" + ("sequence_parallel" if request.param else "plain")
    return runtime_suite.results(2, scenario, sequence_parallel=request.param)


def close(got, want) -> None:
    np.testing.assert_allclose(np.array(got), np.array(want), rtol=0, atol=TOLERANCE)


def test_column_then_row_parallel_mlp(ranks) -> None:
    for rank in ranks:
        mlp, twin = rank["mlp"], rank["mlp_twin"]
        close(mlp["out"], twin["out"])
        close(mlp["dx"], twin["dx"])
        for got, want in zip(mlp["grads"], twin["grads"], strict=True):
            close(got, want)


def test_vocab_parallel_embedding(ranks) -> None:
    for rank in ranks:
        emb = rank["embedding"]
        close(emb["out"], emb["twin_out"])
        close(emb["grad"], emb["twin_grad"])


def test_vocab_parallel_cross_entropy(ranks) -> None:
    for rank in ranks:
        ce = rank["cross_entropy"]
        assert ce["mean"] == pytest.approx(ce["twin_mean"], abs=TOLERANCE)
        assert np.mean(ce["tokens"]) == pytest.approx(ce["twin_mean"], abs=TOLERANCE)
        close(ce["dlogits"], ce["twin_dlogits"])
    assert ranks[0]["cross_entropy"]["tokens"] == pytest.approx(
        ranks[1]["cross_entropy"]["tokens"], abs=0)
