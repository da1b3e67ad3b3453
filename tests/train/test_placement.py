"""Which rank writes what of a checkpoint (the placement record's owner rule,
`mf_parallel.placement.owns`, as `checkpoint.regions` reads it), on every rank of real plans'
meshes: each range of each tensor is written by exactly one of the ranks holding it."""

from __future__ import annotations

import pytest

pytest.importorskip("mindspore")

from mf_config import ParallelismConfig, TrainingConfig
from mf_parallel import make_plan
from mf_parallel.placement import ParameterSpec, ShardingTable, owns, place_parameters, region
from mf_train.checkpoint.regions import RankRegions

EXPERTS = [f"layers.1.experts.{e}.down.weight" for e in range(4)]
TABLE = ShardingTable([
    ParameterSpec("embedding.weight", (8, 4), where="embedding"),
    ParameterSpec("layers.0.qkv.weight", (4, 4), axis=0, layer=0),
    ParameterSpec("layers.1.router.weight", (4, 4), layer=1),
    *(ParameterSpec(name, (4, 4), axis=0, layer=1, expert=e, experts=4)
      for e, name in enumerate(EXPERTS)),
    ParameterSpec("norm.weight", (4,), where="head"),
], tied=True)


def writers(world: int, name: str, strategy: str | None = None,
            **parallelism) -> list[int]:
    """The ranks writing parameter `name` of `TABLE` under `parallelism` on `world` ranks."""
    plan = make_plan(ParallelismConfig(**parallelism),
                     TrainingConfig(global_batch_size=8, local_batch_size=1), world,
                     num_layers=2)
    placement = place_parameters(TABLE, plan, strategy)[name]
    return [rank for rank in range(world) if owns(placement, rank, plan)]


def places(world: int, name: str, **parallelism) -> list[tuple[int, int] | None]:
    plan = make_plan(ParallelismConfig(**parallelism),
                     TrainingConfig(global_batch_size=8, local_batch_size=1), world,
                     num_layers=2)
    placement = place_parameters(TABLE, plan)[name]
    return [region(placement, rank, plan).tensor for rank in range(world)]


def test_data_and_tensor_parallel() -> None:
    """4 ranks, data 2 x tensor 2 (tensor innermost): a replicated weight by rank 0 alone; a
    tensor-split one by one rank per tensor place, which records its place."""
    dims = {"tensor_parallel": 2, "data_parallel_shard": 1}
    assert writers(4, "norm.weight", **dims) == [0]
    assert writers(4, "layers.0.qkv.weight", **dims) == [0, 1]
    assert places(4, "layers.0.qkv.weight", **dims) == [(0, 2), (1, 2), (0, 2), (1, 2)]
    assert places(4, "norm.weight", **dims) == [None] * 4
    assert [RankRegions({}, None, rank).writes_scalars for rank in range(4)] == \
        [True, False, False, False]


def test_fsdp_slices_and_hsdp_replicas() -> None:
    """Slices are each shard rank's own: all 4 FSDP ranks write theirs; under HSDP (replicate 2
    x shard 2) the first replica's two shard ranks do."""
    fsdp = "optim_grads_params"
    assert writers(4, "norm.weight", fsdp, data_parallel_shard=4) == [0, 1, 2, 3]
    assert writers(4, "norm.weight", fsdp, data_parallel_shard=2) == [0, 1]
    assert writers(4, "norm.weight", data_parallel_shard=2) == [0]  # kept whole


def test_experts_once_per_expert_data_group_and_the_tied_copy() -> None:
    """Expert parallel 2 over 4 data ranks: each expert share is held by two ranks, written by
    the first; the last pipeline stage's copy of a tied table is not written."""
    experts = [writers(4, name, expert_parallel=2) for name in EXPERTS]
    assert sorted(experts) == [[0], [0], [1], [1]]  # ranks 2 and 3 hold 0's and 1's shares
    assert writers(4, "layers.1.router.weight", expert_parallel=2) == [0]
    assert writers(2, "embedding.weight", pipeline_parallel=2) == [0]
