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


def bfloat16(values: np.ndarray) -> np.ndarray:
    """float32 values rounded to the nearest bfloat16 (ties to even), as float32."""
    bits = np.asarray(values, np.float32).view(np.uint32)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & np.uint32(0xFFFF0000)
    return bits.view(np.float32)


ROUNDED = {"float32": lambda a: np.asarray(a, np.float32),
           "float16": lambda a: np.asarray(a, np.float16).astype(np.float32),
           "bfloat16": bfloat16}
"""Each reduce_dtype's rounding of float32 values (numpy has no bfloat16)."""


def reduce_input(rank: int, shape: tuple[int, ...]) -> np.ndarray:
    """workers/scenario_collectives.py's gradient of `rank`."""
    return ((np.arange(np.prod(shape), dtype=np.float32).reshape(shape) + 1) / 3
            + rank / 7).astype(np.float32)


def check_reduce_dtypes(results: list[dict]) -> None:
    """`reduce_dtype`: the gradients are rounded to it, summed in it (two ranks: one rounding
    of the exact sum) and cast back to float32; float16 and bfloat16 give other sums than
    float32, so the cast happened, and each the sum of its own rounding."""
    for result in results:
        group, shard = result["groups"]["data"], result["groups"]["shard"]
        assert len(group) == len(shard) == 2
        got = result["reduce_dtype"]
        for name, rounded in ROUNDED.items():
            wants = [rounded(sum(rounded(reduce_input(r, shape)) for r in group))
                     for shape in FLAT_SHAPES]
            assert got[name]["sync_dtypes"] == ["Float32"] * len(FLAT_SHAPES)
            for want, value in zip(wants, got[name]["sync"], strict=True):
                np.testing.assert_array_equal(np.array(value, np.float32), want)
            me, size = shard.index(result["rank"]), len(shard)
            chunks = []
            for want in wants:
                flat, chunk = want.reshape(-1), -(-want.size // size)
                piece = flat[me * chunk:(me + 1) * chunk]
                chunks += [piece, np.zeros(chunk - piece.size, np.float32)]
            assert got[name]["flat_dtype"] == "Float32"
            np.testing.assert_array_equal(np.array(got[name]["flat"], np.float32),
                                          np.concatenate(chunks))
        exact = np.concatenate([np.ravel(g) for g in got["float32"]["sync"]])
        for name in ("float16", "bfloat16"):
            cast = np.concatenate([np.ravel(g) for g in got[name]["sync"]])
            assert (cast != exact).mean() > 0.5


def test_collectives_on_two_ranks(runtime_suite) -> None:
    results = runtime_suite.results(2, "collectives", tensor_parallel=1)
    assert [r["groups"]["data"] for r in results] == [[0, 1], [0, 1]]
    check(results, "data")
    check(results, "tensor")  # one-rank groups: the identity
    check_flat_gather(results)
    check_reduce_dtypes(results)
    np.testing.assert_array_equal(results[1]["send_recv"], inputs(0, (2, 2), 0.5))


def test_collectives_on_four_ranks_data_2_x_tensor_2(runtime_suite) -> None:
    results = runtime_suite.results(4, "collectives", tensor_parallel=2)
    assert [r["groups"]["tensor"] for r in results] == [[0, 1], [0, 1], [2, 3], [2, 3]]
    assert [r["groups"]["data"] for r in results] == [[0, 2], [1, 3], [0, 2], [1, 3]]
    check(results, "data")
    check(results, "tensor")
    check_flat_gather(results)
    check_reduce_dtypes(results)
    np.testing.assert_array_equal(results[3]["send_recv"], inputs(0, (2, 2), 0.5))
