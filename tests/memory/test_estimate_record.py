"""The estimate's share of each rank against the placement record.

mf-memory counts what a rank holds from its own parameter groups and the data-parallel rules
(`data_parallel`); mf-parallel's record (`place_parameters` over the model's sharding table,
mf-train's) places every parameter from the plan. The two must agree on every layout: the
parameter elements a rank holds between steps (`held_params`) and the elements of optimizer
state, summed over the record's regions of each parameter (`region`, `param` and `state`).
The record slices each tensor (its chunk ⌈n / S⌉), the estimate each flat buffer
(⌈P_b / S⌉), so sharded figures may differ by less than one element a tensor.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
from test_estimate import BASE as QWEN3
from test_estimate_moe import BASE as DEEPSEEK

from mf_config import TrainConfig
from mf_memory.estimate import estimate
from mf_parallel import make_plan
from mf_parallel.placement import place_parameters, region
from mf_train.models import sharding_table

LAYOUTS = {  # name: (world size, parallelism settings)
    "one process": (1, {}),
    "data parallel 4": (4, {"data_parallel_shard": 1}),
    "ZeRO-1 4": (4, {"data_parallel_shard_strategy": "optim"}),
    "ZeRO-2 4": (4, {"data_parallel_shard_strategy": "optim_grads"}),
    "FSDP 2": (2, {"data_parallel_shard_strategy": "optim_grads_params"}),
    "FSDP 4": (4, {"data_parallel_shard_strategy": "optim_grads_params"}),
    "FSDP 2 x TP 2": (4, {"tensor_parallel": 2}),
}
EXPERT_LAYOUTS = {
    "EP 2 x FSDP 2": (4, {"expert_parallel": 2}),
    "EP 2 x ZeRO-2": (4, {"expert_parallel": 2, "data_parallel_shard_strategy": "optim_grads"}),
    "EP 2": (2, {"expert_parallel": 2}),
}


def job(base: dict[str, Any], world: int, parallelism: dict[str, Any]) -> TrainConfig:
    data = copy.deepcopy(base)
    data["model"] = {**data["model"], "num_hidden_layers": 2, "vocab_size": 64, "seq_length": 8,
                     "tie_word_embeddings": False}
    data["parallelism"] = parallelism
    data["context"] = {"device_target": "CPU"}
    data["training"] = {"local_batch_size": 1, "global_batch_size": world}
    return TrainConfig.from_dict(data)


def record_share(config: TrainConfig, world: int, rank: int) -> tuple[int, int, int]:
    """(param elements, state elements, tensors) `rank` holds by the record."""
    plan = make_plan(config.parallelism, config.training, world, num_layers=2)
    placed = place_parameters(sharding_table(config.model), plan,
                              config.parallelism.data_parallel_shard_strategy)
    held = [region(p, rank, plan, "param") for p in placed.values()]
    state = [region(p, rank, plan, "state") for p in placed.values() if p.trainable]
    return (sum(r.size for r in held if r is not None),
            sum(r.size for r in state if r is not None), len(placed))


@pytest.mark.parametrize(("base", "layout"), [
    *[(QWEN3, name) for name in LAYOUTS], *[(DEEPSEEK, name) for name in LAYOUTS],
    *[(DEEPSEEK, name) for name in EXPERT_LAYOUTS]])
def test_the_estimate_holds_what_the_record_places(base: dict[str, Any], layout: str) -> None:
    world, parallelism = {**LAYOUTS, **EXPERT_LAYOUTS}[layout]
    config = job(base, world, parallelism)
    result = estimate(config, world)
    held, state, tensors = record_share(config, world, rank=0)
    sliced = world > 1 and parallelism.get("data_parallel_shard", -1) != 1
    fsdp = config.parallelism.data_parallel_shard_strategy == "optim_grads_params"
    slack = tensors if sliced else 1  # whole: equal
    assert 0 <= held - result.held_params < (slack if fsdp else 1)
    # AdamW's float32 state: two moments (8 B) and, when sliced under ZeRO, the master (4 B)
    per_element = 12 if sliced and not fsdp else 8
    assert 0 <= per_element * state - result.optimizer < per_element * slack
