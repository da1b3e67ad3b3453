"""Pipeline parallelism, composed with the data- and tensor-parallel layout of each stage.

Every rank holds one stage's part of the model (`stage_part`: its decoder layers, the
embedding on the first stage, the final norm, head and loss on the last). A step runs the
plan's schedule on each stage (`pipeline_executor.StageRunner`); the gradients are then
reduced by the layout the plan's other degrees select (replicated data parallelism, tensor
parallelism, ZeRO or FSDP, built over the stage's part exactly as without pipelining: the
`inner` layout), and the step's numbers are made the same on every rank:
- tied embeddings: each copy of the table gets the gradient of both (the record's `tied`
  partial sum, over the first and last stage, taken by the inner layout's reducer), so the
  two copies take the same update, as in Megatron; the placement record gives the table to
  the first stage, so the global norm (`StepLayout`'s: the squares each rank owns, one
  all-reduce over the world) counts it once;
- the loss: the sum of the stages' shares (an all-reduce): the last stage's cross-entropy and
  each stage's auxiliary losses (DeepSeek-V3's balance loss of its own MoE layers).
Skip-on-NaN then decides the same on every rank, and each rank saves its stage's parameters
under their model-wide names.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import attrs
from mindspore import Tensor, nn

from mf_config import ParallelismConfig
from mf_config.layer_spec import ids_text
from mf_parallel import Plan
from mf_parallel.dims import ParallelDims
from mf_parallel.runtime import Collectives

from ..models.parts import ModelPart, PipelineModel
from .contract import (
    LayoutParts,
    LayoutRecord,
    LayoutSections,
    LocalGradients,
    MicroBatch,
    Problem,
    StepLayout,
    StepObserver,
)
from .gradient_norm import Owned
from .pipeline_executor import StageRunner


def stage_part(plan: Plan, rank: int) -> ModelPart | None:
    """What `rank` builds of the model under the plan; None without pipeline parallelism."""
    if plan.dims.pipeline == 1 or plan.layout is None:
        return None
    stage = plan.mesh.coordinates(rank)["pipeline"]
    layers = sorted(i for chunk in range(plan.interleave)
                    for i in plan.layout.layers(stage, chunk))
    return ModelPart(tuple(layers), embedding=stage == 0, head=stage == plan.dims.pipeline - 1)


def without_pipeline(dims: ParallelDims) -> ParallelDims:
    """The degrees of one stage's ranks: what the inner layout is chosen by."""
    return attrs.evolve(dims, pipeline=1, world_size=dims.world_size // dims.pipeline)


class Pipelined(StepLayout):
    """The plan's pipeline schedule on each stage, the inner layout's reduction after it."""

    name = "pipeline"
    evaluates = True

    def __init__(self, inner: StepLayout, runner: StageRunner, collectives: Collectives,
                 plan: Plan):
        super().__init__(inner.model, inner.optimizer, loss_divisor=inner.loss_divisor)
        self.inner, self.runner, self.collectives, self.plan = inner, runner, collectives, plan
        self.stage, self.num_stages = runner.stage, runner.num_stages
        self.compile_blocker = inner.compile_blocker
        self.tied = self._tied_copy()

    @classmethod
    def problems(cls, dims: ParallelDims, sections: LayoutSections) -> list[Problem]:
        from . import inner_problems

        return inner_problems(without_pipeline(dims), sections, dims)

    @classmethod
    def layer_built(cls, dims: ParallelDims, parallelism: ParallelismConfig,
                    collectives: Collectives) -> Callable[[nn.Cell], object] | None:
        """The stage's layers cut as its inner layout cuts them (FSDP: as they are built)."""
        from . import inner_layer_built

        return inner_layer_built(without_pipeline(dims), parallelism, collectives)

    @classmethod
    def build(cls, parts: LayoutParts) -> Pipelined:
        from . import inner_layout

        if parts.plan is None or parts.plan.layout is None:
            raise ValueError("the pipeline layout needs the plan's stage layout")
        if not isinstance(parts.model, PipelineModel):
            raise TypeError(f"{type(parts.model).__name__} cannot be cut into pipeline stages "
                            "(it has no embed / decoder / head_loss pieces)")
        inner = inner_layout(without_pipeline(parts.dims), parts.parallelism).build(parts)
        comm = parts.collectives.comm
        runner = StageRunner(parts.model, inner.params, parts.plan.layout, parts.plan.schedule,
                             comm.group_rank("pipeline"), comm.group_ranks["pipeline"],
                             parts.collectives, inner.forward_context,
                             split_backward=parts.plan.split_backward,
                             overlap_p2p=parts.parallelism.pipeline_parallel_overlap_p2p)
        return cls(inner, runner, parts.collectives, parts.plan)

    def describe(self) -> str:
        layers = ", ".join(ids_text(chunk.layers) for chunk in self.runner.chunks)
        return (f"pipeline {self.num_stages} ({self.plan.schedule}"
                f"{f', {self.plan.interleave} chunks' if self.plan.interleave > 1 else ''}"
                f"{', backward split into B and W (ZB-H1)' if self.plan.split_backward else ''}; "
                f"this stage {self.stage}: layers {layers}"
                f"{'; messages overlapped' if self.runner.overlap_p2p else ''}) "
                f"x {self.inner.describe()}")

    def forward_backward(self, micro_batches: list[MicroBatch],
                         observer: StepObserver) -> LocalGradients:
        if not micro_batches:
            raise ValueError("a training step needs at least one micro-batch")
        scale = 1.0 / (len(micro_batches) * self.loss_divisor)
        return self.runner.run(micro_batches, scale, observer)

    def evaluate(self, micro_batches: Sequence[MicroBatch]) -> Tensor:
        """Forward only through the stages (`StageRunner.evaluate`); the stages' shares
        summed over the pipeline group, then made the data-parallel ranks' mean by the
        inner layout."""
        if not micro_batches:
            raise ValueError("an evaluation needs at least one micro-batch")
        try:
            share = self.runner.evaluate(micro_batches) / len(micro_batches)
        finally:
            self.inner.free_gathered()
        return self.inner.evaluated_loss(self.collectives.all_reduce(share, "pipeline"))

    def reduce_grads(self, local: LocalGradients) -> tuple[Tensor, list[Tensor]]:
        loss, reduced = self.inner.reduce_grads(local)
        return self.collectives.all_reduce(loss, "pipeline"), reduced

    def use_record(self, record: LayoutRecord) -> None:
        super().use_record(record)
        self.inner.use_record(record)

    def owned(self) -> list[Owned]:
        """The inner layout's: the record gives a tied embedding to the first stage."""
        return self.inner.owned()

    def whole_model(self):
        return self.inner.whole_model()

    def flat_buckets(self):
        return self.inner.flat_buckets()

    def publish_slices(self, slices):
        self.inner.publish_slices(slices)

    def held_parameters(self) -> int:
        return self.inner.held_parameters()

    def _tied_copy(self) -> int | None:
        """The index of the embedding table in `params` on the first and last stages of a
        model with tied embeddings."""
        if not getattr(self.model, "tied", False) or self.stage not in (0, self.num_stages - 1):
            return None
        table = self.model.embedding.weight
        return next(i for i, p in enumerate(self.params) if p is table)
