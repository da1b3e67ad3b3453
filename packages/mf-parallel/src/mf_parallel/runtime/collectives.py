"""Collective operations, each with the backend's real operation or, where the backend lacks
it, an emulation built from the operations it has.

MindSpore 2.10's CPU backend (mccl) has all-reduce (sum only), all-gather and broadcast, but
not reduce-scatter, all-to-all or send/recv (see shared/reference/mindspore-cpu.md). On CPU:
- all-reduce with max, min or prod = all-gather, then the reduction on every rank;
- reduce-scatter = an all-reduce of each rank's slice in turn, this rank keeping its own
  (the same bytes as one all-reduce of the whole, with one slice as the largest transient);
- all-to-all = all-gather of every rank's chunks, then the chunks addressed to this rank;
- all-gather and broadcast over a group other than the world (mccl runs them over the world
  group only) = an all-reduce (sum) of a buffer in which each rank fills only its own part and
  leaves zeros elsewhere: exact, at the cost of moving the whole buffer;
- send/recv = that broadcast inside a two-rank group of sender and receiver.
Ascend and GPU use the real operations. Every input is made contiguous first: the CPU backend
silently reduces wrong values from non-contiguous tensors (the transposed weight's gradient).
All operations but `all_reduce_in_place` are out of place and return new tensors.

`start_all_gather` launches an all-gather without waiting for it (MindSpore's `async_op`
collectives: on Ascend and GPU on the communication stream, on CPU the emulation's all-reduce)
and returns a `Pending` whose `wait` gives the result: the caller computes something
else in between. `start_send_recv` does the same for a point-to-point message.
"""

from __future__ import annotations

from collections.abc import Callable

import mindspore as ms
from mindspore import communication, mint, nn, ops

from .. import rank_progress
from .comm import Communication
from .copies import fresh_copy

PAD_DTYPES = (ms.float16, ms.float32, ms.float64)
"""The dtypes MindSpore 2.10's CPU pad kernel takes (not bfloat16)."""

FULL_BACKENDS = {"Ascend", "GPU"}
"""Backends with every collective natively (HCCL, NCCL); the CPU backend (mccl) is emulated."""


class Collectives:
    """Collectives over this rank's groups, addressed by kind (`"data"`, `"tensor"`, ...).

    Every method is a no-op on a one-rank group and returns a new tensor. All ranks of the
    group must call it.

    Args:
        comm: this rank's communication, from `init_communication`.
    """

    def __init__(self, comm: Communication):
        self.comm = comm
        self._pairs: set[str] = set()
        self._groups: dict[str, GroupCollectives] = {}

    def of_group(self, kind: str) -> GroupCollectives:
        """The sums and gathers over `kind`'s group as a cell, which also runs inside
        compiled graphs (one per kind, made on first use)."""
        if kind not in self._groups:
            self._groups[kind] = GroupCollectives(self, kind)
        return self._groups[kind]

    def emulates(self, operation: str) -> bool:
        """Whether `operation` (`"reduce_scatter"`, `"all_to_all"`, ...) is emulated from
        other collectives on this backend (see the module docstring): callers that can do
        better than the emulation's whole-buffer transient ask first."""
        return self.comm.device_target not in FULL_BACKENDS

    def all_reduce(self, tensor: ms.Tensor, kind: str, op: str = "sum") -> ms.Tensor:
        """Reduce over the group.

        Args:
            tensor: this rank's tensor.
            kind: the group kind (`"data"`, `"tensor"`, ...).
            op: `"sum"`, `"max"`, `"min"` or `"prod"`.

        Returns:
            The reduction, the same on every rank.
        """
        rank_progress.collective("all_reduce", kind)
        group = self.comm.group(kind)
        if group is None:
            return tensor
        if op == "sum":
            return self.of_group(kind).all_reduce(tensor)
        if self.comm.device_target in FULL_BACKENDS:
            return ops.AllReduce(op=op, group=group)(tensor.contiguous())
        if op not in _LOCAL_REDUCTIONS:
            raise ValueError(f"unknown reduction {op!r}; use sum, max, min or prod")
        size = self.comm.group_size(kind)
        stacked = self.all_gather(tensor.reshape(1, *tensor.shape), kind)
        assert stacked.shape[0] == size
        return _LOCAL_REDUCTIONS[op](stacked)

    def all_reduce_as(self, tensor: ms.Tensor, kind: str, dtype: ms.Type | None) -> ms.Tensor:
        """The sum over the group, communicated in `dtype` (a gradient reduction's
        `reduce_dtype`): `tensor` cast to it, summed, and cast back to its own dtype. With
        `dtype` None or the tensor's own, `all_reduce`.

        The cast buffer is a new tensor, summed in place (`all_reduce_in_place`): on CPU that
        reduction takes float16 and bfloat16, where the AllReduce primitive takes float32 and
        float16 only (its CPU kernel refuses bfloat16).
        """
        if dtype is None or dtype == tensor.dtype or self.comm.group(kind) is None:
            return self.all_reduce(tensor, kind)
        wire = ops.cast(tensor, dtype)
        self.all_reduce_in_place(wire, kind)
        return ops.cast(wire, tensor.dtype)

    def gathers_natively(self, kind: str) -> bool:
        """Whether `all_gather` over `kind`'s group runs the backend's all-gather (Ascend and
        GPU; on CPU the world group only), rather than an all-reduce of a placed buffer."""
        group = self.comm.group(kind)
        return group is None or self._native_everywhere(group)

    def all_reduce_in_place(self, tensor: ms.Tensor, kind: str) -> None:
        """Sum `tensor` (contiguous, not a view) over the group, in place: no second buffer
        of its size, which an out-of-place reduction allocates."""
        rank_progress.collective("all_reduce_in_place", kind)
        group = self.comm.group(kind)
        if group is not None:
            mint.distributed.all_reduce(tensor, group=group)

    def all_gather(self, tensor: ms.Tensor, kind: str) -> ms.Tensor:
        """The group's tensors concatenated along dim 0, in group-rank order."""
        rank_progress.collective("all_gather", kind)
        return self.of_group(kind).all_gather(tensor)

    def start_all_gather(self, tensor: ms.Tensor, kind: str) -> Pending:
        """Launch `all_gather(tensor, kind)` and return at once; `wait()` on the result gives
        the gathered tensor. Not differentiated: the caller attaches the gradient (a gather's
        backward is a reduce-scatter)."""
        rank_progress.collective("start_all_gather", kind)
        group = self.comm.group(kind)
        tensor = ops.stop_gradient(tensor).contiguous()
        if group is None:
            return Pending(tensor, None)
        size, me = self.comm.group_size(kind), self.comm.group_rank(kind)
        if self.comm.device_target in FULL_BACKENDS:
            out = ops.zeros((size * tensor.shape[0], *tensor.shape[1:]), tensor.dtype)
            handle = mint.distributed.all_gather_into_tensor(out, tensor, group=group,
                                                             async_op=True)
            return Pending(out, handle)
        out = _placed(tensor, size, me).contiguous()
        return Pending(out, mint.distributed.all_reduce(out, group=group, async_op=True))

    def reduce_scatter(self, tensor: ms.Tensor, kind: str) -> ms.Tensor:
        """Sum over the group, then this rank's equal slice of dim 0."""
        rank_progress.collective("reduce_scatter", kind)
        if self.comm.group(kind) is not None:
            _divisible(tensor, self.comm.group_size(kind), "reduce_scatter")
        return self.of_group(kind).reduce_scatter(tensor)

    def reduce_scatter_slices(self, slice_of: Callable[[int], ms.Tensor], kind: str,
                              ) -> ms.Tensor:
        """The emulated reduce-scatter over `kind`'s group, from a function giving the input's
        slice addressed to group rank i (so a caller need not build the whole input): each
        slice all-reduced in turn, this rank's kept. `slice_of` must return a new tensor
        (contiguous, not a view): it is summed in place, so a slice in transit takes its own
        memory only, not a second buffer for the sum."""
        rank_progress.collective("reduce_scatter_slices", kind)
        mine = None
        for index in range(self.comm.group_size(kind)):
            piece = slice_of(index)
            self.all_reduce_in_place(piece, kind)
            if index == self.comm.group_rank(kind):
                mine = piece
            del piece
        return mine

    def all_to_all(self, tensor: ms.Tensor, kind: str) -> ms.Tensor:
        """Chunk i of dim 0 goes to group rank i; returns the chunks received, in rank order."""
        rank_progress.collective("all_to_all", kind)
        group = self.comm.group(kind)
        if group is None:
            return tensor
        size = _divisible(tensor, self.comm.group_size(kind), "all_to_all")
        if self.comm.device_target in FULL_BACKENDS:
            return ops.AlltoAll(size, 0, 0, group=group)(tensor.contiguous())
        gathered = self.all_gather(tensor, kind)  # size x size chunks: [sender][receiver]
        me = self.comm.group_rank(kind)
        return ops.cat([_chunk(_chunk(gathered, size, sender), size, me)
                        for sender in range(size)])

    def broadcast(self, tensor: ms.Tensor, kind: str, src: int) -> ms.Tensor:
        """`src`'s tensor (src is a global rank in the group) on every rank of the group."""
        rank_progress.collective("broadcast", kind)
        group = self.comm.group(kind)
        if group is None:
            return tensor
        return self._broadcast(tensor, src, group)

    def send_recv(self, tensor: ms.Tensor, src: int, dst: int) -> ms.Tensor:
        """Point to point: `dst` gets `src`'s tensor (both ranks call this; `dst` passes a
        buffer of the right shape and dtype). Returns the received tensor on `dst`: the
        message of `start_send_recv`, waited for."""
        rank_progress.collective("send_recv", f"pair_{src}_{dst}")
        return self.start_send_recv(tensor, src, dst).wait()

    def start_send_recv(self, tensor: ms.Tensor, src: int, dst: int) -> Pending:
        """`send_recv` launched without waiting: `wait()` on the result gives the received
        tensor on `dst` (the sent one on `src`, which waits before the tensor may change).
        On Ascend and GPU a non-blocking send or receive (`isend` / `irecv`) on the
        communication stream; on CPU the emulation's all-reduce in the two-rank group,
        launched with `async_op`, which the CPU backend still runs in kernel order."""
        rank_progress.collective("start_send_recv", f"pair_{src}_{dst}")
        if src == dst:
            return Pending(tensor, None)
        if self.comm.device_target in FULL_BACKENDS:
            if self.comm.rank == src:
                tensor = tensor.contiguous()
                return Pending(tensor, mint.distributed.isend(tensor, dst=dst))
            return Pending(tensor, mint.distributed.irecv(tensor, src=src))
        contribution = (tensor if self.comm.rank == src else ops.zeros_like(tensor)).contiguous()
        return Pending(contribution, mint.distributed.all_reduce(
            contribution, group=self._pair_group(src, dst), async_op=True))

    def all_reduce_pair(self, tensor: ms.Tensor, a: int, b: int) -> ms.Tensor:
        """Sum over the two global ranks `a` and `b` (both call this; the tied embedding's
        copies on the first and last pipeline stages)."""
        rank_progress.collective("all_reduce_pair", f"pair_{a}_{b}")
        if a == b:
            return tensor
        return ops.AllReduce(op="sum", group=self._pair_group(a, b))(tensor.contiguous())

    def _native_everywhere(self, group: str) -> bool:
        """Whether all-gather and broadcast run natively over `group` on this backend."""
        return (self.comm.device_target in FULL_BACKENDS
                or group == communication.GlobalComm.WORLD_COMM_GROUP)

    def _broadcast(self, tensor: ms.Tensor, src: int, group: str) -> ms.Tensor:
        if self._native_everywhere(group):
            return ops.Broadcast(root_rank=src, group=group)((tensor.contiguous(),))[0]
        contribution = tensor if self.comm.rank == src else ops.zeros_like(tensor)
        return ops.AllReduce(op="sum", group=group)(contribution.contiguous())

    def _pair_group(self, a: int, b: int) -> str:
        ranks = sorted((a, b))
        name = f"mf_pair_{ranks[0]}_{ranks[1]}"
        if name not in self._pairs:
            communication.create_group(name, ranks)
            self._pairs.add(name)
        return name


class GroupCollectives(nn.Cell):
    """The sum, all-gather and reduce-scatter over one group, as a cell whose operations are
    decided when it is built (the group's name and size, this rank's place, the backend's
    primitives), so that the same code runs in PyNative and inside graphs compiled with
    `mindspore.jit` (the tensor-parallel layers' regions). The CPU emulations are the module
    docstring's. Made by `Collectives.of_group`; all ranks of the group must call each
    operation.

    Args:
        collectives: this rank's collectives.
        kind: the group kind.
    """

    def __init__(self, collectives: Collectives, kind: str):
        super().__init__()
        comm = collectives.comm
        group = comm.group(kind)
        self.alone = group is None
        self.size, self.me = comm.group_size(kind), comm.group_rank(kind)
        self.native = comm.device_target in FULL_BACKENDS
        self.gathers = not self.alone and collectives._native_everywhere(group)
        if not self.alone:
            self.sum = ops.AllReduce(op="sum", group=group)
            self.gather = ops.AllGather(group=group)
            self.scatter = ops.ReduceScatter(op="sum", group=group)

    def all_reduce(self, x: ms.Tensor) -> ms.Tensor:
        """The sum over the group."""
        if self.alone:
            return x
        return self.sum(x.contiguous())

    def all_gather(self, x: ms.Tensor) -> ms.Tensor:
        """The group's tensors concatenated along dim 0, in group-rank order."""
        if self.alone:
            return x
        if self.gathers:
            return self.gather(x.contiguous())
        if x.dtype not in PAD_DTYPES:
            return self.sum(_placed(x, self.size, self.me).contiguous())
        # x padded to block `me` of `size` along dim 0: one operation, which graphs compile
        # (the concatenation of `_placed` failed to compile in a backward over a subgroup)
        rows = x.shape[0]
        padding = (0, 0) * (x.ndim - 1) + (self.me * rows, (self.size - 1 - self.me) * rows)
        return self.sum(ops.pad(x, padding).contiguous())

    def reduce_scatter(self, x: ms.Tensor) -> ms.Tensor:
        """Sum over the group, then this rank's equal slice of dim 0 (dim 0 must divide)."""
        if self.alone:
            return x
        if self.native:
            return self.scatter(x.contiguous())
        # Each slice summed in turn, this rank's kept. Each sum waits for the one before
        # (`depend`) and the last is returned with the kept one, so that a compiled graph
        # neither drops the sums it does not keep nor reorders them across ranks.
        step = x.shape[0] // self.size
        mine = summed = x[:step]
        for index in range(self.size):
            piece = fresh_copy(x[index * step:(index + 1) * step])  # not a view
            summed = self.sum(piece if index == 0 else ops.depend(piece, summed))
            if index == self.me:
                mine = summed
        return ops.depend(mine, summed)


class Pending:
    """A collective under way (`Collectives.start_all_gather`, `start_send_recv`)."""

    def __init__(self, buffer: ms.Tensor, handle: object | None):
        self._buffer, self._handle = buffer, handle

    def wait(self) -> ms.Tensor:
        """Block until the collective is done; its result (a gather's: rank after rank along
        dim 0)."""
        if self._handle is not None:
            self._handle.wait()
            self._handle = None
        return self._buffer


_LOCAL_REDUCTIONS = {  # not Tensor.max(axis=): it reads a value back to the host
    "max": lambda stacked: ops.amax(stacked, 0),
    "min": lambda stacked: ops.amin(stacked, 0),
    "prod": lambda stacked: ops.prod(stacked, 0),
}


def _placed(tensor: ms.Tensor, size: int, me: int) -> ms.Tensor:
    """`tensor` as block `me` of `size` blocks along dim 0, zeros in the others: summed over
    the group (an all-reduce), it is the all-gather, where no native one runs."""
    return ops.cat([tensor if index == me else ops.zeros_like(tensor) for index in range(size)])


def _divisible(tensor: ms.Tensor, size: int, operation: str) -> int:
    if tensor.shape[0] % size:
        raise ValueError(f"{operation} over {size} ranks needs dim 0 divisible by {size}, got "
                         f"shape {tuple(tensor.shape)}")
    return size


def _chunk(tensor: ms.Tensor, parts: int, index: int) -> ms.Tensor:
    step = tensor.shape[0] // parts
    return tensor[index * step:(index + 1) * step]
