"""Expert parallelism, composed with the layout of the other degrees.

Each rank holds its share of the routed experts (the model is built with mf-parallel's
`ExpertGroup`, which also dispatches the tokens). Everything else (attention, dense and shared
MLPs, router, embedding, head) is reduced and updated by the layout the plan's other degrees
select (replicated data parallelism, tensor parallelism, ZeRO or FSDP: the `inner` layout, built
over the model with the routed experts left out). The routed experts are updated apart, and
their gradients are reduced over the plan's expert-data-parallel group (every rank holding the
same experts; `mf_parallel.mesh`), not the whole data-parallel group. With a replicated inner
layout (or when no other rank holds the same experts) they are updated whole by the optimizer
`optimizer.type` names. Under ZeRO and FSDP the inner layout shards them itself
(`StepLayout.shards_experts`), over the expert-data group as the rest is over the shard group
(torchtitan's `efsdp`): each MoE layer's experts are one more flat buffer
(`flat_shard.EXPERT_DATA_GROUPS`), their gradients reduce-scattered to this rank's slice by
the same backward pass as everything else (each right after its layer's other parameters:
`ShardedGradients(optional=, after=)`), AdamW's state and update for that slice only, by the
same `ShardedAdamW`. Under ZeRO the updated slices are all-gathered back into the experts,
which stay whole between steps; under FSDP each MoE layer's experts are one more unit, cut to
this rank's slice as the layer is built, gathered and freed with their layer, so a rank holds
its slice of its experts' parameters, gradients and state. In every case:

- a rank's expert gradient already holds the contributions of every token its experts
  computed, from whichever rank the token came (the dispatch's backward sends them back);
- the ranks holding the same experts computed different tokens, so their gradients are summed;
- the sum (in buckets over the `expert_data` group: mf-parallel's `GradientReducer`, as the
  record's `grad_partial` routes it) is then scaled as the other gradients are: divided by
  the data-parallel size when gradients are averaged (`disable_gradient_division: false`),
  left as is when each rank's loss was divided by it before the backward pass.

The global norm is `StepLayout`'s: each expert's reduced gradient is counted by the first rank
of its expert-data group (sliced, each rank counts its slice), as the placement record says,
with what the inner layout's ranks own, in one all-reduce over the world.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence

import attrs
from mindspore import Parameter, Tensor, nn

from mf_config import ParallelismConfig
from mf_config.layer_spec import ids_text
from mf_parallel.dims import ParallelDims
from mf_parallel.runtime import Collectives
from mf_parallel.runtime.flat_shard import EXPERT_DATA_GROUPS, preslice

from ..optim import ShardedAdamW, build_optimizer
from ..optim.base import rules_unchecked, warn_unmatched_rules
from ..optim.joined import JoinedOptimizer
from .contract import (
    LayoutParts,
    LayoutRecord,
    LayoutSections,
    LocalGradients,
    MicroBatch,
    Problem,
    Reduction,
    StepLayout,
    StepObserver,
)
from .gradient_norm import Owned

EXPERT_MARK = ".mlp.experts."
"""What the names of routed-expert parameters contain (`decoder_layers.3.mlp.experts.5.`)."""
STATE_PREFIX = "experts."
HOLDER = EXPERT_MARK.strip(".")
"""The name, within a decoder layer, of the cell holding its routed experts."""


def expert_index(name: str) -> int | None:
    """The global index of the routed expert a parameter belongs to (5 for
    `decoder_layers.3.mlp.experts.5.down.weight`); None for every other parameter."""
    if EXPERT_MARK not in name:
        return None
    return int(name.split(EXPERT_MARK)[1].split(".")[0])


def without_experts(dims: ParallelDims) -> ParallelDims:
    """The degrees the inner layout is chosen by."""
    return attrs.evolve(dims, expert=1, expert_span="shard_context", expert_node=1)


def routed_expert_params(model: nn.Cell) -> list[Parameter]:
    """The trainable parameters of the routed experts this rank holds, in model order."""
    return [p for p in model.trainable_params() if EXPERT_MARK in p.name]


def expert_holders(layers: Sequence[nn.Cell], experts: Sequence[Parameter],
                   ) -> list[tuple[nn.Cell, nn.Cell]]:
    """Each of `layers` that holds some of `experts`, paired with the cell holding them
    (its `mlp.experts`); every expert must be in one (none given: no pairs).

    Raises:
        ValueError: an expert outside the layers' expert cells.
    """
    wanted, found, pairs = {id(p) for p in experts}, 0, []
    for layer in layers:
        for name, cell in layer.cells_and_names():
            params = list(cell.get_parameters()) if name == HOLDER else []
            inside = [id(p) in wanted for p in params]
            if any(inside):
                if not all(inside):
                    raise ValueError(f"{name} of a decoder layer holds parameters that are "
                                     "not among the routed experts given")
                pairs.append((layer, cell))
                found += len(params)
    if found != len(experts):
        raise ValueError(f"found {found} of the {len(experts)} routed expert parameters in "
                         f"the layers' {HOLDER!r} cells")
    return pairs



@contextlib.contextmanager
def left_out(params: Sequence[Parameter]) -> Iterator[None]:
    """The parameters not trainable inside the block: the inner layout (and mf-parallel's
    sharded wrappers) take `model.trainable_params()`, and must not take the experts."""
    for param in params:
        param.requires_grad = False
    try:
        yield
    finally:
        for param in params:
            param.requires_grad = True


def _shards_experts(inner_cls: type[StepLayout] | None, collectives: Collectives) -> bool:
    """Whether the inner layout shards the routed experts itself (FSDP), which it does when
    other ranks hold the same experts."""
    return (inner_cls is not None and inner_cls.shards_experts
            and collectives.comm.group_size("expert_data") > 1)


@contextlib.contextmanager
def _rules_checked_once(parts: LayoutParts) -> Iterator[None]:
    """The weight-decay rules checked against the whole model, not against each of the two
    optimizers' parts (a rule for norms matches nothing among the experts)."""
    names = [p.name for p in parts.model.trainable_params()]
    with rules_unchecked():
        yield
    warn_unmatched_rules(parts.optimizer, names, parts.source)


class ExpertParallel(StepLayout):
    """Routed experts split over the expert group, the inner layout for the rest."""

    name = "expert parallel"
    evaluates = True

    def __init__(self, inner: StepLayout, experts: list[Parameter],
                 optimizer: JoinedOptimizer | ShardedAdamW, collectives: Collectives,
                 parallelism: ParallelismConfig, dims: ParallelDims):
        self.inner, self.collectives, self.dims = inner, collectives, dims
        super().__init__(inner.model, optimizer, loss_divisor=inner.loss_divisor)
        self.experts = experts
        self.dispatcher = parallelism.moe_token_dispatcher_type
        self.compile_blocker = inner.compile_blocker
        self.fused = optimizer is inner.optimizer
        """Whether the inner layout shards the experts too (ZeRO, FSDP), which then runs the
        whole step: its backward, reduction, norm and optimizer."""
        self.reduction = Reduction.of(collectives, parallelism)

    @classmethod
    def problems(cls, dims: ParallelDims, sections: LayoutSections) -> list[Problem]:
        from . import inner_problems

        return inner_problems(without_experts(dims), sections, dims)

    @classmethod
    def layer_built(cls, dims: ParallelDims, parallelism: ParallelismConfig,
                    collectives: Collectives) -> Callable[[nn.Cell], object] | None:
        """Each layer cut as the inner layout cuts it (FSDP: as it is built) without its
        routed experts, which the inner layout leaves out too (`build`)."""
        from . import inner_layer_built, layout_for

        cut = inner_layer_built(without_experts(dims), parallelism, collectives)
        if cut is None:
            return None
        fused = _shards_experts(layout_for(without_experts(dims), parallelism), collectives)

        def cut_without_experts(layer: nn.Cell) -> None:
            # names relative to the layer here (`mlp.experts.3.down.weight`)
            experts = [p for p in layer.trainable_params() if EXPERT_MARK in f".{p.name}"]
            with left_out(experts):
                cut(layer)
            for _, holder in expert_holders([layer], experts) if fused and experts else ():
                preslice(holder, collectives, EXPERT_DATA_GROUPS, list(holder.get_parameters()))

        return cut_without_experts

    @classmethod
    def build(cls, parts: LayoutParts) -> ExpertParallel:
        from . import inner_layout

        inner_cls = inner_layout(without_experts(parts.dims), parts.parallelism)
        experts = routed_expert_params(parts.model)
        if not experts:
            raise TypeError(f"{type(parts.model).__name__} has no routed experts to split "
                            "over expert_parallel ranks")
        with _rules_checked_once(parts), left_out(experts):
            if _shards_experts(inner_cls, parts.collectives):  # one optimizer for all
                inner = inner_cls.build(parts, experts)
                return cls(inner, experts, inner.optimizer, parts.collectives,
                           parts.parallelism, parts.dims)
            inner = inner_cls.build(parts)
            own = build_optimizer(parts.optimizer, [(p.name, p) for p in experts],
                                  parts.source)
        optimizer = JoinedOptimizer(inner.optimizer, own, STATE_PREFIX)
        return cls(inner, experts, optimizer, parts.collectives, parts.parallelism, parts.dims)

    def describe(self) -> str:
        held = sorted({expert_index(p.name) for p in self.experts})
        total = len(held) * self.dims.expert
        dispatch = ("all-to-all" if self.dispatcher == "alltoall"
                    else f"deredundant, devices of {self.dims.expert_node}")
        ranks = self.collectives.comm.group_size("expert_data") if self.fused else 1
        sliced = f", sliced over {ranks} expert-data ranks" if ranks > 1 else ""
        return (f"expert parallel {self.dims.expert} (experts {ids_text(held)} of {total} "
                f"here, {dispatch}{sliced}) x {self.inner.describe()}")

    def forward_backward(self, micro_batches: Sequence[MicroBatch],
                         observer: StepObserver) -> LocalGradients:
        """The inner layout's when it holds the experts (its backward reduces every buffer,
        the experts' last); else `StepLayout`'s whole gradients, reduced in `reduce`."""
        if self.fused:
            return self.inner.forward_backward(micro_batches, observer)
        return super().forward_backward(micro_batches, observer)

    def reduce_grads(self, local: LocalGradients) -> tuple[Tensor, list[Tensor]]:
        if self.fused:
            return self.inner.reduce_grads(local)
        split = len(local.grads) - len(self.experts)
        loss, grads = self.inner.reduce_grads(LocalGradients(local.loss, local.grads[:split],
                                                             local.tokens))
        return loss, [*grads, *self.reducer.reduce_whole(local.grads[split:])]

    def use_record(self, record: LayoutRecord) -> None:
        super().use_record(record)
        self.inner.use_record(record)

    @property
    def reducer(self):
        """The reducer of the routed experts' whole gradients (not fused)."""
        if self._reducer is None:
            self._reducer = self.reduction.reducer(self.experts, self.record)
        return self._reducer

    def owned(self) -> list[Owned]:
        """The inner layout's, then (not fused) each whole expert gradient: owned by the
        first of its expert-data ranks, as the record says."""
        if self.fused:
            return self.inner.owned()
        return [*self.inner.owned(),
                *(self.record is None or self.record.owns(p.name) for p in self.experts)]

    def evaluate(self, micro_batches: Sequence[MicroBatch]) -> Tensor:
        """The inner layout's: the model's forward dispatches the tokens to the experts'
        ranks as in training."""
        return self.inner.evaluate(micro_batches)

    def whole_model(self):
        return self.inner.whole_model()

    def flat_buckets(self):
        return self.inner.flat_buckets()

    def publish_slices(self, slices: Sequence[Tensor]) -> None:
        self.inner.publish_slices(slices)

    def held_parameters(self) -> int:
        return self.inner.held_parameters()

    def forward_context(self):
        return self.inner.forward_context()



