"""Collectives on real ranks (msrun on 127.0.0.1), against numpy reimplementations; the ranks
run workers/scenario_collectives.py in the runtime suite's jobs (rank_jobs.py)."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("mindspore")

pytestmark = pytest.mark.ranks
FLAT_SHAPES = [(5, 3), (4,), (2, 2, 2)]  # workers/scenario_collectives.py's


def inputs(rank: int, shape: tuple[int, ...], offset: float = 0.0) -> np.ndarray:
    return np.arange(np.prod(shape), dtype=np.float32).reshape(shape) + rank * 100 + offset


def check(results: list[dict], kind: str) -> None:
    for result in results:
        group = result["groups"][kind]
        size, me = len(group), group.index(result["rank"])
        xs = [inputs(r, (2 * size, 3)) for r in group]
        got = {name: np.array(value) for name, value in result[kind].items()}
        np.testing.assert_array_equal(got["all_reduce"], sum(xs))
        np.testing.assert_array_equal(got["all_reduce_in_place"], sum(xs))
        transposed = [inputs(r, (3, 2 * size)).T for r in group]
        np.testing.assert_array_equal(got["all_reduce_noncontiguous"], sum(transposed))
        np.testing.assert_array_equal(got["all_reduce_max"], np.maximum.reduce(xs))
        np.testing.assert_array_equal(got["all_gather"], np.concatenate(xs))
        np.testing.assert_array_equal(got["reduce_scatter"], np.split(sum(xs), size)[me])
        np.testing.assert_array_equal(
            got["all_to_all"], np.concatenate([np.split(x, size)[me] for x in xs]))
        np.testing.assert_array_equal(got["broadcast"], xs[-1])


def check_flat_gather(results: list[dict]) -> None:
    """Every rank's slices of a padded flat buffer gathered back into the whole tensors, each
    in memory of its own (a view into one buffer would be copied at every use)."""
    for result in results:
        for index, (shape, got) in enumerate(zip(FLAT_SHAPES, result["flat_gather"]["values"],
                                                 strict=True)):
            want = np.arange(np.prod(shape), dtype=np.float32).reshape(shape) + 100 * index
            np.testing.assert_array_equal(np.array(got), want)
        assert result["flat_gather"]["own_memory"]


def test_collectives_on_two_ranks(runtime_suite) -> None:
    results = runtime_suite.results(2, "collectives", tensor_parallel=1)
    assert [r["groups"]["data"] for r in results] == [[0, 1], [0, 1]]
    check(results, "data")
    check(results, "tensor")  # one-rank groups: the identity
    check_flat_gather(results)
    np.testing.assert_array_equal(results[1]["send_recv"], inputs(0, (2, 2), 0.5))


def test_collectives_on_four_ranks_data_2_x_tensor_2(runtime_suite) -> None:
    results = runtime_suite.results(4, "collectives", tensor_parallel=2)
    assert [r["groups"]["tensor"] for r in results] == [[0, 1], [0, 1], [2, 3], [2, 3]]
    assert [r["groups"]["data"] for r in results] == [[0, 2], [1, 3], [0, 2], [1, 3]]
    check(results, "data")
    check(results, "tensor")
    check_flat_gather(results)
    np.testing.assert_array_equal(results[3]["send_recv"], inputs(0, (2, 2), 0.5))
