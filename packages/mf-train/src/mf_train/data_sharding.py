"""Which data-parallel strategy the trainer runs, whether the rest of the configuration allows
it, and building its optimizer.

With a data-parallel shard degree (`parallelism.data_parallel_shard`, -1 = every data-parallel
rank) above one, `parallelism.data_parallel_shard_strategy` decides:

- `optim` (ZeRO-1): gradients all-reduced whole, optimizer state and update for this rank's
  slice, slices all-gathered back into the model;
- `optim_grads` (ZeRO-2): gradients reduce-scattered, so only the slice is kept after
  the reduction;
- `optim_grads_params` (FSDP): parameters sharded too, unit by unit (the decoder layers; the
  embedding, final norm and head form the root unit), gathered around each unit's forward and
  backward (`reshard_after_forward_policy`).

With shard degree 1 the data-parallel ranks are replicas (plain data parallelism, gradients
all-reduced, `train_step`'s path). The sharded strategies run `sharded_optimizer.ShardedAdamW`;
what they cannot run yet is refused before any rank starts (`check_sharding`): Muon (its
Newton-Schulz step needs whole matrices, the slices cut them), optimizers other than AdamW,
tensor parallelism together with sharding, and under FSDP mf-memory's swap and communication
recompute (their saved-tensor hooks and FSDP's do not stack).
"""

from __future__ import annotations

from typing import Any

from mf_config import (
    OptimizerConfig,
    ParallelismConfig,
    RecomputeCommConfig,
    SwapConfig,
)
from mf_config.component_settings import settings_error
from mf_config.yaml_source import Source
from mf_parallel.dims import ParallelDims

NAMES = {"optim": "ZeRO-1", "optim_grads": "ZeRO-2", "optim_grads_params": "FSDP"}
FSDP = "optim_grads_params"
STRATEGY_PATH = ("parallelism", "data_parallel_shard_strategy")


def sharded_strategy(parallelism: ParallelismConfig, dims: ParallelDims) -> str | None:
    """The sharded strategy that runs, or None for replicated data parallelism (shard degree
    1, including a single process)."""
    return parallelism.data_parallel_shard_strategy if dims.data_shard > 1 else None


def describe(parallelism: ParallelismConfig, dims: ParallelDims) -> str:
    """One line for the log: `data parallel 2 (replicated)`, `ZeRO-2 over 2 ranks`,
    `FSDP over 2 ranks, reshard policy default` (`x R replicas` with HSDP)."""
    strategy = sharded_strategy(parallelism, dims)
    if strategy is None:
        return (f"data parallel {dims.data} (replicated)" if dims.data > 1
                else "no data parallelism")
    text = f"{NAMES[strategy]} over {dims.data_shard} ranks"
    if dims.data_replicate > 1:
        text += f" x {dims.data_replicate} replicas"
    if strategy == FSDP:
        text += f", reshard policy {parallelism.reshard_after_forward_policy}"
    return text


def check_sharding(dims: ParallelDims, *, parallelism: ParallelismConfig,
                   optimizer: OptimizerConfig, swap: SwapConfig,
                   recompute_comm: RecomputeCommConfig, source: Source | None = None) -> None:
    """`ConfigError` listing every setting the sharded strategy cannot run with; nothing
    when the data-parallel ranks are replicas."""
    strategy = sharded_strategy(parallelism, dims)
    if strategy is None:
        return
    name = f"{strategy} ({NAMES[strategy]}) with data_parallel_shard {dims.data_shard}"
    found = _optimizer_problems(optimizer, name, source)
    if dims.tensor > 1:
        found.append((("parallelism", "tensor_parallel"),
                      f"{name} together with tensor parallelism is not run by mf-train yet; set "
                      "parallelism.data_parallel_shard: 1 (replicated data parallelism) or "
                      "tensor_parallel: 1"))
    if strategy == FSDP and swap.enable:
        found.append((("swap", "enable"),
                      f"swap cannot run under {name}: both use MindSpore's saved-tensor hooks, "
                      "which do not stack; set swap.enable: false or choose "
                      "data_parallel_shard_strategy 'optim_grads' (ZeRO-2)"))
    if strategy == FSDP and recompute_comm.enable:
        found.append((("recompute_comm", "enable"),
                      f"communication recompute cannot run under {name}: both use MindSpore's "
                      "saved-tensor hooks, which do not stack; set recompute_comm.enable: "
                      "false or choose data_parallel_shard_strategy 'optim_grads' (ZeRO-2)"))
    if found:
        raise settings_error(found, source)


def _optimizer_problems(optimizer: OptimizerConfig, name: str,
                        source: Source | None) -> list[tuple[tuple[str, ...], str]]:
    from .optim import AdamW, Muon
    from .registry import OPTIMIZERS

    cls = OPTIMIZERS.get(optimizer.type, ("optimizer", "type"), source)
    if cls is AdamW:
        return []
    if isinstance(cls, type) and issubclass(cls, Muon):
        return [(("optimizer", "type"),
                 f"Muon cannot run under {name}: its Newton-Schulz step needs each weight "
                 "matrix whole, and the sharded strategies give each rank a flat slice that "
                 "cuts matrices; use AdamW, or parallelism.data_parallel_shard: 1 "
                 "(replicated data parallelism)")]
    return [(("optimizer", "type"),
             f"{optimizer.type!r} cannot run under {name}: the sharded strategies update "
             "slices with AdamW's element-wise step only; use AdamW, or "
             "parallelism.data_parallel_shard: 1 (replicated data parallelism)")]


def build_sharded_optimizer(strategy: str, config: OptimizerConfig, model: Any,
                            collectives: Any, *, reshard_policy: str = "default",
                            pipeline_parallel: int = 1, average: bool = True,
                            source: Source | None = None) -> Any:
    """`ShardedAdamW` over `model`'s trainable parameters under `strategy` (`optim`,
    `optim_grads` or `optim_grads_params`), its settings from the `optimizer` section.
    FSDP shards `model.decoder_layers` unit by unit and leaves placeholders in the model.
    `average`: divide the reduced gradients by the data-parallel size (else they are summed,
    `parallelism.disable_gradient_division`)."""
    from mf_parallel.runtime import FullyShardedDataParallel, ShardedDataParallel

    from .optim.adamw import adamw_settings
    from .optim.base import adam_hyperparameters, decay_flags
    from .sharded_optimizer import ShardedAdamW

    named = [(p.name, p) for p in model.trainable_params()]
    adamw_settings(config, source)
    betas, eps = adam_hyperparameters(config, source)
    rates = [config.weight_decay if decays else 0.0
             for decays in decay_flags(config, named, source)]
    if strategy == FSDP:
        sharded = FullyShardedDataParallel(
            model, list(_decoder_layers(model)), collectives,
            reshard_after_forward_policy=reshard_policy, pipeline_parallel=pipeline_parallel,
            average=average)
    else:
        sharded = ShardedDataParallel([p for _, p in named], collectives, strategy,
                                      average=average)
    return ShardedAdamW(named, sharded, collectives, betas=betas, eps=eps,
                        weight_decays=rates)


def _decoder_layers(model: Any) -> Any:
    layers = getattr(model, "decoder_layers", None)
    if layers is None or len(layers) == 0:
        raise settings_error([(STRATEGY_PATH,
                               f"FSDP shards the model's decoder layers, and "
                               f"{type(model).__name__} has none (no `decoder_layers`); "
                               "choose 'optim_grads' (ZeRO-2)")])
    return layers
