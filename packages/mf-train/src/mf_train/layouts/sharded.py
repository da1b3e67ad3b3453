"""Sharded data parallelism: ZeRO-1, ZeRO-2 and FSDP, each rank updating its slice.

With a data-parallel shard degree (`parallelism.data_parallel_shard`, -1 = every data-parallel
rank) above one, `parallelism.data_parallel_shard_strategy` decides:

- `optim` (ZeRO-1): gradients all-reduced whole, optimizer state and update for this rank's
  slice, slices all-gathered back into the model;
- `optim_grads` (ZeRO-2): gradients reduce-scattered, so only the slice is kept after
  the reduction;
- `optim_grads_params` (FSDP): parameters sharded too, unit by unit (the decoder layers; the
  embedding, final norm and head form the root unit), gathered around each unit's forward and
  backward (`reshard_after_forward_policy`).

mf-parallel's `ShardedDataParallel` / `FullyShardedDataParallel` reduce the gradients to this
rank's slice; `optim.ShardedAdamW` updates it. The global norm is sqrt(sum over the shard
group of this rank's sum of squares): the slices of the shard group partition every gradient
(padding is zero), and with HSDP the replicas hold equal slices, so summing over the shard
group alone counts each element once (`SliceNorm`).

With tensor parallelism (`parallelism.tensor_parallel` > 1) each strategy runs on the plan's
groups as they are: the shard group is over ranks of the same tensor coordinate, so each rank's
flat buffers are laid out over its own tensor-parallel shards, the same shapes on every rank of
its shard group; FSDP gathers and frees those shards (the layers' custom-bprop cells are
untouched: they hold no parameters) and `whole_model()` gathers the model each rank holds under
plain tensor parallelism, which is what its checkpoint saves. Before the data-parallel
reduction, the partial gradients of the sequence-parallel parameters (norm weights,
row-parallel biases) are summed over the tensor group, as `TensorParallel` does; the norm then
adds the squares of tensor-split elements over the tensor group too and counts the replicated
ones once.

What the sharded strategies cannot run yet is refused before any rank starts (`problems`):
Muon (its Newton-Schulz step needs whole matrices, the slices cut them), optimizers other than
AdamW, and under FSDP mf-memory's swap and communication recompute (their saved-tensor hooks
and FSDP's do not stack).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from typing import Any

import numpy as np
from mindspore import Parameter, Tensor, nn, ops

from mf_config import OptimizerConfig, ParallelismConfig
from mf_config.component_settings import settings_error
from mf_config.yaml_source import Source
from mf_parallel import runtime
from mf_parallel.dims import ParallelDims
from mf_parallel.runtime import Collectives
from mf_parallel.runtime.tensor_parallel import (
    TensorGroup,
    is_tensor_sharded,
    reduce_sequence_parallel_grads,
)

from ..optim import AdamW, Muon, ShardedAdamW
from ..optim.adamw import adamw_settings
from ..optim.base import adam_hyperparameters, decay_flags
from ..optim.protocol import FLOAT32
from ..registry import OPTIMIZERS
from .contract import (
    LayoutParts,
    LayoutSections,
    LocalGradients,
    Problem,
    ReducedGradients,
    StepLayout,
)
from .replicated import DataParallelLoss, TensorParallel, whole_model_here

NAMES = {"optim": "ZeRO-1", "optim_grads": "ZeRO-2", "optim_grads_params": "FSDP"}
FSDP_STRATEGY = "optim_grads_params"
STRATEGY_PATH = ("parallelism", "data_parallel_shard_strategy")


class SliceNorm:
    """The global L2 norm of the reduced gradients, from this rank's slice of them.

    The slices of the shard group partition every flat buffer (padding is zero) and HSDP
    replicas hold equal slices, so summing the squares over the shard group counts each
    element of this rank's buffers once. Under tensor parallelism the buffers of the ranks
    of one tensor group hold different shards of the split parameters and equal copies of
    the replicated ones: the squares of split elements are then also summed over the tensor
    group, those of replicated elements counted once (as `replicated.tensor_parallel_norm`).

    Args:
        buffers: the sharded wrapper's flat buffers (`ShardedDataParallel.buffers`, or
            `FullyShardedDataParallel.buffers`), in slice order.
        collectives: this rank's collectives (the `shard` group).
        group: this rank's tensor group, or None without tensor parallelism.
    """

    def __init__(self, buffers: Sequence[Any], collectives: Collectives,
                 group: TensorGroup | None = None):
        self.collectives, self.group = collectives, group
        self.split: Tensor | None = None
        """1 where this rank's slice holds an element of a tensor-split parameter."""
        if group is not None and group.size > 1:
            self.split = Tensor(np.concatenate([
                buffer.flat.own_values([float(is_tensor_sharded(p)) for p in buffer.params])
                for buffer in buffers]))

    def __call__(self, grad: Tensor) -> float:
        squares = ops.square(grad)
        if self.split is None:
            total = self.collectives.all_reduce(ops.sum(squares).reshape(1), "shard")
            return math.sqrt(float(total.asnumpy()[0]))
        parts = ops.stack([ops.sum(squares * self.split), ops.sum(squares * (1 - self.split))])
        split, whole = self.collectives.all_reduce(parts, "shard").split(1)
        total = self.group.all_reduce(split) + whole
        return math.sqrt(float(total.asnumpy()[0]))


def reduce_to_slice(sharded: Any, collectives: Collectives, grads: Sequence[Tensor],
                    norm: SliceNorm | None = None) -> tuple[Tensor, float]:
    """This rank's slice of the reduced gradients, and their global norm.

    Args:
        sharded: mf-parallel's `ShardedDataParallel` or `FullyShardedDataParallel`.
        collectives: this rank's collectives (the norm sums over the `shard` group).
        grads: this rank's local gradients, aligned with the sharded parameters (under
            tensor parallelism, with the sequence-parallel partial sums already added up).
        norm: the norm of the slice (None: `SliceNorm` without tensor parallelism).

    Returns:
        The float32 slice (all buffers end to end) and the L2 norm of the whole gradient.
    """
    slices = sharded.reduce_grads(list(grads))
    grad = ops.cast(slices[0] if len(slices) == 1 else ops.cat(slices), FLOAT32)
    norm = norm if norm is not None else SliceNorm(sharded.buffers, collectives)
    return grad, norm(grad)


class ZeRO(StepLayout):
    """ZeRO-1 / ZeRO-2: optimizer state (and, ZeRO-2, reduced gradients) sharded."""

    def __init__(self, model: nn.Cell, optimizer: ShardedAdamW, collectives: Collectives,
                 parallelism: ParallelismConfig, dims: ParallelDims,
                 group: TensorGroup | None = None):
        self.loss = DataParallelLoss(collectives, parallelism)
        super().__init__(model, optimizer, loss_divisor=self.loss.divisor)
        self.sharded, self.collectives = optimizer.sharded, collectives
        self.strategy, self.dims = parallelism.data_parallel_shard_strategy, dims
        self.reshard_policy = parallelism.reshard_after_forward_policy
        self.group = group if group is not None and group.size > 1 else None
        self.norm = SliceNorm(self.sharded.buffers, collectives, self.group)
        if self.group is not None and self.compile_blocker is None:
            self.compile_blocker = TensorParallel.compile_blocker  # the layers' bprop cells

    @classmethod
    def selects(cls, dims: ParallelDims, parallelism: ParallelismConfig) -> bool:
        return (whole_model_here(dims) and dims.data_shard > 1
                and parallelism.data_parallel_shard_strategy != FSDP_STRATEGY)

    @classmethod
    def problems(cls, dims: ParallelDims, sections: LayoutSections) -> list[Problem]:
        name = (f"{sections.parallelism.data_parallel_shard_strategy} "
                f"({NAMES[sections.parallelism.data_parallel_shard_strategy]}) with "
                f"data_parallel_shard {dims.data_shard}")
        return _optimizer_problems(sections.optimizer, name, sections.source)

    @classmethod
    def build(cls, parts: LayoutParts) -> ZeRO:
        if parts.dims.tensor > 1 and parts.tensor_group is None:
            raise ValueError(f"{cls.__name__} with tensor_parallel {parts.dims.tensor} needs "
                             "the tensor-parallel group")
        named = [(p.name, p) for p in parts.model.trainable_params()]
        settings = adamw_settings_of(parts.optimizer, named, parts.source)
        sharded = cls.shard(parts, [p for _, p in named])
        optimizer = ShardedAdamW(named, sharded, parts.collectives, **settings)
        return cls(parts.model, optimizer, parts.collectives, parts.parallelism, parts.dims,
                   parts.tensor_group)

    @classmethod
    def shard(cls, parts: LayoutParts, params: list[Parameter]) -> Any:
        """mf-parallel's wrapper that lays `params` out in flat buffers and slices them."""
        return runtime.ShardedDataParallel(
            params, parts.collectives, parts.parallelism.data_parallel_shard_strategy,
            average=not parts.parallelism.disable_gradient_division)

    def describe(self) -> str:
        text = f"{NAMES[self.strategy]} over {self.dims.data_shard} ranks"
        if self.dims.data_replicate > 1:
            text += f" x {self.dims.data_replicate} replicas"
        if self.group is not None:
            text += f", tensor parallel {self.group.size} (sequence parallel)"
        return text

    def reduce(self, local: LocalGradients) -> ReducedGradients:
        """The sequence-parallel partial gradients summed over the tensor group first (each
        tensor rank's flat buffer then holds the whole gradient of its own shards), then
        reduced over the data-parallel ranks to this rank's slice."""
        grads = tuple(local.grads)
        if self.group is not None:
            grads = reduce_sequence_parallel_grads(self.params, grads, self.group)
        grad, norm = reduce_to_slice(self.sharded, self.collectives, grads, self.norm)
        return ReducedGradients(self.loss(local.loss), [grad], norm)


class FSDP(ZeRO):
    """FSDP: parameters sharded too, unit by unit, gathered around each unit's passes."""

    compile_blocker = ("FSDP swaps each unit's parameters for placeholders between its passes "
                       "(hooks a compiled graph would not see)")

    @classmethod
    def selects(cls, dims: ParallelDims, parallelism: ParallelismConfig) -> bool:
        return (whole_model_here(dims) and dims.data_shard > 1
                and parallelism.data_parallel_shard_strategy == FSDP_STRATEGY)

    @classmethod
    def problems(cls, dims: ParallelDims, sections: LayoutSections) -> list[Problem]:
        found = super().problems(dims, sections)
        name = f"{FSDP_STRATEGY} (FSDP) with data_parallel_shard {dims.data_shard}"
        for path, what in ((("swap", "enable"), "swap"),
                           (("recompute_comm", "enable"), "communication recompute")):
            section = getattr(sections, path[0])
            if section.enable:
                found.append((path, f"{what} cannot run under {name}: both use MindSpore's "
                                    "saved-tensor hooks, which do not stack; set "
                                    f"{'.'.join(path)}: false or choose "
                                    "data_parallel_shard_strategy 'optim_grads' (ZeRO-2)"))
        return found

    @classmethod
    def shard(cls, parts: LayoutParts, params: list[Parameter]) -> Any:
        """mf-parallel's FSDP wrapper: the decoder layers are the units, the rest the root."""
        return runtime.FullyShardedDataParallel(
            parts.model, list(_decoder_layers(parts.model)), parts.collectives,
            reshard_after_forward_policy=parts.parallelism.reshard_after_forward_policy,
            pipeline_parallel=parts.dims.pipeline,
            average=not parts.parallelism.disable_gradient_division)

    def describe(self) -> str:
        return f"{super().describe()}, reshard policy {self.reshard_policy}"

    def forward_context(self) -> AbstractContextManager[None]:
        """The root unit gathered and the saved-tensor hooks on (see `StepLayout`)."""
        return self.sharded.forward_context()

    @contextmanager
    def whole_model(self) -> Iterator[None]:
        """The parameters gathered (a collective: every rank enters together), freed after."""
        self.sharded.unshard()
        try:
            yield
        finally:
            self.sharded.reshard()


def adamw_settings_of(config: OptimizerConfig, named: list[tuple[str, Any]],
                      source: Source | None) -> dict[str, Any]:
    """`ShardedAdamW`'s keyword settings from the `optimizer` section: betas, eps and each
    parameter's decay rate. Read before mf-parallel shards the parameters: the decay groups
    depend on their shapes, which FSDP's placeholders lose."""
    adamw_settings(config, source)
    betas, eps = adam_hyperparameters(config, source)
    rates = [config.weight_decay if decays else 0.0
             for decays in decay_flags(config, named, source)]
    return {"betas": betas, "eps": eps, "weight_decays": rates}


def _optimizer_problems(optimizer: OptimizerConfig, name: str,
                        source: Source | None) -> list[Problem]:
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


def _decoder_layers(model: nn.Cell) -> nn.CellList:
    layers = getattr(model, "decoder_layers", None)
    if layers is None or len(layers) == 0:
        raise settings_error([(STRATEGY_PATH,
                               f"FSDP shards the model's decoder layers, and "
                               f"{type(model).__name__} has none (no `decoder_layers`); "
                               "choose 'optim_grads' (ZeRO-2)")])
    return layers
