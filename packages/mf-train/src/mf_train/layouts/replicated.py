"""Layouts whose every rank holds the whole optimizer state: one rank, data parallelism with
replicas (gradients all-reduced), and tensor parallelism (with or without replicas).

Replicated data parallelism reduces the gradients with mf-parallel's `GradientReducer` (whole
gradients, all-reduced in buckets) as the placement record routes them: summed over the
data-parallel group (`parallelism.disable_gradient_division`, the default, with
each rank's loss divided by the group's size before the backward pass) or averaged. Both give
the same update (bit for bit when the data-parallel size is a power of two). The reported loss
is the mean over the data-parallel ranks either way. The buckets travel in
`parallelism.reduce_dtype` (`reduce_dtype`), cast back to the gradients' dtype after the sum.

Under tensor parallelism (sequence parallelism on, as the spec keeps it) the gradients of
parameters used on sequence slices are partial sums, added up over the tensor group first (the
record's `grad_partial`).
The global norm is `StepLayout`'s, as in every layout: the squares each rank owns (the
placement record), one all-reduce over the world.
"""

from __future__ import annotations

from mindspore import Tensor

from mf_config import ParallelismConfig
from mf_parallel.runtime import Collectives
from mf_parallel.runtime.tensor_parallel import TensorGroup

from ..optim import Optimizer, build_optimizer
from .contract import LayoutParts, LocalGradients, Reduction, StepLayout


class DataParallelLoss:
    """The step's loss over the data-parallel ranks, and what each rank divides it by first.

    With averaged gradients each rank's loss is its mean and the reported loss is the mean of
    the ranks'; with summed gradients each rank's loss is divided by the group's size before
    the backward pass (`divisor`), so the ranks' losses are summed.
    """

    def __init__(self, collectives: Collectives, parallelism: ParallelismConfig):
        self.collectives = collectives
        self.average = not parallelism.disable_gradient_division
        self.size = collectives.comm.group_size("data")
        self.divisor = 1 if self.average or self.size == 1 else self.size

    def mean(self, loss: Tensor) -> Tensor:
        """The mean of the ranks' `loss` (an evaluation's: never divided before)."""
        if self.size == 1:
            return loss
        return self.collectives.all_reduce(loss, "data") / self.size

    def __call__(self, loss: Tensor) -> Tensor:
        if self.size == 1:
            return loss
        if self.average:
            return self.collectives.all_reduce(loss, "data") / self.size
        return self.collectives.all_reduce(loss, "data")


def replicated_optimizer(parts: LayoutParts) -> Optimizer:
    """The optimizer `optimizer.type` names, over every trainable parameter of the model."""
    named = [(p.name, p) for p in parts.model.trainable_params()]
    return build_optimizer(parts.optimizer, named, parts.source)


class SingleRank(StepLayout):
    """One data rank: no data-parallel reduction. On one process the gradients stay as they
    are; as a pipeline stage's layout the record's partial sums are still taken (a tied
    embedding's gradient summed over the first and last stages)."""

    name = "no data parallelism"
    compiles_body = True
    evaluates = True

    def __init__(self, model, optimizer: Optimizer, collectives: Collectives | None = None):
        super().__init__(model, optimizer)
        if collectives is not None:
            self.reduction = Reduction(collectives, average=False)

    @classmethod
    def build(cls, parts: LayoutParts) -> SingleRank:
        return cls(parts.model, replicated_optimizer(parts), parts.collectives)

    def reduce_grads(self, local: LocalGradients) -> tuple[Tensor, list[Tensor]]:
        if self.record is None:  # one process: every gradient whole and this rank's
            return local.loss, list(local.grads)
        return local.loss, self.reducer.reduce_whole(local.grads)


class DataParallel(StepLayout):
    """Replicas: the gradients all-reduced in buckets over the data-parallel group."""

    compiles_body = True
    evaluates = True

    def __init__(self, model, optimizer: Optimizer, collectives: Collectives,
                 parallelism: ParallelismConfig):
        self.loss = DataParallelLoss(collectives, parallelism)
        super().__init__(model, optimizer, loss_divisor=self.loss.divisor)
        self.reduction = Reduction.of(collectives, parallelism)

    @classmethod
    def build(cls, parts: LayoutParts) -> DataParallel:
        return cls(parts.model, replicated_optimizer(parts), parts.collectives,
                   parts.parallelism)

    def describe(self) -> str:
        return f"data parallel {self.loss.size} (replicated)"

    def reduce_grads(self, local: LocalGradients) -> tuple[Tensor, list[Tensor]]:
        return self.loss(local.loss), self.reducer.reduce_whole(local.grads)

    def evaluated_loss(self, loss: Tensor) -> Tensor:
        return self.loss.mean(loss)


class TensorParallel(DataParallel):
    """Tensor (and sequence) parallelism, with replicated data parallelism or without."""

    def __init__(self, model, optimizer: Optimizer, collectives: Collectives,
                 parallelism: ParallelismConfig, group: TensorGroup):
        super().__init__(model, optimizer, collectives, parallelism)
        self.group = group

    @classmethod
    def build(cls, parts: LayoutParts) -> TensorParallel:
        if parts.tensor_group is None:
            raise ValueError("TensorParallel needs the tensor-parallel group")
        return cls(parts.model, replicated_optimizer(parts), parts.collectives,
                   parts.parallelism, parts.tensor_group)

    def describe(self) -> str:
        data = f", {super().describe()}" if self.loss.size > 1 else ""
        return f"tensor parallel {self.group.size} (sequence parallel){data}"

