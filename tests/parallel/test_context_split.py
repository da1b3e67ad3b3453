"""The context-parallel split of the sequence and the context sub-groups of the mesh."""

from __future__ import annotations

import pytest

from mf_config import ParallelismConfig
from mf_parallel.dims import ParallelDims
from mf_parallel.errors import PlanError
from mf_parallel.mesh import RankMesh
from mf_parallel.sequence import context_spans


def tokens(spans: list[range]) -> list[int]:
    return [i for span in spans for i in span]


def test_causal_split_gives_each_rank_an_early_and_a_late_chunk() -> None:
    assert tokens(context_spans(16, 2, 0)) == [0, 1, 2, 3, 12, 13, 14, 15]
    assert tokens(context_spans(16, 2, 1)) == [4, 5, 6, 7, 8, 9, 10, 11]
    every = sorted(i for r in range(4) for i in tokens(context_spans(32, 4, r)))
    assert every == list(range(32))


def test_full_mask_split_is_contiguous() -> None:
    assert tokens(context_spans(12, 3, 1, causal=False)) == [4, 5, 6, 7]


def test_split_refuses_lengths_and_ranks_that_do_not_fit() -> None:
    with pytest.raises(PlanError, match=r"seq_length 10 must be a multiple of "
                                        r"context_parallel \(2\) x 2"):
        context_spans(10, 2, 0)
    with pytest.raises(PlanError, match=r"context rank 2 is outside 0\.\.1"):
        context_spans(16, 2, 2)


def mesh(world: int, **fields: object) -> RankMesh:
    return RankMesh(ParallelDims.from_config(ParallelismConfig(**fields), world))


def test_hybrid_groups_split_each_context_group() -> None:
    m = mesh(8, context_parallel=4, context_parallel_method="hybrid", ulysses_degree_in_cp=2,
             tensor_parallel=2)
    assert m.dims.context_ulysses == 2
    assert m.groups("context") == [[0, 2, 4, 6], [1, 3, 5, 7]]
    assert m.groups("context_ulysses") == [[0, 2], [1, 3], [4, 6], [5, 7]]
    assert m.groups("context_ring") == [[0, 4], [1, 5], [2, 6], [3, 7]]


def test_ulysses_and_colossal_degrees() -> None:
    assert mesh(4, context_parallel=4, context_parallel_method="ulysses").groups(
        "context_ulysses") == [[0, 1, 2, 3]]
    colossal = mesh(4, context_parallel=2)
    assert colossal.dims.context_ulysses == 1
    assert colossal.groups("context_ring") == [[0, 1], [2, 3]]
    assert "keys and values all-gathered over 2 (colossal)" in colossal.dims.describe()


def test_overlap_needs_a_key_value_gather() -> None:
    """`context_parallel_async` overlaps the ring's all-gather; pure Ulysses has none."""
    colossal = mesh(2, context_parallel=2, context_parallel_async=True).dims
    assert colossal.context_overlap
    assert ("keys and values all-gathered over 2, overlapped with attention over this rank's "
            "keys (colossal)") in colossal.describe()
    hybrid = mesh(4, context_parallel=4, context_parallel_method="hybrid",
                  ulysses_degree_in_cp=2, context_parallel_async=True).dims
    assert hybrid.context_overlap and "overlapped" in hybrid.describe()
    ulysses = mesh(2, context_parallel=2, context_parallel_method="ulysses",
                   context_parallel_async=True).dims
    assert not ulysses.context_overlap and "overlapped" not in ulysses.describe()
    assert not mesh(2, context_parallel=2).dims.context_overlap
