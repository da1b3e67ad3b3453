"""Tensor-parallel layers (Megatron-LM style) with sequence parallelism, for MindSpore PyNative.

Column-parallel linear splits the output features over the tensor group; row-parallel linear
splits the input features and sums the partial outputs; the vocabulary-parallel embedding and
cross-entropy split the vocabulary. The communication between them is written as four small
cells with their own backward (`bprop`), Megatron's conjugate pairs:

| cell | forward | backward |
|---|---|---|
| `CopyToTensorRegion` | identity | all-reduce |
| `ReduceFromTensorRegion` | all-reduce | identity |
| `GatherFromSequenceRegion` | all-gather along dim 0 | reduce-scatter along dim 0 |
| `ReduceScatterToSequenceRegion` | reduce-scatter along dim 0 | all-gather along dim 0 |

(MindSpore's own `AllReduce` backward is another all-reduce, right for data parallelism but
tensor-parallel-times too large here.) With sequence parallelism, activations outside the
tensor-parallel regions are split along dim 0, the sequence dimension of Megatron's
`[sequence, batch, hidden]` layout; the spec keeps sequence parallelism on whenever tensor
parallelism is. A parameter that is replicated over the tensor group but used on the sequence
slices (the row-parallel bias; the norms around the layers) then gets only its slice's share
of the gradient: such parameters are marked, and their gradients are summed over the tensor
group (the placement record's `grad_partial`, `grad_reduce.GradientReducer`), as Megatron-LM
does.
"""

from __future__ import annotations

import mindspore as ms
import numpy as np
from mindspore import Parameter, Tensor, mint, nn, ops

from .collectives import Collectives

KIND = "tensor"


_MATMUL_TRANSPOSED_B = ops.MatMul(transpose_b=True)


def linear_rows(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """`x W^T (+ b)` for `x` `[..., in]` and `weight` `[out, in]`, as one 2-D matmul.

    Why 2-D: a `[s, b, in] @ [in, out]` matmul is expanded, in compiled graphs, into a
    broadcast of the weight to `[s, in, out]` and a batched matmul, and MindSpore's CPU
    broadcast kernel made a compiled decoder layer far slower than PyNative.
    Why `MatMul(transpose_b=True)`: `mint.nn.functional.linear` (MindSpore's Dense) makes
    the transposed weight contiguous first, in its forward and backward: slower, with the
    same values (measured in benchmarks/HISTORY.md). With a bias, Dense adds it (the CPU's
    broadcasting add is slow). The one-process peak this MatMul seemed to raise was
    MindSpore's CPU memory pool spreading tensors over 1 GiB blocks, which any change of
    allocation order moves; mf-train gives the pool one block
    (`mf_train.observe.process_memory.one_block_cpu_pool`).
    """
    rows = x if x.ndim == 2 else x.reshape(-1, x.shape[-1])
    y = (_MATMUL_TRANSPOSED_B(rows, weight) if bias is None
         else mint.nn.functional.linear(rows, weight, bias))
    return y if x.ndim == 2 else y.reshape(*x.shape[:-1], weight.shape[0])


class TensorGroup:
    """The tensor-parallel group of this rank, with its collectives: what every layer here
    takes, so that the layers never look up the group themselves.

    Args:
        collectives: this rank's collectives (the `tensor` group is used).
        sequence_parallel: split activations along the sequence outside the tensor-parallel
            regions (None: whenever the group has more than one rank, as the spec keeps it).
        kind: the group's kind in `Comm` (`sharded_vocabulary` splits the vocabulary over the
            data-parallel `shard` group with these same regions).
    """

    def __init__(self, collectives: Collectives, sequence_parallel: bool | None = None,
                 kind: str = KIND):
        self.collectives, self.kind = collectives, kind
        self.ops = collectives.of_group(kind)
        """The group's collectives as a cell: what the regions call, in PyNative and in
        compiled graphs alike."""
        self.size = collectives.comm.group_size(kind)
        self.rank = collectives.comm.group_rank(kind)
        self.sequence_parallel = self.size > 1 if sequence_parallel is None else sequence_parallel

    def all_reduce(self, x: Tensor) -> Tensor:
        return self.collectives.all_reduce(x, self.kind)

    def all_gather(self, x: Tensor) -> Tensor:
        return self.collectives.all_gather(x, self.kind)

    def reduce_scatter(self, x: Tensor) -> Tensor:
        return self.collectives.reduce_scatter(x, self.kind)

    def shard(self, full: np.ndarray, axis: int) -> np.ndarray:
        """This rank's equal slice of a full array, to build a layer's sharded weights.

        Args:
            full: the unsharded array (the same on every rank).
            axis: the axis to split.

        Returns:
            This rank's slice.

        Raises:
            ValueError: the axis does not divide by the group size.
        """
        if full.shape[axis] % self.size:
            raise ValueError(f"dimension {axis} of shape {full.shape} is not divisible by "
                             f"tensor_parallel ({self.size})")
        return np.split(full, self.size, axis=axis)[self.rank]


class _TensorRegion(nn.Cell):
    """A cell at the edge of a tensor-parallel region: its forward and its `bprop` are a
    conjugate pair of collectives over the tensor group (`TensorGroup.ops`, which a compiled
    graph can hold).

    Args:
        group: this rank's tensor group.
    """

    def __init__(self, group: TensorGroup):
        super().__init__()
        self.group = group.ops


class CopyToTensorRegion(_TensorRegion):
    """Identity forward; all-reduce of the gradient backward: enters a tensor-parallel region
    without sequence parallelism. Built with this rank's `TensorGroup`."""

    def construct(self, x: Tensor) -> Tensor:
        return x

    def bprop(self, x: Tensor, out: Tensor, dout: Tensor) -> tuple[Tensor]:
        return (self.group.all_reduce(dout),)


class ReduceFromTensorRegion(_TensorRegion):
    """All-reduce forward; identity backward (the gradient is already the same everywhere)."""

    def construct(self, x: Tensor) -> Tensor:
        return self.group.all_reduce(x)

    def bprop(self, x: Tensor, out: Tensor, dout: Tensor) -> tuple[Tensor]:
        return (dout,)


class GatherFromSequenceRegion(_TensorRegion):
    """All-gather along dim 0 forward; reduce-scatter along dim 0 backward: enters a
    tensor-parallel region from sequence slices. Built with this rank's `TensorGroup`."""

    def construct(self, x: Tensor) -> Tensor:
        return self.group.all_gather(x)

    def bprop(self, x: Tensor, out: Tensor, dout: Tensor) -> tuple[Tensor]:
        return (self.group.reduce_scatter(dout),)


class ReduceScatterToSequenceRegion(_TensorRegion):
    """Reduce-scatter along dim 0 forward; all-gather along dim 0 backward."""

    def construct(self, x: Tensor) -> Tensor:
        return self.group.reduce_scatter(x)

    def bprop(self, x: Tensor, out: Tensor, dout: Tensor) -> tuple[Tensor]:
        return (self.group.all_gather(dout),)


class ScatterToSequenceRegion(_TensorRegion):
    """This rank's equal slice along dim 0 forward; all-gather along dim 0 backward (Megatron's
    scatter to the sequence-parallel region): leaves a region where every rank computed the
    same values for every rank's rows."""

    def construct(self, x: Tensor) -> Tensor:
        rows = x.shape[0] // self.group.size
        return x[self.group.me * rows:(self.group.me + 1) * rows]

    def bprop(self, x: Tensor, out: Tensor, dout: Tensor) -> tuple[Tensor]:
        return (self.group.all_gather(dout),)


class ColumnParallelLinear(nn.Cell):
    """`y = x A^T + b` with A's output features split over the tensor group.

    Input: the full activation (or, with sequence parallelism, this rank's sequence slice,
    gathered here). Output: this rank's slice of the output features, ready for a
    `RowParallelLinear`.

    Args:
        weight: the full `[out, in]` weight (the same on every rank); rows are split.
        bias: the full `[out]` bias, or None.
        group: this rank's tensor group.
    """

    def __init__(self, weight: np.ndarray, bias: np.ndarray | None, group: TensorGroup):
        super().__init__()
        self.weight = mark_tensor_sharded(Parameter(Tensor(group.shard(weight, 0)),
                                                    name="weight"))
        self.bias = None if bias is None else mark_tensor_sharded(
            Parameter(Tensor(group.shard(bias, 0)), name="bias"))
        self.enter = (GatherFromSequenceRegion(group) if group.sequence_parallel
                      else CopyToTensorRegion(group))

    def construct(self, x: Tensor) -> Tensor:
        # Rows before the gather: gathering `[s_r * b, in]` rows along dim 0 equals gathering
        # `[s_r, b, in]` along the sequence, and the matmul then saves the gathered tensor
        # itself, which communication recompute (mf-memory) recognises and drops.
        rows = self.enter(x.reshape(-1, x.shape[-1]))
        y = linear_rows(rows, self.weight, self.bias)
        return y.reshape(-1, *x.shape[1:-1], y.shape[-1])


class RowParallelLinear(nn.Cell):
    """`y = x A^T + b` with A's input features split over the tensor group.

    Input: this rank's slice of the features (a `ColumnParallelLinear`'s output). Output: the
    full result, summed over the group (or, with sequence parallelism, this rank's sequence
    slice of it). The bias is added once, after the sum.

    Args:
        weight: the full `[out, in]` weight (the same on every rank); columns are split.
        bias: the full `[out]` bias (replicated), or None.
        group: this rank's tensor group.
    """

    def __init__(self, weight: np.ndarray, bias: np.ndarray | None, group: TensorGroup):
        super().__init__()
        self.weight = mark_tensor_sharded(Parameter(Tensor(group.shard(weight, 1)),
                                                    name="weight"))
        self.bias = None if bias is None else Parameter(Tensor(bias), name="bias")
        if self.bias is not None and group.sequence_parallel:
            mark_sequence_parallel(self.bias)
        self.leave = (ReduceScatterToSequenceRegion(group) if group.sequence_parallel
                      else ReduceFromTensorRegion(group))

    def construct(self, x: Tensor) -> Tensor:
        y = self.leave(linear_rows(x, self.weight))
        return y if self.bias is None else y + self.bias


class VocabParallelEmbedding(nn.Cell):
    """Embedding with the vocabulary split over the tensor group.

    Each rank looks up the ids in its vocabulary range (others give zeros); the partial
    results are summed over the group (or reduce-scattered along the sequence with sequence
    parallelism). Ids are `[sequence, ...]`, so dim 0 is the sequence.

    Args:
        table: the full `[vocab, hidden]` table (the same on every rank); rows are split.
        group: this rank's tensor group (its size must divide the vocabulary).
    """

    def __init__(self, table: np.ndarray, group: TensorGroup):
        super().__init__()
        self.group = group
        self.weight = mark_tensor_sharded(Parameter(Tensor(group.shard(table, 0)),
                                                    name="weight"))
        self.per_rank = table.shape[0] // group.size
        self.start = group.rank * self.per_rank
        self.leave = (ReduceScatterToSequenceRegion(group) if group.sequence_parallel
                      else ReduceFromTensorRegion(group))

    def construct(self, ids: Tensor) -> Tensor:
        return self.leave(rows_in_range(self.weight, ids, self.start))


def rows_in_range(table: Tensor, ids: Tensor, start: int) -> Tensor:
    """`table[ids - start]` for the ids this rank's rows `[start, start + len(table))` hold,
    zeros for the others: `ids.shape + table.shape[1:]`."""
    local = ids - start
    outside = ops.logical_or(local < 0, local >= table.shape[0])
    rows = ops.gather(table, ops.masked_fill(local, outside, 0), 0)
    return ops.masked_fill(rows, outside.expand_dims(-1), 0.0)


def vocab_parallel_cross_entropy(logits: Tensor, targets: Tensor,
                                 group: TensorGroup) -> Tensor:
    """Per-token cross-entropy from logits split over the vocabulary (last dim).

    The full logits never exist on one rank: the max, the sum of exponentials and the target's
    logit are each reduced over the group. The gradient of each rank's logits is its slice of
    `softmax - one_hot`, as for the unsplit loss.

    Args:
        logits: this rank's slice of the vocabulary, `[..., vocab / tensor]`.
        targets: the full target ids, `[...]`.
        group: this rank's tensor group.

    Returns:
        The loss of each token, `[...]`, the same on every rank.
    """
    per_rank = logits.shape[-1]
    start = group.rank * per_rank
    reduce = ReduceFromTensorRegion(group)
    # The max only keeps exp() in range; it cancels in the loss, so no gradient flows into it.
    # (ops.amax: Tensor.max(axis=) reads a value back to the host.)
    local_max = ops.stop_gradient(ops.amax(logits, -1, True))
    global_max = group.collectives.all_reduce(local_max, group.kind, op="max")
    shifted = logits - ops.stop_gradient(global_max)
    sum_exp = reduce(ops.exp(shifted).sum(axis=-1))
    local_targets = targets - start
    outside = ops.logical_or(local_targets < 0, local_targets >= per_rank)
    local_targets = ops.masked_fill(local_targets, outside, 0)
    picked = ops.gather_elements(shifted, -1, local_targets.expand_dims(-1)).squeeze(-1)
    target_logit = reduce(ops.masked_fill(picked, outside, 0.0))
    return ops.log(sum_exp) - target_logit


SEQUENCE_PARALLEL_ATTRIBUTE = "mf_sequence_parallel"


TENSOR_SHARDED_ATTRIBUTE = "mf_tensor_sharded"
"""Set on parameters split over the tensor group (column/row-parallel weights, the vocabulary-
parallel table): each rank holds a different slice, so a norm over them sums over the group."""


def mark_tensor_sharded(param: Parameter) -> Parameter:
    """Mark a parameter whose ranks each hold a different slice."""
    setattr(param, TENSOR_SHARDED_ATTRIBUTE, True)
    return param


def is_tensor_sharded(param: Parameter) -> bool:
    """Whether a parameter is split over the tensor group, so that a norm over it (gradient
    clipping) sums over the group instead of counting replicas.

    Args:
        param: a model parameter.

    Returns:
        True if `mark_tensor_sharded` marked it.
    """
    return bool(getattr(param, TENSOR_SHARDED_ATTRIBUTE, False))


def mark_sequence_parallel(param: Parameter) -> Parameter:
    """Mark a tensor-replicated parameter used on sequence slices (a norm's weight), whose
    gradient is then summed over the tensor group (the placement record's `grad_partial`:
    `grad_reduce.GradientReducer`).

    Args:
        param: the parameter.

    Returns:
        The same parameter, marked.
    """
    setattr(param, SEQUENCE_PARALLEL_ATTRIBUTE, True)
    return param


def sequence_shard(x: np.ndarray, group: TensorGroup) -> ms.Tensor:
    """This rank's slice of a full activation along the sequence (dim 0)."""
    return Tensor(group.shard(x, 0))
