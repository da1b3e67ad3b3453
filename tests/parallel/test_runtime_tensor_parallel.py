"""Tensor-parallel layers on 2 real ranks equal their unsharded twins, forward and backward."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("mindspore")

from mf_parallel.launch import run_ranks

WORKER = Path(__file__).resolve().parent / "workers" / "tp_worker.py"
pytestmark = pytest.mark.ranks
TOLERANCE = 1e-5


@pytest.fixture(scope="module", params=[False, True], ids=["plain", "sequence_parallel"])
def ranks(request, tmp_path_factory) -> list[dict]:
    out = tmp_path_factory.mktemp("tp")
    run_ranks(WORKER, 2, log_dir=out / "logs", timeout=300,
              args=[str(out), "1" if request.param else "0"])
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]


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
