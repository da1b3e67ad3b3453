"""Parallel degrees, rank coordinates and communication groups."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mf_config import ParallelismConfig
from mf_parallel.dims import ParallelDims
from mf_parallel.errors import PlanError
from mf_parallel.mesh import DIMENSIONS, GROUP_KINDS, RankMesh


def dims(world: int, **parallelism) -> ParallelDims:
    return ParallelDims.from_config(ParallelismConfig(**parallelism), world)


def test_data_parallel_is_what_is_left() -> None:
    d = dims(16, tensor_parallel=2, pipeline_parallel=2)
    assert (d.pipeline, d.data, d.data_replicate, d.data_shard, d.context, d.tensor) == (
        2, 4, 1, 4, 1, 2)
    assert not d.hsdp


def test_hsdp_gives_a_replicate_dimension() -> None:
    d = dims(8, data_parallel_shard=2)
    assert (d.data, d.data_replicate, d.data_shard, d.hsdp) == (8, 4, 2, True)
    assert d.describe() == ("world 8 = pipeline 1 x data 8 (replicate 4 x shard 2) x "
                            "context 1 x tensor 1")


@pytest.mark.parametrize(("world", "parallelism", "message"), [
    (6, {"tensor_parallel": 4}, "world size 6 is not divisible by tensor_parallel (4) x "
                                "context_parallel (1) x pipeline_parallel (1) = 4"),
    (8, {"pipeline_parallel": 3}, "pipeline_parallel (3) = 3"),
    (8, {"data_parallel_shard": 3}, "data_parallel_shard (3) must divide the data-parallel "
                                    "degree 8"),
    (8, {"expert_parallel": 3}, "expert_parallel (3) must divide data_parallel_shard x "
                                "context_parallel (8 x 1 = 8)"),
    (8, {"tensor_parallel": 2, "expert_parallel": 6}, "expert_parallel (6)"),
    (0, {}, "the world size must be >= 1, got 0"),
])
def test_layouts_that_do_not_fit(world, parallelism, message) -> None:
    with pytest.raises(PlanError) as exc:
        dims(world, **parallelism)
    assert message in str(exc.value)


def test_expert_parallel_borrows_tensor_ranks_when_it_must() -> None:
    assert dims(8, tensor_parallel=2, expert_parallel=4).expert_span == "shard_context"
    d = dims(8, tensor_parallel=2, expert_parallel=8)
    assert d.expert_span == "shard_context_tensor"
    assert d.describe().endswith("; expert 8 over shard x context x tensor")


def test_rank_order_has_tensor_fastest() -> None:
    mesh = RankMesh(dims(8, tensor_parallel=2, pipeline_parallel=2))
    assert mesh.coordinates(0) == dict.fromkeys(DIMENSIONS, 0)
    assert mesh.coordinates(1) == {"pipeline": 0, "replicate": 0, "shard": 0, "context": 0,
                                   "tensor": 1}
    assert mesh.coordinates(6) == {"pipeline": 1, "replicate": 0, "shard": 1, "context": 0,
                                   "tensor": 0}
    assert mesh.groups("tensor") == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert mesh.groups("pipeline") == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert mesh.groups("data") == [[0, 2], [1, 3], [4, 6], [5, 7]]


def test_groups_of_a_four_dimensional_layout() -> None:
    """pipeline 2 x replicate 2 x shard 2 x context 2 x tensor 2 = 32 ranks."""
    mesh = RankMesh(dims(32, data_parallel_shard=2, context_parallel=2, tensor_parallel=2,
                         pipeline_parallel=2))
    groups = mesh.groups_of(13)  # 13 = 0b01101: pipeline 0, replicate 1, shard 1, context 0, tp 1
    assert mesh.coordinates(13) == {"pipeline": 0, "replicate": 1, "shard": 1, "context": 0,
                                    "tensor": 1}
    assert groups["tensor"] == [12, 13]
    assert groups["context"] == [13, 15]
    assert groups["shard"] == [9, 13]
    assert groups["replicate"] == [5, 13]
    assert groups["data"] == [1, 5, 9, 13]
    assert groups["loss"] == [1, 3, 5, 7, 9, 11, 13, 15]
    assert groups["pipeline"] == [13, 29]


def test_expert_groups() -> None:
    mesh = RankMesh(dims(8, expert_parallel=4))
    assert mesh.groups("expert") == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert mesh.groups("expert_data") == [[0, 4], [1, 5], [2, 6], [3, 7]]
    mesh = RankMesh(dims(8, tensor_parallel=2, expert_parallel=2))  # over shard, per tensor rank
    assert mesh.groups("expert") == [[0, 2], [1, 3], [4, 6], [5, 7]]
    # Experts are not tensor-split: both tensor ranks of a position hold the same experts.
    assert mesh.groups("expert_data") == [[0, 1, 4, 5], [2, 3, 6, 7]]
    mesh = RankMesh(dims(8, data_parallel_shard=2, expert_parallel=2))  # HSDP: replicas too
    assert mesh.groups("expert_data") == [[0, 2, 4, 6], [1, 3, 5, 7]]
    mesh = RankMesh(dims(8, pipeline_parallel=2, expert_parallel=2))  # per stage
    assert mesh.groups("expert_data") == [[0, 2], [1, 3], [4, 6], [5, 7]]
    mesh = RankMesh(dims(8, tensor_parallel=2, expert_parallel=8))  # borrows the tensor ranks
    assert mesh.groups("expert") == [list(range(8))]
    assert mesh.groups("expert_data") == [[r] for r in range(8)]


def test_each_rank_holds_the_experts_of_its_place_in_its_expert_group() -> None:
    mesh = RankMesh(dims(8, tensor_parallel=2, expert_parallel=2))  # groups [0, 2], [1, 3], ...
    assert [mesh.experts_of(rank, 8) for rank in range(4)] == [range(0, 4), range(0, 4),
                                                               range(4, 8), range(4, 8)]
    assert RankMesh(dims(8)).experts_of(5, 8) == range(8)  # no expert parallelism
    with pytest.raises(PlanError, match="6 routed experts cannot be split evenly over "
                                        "expert_parallel 4 ranks"):
        RankMesh(dims(8, expert_parallel=4)).experts_of(0, 6)


def test_device_groups_of_the_deredundant_dispatcher() -> None:
    d = dims(8, expert_parallel=8, moe_token_dispatcher_type="alltoall_deredundancy",
             npu_nums_per_device=4)
    assert d.expert_node == 4
    assert d.describe().endswith("; expert 8 over shard x context in devices of 4")
    mesh = RankMesh(d)
    assert mesh.groups("expert_node") == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert mesh.groups("expert_peer") == [[0, 4], [1, 5], [2, 6], [3, 7]]
    plain = RankMesh(dims(8, expert_parallel=4, npu_nums_per_device=2))
    assert plain.dims.expert_node == 1  # the all-to-all dispatcher has no devices
    assert plain.groups("expert_node") == [[r] for r in range(8)]
    assert plain.groups("expert_peer") == plain.groups("expert")
    with pytest.raises(PlanError, match=r"expert_parallel \(6\) must be a multiple of "
                                        r"npu_nums_per_device \(4\)"):
        dims(12, expert_parallel=6, moe_token_dispatcher_type="alltoall_deredundancy",
             npu_nums_per_device=4)


def test_unknown_group_kind_and_rank() -> None:
    mesh = RankMesh(dims(4))
    with pytest.raises(PlanError, match="unknown group kind 'model'; known: pipeline"):
        mesh.groups("model")
    with pytest.raises(PlanError, match=r"rank 4 is outside the world \(0..3\)"):
        mesh.coordinates(4)


LAYOUTS = st.builds(
    lambda pp, rep, shard, cp, tp, ep_pick: (pp, rep, shard, cp, tp, ep_pick),
    st.integers(1, 3), st.integers(1, 3), st.integers(1, 4), st.integers(1, 2),
    st.integers(1, 4), st.integers(0, 10))


@settings(max_examples=150, deadline=None)
@given(LAYOUTS)
def test_every_rank_is_in_exactly_one_group_of_each_kind(layout) -> None:
    pp, rep, shard, cp, tp, ep_pick = layout
    divisors = [e for e in range(1, shard * cp * tp + 1) if (shard * cp) % e == 0
                or (e % tp == 0 and (shard * cp * tp) % e == 0)]
    ep = divisors[ep_pick % len(divisors)]
    world = pp * rep * shard * cp * tp
    d = dims(world, pipeline_parallel=pp, data_parallel_shard=shard, context_parallel=cp,
             tensor_parallel=tp, expert_parallel=ep)
    assert (d.data_replicate, d.data_shard) == (rep, shard)
    mesh = RankMesh(d)
    expected_sizes = {"pipeline": pp, "replicate": rep, "shard": shard, "context": cp,
                      "tensor": tp, "data": rep * shard, "loss": rep * shard * cp,
                      "expert": ep}
    for kind in GROUP_KINDS:
        groups = mesh.groups(kind)
        members = sorted(itertools.chain.from_iterable(groups))
        assert members == list(range(world)), kind
        assert len({len(g) for g in groups}) == 1, kind
        if kind in expected_sizes:
            assert len(groups[0]) == expected_sizes[kind], kind
    assert len(mesh.groups("expert_data")[0]) == world // (pp * ep)
    for group in mesh.groups("expert_data"):  # one stage, one place in its expert group
        assert len({mesh.coordinates(r)["pipeline"] for r in group}) == 1
        assert len({mesh.groups_of(r)["expert"].index(r) for r in group}) == 1
    for rank in range(world):
        coords = mesh.coordinates(rank)
        assert mesh.rank(coords) == rank
        for kind, group in mesh.groups_of(rank).items():
            assert rank in group, kind
        # ranks of one tensor group differ only in the tensor coordinate
        for other in mesh.groups_of(rank)["tensor"]:
            assert {k: v for k, v in mesh.coordinates(other).items() if k != "tensor"} == {
                k: v for k, v in coords.items() if k != "tensor"}
