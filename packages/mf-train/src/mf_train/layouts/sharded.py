"""Sharded data parallelism: ZeRO-1, ZeRO-2 and FSDP, each rank updating its slice.

With a data-parallel shard degree (`parallelism.data_parallel_shard`, -1 = every data-parallel
rank) above one, `parallelism.data_parallel_shard_strategy` decides:

- `optim` (ZeRO-1): gradients all-reduced whole, optimizer state and update for this rank's
  slice, slices all-gathered back into the model;
- `optim_grads` (ZeRO-2): gradients reduce-scattered, so only the slice is kept after
  the reduction;
- `optim_grads_params` (FSDP): parameters sharded too, unit by unit (the decoder layers; the
  embedding, final norm and head form the root unit), gathered around each unit's forward and
  backward (`reshard_after_forward_policy`). Without tensor parallelism, and where the shard
  group's size divides the vocabulary, the embedding table and an untied head stay split by
  rows instead, never gathered: the tokens travel to them (`sharded_vocabulary`).

mf-parallel's `ShardedDataParallel` / `FullyShardedDataParallel` lay the parameters out in flat
buffers, whose gradients mf-parallel's `ShardedGradients` and `GradientReducer` reduce to this
rank's slice (as the placement record routes them); `optim.ShardedAdamW` updates it. The
global norm is `StepLayout`'s: each rank sums the squares of the chunks of its slices it owns
(the placement record: the slices of a shard group partition every gradient, padding is zero;
of HSDP replicas and of tensor ranks holding equal chunks, the first), one all-reduce over the
world.

With tensor parallelism (`parallelism.tensor_parallel` > 1) each strategy runs on the plan's
groups as they are: the shard group is over ranks of the same tensor coordinate, so each rank's
flat buffers are laid out over its own tensor-parallel shards, the same shapes on every rank of
its shard group; FSDP gathers and frees those shards (the layers' custom-bprop cells are
untouched: they hold no parameters) and `whole_model()` gathers the model each rank holds under
plain tensor parallelism, which is what its checkpoint saves. Before the data-parallel
reduction, the partial gradients of the sequence-parallel parameters (norm weights,
row-parallel biases) are summed over the tensor group, as under `TensorParallel` (the
record's `grad_partial`).

What the sharded strategies cannot run yet is refused before any rank starts (`problems`):
Muon (its Newton-Schulz step needs whole matrices, the slices cut them), optimizers other than
AdamW, and under FSDP mf-memory's swap and communication recompute (their saved-tensor hooks
and FSDP's do not stack).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from typing import Any

from mindspore import Parameter, Tensor, nn

from mf_config import OptimizerConfig, ParallelismConfig
from mf_config.component_settings import settings_error
from mf_config.yaml_source import Source
from mf_parallel import runtime
from mf_parallel.dims import ParallelDims
from mf_parallel.runtime import Collectives
from mf_parallel.runtime.flat_shard import EXPERT_DATA_GROUPS, preslice
from mf_parallel.runtime.grad_shards import ShardedGradients
from mf_parallel.runtime.sharded_vocabulary import ShardedVocabulary
from mf_parallel.runtime.tensor_parallel import TensorGroup
from mf_parallel.vocabulary_rows import keeps_vocabulary_rows

from ..optim import AdamW, Muon, ShardedAdamW
from ..optim.adamw import adamw_settings
from ..optim.base import adam_hyperparameters, decay_flags
from ..registry import OPTIMIZERS
from .contract import (
    LayoutParts,
    LayoutSections,
    LocalGradients,
    MicroBatch,
    Problem,
    Reduction,
    StepLayout,
    StepObserver,
    reduce_dtype,
)
from .expert_parallel import EXPERT_MARK, expert_holders
from .gradient_norm import Owned
from .replicated import DataParallelLoss

NAMES = {"optim": "ZeRO-1", "optim_grads": "ZeRO-2", "optim_grads_params": "FSDP"}
FSDP_STRATEGY = "optim_grads_params"
STRATEGY_PATH = ("parallelism", "data_parallel_shard_strategy")


class ZeRO(StepLayout):
    """ZeRO-1 / ZeRO-2: optimizer state (and, ZeRO-2, reduced gradients) sharded."""

    evaluates = True

    def __init__(self, model: nn.Cell, optimizer: ShardedAdamW, collectives: Collectives,
                 parallelism: ParallelismConfig, dims: ParallelDims,
                 group: TensorGroup | None = None):
        self.loss = DataParallelLoss(collectives, parallelism)
        super().__init__(model, optimizer, loss_divisor=self.loss.divisor)
        self.sharded, self.collectives = optimizer.sharded, collectives
        self.strategy, self.dims = parallelism.data_parallel_shard_strategy, dims
        self.reshard_policy = parallelism.reshard_after_forward_policy
        self.group = group if group is not None and group.size > 1 else None
        self.reduction = Reduction.of(collectives, parallelism)
        buffers = self.sharded.buffers
        self.grads = ShardedGradients(
            buffers, self.params, lambda bucket, grads: self.reducer.reduce_flat(bucket, grads),
            prepare=lambda index, grad: self.reducer.partial_sum(index, grad),
            optional=[i for i, p in enumerate(self.params) if EXPERT_MARK in p.name],
            after=_experts_after(model, buffers))
        """Reduces the gradients buffer by buffer (`GradientReducer.reduce_flat`, the partial
        sums first); during backward for ZeRO-2 and FSDP."""

    @classmethod
    def problems(cls, dims: ParallelDims, sections: LayoutSections) -> list[Problem]:
        name = (f"{sections.parallelism.data_parallel_shard_strategy} "
                f"({NAMES[sections.parallelism.data_parallel_shard_strategy]}) with "
                f"data_parallel_shard {dims.data_shard}")
        return _optimizer_problems(sections.optimizer, name, sections.source)

    shards_experts = True

    @classmethod
    def build(cls, parts: LayoutParts, experts: Sequence[Parameter] = ()) -> ZeRO:
        """The layout over the model's trainable parameters and, when the layout
        `shards_experts`, the routed `experts` left out of them (expert parallelism: sliced
        over the expert-data group, each MoE layer's one unit)."""
        if parts.dims.tensor > 1 and parts.tensor_group is None:
            raise ValueError(f"{cls.__name__} with tensor_parallel {parts.dims.tensor} needs "
                             "the tensor-parallel group")
        if experts and not cls.shards_experts:
            raise TypeError(f"{cls.__name__} does not shard routed experts")
        named = [(p.name, p) for p in [*parts.model.trainable_params(), *experts]]
        settings = adamw_settings_of(parts.optimizer, named, parts.source)
        sharded = cls.shard(parts, [p for _, p in named], list(experts))
        optimizer = ShardedAdamW(named, sharded, parts.collectives, **settings)
        return cls(parts.model, optimizer, parts.collectives, parts.parallelism, parts.dims,
                   parts.tensor_group)

    @classmethod
    def shard(cls, parts: LayoutParts, params: list[Parameter],
              experts: list[Parameter]) -> Any:
        """mf-parallel's wrapper that lays `params` out in flat buffers (one per decoder
        layer, one per layer's routed `experts` over the expert-data group, one for the
        rest) and slices them."""
        layers = list(getattr(parts.model, "decoder_layers", None) or [])
        return runtime.ShardedDataParallel(
            params, parts.collectives, parts.parallelism.data_parallel_shard_strategy,
            units=[layer.trainable_params() for layer in layers],
            expert_units=[list(holder.get_parameters())
                          for _, holder in expert_holders(layers, experts)],
            reduce_dtype=reduce_dtype(parts.parallelism))

    def describe(self) -> str:
        text = f"{NAMES[self.strategy]} over {self.dims.data_shard} ranks"
        if self.dims.data_replicate > 1:
            text += f" x {self.dims.data_replicate} replicas"
        if self.group is not None:
            text += f", tensor parallel {self.group.size} (sequence parallel)"
        return text

    def flat_buckets(self) -> Sequence[Any]:
        return self.sharded.buffers

    def publish_slices(self, slices: Sequence[Tensor]) -> None:
        self.sharded.publish(list(slices))

    @property
    def scatters(self) -> bool:
        """Whether gradients are reduce-scattered as backward produces them (ZeRO-2, FSDP);
        ZeRO-1 accumulates them whole and reduces them at the end of the step."""
        return self.strategy != "optim"

    def forward_backward(self, micro_batches: Sequence[MicroBatch],
                         observer: StepObserver) -> LocalGradients:
        """ZeRO-2 and FSDP: each micro-batch's gradients reduced to this rank's float32 slices
        during its backward pass, unit by unit (`ShardedGradients`), so no whole-size gradient
        outlives its unit; only the gradients the observer watches are kept whole (and summed
        over the micro-batches for it). ZeRO-1: `StepLayout`'s whole accumulation."""
        if not self.scatters:
            return super().forward_backward(micro_batches, observer)
        self._scale = 1.0 / (len(micro_batches) * self.loss_divisor)
        names = self.optimizer.names
        watched = frozenset(i for i, name in enumerate(names) if observer.watches(name))
        loss: Tensor | None = None
        summed: dict[int, Tensor] = {}
        tokens = 0
        for index, batch in enumerate(micro_batches, 1):
            with self.grads.collecting(watched):
                micro_loss, returned = self._grad_fn(*batch.model_inputs())
                self.grads.finish_micro_batch(returned)
            del returned
            seen = self.grads.watched_grads
            observer.micro_batch(index, micro_loss / self._scale,
                                 [seen.get(i) for i in range(len(names))])
            observer.routed(None)
            for i, grad in seen.items():
                summed[i] = grad if i not in summed else summed[i] + grad
            loss = micro_loss if loss is None else loss + micro_loss
            tokens += int(batch.tokens.size)
        if loss is None:
            raise ValueError("a training step needs at least one micro-batch")
        self.free_gathered()
        return LocalGradients(loss, [summed.get(i) for i in range(len(names))], tokens,
                              slices=self.grads.take())

    def owned(self) -> list[Owned]:
        """What this rank owns of each buffer's slice: each parameter's chunk, as the
        placement record says (every chunk without a record: one process)."""
        found: list[Owned] = []
        for buffer in self.sharded.buffers:
            flags = [self.record is None or self.record.owns(p.name) for p in buffer.params]
            found.append(all(flags) or buffer.flat.own_values([float(f) for f in flags]))
        return found

    def reduce_grads(self, local: LocalGradients) -> tuple[Tensor, list[Tensor]]:
        """This rank's slice of the reduced gradients (one per buffer). Whole local
        gradients (ZeRO-1, or a composing layout's own backward) are reduced here, buffer by
        buffer, each buffer's freed once reduced (`local.grads` is consumed): the
        sequence-parallel partial gradients summed over the tensor group first (each tensor
        rank's flat buffer then holds the whole gradient of its own shards), then reduced over
        the data-parallel ranks to this rank's slice. Slices reduced during backward are taken
        as they are, and the whole gradients kept for the observers, read by now, dropped."""
        slices = local.slices
        if slices is not None:  # the whole gradients kept for the observers are read
            local.grads[:] = [None] * len(local.grads)
        else:
            self.free_gathered()
            self.grads.add_all(local.grads)
            slices = self.grads.take()
        return self.loss(local.loss), slices

    def evaluated_loss(self, loss: Tensor) -> Tensor:
        return self.loss.mean(loss)

    def free_gathered(self) -> None:
        """Free what the forward and backward passes gathered (FSDP's units); ZeRO keeps
        whole parameters: nothing."""

class FSDP(ZeRO):
    """FSDP: parameters sharded too, unit by unit, gathered around each unit's passes."""

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
    def layer_built(cls, dims: ParallelDims, parallelism: ParallelismConfig,
                    collectives: Collectives) -> Callable[[nn.Cell], object]:
        """Each decoder layer cut to this rank's slice as soon as it is built
        (`flat_shard.preslice`; the wrapper takes the slice): the build peak is the rank's
        share, the root unit (embedding, final norm, head) and one layer."""
        return lambda layer: preslice(layer, collectives)

    @classmethod
    def shard(cls, parts: LayoutParts, params: list[Parameter],
              experts: list[Parameter]) -> Any:
        """mf-parallel's FSDP wrapper: the decoder layers are the units, the rest the root;
        each layer's routed `experts` one more unit over the expert-data group, gathered with
        its layer."""
        layers = list(_decoder_layers(parts.model))
        vocabulary = sharded_vocabulary(parts)
        return runtime.FullyShardedDataParallel(
            parts.model, layers, parts.collectives,
            expert_units=expert_holders(layers, experts),
            reshard_after_forward_policy=parts.parallelism.reshard_after_forward_policy,
            pipeline_parallel=parts.dims.pipeline,
            keep_tensors=parts.compiled,
            vocabulary_tables=parts.model.vocabulary_tables() if vocabulary else (),
            reduce_dtype=reduce_dtype(parts.parallelism))

    def describe(self) -> str:
        text = f"{super().describe()}, reshard policy {self.reshard_policy}"
        if self.sharded.vocabulary_units:
            text += ", vocabulary split over the shard group"
        return text

    def forward_context(self) -> AbstractContextManager[None]:
        """The root unit gathered and the saved-tensor hooks on (see `StepLayout`)."""
        return self.sharded.forward_context()

    def free_gathered(self) -> None:
        """Every unit's gathered parameters freed (the root unit stays gathered through the
        backward pass)."""
        self.sharded.reshard()

    def evaluate(self, micro_batches: Sequence[MicroBatch]) -> Tensor:
        """`StepLayout.evaluate` with each unit gathered around its forward by the units'
        hooks, and everything still gathered (the root unit) freed after."""
        try:
            return super().evaluate(micro_batches)
        finally:
            self.free_gathered()

    def held_parameters(self) -> int:
        """The model's parameters (placeholders where sharded) and this rank's slices."""
        return super().held_parameters() + sum(b.flat.length for b in self.sharded.buffers)

    @contextmanager
    def whole_model(self) -> Iterator[None]:
        """The parameters gathered (a collective: every rank enters together), freed after."""
        self.sharded.unshard()
        try:
            yield
        finally:
            self.sharded.reshard()


def sharded_vocabulary(parts: LayoutParts) -> ShardedVocabulary | None:
    """The vocabulary split over the shard group, handed to the model
    (`use_sharded_vocabulary`), where FSDP keeps the embedding table (and an untied head) as
    each rank's rows instead of gathering them (mf-parallel's `sharded_vocabulary`): a model
    with the pieces for it, its embedding and head here, and mf-parallel's
    `keeps_vocabulary_rows`. None otherwise: the tables are then gathered with the root
    unit."""
    model, shards = parts.model, parts.collectives.comm.group_size("shard")
    if not (hasattr(model, "use_sharded_vocabulary") and model.part.embedding
            and model.part.head and keeps_vocabulary_rows(
                model.settings.vocab_size, shards, parts.dims.tensor, parts.dims.pipeline)):
        return None
    vocabulary = ShardedVocabulary(parts.collectives, model.settings.vocab_size)
    model.use_sharded_vocabulary(vocabulary)
    return vocabulary


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


def holds_experts(buffer: Any) -> bool:
    """Whether a flat buffer of the sharded wrappers holds routed experts alone (sliced over
    the expert-data group under expert parallelism)."""
    return buffer.flat.groups == EXPERT_DATA_GROUPS


def _experts_after(model: nn.Cell, buffers: Sequence[Any]) -> dict[int, int]:
    """Each buffer of routed experts (`EXPERT_DATA_GROUPS`, by index) with the buffer of its
    decoder layer's other parameters, used before the experts in the forward pass: reduced
    right after it (`ShardedGradients(after=)`)."""
    experts = [b for b, buffer in enumerate(buffers) if holds_experts(buffer)]
    if not experts:
        return {}
    layers = list(getattr(model, "decoder_layers", None) or [])
    owner = {id(p): b for b, buffer in enumerate(buffers) for p in buffer.params}
    after = {}
    for layer, holder in expert_holders(layers, [p for b in experts
                                                 for p in buffers[b].params]):
        mine = owner[id(next(iter(holder.get_parameters())))]
        rest = {owner.get(id(p)) for p in layer.trainable_params()} - {mine, None}
        if len(rest) != 1:
            raise ValueError(f"the parameters of the decoder layer holding expert buffer {mine} "
                             f"are in {len(rest)} buffers, not one")
        after[mine] = rest.pop()
    return after


def _decoder_layers(model: nn.Cell) -> nn.CellList:
    layers = getattr(model, "decoder_layers", None)
    if layers is None or len(layers) == 0:
        raise settings_error([(STRATEGY_PATH,
                               f"FSDP shards the model's decoder layers, and "
                               f"{type(model).__name__} has none (no `decoder_layers`); "
                               "choose 'optim_grads' (ZeRO-2)")])
    return layers
