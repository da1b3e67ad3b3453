"""Data-parallel gradient synchronisation in flat, contiguous buckets.

One all-reduce per parameter pays the collective's fixed cost hundreds of times a step; one
all-reduce of everything cannot start until the last gradient exists. Buckets of about
`bucket_bytes` (25 MiB, as PyTorch DDP and Megatron use) sit between. Each bucket is one
freshly concatenated, contiguous buffer, which also sidesteps the CPU backend's wrong results
for in-place reductions of non-contiguous gradients. With `reduce_dtype` (the config's
`parallelism.reduce_dtype`) each bucket is communicated in that dtype and cast back to the
gradients' dtype after the sum.

`disable_gradient_division` (the config's default, True) sums gradients over the data-parallel
ranks; False averages them. With per-rank mean losses, averaging gives exactly the gradient of
one process that sees the whole global batch. Averaging multiplies by 1/size (exact for powers
of two, within an ulp otherwise): on MindSpore's CPU backend a float32 division of a 16 MiB
buffer takes 20x as long as a multiplication (63 ms against 3 ms, measured).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import mindspore as ms
from mindspore import mint, ops

from .collectives import Collectives

DEFAULT_BUCKET_BYTES = 25 * 2**20


class GradientSync:
    """Reduce a step's gradients over a group kind (`"data"` for plain data parallelism), in
    buckets of about `bucket_bytes`: one all-reduce per bucket.

    Args:
        collectives: this rank's collectives.
        shapes: the gradients' shapes, in the order they will be given.
        kind: the group kind to reduce over.
        average: divide by the group size (the config's `disable_gradient_division` False).
        bucket_bytes: the bucket size.
        itemsize: bytes per gradient element, to size the buckets.
        reduce_dtype: the dtype the buckets are summed in (None: the gradients' own).
    """

    def __init__(self, collectives: Collectives, shapes: Sequence[tuple[int, ...]], *,
                 kind: str = "data", average: bool = False,
                 bucket_bytes: int = DEFAULT_BUCKET_BYTES, itemsize: int = 4,
                 reduce_dtype: ms.Type | None = None):
        self.collectives = collectives
        self.reduce_dtype = reduce_dtype
        self.kind = kind
        self.average = average
        self.shapes = [tuple(shape) for shape in shapes]
        self.buckets = _buckets([math.prod(s) * itemsize for s in self.shapes], bucket_bytes)

    @property
    def size(self) -> int:
        """Ranks the gradients are reduced over."""
        return self.collectives.comm.group_size(self.kind)

    def __call__(self, grads: Sequence[ms.Tensor]) -> tuple[ms.Tensor, ...]:
        """Reduce one step's gradients (a collective: all ranks call it).

        Args:
            grads: the gradients, with the shapes given at construction.

        Returns:
            The reduced gradients, in the order given.
        """
        if len(grads) != len(self.shapes):
            raise ValueError(f"expected {len(self.shapes)} gradients, got {len(grads)}")
        if self.size == 1:
            return tuple(grads)
        out: list[ms.Tensor] = list(grads)
        for bucket in self.buckets:
            flat = ops.cat([grads[i].reshape(-1) for i in bucket])
            flat = self._scaled(self._sum(flat))
            pieces = mint.split(flat, [math.prod(self.shapes[i]) for i in bucket])
            for i, piece in zip(bucket, pieces, strict=True):
                out[i] = piece.reshape(self.shapes[i])
        return tuple(out)

    def per_parameter(self, grads: Sequence[ms.Tensor]) -> tuple[ms.Tensor, ...]:
        """The same result with one all-reduce per gradient (the baseline of the benchmark)."""
        return tuple(self._scaled(self._sum(g)) for g in grads)

    def _sum(self, grad: ms.Tensor) -> ms.Tensor:
        return self.collectives.all_reduce_as(grad, self.kind, self.reduce_dtype)

    def _scaled(self, summed: ms.Tensor) -> ms.Tensor:
        return summed * (1.0 / self.size) if self.average else summed

    def average_loss(self, loss: ms.Tensor, kind: str = "loss") -> ms.Tensor:
        """The mean of a per-rank loss over the ranks that saw different samples.

        Args:
            loss: this rank's loss.
            kind: the group kind to average over (`"loss"`: data x context).

        Returns:
            The mean loss, the same on every rank of the group.
        """
        size = self.collectives.comm.group_size(kind)
        return self.collectives.all_reduce(loss, kind) / size if size > 1 else loss


def _buckets(sizes: list[int], limit: int) -> list[list[int]]:
    """Consecutive indices grouped so that each bucket stays within `limit` bytes (a single
    larger gradient gets a bucket of its own)."""
    buckets: list[list[int]] = []
    current: list[int] = []
    filled = 0
    for index, size in enumerate(sizes):
        if current and filled + size > limit:
            buckets.append(current)
            current, filled = [], 0
        current.append(index)
        filled += size
    if current:
        buckets.append(current)
    return buckets
