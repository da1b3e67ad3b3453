"""Sharded data parallel (ZeRO-1, ZeRO-2, FSDP under each reshard policy, and HSDP) on real
ranks equals plain data parallel; its per-rank state shrinks with the shard degree. The ranks
run workers/scenario_sharded.py in the runtime suite's jobs (rank_jobs.py)."""

from __future__ import annotations

import pytest
from same_tensors import assert_same_tensors

pytest.importorskip("mindspore")

STEPS = 3
PARAMS = 16 * 33 + 33 + 33 * 33 + 33 + 33 * 8 + 8  # the worker's 3-layer MLP: 1955
FSDP = ("fsdp_always", "fsdp_never", "fsdp_default")
pytestmark = pytest.mark.ranks


@pytest.fixture(scope="module")
def two(runtime_suite) -> list[dict]:
    return runtime_suite.results(2, "sharded", shard=-1, steps=STEPS)


@pytest.fixture(scope="module")
def hsdp(runtime_suite) -> list[dict]:
    """4 ranks as replicate 2 x shard 2."""
    return runtime_suite.results(4, "sharded_hsdp", shard=2, steps=STEPS)


@pytest.mark.parametrize("strategy", ("optim", "optim_grads", *FSDP))
def test_each_strategy_on_two_ranks_equals_plain_data_parallel(two, strategy) -> None:
    for rank in two:
        assert_same_tensors(rank[strategy]["weights"], rank["plain"]["weights"], rel=0,
                            atol=1e-6)


def test_state_kept_between_steps_shrinks_with_the_strategy(two) -> None:
    """Bytes kept per rank with 2 shards: 1955 parameters in 6 tensors, each cut in two
    chunks (an odd one's second padded): slices of 980 floats."""
    tensors = [16 * 33, 33, 33 * 33, 33, 33 * 8, 8]  # weight and bias of 3 linear layers
    assert sum(tensors) == PARAMS
    full, mine = 4 * PARAMS, 4 * sum(-(-n // 2) for n in tensors)
    held = {name: two[0][name]["held"] for name in ("optim", "optim_grads", "fsdp_always")}
    assert held["optim"] == {"params": full + mine, "grads": full, "optimizer": 2 * mine}
    assert held["optim_grads"] == {"params": full + mine, "grads": mine, "optimizer": 2 * mine}
    # FSDP's 3 units (2 linear layers and the root) hold the same chunks
    assert held["fsdp_always"] == {"params": mine, "grads": mine, "optimizer": 2 * mine}


def test_fsdp_parameters_are_empty_between_steps(two) -> None:
    for name in FSDP:
        assert two[0][name]["between_steps_shapes"] == [[0]] * 6


def test_fsdp_reshard_policy_decides_the_gathers(two) -> None:
    """Per step: a unit that reshards after forward is gathered twice (forward and backward),
    one that keeps its parameters once; the root (the last linear layer) once."""
    expected = {"fsdp_always": ([True, True], [2, 2, 1]),
                "fsdp_never": ([False, False], [1, 1, 1]),
                "fsdp_default": ([True, False], [2, 1, 1])}
    for name, (flags, per_step) in expected.items():
        result = two[0][name]
        assert result["reshard_after_forward"] == flags
        assert result["gathers"] == [STEPS * n for n in per_step]


def test_fsdp_backward_reuses_regathered_weights_instead_of_saved_ones(two) -> None:
    """Each resharding unit's weight is saved for backward as a reference, once per step."""
    assert two[0]["fsdp_always"]["saved_replaced"] == 2 * STEPS
    assert two[0]["fsdp_default"]["saved_replaced"] == STEPS
    assert two[0]["fsdp_never"]["saved_replaced"] == 0


def test_hsdp_groups(hsdp) -> None:
    assert [r["groups"]["shard"] for r in hsdp] == [[0, 1], [0, 1], [2, 3], [2, 3]]
    assert [r["groups"]["replicate"] for r in hsdp] == [[0, 2], [1, 3], [0, 2], [1, 3]]


@pytest.mark.parametrize("strategy", ("optim_grads", "fsdp_default"))
def test_hsdp_on_four_ranks_equals_plain_data_parallel(hsdp, strategy) -> None:
    for rank in hsdp:
        assert_same_tensors(rank[strategy]["weights"], rank["plain"]["weights"], rel=0,
                            atol=1e-6)
