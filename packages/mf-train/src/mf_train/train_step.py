"""One optimizer step: micro-batches -> accumulated gradients -> reduced -> norm, clip, update.

The loss of each micro-batch is divided by the number of micro-batches, so the accumulated
gradient is that of the step's mean loss (Megatron's and MindFormers' convention). With data
parallelism the reduced gradients and the reported loss are the mean over the data-parallel
group (mf-parallel's bucketed `GradientSync`): either the reduction averages, or, when the
gradients are summed (`parallelism.disable_gradient_division`, MindFormers' default), each
rank's loss is also divided by `loss_divisor`, the data-parallel size, before the backward.

The global gradient norm is the float32 L2 norm over all gradients; when it exceeds
`training.max_norm` every gradient is scaled by `clip_coef = max_norm / (norm + 1e-6)`
(applied only when below 1). With `training.use_skip_step_on_nan` a step whose norm is not
finite, or above `monitor.health_checkpoint.global_norm_skip_threshold`, is skipped: no
update, the optimizer's step count unchanged.

Under a sharded data-parallel strategy (ZeRO-1/2, FSDP) the optimizer owns the reduction: it is
a `ReducingOptimizer` (`mf_train.sharded_optimizer.ShardedAdamW`), which reduces the local
gradients to this rank's slice, returns the global norm computed from the slices, and applies
the clip coefficient to its slice in `step_reduced`.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import mindspore as ms
import numpy as np
from mindspore import Tensor, nn, ops

CLIP_EPS = 1e-6


@dataclass(frozen=True)
class StepOutcome:
    """What one optimizer step did (plain Python numbers)."""

    loss: float
    grad_norm: float
    skipped: bool
    tokens: int
    """Tokens of this step on this rank (micro-batches x batch x sequence)."""
    seconds: float


class StepObserver(Protocol):
    """What the monitors see inside a step (mf_train.monitor's TrainStateMonitor/MoeMonitor)."""

    def micro_batch(self, index: int, loss: Tensor, grads: Sequence[Tensor]) -> None: ...

    def reduced(self, loss: Tensor, grads: Sequence[Tensor]) -> None: ...


@runtime_checkable
class ReducingOptimizer(Protocol):
    """An optimizer that reduces the gradients itself (sharded data parallelism)."""

    def reduce_gradients(self, grads: Sequence[Tensor]) -> float:
        """Reduce this rank's local gradients; the global L2 norm of the reduced ones."""
        ...

    def step_reduced(self, lr: float, clip: float = 1.0) -> None:
        """Update from the reduced gradients scaled by `clip`."""
        ...

    def discard_reduced(self) -> None:
        """Forget the reduced gradients (a skipped step)."""
        ...


class TrainStep:
    """Runs optimizer steps of `model` with `optimizer` (mf_train.optim's interface, or a
    `ReducingOptimizer`, which then replaces `reduce_grads` and `norm_of`)."""

    def __init__(self, model: nn.Cell, optimizer, *, max_norm: float,
                 skip_threshold: float | None = None,
                 reduce_grads: Callable[[Sequence[Tensor]], Sequence[Tensor]] | None = None,
                 average_loss: Callable[[Tensor], Tensor] | None = None,
                 observer: StepObserver | None = None,
                 norm_of: Callable[[Sequence[Tensor]], float] | None = None,
                 loss_divisor: int = 1):
        self.model = model
        self.optimizer = optimizer
        self.params = list(optimizer.params)
        self.max_norm = max_norm
        self.skip_threshold = skip_threshold
        self.reduce_grads = reduce_grads
        self.average_loss = average_loss
        self.observer = observer
        self.norm_of = norm_of or global_norm
        self.loss_divisor = loss_divisor
        self.reducing = isinstance(optimizer, ReducingOptimizer)
        if self.reducing and (reduce_grads is not None or norm_of is not None):
            raise ValueError("TrainStep: an optimizer that reduces gradients itself takes no "
                             "reduce_grads or norm_of")
        self._scale = 1.0
        self._grad_fn = ms.value_and_grad(self._forward, None, self.params)

    def _forward(self, tokens: Tensor, labels: Tensor, loss_mask: Tensor | None) -> Tensor:
        return self.model(tokens, labels, loss_mask) * self._scale

    def __call__(self, micro_batches: Sequence[tuple[np.ndarray, np.ndarray, np.ndarray | None]],
                 lr: float) -> StepOutcome:
        start = time.perf_counter()
        self._scale = 1.0 / (len(micro_batches) * self.loss_divisor)
        loss_sum: Tensor | None = None
        grads: list[Tensor] | None = None
        tokens = 0
        for index, (tokens_np, labels_np, mask_np) in enumerate(micro_batches, 1):
            mask = None if mask_np is None else Tensor(mask_np.astype(np.float32))
            loss, micro_grads = self._grad_fn(Tensor(tokens_np), Tensor(labels_np), mask)
            if self.observer is not None:
                self.observer.micro_batch(index, loss / self._scale, micro_grads)
            loss_sum = loss if loss_sum is None else loss_sum + loss
            grads = list(micro_grads) if grads is None else [
                g + m for g, m in zip(grads, micro_grads, strict=True)]
            tokens += int(tokens_np.size)
        assert loss_sum is not None and grads is not None
        if self.observer is not None:
            self.observer.reduced(loss_sum, grads)
        if self.reducing:
            norm = self.optimizer.reduce_gradients(grads)
        elif self.reduce_grads is not None:
            grads = list(self.reduce_grads(grads))
        if self.average_loss is not None:
            loss_sum = self.average_loss(loss_sum)
        if not self.reducing:
            norm = self.norm_of(grads)
        skipped = self._should_skip(norm)
        if self.reducing:
            self._sharded_update(norm, lr, skipped)
        elif not skipped:
            self.optimizer.step(clipped(grads, norm, self.max_norm), lr)
        return StepOutcome(loss=float(loss_sum.asnumpy()), grad_norm=norm, skipped=skipped,
                           tokens=tokens, seconds=time.perf_counter() - start)

    def _sharded_update(self, norm: float, lr: float, skipped: bool) -> None:
        if skipped:
            self.optimizer.discard_reduced()
        else:
            self.optimizer.step_reduced(lr, clip_coefficient(norm, self.max_norm))

    def _should_skip(self, norm: float) -> bool:
        if self.skip_threshold is None:
            return False
        return not math.isfinite(norm) or norm > self.skip_threshold


def global_norm(grads: Sequence[Tensor]) -> float:
    """The float32 L2 norm of all gradients together."""
    return math.sqrt(float(square_sum(grads).asnumpy()))


def square_sum(grads: Sequence[Tensor]) -> Tensor:
    """Sum of the squares of every element of `grads`, in float32 (0 for no gradients)."""
    if not grads:
        return ms.Tensor(0.0, ms.float32)
    return ops.stack([ops.sum(ops.square(g.astype(ms.float32))) for g in grads]).sum()


def tensor_parallel_norm(sharded: Sequence[bool],
                         sum_over_group: Callable[[Tensor], Tensor]) -> Callable[
                             [Sequence[Tensor]], float]:
    """The global norm under tensor parallelism: the squares of the gradients of parameters
    split over the tensor group (`sharded[i]`) are summed over the group; those of replicated
    parameters, equal on every rank once their partial sums are reduced, count once."""

    def norm(grads: Sequence[Tensor]) -> float:
        split = [g for g, s in zip(grads, sharded, strict=True) if s]
        whole = [g for g, s in zip(grads, sharded, strict=True) if not s]
        total = sum_over_group(square_sum(split).reshape(1)) + square_sum(whole)
        return math.sqrt(float(total.asnumpy().sum()))

    return norm


def clip_coefficient(norm: float, max_norm: float) -> float:
    """`max_norm / (norm + 1e-6)` when that is below 1 (or not a number), else 1."""
    coef = max_norm / (norm + CLIP_EPS)
    return 1.0 if coef >= 1.0 else coef


def clipped(grads: Sequence[Tensor], norm: float, max_norm: float) -> list[Tensor]:
    """`grads` scaled by `clip_coefficient(norm, max_norm)` when below 1, else unchanged."""
    coef = clip_coefficient(norm, max_norm)
    if coef == 1.0:
        return list(grads)
    return [g * coef for g in grads]
