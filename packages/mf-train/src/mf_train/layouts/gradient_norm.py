"""The global gradient norm, the clip coefficient (Megatron's and MindFormers' formulas) and
the skip decision, all on the device. `OwnedNorm` is the global norm of every layout: the
squares of the elements each rank owns, one all-reduce over the world.

The global norm is the float32 L2 norm over all gradients; when it exceeds `training.
max_norm` every gradient is scaled by `clip_coefficient = max_norm / (norm + 1e-6)` (applied
only when below 1). Which elements a rank owns is the placement record's
(`mf_parallel.placement`); what a layout hands over after its reduction is the layout's
(`mf_train.layouts`).

Each is a 0-d float32 (or bool) tensor, never read back to the host inside a step: on a
device that queues kernels ahead of the host (PyNative on Ascend), a read would stop the host
from queueing the update until the norm is computed (torchtitan keeps its norm and clip on
the device too). The trainer reads the numbers it reports after the step.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import mindspore as ms
import numpy as np
from mindspore import Tensor, mint, ops

CLIP_EPS = 1e-6


def square_sum(grads: Sequence[Tensor]) -> Tensor:
    """Sum of the squares of every element of `grads`, in float32 (0 for no gradients).

    Each gradient's sum is one matmul, a single pass without the squared copy: for a large
    gradient the trace of `rows @ rows^T` with the gradient as 32 rows, which oneDNN runs
    2-2.4x faster than the `[1, n] @ [n, 1]` product smaller ones take (4.8 against 11.5 ms
    for a `[8192, 512]` gradient on CPU; 15 ms for `sum(square(g))`; relative error 1e-7
    against float64; benchmarks/README.md, "speed.py").
    """
    if not grads:
        return ms.Tensor(0.0, ms.float32)
    return ops.stack([_self_dot(g.astype(ms.float32) if g.dtype != ms.float32 else g)
                      for g in grads]).sum()


_GRAM_ROWS = 32
_GRAM_FROM = 1 << 16  # elements; below, the two extra operations cost more than they save
_GRAM = ops.MatMul(transpose_b=True)


def _self_dot(grad: Tensor) -> Tensor:
    size = grad.size
    if size >= _GRAM_FROM and size % _GRAM_ROWS == 0:
        rows = grad.reshape(_GRAM_ROWS, -1)
        return ops.trace(_GRAM(rows, rows))
    flat = grad.reshape(1, -1)
    return mint.matmul(flat, flat.reshape(-1, 1)).reshape(())


def root(squares: Tensor) -> Tensor:
    """The norm from a sum of squares (any shape holding one value): a 0-d float32 tensor."""
    return ops.sqrt(squares.reshape(()))


def clip_coefficient(norm: Tensor, max_norm: float) -> Tensor:
    """`max_norm / (norm + 1e-6)` when that is below 1 (or not a number), else 1: a 0-d
    float32 tensor."""
    coef = max_norm / (norm + CLIP_EPS)
    return ops.select(coef >= 1.0, ops.ones((), ms.float32), coef)


def update_kept(norm: Tensor, skip_threshold: float) -> Tensor:
    """Whether the step's update is applied (`training.use_skip_step_on_nan`): the norm is
    finite and at most `skip_threshold`. A 0-d bool tensor."""
    return ops.logical_and(ops.isfinite(norm), norm <= skip_threshold)


Owned = bool | np.ndarray
"""Which elements of one reduced gradient this rank counts: all (True), none (False), or a
float mask of the gradient's shape (1.0 where it owns the element: a slice holding pieces
of several parameters)."""


class OwnedNorm:
    """The global L2 norm of the reduced gradients, the same formula for every layout: each
    rank sums the squares of the elements it owns (`mf_parallel.placement.owns`: it holds
    them and is the first holder in every group they are replicated over, so each element
    of the model's gradient is counted by exactly one rank), and one all-reduce over the
    world adds the ranks' sums.

    Args:
        owned: for each reduced gradient, in the order the layout gives them, what this
            rank owns of it (`Owned`).
        sum_over_world: the all-reduce (sum) over every rank; None on one rank.
    """

    def __init__(self, owned: Sequence[Owned],
                 sum_over_world: Callable[[Tensor], Tensor] | None = None):
        self.owned = list(owned)
        self.sum_over_world = sum_over_world
        self.masks = {i: Tensor(mask.astype(np.float32)) for i, mask in enumerate(self.owned)
                      if isinstance(mask, np.ndarray) and not _constant(mask)}
        self.whole = [i for i, mask in enumerate(self.owned)
                      if i not in self.masks and _all(mask)]

    def squares(self, grads: Sequence[Tensor]) -> Tensor:
        """This rank's sum of the squares of its owned elements (0-d, float32)."""
        if len(grads) != len(self.owned):
            raise ValueError(f"{len(grads)} gradients for {len(self.owned)} ownership entries")
        total = square_sum([grads[i] for i in self.whole])
        for i, mask in self.masks.items():
            grad = grads[i] if grads[i].dtype == ms.float32 else grads[i].astype(ms.float32)
            total = total + ops.sum(ops.square(grad) * mask.reshape(grad.shape))
        return total

    def __call__(self, grads: Sequence[Tensor]) -> Tensor:
        squares = self.squares(grads).reshape(1)
        if self.sum_over_world is not None:
            squares = self.sum_over_world(squares)
        return root(squares)


def _constant(mask: np.ndarray) -> bool:
    return mask.size == 0 or bool((mask == mask.reshape(-1)[0]).all())


def _all(owned: Owned) -> bool:
    if isinstance(owned, np.ndarray):
        return owned.size > 0 and bool(owned.reshape(-1)[0])
    return bool(owned)
