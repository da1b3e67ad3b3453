"""Data parallel 2 x tensor parallel 2 on 4 real ranks: the right groups, and training that
equals one unsharded model on the whole global batch. The ranks run workers/scenario_dp_tp.py
in the runtime suite's 4-rank job (rank_jobs.py)."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("mindspore")

STEPS = 3
pytestmark = pytest.mark.ranks


@pytest.fixture(scope="module")
def ranks(runtime_suite) -> list[dict]:
    return runtime_suite.results(4, "dp_tp", steps=STEPS)


def test_groups_put_tensor_innermost(ranks) -> None:
    assert [r["groups"]["tensor"] for r in ranks] == [[0, 1], [0, 1], [2, 3], [2, 3]]
    assert [r["groups"]["data"] for r in ranks] == [[0, 2], [1, 3], [0, 2], [1, 3]]
    assert [r["groups"]["loss"] for r in ranks] == [[0, 2], [1, 3], [0, 2], [1, 3]]


def test_losses_equal_the_unsharded_model(ranks) -> None:
    for rank in ranks:
        np.testing.assert_allclose(rank["losses"], rank["twin_losses"], rtol=0, atol=1e-5)
    assert ranks[0]["losses"][-1] < ranks[0]["losses"][0]


def test_weights_equal_the_unsharded_model_shards(ranks) -> None:
    for rank in ranks:
        for got, want in zip(rank["weights"], rank["twin_weights"], strict=True):
            np.testing.assert_allclose(np.array(got), np.array(want), rtol=0, atol=1e-5)


def test_data_parallel_replicas_hold_identical_weights(ranks) -> None:
    """Ranks 0 and 2 (and 1 and 3) hold the same tensor shard in different data replicas."""
    for a, b in ((0, 2), (1, 3)):
        for x, y in zip(ranks[a]["weights"], ranks[b]["weights"], strict=True):
            assert x == y
    assert ranks[0]["weights"][1] != ranks[1]["weights"][1]  # different tensor shards
