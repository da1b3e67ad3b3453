"""Differentiable exchanges of rows with different counts between the ranks of a group
(all-to-all-v, all-gather-v and its conjugate reduce-scatter-v), for the expert dispatch.

Each is an operation of equal chunks padded to the largest count in the group, which every
backend has (mf-parallel's `Collectives`: the real operation on Ascend and GPU, an emulation on
the CPU backend), inside a cell whose backward is the conjugate exchange, as the
tensor-parallel region cells: MindSpore's own backward of these collectives would reduce where
rows must be routed. Counts are passed as tuples of Python ints (`row_counts`), arguments of
the cell, so that the backward reads the counts of its own forward (a micro-batch's, a
recomputed layer's) without reading anything back from the device.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from mindspore import Tensor, nn, ops

from .collectives import Collectives

Counts = tuple[int, ...]
"""Rows to or from each group rank, on the host."""


class Exchange(nn.Cell):
    """All-to-all-v over a group: rows addressed to each group rank in turn go there; the
    backward sends the gradients back the same way (the reverse exchange).

    Call with the rows ordered by destination, two row counts (`send[d]`: rows to group rank
    d; `recv[s]`: rows from group rank s) and the largest count in the group. Returns the
    received rows, by source.
    """

    def __init__(self, collectives: Collectives, kind: str):
        super().__init__()
        self.collectives, self.kind = collectives, kind

    def construct(self, rows: Tensor, send: Counts, recv: Counts, width: int) -> Tensor:
        return _exchange(self.collectives, self.kind, rows, send, recv, width)

    def bprop(self, rows: Tensor, send: Counts, recv: Counts, width: int, out: Tensor,
              dout: Tensor) -> tuple[Tensor, tuple[()], tuple[()], int]:
        return _exchange(self.collectives, self.kind, dout, recv, send, width), (), (), 0


class GatherRows(nn.Cell):
    """All-gather-v over a group: every rank gets the rows of all, in group-rank order; the
    backward sums the gradients of this rank's rows over the group (a reduce-scatter-v).

    Call with this rank's rows and the row counts of every group rank.
    """

    def __init__(self, collectives: Collectives, kind: str):
        super().__init__()
        self.collectives, self.kind = collectives, kind

    def construct(self, rows: Tensor, counts: Counts) -> Tensor:
        return _gather_rows(self.collectives, self.kind, rows, counts)

    def bprop(self, rows: Tensor, counts: Counts, out: Tensor, dout: Tensor,
              ) -> tuple[Tensor, tuple[()]]:
        return _scatter_rows(self.collectives, self.kind, dout, counts), ()


class ScatterRows(nn.Cell):
    """Reduce-scatter-v over a group, the conjugate of `GatherRows`: the rows of all ranks
    (in group-rank order) summed over the group, this rank's part kept; the backward
    all-gathers the gradients."""

    def __init__(self, collectives: Collectives, kind: str):
        super().__init__()
        self.collectives, self.kind = collectives, kind

    def construct(self, rows: Tensor, counts: Counts) -> Tensor:
        return _scatter_rows(self.collectives, self.kind, rows, counts)

    def bprop(self, rows: Tensor, counts: Counts, out: Tensor, dout: Tensor,
              ) -> tuple[Tensor, tuple[()]]:
        return _gather_rows(self.collectives, self.kind, dout, counts), ()


def _exchange(collectives: Collectives, kind: str, rows: Tensor, send: Counts, recv: Counts,
              width: int) -> Tensor:
    """Rows to each destination padded to `width`, one all-to-all, padding dropped."""
    chunks, start = [], 0
    for count in send:
        chunks.append(_padded(rows[start:start + count], width))
        start += count
    received = collectives.all_to_all(ops.cat(chunks), kind)
    return _unpadded(received, recv, width)


def _gather_rows(collectives: Collectives, kind: str, rows: Tensor, counts: Counts) -> Tensor:
    width = max(counts)
    gathered = collectives.all_gather(_padded(rows, width), kind)
    return _unpadded(gathered, counts, width)


def _scatter_rows(collectives: Collectives, kind: str, rows: Tensor, counts: Counts) -> Tensor:
    width = max(counts)
    chunks, start = [], 0
    for count in counts:
        chunks.append(_padded(rows[start:start + count], width))
        start += count
    mine = collectives.reduce_scatter(ops.cat(chunks), kind)
    me = collectives.comm.group_rank(kind)
    return mine[:counts[me]] if counts[me] else no_rows(mine)


def _padded(rows: Tensor, width: int) -> Tensor:
    """`rows` followed by zero rows, `width` rows in all (width 0: one zero row, so that no
    chunk is empty)."""
    width = max(width, 1)
    missing = width - rows.shape[0]
    if missing == 0:
        return rows
    zeros = ops.zeros((missing, *rows.shape[1:]), rows.dtype)
    return zeros if rows.shape[0] == 0 else ops.cat((rows, zeros))


def _unpadded(received: Tensor, counts: Counts, width: int) -> Tensor:
    width = max(width, 1)
    parts = [received[s * width:s * width + c] for s, c in enumerate(counts) if c]
    if not parts:
        return no_rows(received)
    return parts[0] if len(parts) == 1 else ops.cat(parts)


def no_rows(like: Tensor) -> Tensor:
    """No rows of `like` (which has some), still in the autograd graph: a gather of no index.

    Not a slice: MindSpore's backward of an empty slice fails ("StridedSliceGrad ... out of
    bounds"). Not a fresh zero tensor: what follows must stay connected on every rank, since
    an exchange cell's backward is a collective that each rank of the group must call, also
    the rank that received nothing.
    """
    return ops.gather(like, Tensor(np.zeros(0, np.int32)), 0)


def row_counts(values: Sequence[int] | np.ndarray) -> Counts:
    """Row counts as the exchange cells take them."""
    return tuple(int(value) for value in np.asarray(values).reshape(-1))


def take_rows(rows: Tensor, index: np.ndarray) -> Tensor:
    """The rows of `rows` at `index` (numpy), in that order.

    From no rows, no index gives the rows themselves: the gather's backward (a segment sum
    over the source's rows) fails for a source without rows, as on a rank no token reached.
    """
    if len(index) == 0 and rows.shape[0] == 0:
        return rows
    return ops.gather(rows, Tensor(index.astype(np.int32)), 0)
