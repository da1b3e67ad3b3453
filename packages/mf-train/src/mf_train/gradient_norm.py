"""The global gradient norm, the clip coefficient (Megatron's and MindFormers' formulas) and
the skip decision, all on the device.

The global norm is the float32 L2 norm over all gradients; when it exceeds `training.
max_norm` every gradient is scaled by `clip_coefficient = max_norm / (norm + 1e-6)` (applied
only when below 1). How the squares are summed over ranks is the step layout's
(`mf_train.layouts`); these are the pieces every layout uses.

Each is a 0-d float32 (or bool) tensor, never read back to the host inside a step: on a
device that queues kernels ahead of the host (PyNative on Ascend), a read would stop the host
from queueing the update until the norm is computed (torchtitan keeps its norm and clip on
the device too). The trainer reads the numbers it reports after the step.
"""

from __future__ import annotations

from collections.abc import Sequence

import mindspore as ms
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


def global_norm(grads: Sequence[Tensor]) -> Tensor:
    """The float32 L2 norm of all gradients together (a 0-d tensor)."""
    return root(square_sum(grads))


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
