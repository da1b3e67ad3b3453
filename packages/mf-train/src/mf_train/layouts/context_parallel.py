"""Context parallelism, composed with the layout of the other degrees.

The model splits each sequence over the context group (its attention exchanges keys, values or
heads, `mf_parallel.runtime.context_parallel`; the loader gives each rank its tokens). For the
step, context ranks are data ranks: they hold the same parameters and compute gradients from
different tokens of the same samples. So the layout the other degrees select (data parallel,
tensor parallel, ZeRO, FSDP, expert parallel: the `inner` layout) runs with context folded into
data (`without_context`): gradients reduced over data x context (Megatron-LM's data-parallel
group with context); with sharding (`data_parallel_shard` > 1) ZeRO and FSDP shard over
shard x context (torchtitan's `dp_shard_cp`), without it context ranks join the replicas.

The loss needs no change here: each rank's loss is its tokens' share of the sequence's mean
loss times the context size (`blocks.causal_lm_loss`), so the mean over data x context that
the inner layout takes is the mean over the data ranks of whole-sequence losses, and the
averaged gradient is its gradient.

With pipeline parallelism this layout runs on each stage (the `Pipelined` layout's inner one;
an inner layout is chosen by a stage's degrees, `layouts.inner_layout`): the ranks of a
pipeline group share one context coordinate and pass the hidden states of their own sequence
chunks.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import attrs
from mindspore import Tensor, nn

from mf_config import ParallelismConfig
from mf_parallel.dims import ParallelDims
from mf_parallel.runtime import Collectives

from .contract import (
    LayoutParts,
    LayoutRecord,
    LayoutSections,
    LocalGradients,
    Problem,
    StepLayout,
)
from .gradient_norm import Owned


def without_context(dims: ParallelDims) -> ParallelDims:
    """The degrees the inner layout is chosen by: context ranks counted as shard ranks, or as
    replicas without sharding (the plan's rank order puts context right after shard, so the
    groups are the same ranks; `Communication.context_as_data`)."""
    if dims.data_shard == 1:
        return attrs.evolve(dims, data_replicate=dims.data_replicate * dims.context, context=1,
                            context_ulysses=1)
    return attrs.evolve(dims, data_shard=dims.data_shard * dims.context, context=1,
                        context_ulysses=1)


class ContextParallel(StepLayout):
    """The sequence split over the context group, the inner layout over data x context."""

    name = "context parallel"
    evaluates = True

    compile_blocker = ("context-parallel attention exchanges key/value blocks through "
                       "collectives launched and waited for from Python (overlapped with "
                       "each block's attention), which a compiled graph cannot hold")

    def __init__(self, inner: StepLayout, dims: ParallelDims):
        self.inner, self.dims = inner, dims
        super().__init__(inner.model, inner.optimizer, loss_divisor=inner.loss_divisor)

    @classmethod
    def problems(cls, dims: ParallelDims, sections: LayoutSections) -> list[Problem]:
        from . import inner_problems

        return inner_problems(without_context(dims), sections)

    @classmethod
    def layer_built(cls, dims: ParallelDims, parallelism: ParallelismConfig,
                    collectives: Collectives) -> Callable[[nn.Cell], object] | None:
        """The layers cut as the inner layout cuts them, over data x context (as `build`
        gives it its collectives)."""
        from . import inner_layer_built

        return inner_layer_built(without_context(dims), parallelism,
                                 Collectives(collectives.comm.context_as_data()))

    @classmethod
    def build(cls, parts: LayoutParts) -> ContextParallel:
        from . import inner_layout

        folded = without_context(parts.dims)
        inner_cls = inner_layout(folded, parts.parallelism)
        collectives = Collectives(parts.collectives.comm.context_as_data())
        inner = inner_cls.build(dataclasses.replace(parts, dims=folded,
                                                   collectives=collectives))
        return cls(inner, parts.dims)

    def describe(self) -> str:
        return (f"context parallel {self.dims.context} ({self.dims.context_method()}) x "
                f"{self.inner.describe()} over data x context")

    def forward_backward(self, micro_batches, observer) -> LocalGradients:
        return self.inner.forward_backward(micro_batches, observer)

    def evaluate(self, micro_batches):
        """The inner layout's, over data x context: each rank's loss is its tokens' share
        times the context size, so their mean is the whole sequences' loss."""
        return self.inner.evaluate(micro_batches)

    def reduce_grads(self, local: LocalGradients) -> tuple[Tensor, list[Tensor]]:
        return self.inner.reduce_grads(local)

    def use_record(self, record: LayoutRecord) -> None:
        super().use_record(record)
        self.inner.use_record(record)

    def owned(self) -> list[Owned]:
        return self.inner.owned()

    def whole_model(self):
        return self.inner.whole_model()

    def flat_buckets(self):
        return self.inner.flat_buckets()

    def publish_slices(self, slices):
        self.inner.publish_slices(slices)

    def held_parameters(self) -> int:
        return self.inner.held_parameters()

    def forward_context(self):
        return self.inner.forward_context()
