"""The placement record (`mf_parallel.placement`) from the models' sharding tables and real
plans, against what the code that trains and saves works out its own way: the built models'
parameters and the export's `holdings` (the checkpoint writes what the record's `owns`
says: test_checkpoint_layouts.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("mindspore")

from runs import DEEPSEEK, QWEN3

from mf_config.validate import config_from_source, load_source
from mf_parallel.placement import FlatRange, Replicate, Shard, owns, place_parameters, region
from mf_train.layouts.expert_parallel import expert_index
from mf_train.layouts.pipelined import stage_part
from mf_train.models import build_model, sharding_table
from mf_train.preflight.job import make_job_plan


def record(example: Path, world: int, *overrides: str):
    """(config, plan, placements by name) of `example` with `overrides` on `world` ranks."""
    batch = "training.global_batch_size=32"  # a micro-batch for each of 16 data ranks
    config = config_from_source(load_source(str(example), [batch, *overrides]))
    plan = make_job_plan(config, world)
    strategy = config.parallelism.data_parallel_shard_strategy
    return config, plan, place_parameters(sharding_table(config.model), plan, strategy)


@pytest.mark.parametrize("example", [QWEN3, DEEPSEEK])
def test_tables_list_the_built_models_parameters(example: Path) -> None:
    """Names, shapes, dtypes, trainability in the model's order; fused parts and split axes
    as the model's own weight table (which export and import read)."""
    config = config_from_source(load_source(str(example), []))
    model = build_model(config.model, seed=0)
    table = sharding_table(config.model)
    assert [(s.name, s.shape, s.dtype, s.trainable) for s in table.params] == [
        (name, tuple(p.shape), str(p.dtype).lower(), p.requires_grad)
        for name, p in model.parameters_and_names()]
    maps = model.weight_maps()
    assert [(s.parts, s.axis) for s in table.params] == [
        (tuple(zip(e.hf, e.rows(), strict=True)), e.axis) for e in maps]


def holdings(config, plan) -> list[tuple[int, frozenset[str], int]]:
    """Per rank, `(rank, names, tensor place)` of what training builds there: its pipeline
    stage's model (`stage_part`), its share of the routed experts (`RankMesh.experts_of`)
    and its place in its tensor group."""
    whole = build_model(config.model, seed=0)
    experts = whole.settings.n_routed_experts if plan.dims.expert > 1 else 0
    stages = {}
    found = []
    for rank in range(plan.dims.world_size):
        part = stage_part(plan, rank)
        if part not in stages:
            model = whole if part is None else build_model(config.model, seed=0, part=part)
            stages[part] = [entry.ours for entry in model.weight_maps()]
        held = plan.mesh.experts_of(rank, experts) if experts else None
        names = frozenset(name for name in stages[part]
                          if held is None or expert_index(name) in (None, *held))
        found.append((rank, names, plan.mesh.coordinates(rank)["tensor"]))
    return found


HOLDING_LAYOUTS = [
    (QWEN3, 8, ("parallelism.pipeline_parallel=2", "parallelism.tensor_parallel=2")),
    (QWEN3, 2, ("parallelism.pipeline_parallel=2",
                "parallelism.pipeline_parallel_schedule=interleaved_1f1b",
                "parallelism.pipeline_parallel_interleave_num=2")),
    (DEEPSEEK, 4, ("parallelism.tensor_parallel=2", "parallelism.expert_parallel=2")),
    (DEEPSEEK, 2, ("parallelism.tensor_parallel=2", "parallelism.expert_parallel=2")),
    (DEEPSEEK, 4, ("parallelism.pipeline_parallel=2", "parallelism.expert_parallel=2")),
    (DEEPSEEK, 8, ("parallelism.pipeline_parallel=2", "parallelism.expert_parallel=2",
                   "parallelism.data_parallel_shard=4",
                   "parallelism.data_parallel_shard_strategy=optim_grads_params")),
]


@pytest.mark.parametrize(("example", "world", "overrides"), HOLDING_LAYOUTS)
def test_each_rank_holds_what_training_builds_there(example, world, overrides) -> None:
    """Per rank, the parameters the record puts there are those training builds there (the
    stage's built model, `experts_of`), and a split weight's shard is its tensor place's."""
    config, plan, placed = record(example, world, *overrides)
    for rank, names, tensor in holdings(config, plan):
        held = {name: region(p, rank, plan, "param") for name, p in placed.items()}
        assert {name for name, r in held.items() if r is not None} == names
        for name in names:
            place = held[name].tensor
            assert place is None or place == (tensor, plan.dims.tensor), name


TILED = [
    (DEEPSEEK, 16, ("parallelism.pipeline_parallel=2", "parallelism.tensor_parallel=2",
                    "parallelism.expert_parallel=2", "parallelism.data_parallel_shard=2",
                    "parallelism.data_parallel_shard_strategy=optim_grads_params")),
    (QWEN3, 3, ("parallelism.data_parallel_shard=3",  # chunks that do not divide: padded
                "parallelism.data_parallel_shard_strategy=optim")),
]


@pytest.mark.parametrize(("example", "world", "overrides"), TILED)
def test_owned_regions_tile_every_tensor_once(example, world, overrides) -> None:
    """HSDP x tensor x pipeline x experts, and uneven slices: over the ranks, the owned
    regions of each parameter cover its global elements exactly once."""
    _, plan, placed = record(example, world, *overrides)
    for name, placement in placed.items():
        count = np.zeros(placement.global_shape, np.int64)
        for rank in range(world):
            held = region(placement, rank, plan)
            if held is None or not owns(placement, rank, plan):
                continue
            index = np.arange(count.size).reshape(placement.global_shape)
            shard = np.concatenate([index[box] for box in held.boxes],
                                   axis=getattr(placement.tensor, "axis", 0))
            count.reshape(-1)[shard.reshape(-1)[held.flat[0]:held.flat[1]]] += 1
        assert (count == 1).all(), name


def test_placements_of_each_strategy() -> None:
    """Data placements (param, grad, state): ZeRO-1 R R F, ZeRO-2 R F F, FSDP F F F over the
    shard group with the HSDP replicas; routed experts over the expert-data group; the
    partial-sum groups; a fused weight's shard is one box per part."""
    sets = ("parallelism.data_parallel_shard=2", "parallelism.expert_parallel=2")
    want = {"optim": "RRF", "optim_grads": "RFF", "optim_grads_params": "FFF"}
    for strategy, letters in want.items():
        _, plan, placed = record(DEEPSEEK, 4, *sets,
                                 f"parallelism.data_parallel_shard_strategy={strategy}")
        norm = placed["decoder_layers.1.input_norm.weight"]
        assert "".join("F" if isinstance(norm.data(k), FlatRange) else "R"
                       for k in ("param", "grad", "state")) == letters
        assert norm.state == FlatRange("shard", "replicate")
        expert = placed["decoder_layers.1.mlp.experts.3.down.weight"]
        assert expert.state == FlatRange("expert_data")
        assert expert.grad_partial == ("expert_data",)
    _, plan, placed = record(QWEN3, 4, "parallelism.tensor_parallel=2",
                             "parallelism.pipeline_parallel=2")
    qkv = placed["decoder_layers.0.attention.qkv.weight"]
    assert qkv.tensor == Shard(0) and qkv.state == Replicate("loss")
    assert placed["decoder_layers.0.input_norm.weight"].grad_partial == ("loss", "tensor")
    assert placed["embedding.weight"].stages == (0, 1)
    assert placed["embedding.weight"].grad_partial == ("loss", "tied")
    q, kv = 4 * 16, 2 * 16  # 4 query heads, 2 key/value heads of 16
    assert region(qkv, 1, plan).boxes == (
        (slice(q // 2, q), slice(0, 64)), (slice(q + kv // 2, q + kv), slice(0, 64)),
        (slice(q + kv + kv // 2, q + 2 * kv), slice(0, 64)))
