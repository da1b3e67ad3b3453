"""The expert dispatch on real ranks equals one process holding every expert: outputs, the
gradients of the tokens, of the routing weights and of each rank's experts; each rank's experts
compute exactly their (token, expert) pairs. The ranks run workers/scenario_experts.py in the
runtime suite's jobs (rank_jobs.py)."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("mindspore")

pytestmark = pytest.mark.ranks
TOLERANCE = 1e-5
CASES = {"alltoall-2": (2, "alltoall", 1), "dered-2-device1": (2, "alltoall_deredundancy", 1),
         "alltoall-4": (4, "alltoall", 1), "dered-4-device2": (4, "alltoall_deredundancy", 2)}
"""(ranks, dispatcher, npu_nums_per_device): 4 ranks in devices of 2 send between devices and
fan out inside them."""


@pytest.fixture(scope="module", params=[
    pytest.param(name, marks=pytest.mark.slow) if name == "alltoall-4" else name
    for name in CASES])
def ranks(request, runtime_suite) -> list[dict]:
    world, dispatcher, node = CASES[request.param]
    return runtime_suite.results(world, f"experts_{request.param}", dispatcher=dispatcher,
                                 npu_nums_per_device=node)


def close(got, want) -> None:
    np.testing.assert_allclose(np.array(got), np.array(want), rtol=0, atol=TOLERANCE)


def test_outputs_and_gradients_equal_one_process(ranks) -> None:
    for rank in ranks:
        close(rank["out"], rank["twin_out"])
        close(rank["dx"], rank["twin_dx"])
        close(rank["dw"], rank["twin_dw"])
        for got, want in zip(rank["dexperts"], rank["twin_dexperts"], strict=True):
            close(got, want)


def test_each_rank_computes_exactly_its_experts_pairs(ranks) -> None:
    counts = np.array(ranks[0]["counts"])
    for rank in ranks:
        load = np.array(rank["load"])
        held = rank["experts"]
        assert load[held].tolist() == counts[held].tolist()
        assert np.delete(load, held).sum() == 0
    assert sum(np.array(r["load"]) for r in ranks).tolist() == counts.tolist()
