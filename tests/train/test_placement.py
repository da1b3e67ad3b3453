"""Which rank writes what (`mf_train.placement.Placement`), on every rank of real plans'
meshes: each range of each tensor is written by exactly one of the ranks holding it."""

from __future__ import annotations

import pytest

pytest.importorskip("mindspore")

import numpy as np
from mindspore import Parameter, Tensor

from mf_config import ParallelismConfig
from mf_parallel.dims import ParallelDims
from mf_parallel.mesh import RankMesh
from mf_parallel.runtime import Communication
from mf_parallel.runtime.tensor_parallel import mark_tensor_sharded
from mf_train.placement import Placement

EXPERT = "decoder_layers.1.mlp.experts.2.down.weight"


def placements(world: int, copies=(), **parallelism) -> list[Placement]:
    """Every rank's placement under `parallelism` on `world` ranks."""
    dims = ParallelDims.from_config(ParallelismConfig(**parallelism), world)
    mesh = RankMesh(dims)
    return [Placement(Communication(rank=rank, world_size=world, device_target="CPU",
                                    group_ranks=mesh.groups_of(rank), group_names={}), dims,
                      copies if mesh.coordinates(rank)["pipeline"] > 0 else ())
            for rank in range(world)]


def param(split: bool = False) -> Parameter:
    p = Parameter(Tensor(np.zeros((4, 4), np.float32)), name="w")
    if split:
        mark_tensor_sharded(p)
    return p


def writers(ranks: list[Placement], name: str, p: Parameter, sliced: bool = False) -> list[int]:
    return [place.comm.rank for place in ranks if place.owns(name, p, sliced)]


def test_data_and_tensor_parallel() -> None:
    """4 ranks, data 2 x tensor 2 (tensor innermost): a replicated weight by rank 0 alone; a
    tensor-split one by one rank per tensor place, which records its place."""
    ranks = placements(4, tensor_parallel=2, data_parallel_shard=1)
    assert writers(ranks, "norm.weight", param()) == [0]
    assert writers(ranks, "qkv.weight", param(split=True)) == [0, 1]
    assert [place.tensor(param(split=True)) for place in ranks] == [(0, 2), (1, 2), (0, 2),
                                                                     (1, 2)]
    assert [place.tensor(param()) for place in ranks] == [None] * 4
    assert [place.writes_scalars for place in ranks] == [True, False, False, False]


def test_fsdp_slices_and_hsdp_replicas() -> None:
    """Slices are each shard rank's own: all 4 FSDP ranks write theirs; under HSDP (replicate 2
    x shard 2) the first replica's two shard ranks do."""
    fsdp = placements(4, data_parallel_shard=4)
    assert writers(fsdp, "w", param(), sliced=True) == [0, 1, 2, 3]
    hsdp = placements(4, data_parallel_shard=2)
    assert writers(hsdp, "w", param(), sliced=True) == [0, 1]
    assert writers(hsdp, "w", param()) == [0]  # a parameter FSDP keeps whole


def test_experts_once_per_expert_data_group_and_the_tied_copy() -> None:
    """Expert parallel 2 over 4 data ranks: each expert share is held by two ranks, written by
    the first; the last pipeline stage's copy of a tied table is not written."""
    experts = placements(4, expert_parallel=2)
    assert writers(experts, EXPERT, param()) == [0, 1]
    assert writers(experts, "router.weight", param()) == [0]
    stages = placements(2, copies={"embedding.weight"}, pipeline_parallel=2)
    assert writers(stages, "embedding.weight", param()) == [0]
