"""One reduction of a step's gradients, read from each gradient's placement.

The placement record (`mf_parallel.placement`) says of every parameter the groups its local
gradient is a partial sum over (`grad_partial`) and whether the reduced gradient is whole on
every rank or this rank's flat chunk (`grad`: `Replicate` or `FlatRange`). `GradientReducer`
reduces by those two facts:

- partial sums first, one all-reduce per gradient: over the tensor group (`tensor`: a
  tensor-replicated parameter used on this rank's sequence slice or heads) and over the first
  and last pipeline stages (`tied`: the two copies of a tied embedding);
- then the data-parallel sum over the gradient's data group (`loss`: data x context, a leaf
  layout's `data` group; `expert_data` for a routed expert under expert parallelism):
  whole gradients (`reduce_whole`) all-reduced in flat buckets, flat chunks (`reduce_flat`)
  reduce-scattered one buffer at a time (`flat_shard.FlatBucket.reduce`, summed over the HSDP
  replicas too), in float32;
- then the mean (`mean`, the one place it is taken): with averaged gradients
  (`disable_gradient_division` False) every reduced gradient times 1 / the data-parallel size
  (data x context), a routed expert's too, whose gradient already holds the tokens every
  data-parallel rank dispatched to it. With summed gradients (the default) each rank's loss
  was divided by that size before the backward pass instead: the same update (bit for bit when
  the size is a power of two).

One all-reduce per parameter pays the collective's fixed cost hundreds of times a step; one
all-reduce of everything cannot start until the last gradient exists. Buckets of about
`bucket_bytes` (25 MiB, as PyTorch DDP and Megatron use) sit between, consecutive gradients of
one data group each. Each bucket is one freshly concatenated, contiguous buffer, which also
sidesteps the CPU backend's wrong results for in-place reductions of non-contiguous gradients.
With `reduce_dtype` (the config's `parallelism.reduce_dtype`) each bucket is communicated in
that dtype and cast back to the gradients' dtype after the sum. The mean multiplies by 1/size
(exact for powers of two, within an ulp otherwise): on MindSpore's CPU backend a float32
division of a large buffer is many times slower than a multiplication.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import mindspore as ms
from mindspore import mint, ops

from ..placement import TIED
from .collectives import Collectives

DEFAULT_BUCKET_BYTES = 25 * 2**20
PARTIAL_SUMS = ("tensor", TIED)
"""The `grad_partial` kinds summed before the data-parallel reduction, in this order."""
DATA_KINDS = {"loss": "data", "expert_data": "expert_data"}
"""A `grad_partial` data kind -> the group kind a leaf layout's collectives reduce it over
(context folded into data: `Communication.context_as_data`)."""


class GradientReducer:
    """A step's gradients reduced as their placements say (see the module): a collective,
    every rank of the job calls it at the same step.

    Args:
        collectives: this rank's collectives (a leaf layout's: `data` is data x context).
        partial: for each gradient, in the order they will be given, the groups it is a
            partial sum over (the record's `grad_partial`: one data kind, `loss` or
            `expert_data`, and any of `tensor`, `tied`).
        shapes: the gradients' shapes, for the buckets of `reduce_whole`.
        average: take the mean over the data-parallel ranks (`disable_gradient_division`
            False) instead of the sum.
        bucket_bytes: the bucket size of `reduce_whole`.
        itemsize: bytes per gradient element, to size the buckets.
        reduce_dtype: the dtype whole buckets are summed in (None: the gradients' own).
    """

    def __init__(self, collectives: Collectives, partial: Sequence[Sequence[str]],
                 shapes: Sequence[tuple[int, ...]], *, average: bool,
                 bucket_bytes: int = DEFAULT_BUCKET_BYTES, itemsize: int = 4,
                 reduce_dtype: ms.Type | None = None):
        if len(partial) != len(shapes):
            raise ValueError(f"{len(partial)} placements for {len(shapes)} gradients")
        self.collectives, self.reduce_dtype = collectives, reduce_dtype
        self.shapes = [tuple(shape) for shape in shapes]
        self.sums = [[kind for kind in PARTIAL_SUMS if kind in kinds] for kinds in partial]
        """Per gradient, the partial sums taken before the data-parallel reduction."""
        self.over = [_data_kind(kinds) for kinds in partial]
        """Per gradient, the group kind its data-parallel sum runs over."""
        comm = collectives.comm
        ranks = comm.group_size("data")
        self.scale = 1.0 / ranks if average and ranks > 1 else None
        """The mean's factor, None for a sum."""
        self.buckets = [(kind, bucket) for kind in dict.fromkeys(self.over)
                        for bucket in _buckets([i for i, k in enumerate(self.over) if k == kind],
                                               [math.prod(s) * itemsize for s in self.shapes],
                                               bucket_bytes)]
        """(group kind, gradient indices) of each bucket of `reduce_whole`, in order."""
        pipeline = comm.group_ranks.get("pipeline", [comm.rank])
        self._pair = (pipeline[0], pipeline[-1])
        """The first and last pipeline stages' ranks of this rank's group (`tied`)."""

    @classmethod
    def data_parallel(cls, collectives: Collectives, shapes: Sequence[tuple[int, ...]],
                      **settings: Any) -> GradientReducer:
        """Every gradient reduced over the data group alone (plain data parallelism; the
        keyword settings as the constructor's)."""
        return cls(collectives, [("loss",)] * len(shapes), shapes, **settings)

    def mean(self, reduced: ms.Tensor) -> ms.Tensor:
        """A data-parallel sum made the mean when gradients are averaged (else as it is)."""
        return reduced if self.scale is None else reduced * self.scale

    def partial_sum(self, index: int, grad: ms.Tensor) -> ms.Tensor:
        """Gradient `index` summed over the groups it is a partial sum over, besides its data
        group (over the tensor group, over the tied stages)."""
        for kind in self.sums[index]:
            if kind == TIED:
                grad = self.collectives.all_reduce_pair(grad, *self._pair)
            else:
                grad = self.collectives.all_reduce(grad, kind)
        return grad

    def reduce_whole(self, grads: Sequence[ms.Tensor]) -> list[ms.Tensor]:
        """Whole gradients reduced: partial sums, then one all-reduce per bucket over its
        data group, then the mean.

        Args:
            grads: the gradients, in the order and shapes given at construction.

        Returns:
            The reduced gradients, in the order given.
        """
        if len(grads) != len(self.shapes):
            raise ValueError(f"expected {len(self.shapes)} gradients, got {len(grads)}")
        out = [self.partial_sum(i, grad) if self.sums[i] else grad
               for i, grad in enumerate(grads)]
        for kind, bucket in self.buckets:
            if self.collectives.comm.group(kind) is None:
                if self.scale is not None:
                    for i in bucket:
                        out[i] = self.mean(out[i])
                continue
            flat = ops.cat([out[i].reshape(-1) for i in bucket])
            flat = self.mean(self.collectives.all_reduce_as(flat, kind, self.reduce_dtype))
            pieces = mint.split(flat, [math.prod(self.shapes[i]) for i in bucket])
            for i, piece in zip(bucket, pieces, strict=True):
                out[i] = piece.reshape(self.shapes[i])
        return out

    def reduce_flat(self, bucket: Any, grads: Sequence[ms.Tensor]) -> ms.Tensor:
        """One flat buffer's gradients (partial sums taken) reduced to this rank's float32
        chunk, the mean taken.

        Args:
            bucket: a `flat_shard.FlatBucket` (a ZeRO buffer, an FSDP unit).
            grads: its parameters' gradients, in its order.
        """
        return self.mean(ops.cast(bucket.reduce(list(grads)), ms.float32))


def _data_kind(kinds: Sequence[str]) -> str:
    found = [DATA_KINDS[kind] for kind in kinds if kind in DATA_KINDS]
    if len(found) != 1:
        raise ValueError(f"a gradient's partial groups {tuple(kinds)} name "
                         f"{len(found)} data groups, not one")
    return found[0]


def _buckets(indices: list[int], sizes: list[int], limit: int) -> list[list[int]]:
    """`indices` grouped in order so that each bucket stays within `limit` bytes (a single
    larger gradient gets a bucket of its own)."""
    buckets: list[list[int]] = []
    current: list[int] = []
    filled = 0
    for index in indices:
        if current and filled + sizes[index] > limit:
            buckets.append(current)
            current, filled = [], 0
        current.append(index)
        filled += sizes[index]
    if current:
        buckets.append(current)
    return buckets
