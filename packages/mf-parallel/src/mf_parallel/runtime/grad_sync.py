"""Data-parallel gradient synchronisation in flat, contiguous buckets.

One all-reduce per parameter pays the collective's fixed cost hundreds of times a step; one
all-reduce of everything cannot start until the last gradient exists. Buckets of about
`bucket_bytes` (25 MiB, as PyTorch DDP and Megatron use) sit between. Each bucket is one
freshly concatenated, contiguous buffer, which also sidesteps the CPU backend's wrong results
for in-place reductions of non-contiguous gradients.

`disable_gradient_division` (the config's default, True) sums gradients over the data-parallel
ranks; False averages them. With per-rank mean losses, averaging gives exactly the gradient of
one process that sees the whole global batch.
"""

from __future__ import annotations

from collections.abc import Sequence

import mindspore as ms
from mindspore import ops

from .collectives import Collectives

DEFAULT_BUCKET_BYTES = 25 * 2**20


class GradientSync:
    """Reduce a step's gradients over a group kind (`"data"` for plain data parallelism)."""

    def __init__(self, collectives: Collectives, shapes: Sequence[tuple[int, ...]], *,
                 kind: str = "data", average: bool = False,
                 bucket_bytes: int = DEFAULT_BUCKET_BYTES, itemsize: int = 4):
        self.collectives = collectives
        self.kind = kind
        self.average = average
        self.shapes = [tuple(shape) for shape in shapes]
        self.buckets = _buckets([_numel(s) * itemsize for s in self.shapes], bucket_bytes)

    @property
    def size(self) -> int:
        """Ranks the gradients are reduced over."""
        return self.collectives.comm.group_size(self.kind)

    def __call__(self, grads: Sequence[ms.Tensor]) -> tuple[ms.Tensor, ...]:
        """The reduced gradients, in the order given."""
        if len(grads) != len(self.shapes):
            raise ValueError(f"expected {len(self.shapes)} gradients, got {len(grads)}")
        if self.size == 1:
            return tuple(grads)
        out: list[ms.Tensor] = list(grads)
        for bucket in self.buckets:
            flat = ops.cat([grads[i].reshape(-1) for i in bucket])
            flat = self.collectives.all_reduce(flat, self.kind)
            if self.average:
                flat = flat / self.size
            offset = 0
            for i in bucket:
                count = _numel(self.shapes[i])
                out[i] = flat[offset:offset + count].reshape(self.shapes[i])
                offset += count
        return tuple(out)

    def per_parameter(self, grads: Sequence[ms.Tensor]) -> tuple[ms.Tensor, ...]:
        """The same result with one all-reduce per gradient (the baseline of the benchmark)."""
        reduced = [self.collectives.all_reduce(g, self.kind) for g in grads]
        return tuple(g / self.size for g in reduced) if self.average else tuple(reduced)

    def average_loss(self, loss: ms.Tensor, kind: str = "loss") -> ms.Tensor:
        """The mean of a per-rank loss over the ranks that saw different samples."""
        size = self.collectives.comm.group_size(kind)
        return self.collectives.all_reduce(loss, kind) / size if size > 1 else loss


def _numel(shape: tuple[int, ...]) -> int:
    count = 1
    for dim in shape:
        count *= dim
    return count


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
