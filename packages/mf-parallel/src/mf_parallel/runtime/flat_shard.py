"""A list of tensors sharded over the `shard` group, each rank holding one flat slice.

Each tensor is cut into `shards` equal chunks of its row-major elements, the last padded with
zeros, and rank r's slice is chunk r of every tensor, end to end (PyTorch FSDP2's
per-parameter sharding, by elements): the whole buffer (`flatten`) is rank 0's slice, then
rank 1's, and so on. A tensor is then gathered by one all-gather of its chunks, whose output
is the tensor itself, and never by copying it out of a gathered buffer of the whole unit.
ZeRO-1/2 keep one such buffer per bucket of parameters; fully sharded data parallel keeps one
per sharded unit. With HSDP (replicate > 1) the slices are taken over the `shard` group, and
reduced slices are then summed over the `replicate` group. Routed experts under expert
parallelism are sliced the same way over the `expert_data` group (the ranks holding the same
experts; `EXPERT_DATA_GROUPS`). A buffer's `reduce_dtype` (the config's
`parallelism.reduce_dtype`) is the dtype its gradients travel in: each slice is cast to it
before the reduction and back after.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, NamedTuple

import mindspore as ms
import numpy as np
from mindspore import Parameter, ops

from .collectives import PAD_DTYPES, Collectives
from .copies import fresh_copy, joined


class ShardGroups(NamedTuple):
    """The groups a flat buffer is sharded over, by their kinds in `Comm`."""

    shard: str
    """Sliced over this group."""
    replicate: str | None
    """Reduced slices summed over this group too (HSDP), or None."""


DATA_GROUPS = ShardGroups("shard", "replicate")
"""The groups of sharded data parallelism: sliced over `shard`, summed over `replicate` too."""
EXPERT_DATA_GROUPS = ShardGroups("expert_data", None)
"""The groups routed experts are sliced over under expert parallelism: every rank holding the
same experts (torchtitan's `efsdp`); no replicas."""


IN_PLACE_GATHER_BYTES = 64 << 20
"""On CPU, a tensor at least this large whose chunks are not whole rows is gathered in place
(a zero tensor holding this rank's elements, all-reduced) also where the all-gather runs
natively: the native gather's output and the copy out of it would be twice the tensor."""


class FlatShard:
    """This rank's slice of the tensors with the given shapes, over the groups `groups`
    names: `(shard kind, replicate kind or None)`; gradients reduced in `reduce_dtype`
    (None: their own dtype)."""

    def __init__(self, shapes: Sequence[tuple[int, ...]], collectives: Collectives,
                 groups: ShardGroups = DATA_GROUPS, reduce_dtype: ms.Type | None = None):
        self.reduce_dtype = reduce_dtype
        self.shapes = [tuple(shape) for shape in shapes]
        self.numels = [math.prod(shape) for shape in self.shapes]
        self.collectives = collectives
        self.groups = groups
        self.shard_kind, self.replicate_kind = groups.shard, groups.replicate
        comm = collectives.comm
        self.shards = comm.group_size(self.shard_kind)
        self.replicas = comm.group_size(self.replicate_kind) if self.replicate_kind else 1
        self.chunks = [-(-numel // self.shards) for numel in self.numels]
        """Elements of each tensor in every rank's slice (its last rank's padded)."""
        self.offsets = [sum(self.chunks[:index]) for index in range(len(self.chunks))]
        """Where each tensor's chunk starts in a slice."""
        self.length = sum(self.chunks)
        """Elements in each rank's slice."""
        self.padding = self.length * self.shards - self.total
        self.rank = comm.group_rank(self.shard_kind)
        """This rank's place in the shard group."""
        self.start = self.rank * self.length
        """Where this rank's slice starts in the whole buffer (`flatten`)."""

    @property
    def total(self) -> int:
        """Elements in the tensors (without padding)."""
        return sum(self.numels)

    def flatten(self, tensors: Sequence[ms.Tensor]) -> ms.Tensor:
        """The whole buffer of `tensors`: every rank's slice in rank order (one tensor that
        needs no padding: itself, flattened, not a copy)."""
        flats = [t.reshape(-1) for t in tensors]
        if len(flats) == 1 and not self.padding:
            return flats[0]
        return joined([piece for shard in range(self.shards)
                       for piece in self._pieces(flats, shard)], flats[0].dtype)

    def own(self, flat: ms.Tensor) -> ms.Tensor:
        """This rank's slice of a whole buffer (`flatten`'s; a copy)."""
        return fresh_copy(flat[self.start:self.start + self.length])

    def own_tensors(self, tensors: Sequence[ms.Tensor]) -> ms.Tensor:
        """This rank's slice of `tensors` (a new tensor), without their whole buffer."""
        return self._slice_of([t.reshape(-1) for t in tensors], self.rank)

    def own_values(self, values: Sequence[float], dtype: np.dtype | type = np.float32,
                   ) -> np.ndarray:
        """This rank's slice of a per-element table in which every element of tensor i
        holds `values[i]` (padding holds 0): what an element-wise step needs to know of each
        element's tensor (its weight-decay rate, whether it is split by tensor parallelism).

        Args:
            values: one value per tensor, in buffer order.
            dtype: the table's dtype.

        Returns:
            An array of `length` elements, aligned with this rank's slice.
        """
        if len(values) != len(self.numels):
            raise ValueError(f"expected {len(self.numels)} values, got {len(values)}")
        table = np.zeros(self.length, dtype=dtype)
        for index, low, high, offset in self.own_ranges():
            table[offset:offset + high - low] = values[index]
        return table

    def own_ranges(self) -> list[tuple[int, int, int, int]]:
        """Which elements of which tensors this rank's slice holds, in slice order.

        Returns:
            `(tensor index, first element, one past the last, offset in the slice)` per
            tensor with elements in the slice (each tensor's elements counted in its
            row-major flattening); the padding is in none.
        """
        ranges = []
        for index, (numel, chunk, offset) in enumerate(zip(self.numels, self.chunks,
                                                           self.offsets, strict=True)):
            low, high = self.rank * chunk, min((self.rank + 1) * chunk, numel)
            if low < high:
                ranges.append((index, low, high, offset))
        return ranges

    def reduce_scatter(self, flat: ms.Tensor) -> ms.Tensor:
        """Sum a whole buffer (`flatten`'s) over every data-parallel rank; return this rank's
        slice."""
        wire = self._wire(flat.dtype)
        if wire is None:
            return self.over_replicas(self.collectives.reduce_scatter(flat, self.shard_kind))
        mine = self.collectives.reduce_scatter(ops.cast(flat, wire), self.shard_kind)
        return self.over_replicas(ops.cast(mine, flat.dtype))

    def reduce_scatter_tensors(self, tensors: Sequence[ms.Tensor]) -> ms.Tensor:
        """`reduce_scatter(flatten(tensors))` without the whole buffer where the backend has
        no reduce-scatter (CPU): the emulation takes each rank's slice cut from the tensors.
        Backends with a reduce-scatter run it on the whole buffer."""
        if self.shards == 1 or not self.collectives.emulates("reduce_scatter"):
            return self.reduce_scatter(self.flatten(tensors))
        flats = [t.reshape(-1) for t in tensors]
        dtype = flats[0].dtype
        wire = self._wire(dtype)
        if wire is None:
            mine = self.collectives.reduce_scatter_slices(
                lambda shard: self._slice_of(flats, shard), self.shard_kind)
        else:  # each slice cast (a new tensor, as the in-place sum needs), summed, cast back
            mine = ops.cast(self.collectives.reduce_scatter_slices(
                lambda shard: ops.cast(self._slice_of(flats, shard), wire), self.shard_kind),
                dtype)
        return self.over_replicas(mine)

    def over_replicas(self, mine: ms.Tensor) -> ms.Tensor:
        """A reduced slice summed over the replicate group (HSDP), if there is one (in
        `reduce_dtype`)."""
        if self.replicate_kind is None:
            return mine
        if self.reduce_dtype is None:
            return self.collectives.all_reduce(mine, self.replicate_kind)
        return self.collectives.all_reduce_as(mine, self.replicate_kind, self.reduce_dtype)

    def _wire(self, dtype: ms.Type) -> ms.Type | None:
        """The dtype gradients of `dtype` are cast to for the shard group's reduction, or
        None where they are reduced as they are (the same dtype, or no other shard)."""
        if self.reduce_dtype is None or self.reduce_dtype == dtype or self.shards == 1:
            return None
        return self.reduce_dtype

    def _slice_of(self, flats: Sequence[ms.Tensor], shard: int) -> ms.Tensor:
        """Rank `shard`'s slice of the flattened tensors `flats` (a new tensor)."""
        return joined(self._pieces(flats, shard), flats[0].dtype)

    def _pieces(self, flats: Sequence[ms.Tensor], shard: int) -> list[ms.Tensor]:
        """Rank `shard`'s chunk of each of `flats` (views) and the zeros padding them."""
        pieces = []
        for flat, numel, chunk in zip(flats, self.numels, self.chunks, strict=True):
            low, high = min(shard * chunk, numel), min((shard + 1) * chunk, numel)
            if low < high:
                pieces.append(flat[low:high])
            if high - low < chunk:
                pieces.append(ops.zeros(chunk - (high - low), flats[0].dtype))
        return pieces

    def all_gather(self, mine: ms.Tensor) -> list[ms.Tensor]:
        """The full tensors, in their shapes, from every rank's slice: one all-gather of each
        tensor's chunks. Where the chunks are whole rows, its output is the tensor; otherwise
        (a dim 0 the ranks do not divide, padding) it is copied into the tensor's shape.

        Each is a tensor of its own, not a view into a gathered buffer of the unit:
        MindSpore copies such a view each time an operation uses it (for the 131 MB
        embedding, at every lookup and at the head's matmul), and an operation saves a copy
        of a view for backward, so fully sharded data parallel could not recognise a saved
        parameter (see `fully_sharded`). The largest transient of a gather is the unit's
        tensors themselves and the output of one tensor that is not whole rows, against the
        gathered buffer of the whole unit and the tensors copied out of it (twice the unit)
        when a unit was gathered in one collective.

        On CPU, where the all-gather itself is emulated (a group other than the world), and
        for a tensor of `IN_PLACE_GATHER_BYTES` or more that is not whole rows (a 131 MB
        embedding on 3 ranks), each tensor is a zero tensor of its shape holding this rank's
        elements, summed over the group in place: the tensor itself in transit, no copy.
        """
        emulated = self.shards > 1 and self.collectives.emulates("all_gather")
        in_place_group = emulated and not self.collectives.gathers_natively(self.shard_kind)
        fulls = []
        for numel, chunk, offset, shape in zip(self.numels, self.chunks, self.offsets,
                                               self.shapes, strict=True):
            part = mine[offset:offset + chunk]
            if self.shards == 1:
                fulls.append(fresh_copy(part.reshape(shape)))
                continue
            if not numel:
                fulls.append(ops.zeros(shape, mine.dtype))
                continue
            # chunks of whole rows gather into the tensor's shape; others need a copy into
            # it (a reshaped view would be saved as a copy by the operations using it)
            rows = bool(shape) and chunk * self.shards == numel and shape[0] % self.shards == 0
            if rows:
                part = part.reshape((shape[0] // self.shards, *shape[1:]))
            if in_place_group or (emulated and not rows
                                  and numel * mine.itemsize >= IN_PLACE_GATHER_BYTES):
                if rows:
                    count = part.shape[0]
                    full = _padded(part, self.rank * count,
                                   (self.shards - 1 - self.rank) * count)
                else:
                    low, high = min(self.rank * chunk, numel), min((self.rank + 1) * chunk,
                                                                   numel)
                    full = (_placed_in(shape, part[:high - low], low) if low < high
                            else ops.zeros(shape, mine.dtype))
                self.collectives.all_reduce_in_place(full, self.shard_kind)
            else:
                full = self.collectives.all_gather(part, self.shard_kind)
                if not rows:
                    full = fresh_copy(full[:numel].reshape(shape))
            fulls.append(full)
        return fulls


def _placed_in(shape: tuple[int, ...], part: ms.Tensor, low: int) -> ms.Tensor:
    """A tensor of `shape` (memory of its own, not a view) holding `part` as its row-major
    elements `[low, low + len(part))` and zeros elsewhere. Built by padding: the rows `part`
    touches, then the rows before and after (MindSpore's slice assignment builds index
    tensors of the part's size, several times the part in transient memory)."""
    high = low + part.shape[0]
    if not shape:
        return part.reshape(()) * 1
    inner = math.prod(shape[1:])
    first, last = low // inner, -(-high // inner)
    before, after = low - first * inner, last * inner - high
    rows = _padded(part, before, after) if before or after else part
    block = rows.reshape((last - first, *shape[1:]))
    if first == 0 and last == shape[0]:
        return fresh_copy(block)
    return _padded(block, first, shape[0] - last)


def _padded(part: ms.Tensor, before: int, after: int) -> ms.Tensor:
    """`part` between `before` and `after` rows of zeros (along dim 0): a new tensor, padded
    in one operation where the kernel exists, else concatenated with zero blocks."""
    if part.dtype in PAD_DTYPES:
        return ops.pad(part, (0, 0) * (part.ndim - 1) + (before, after))
    zeros = [ops.zeros((count, *part.shape[1:]), part.dtype) for count in (before, after)]
    return ops.cat([piece for piece in (zeros[0], part, zeros[1]) if piece.shape[0]])


PRESLICED = "mf_presliced"
"""The attribute of a cell whose parameters `preslice` emptied: this rank's slice of them."""
BUILT_SHAPE = "mf_built_shape"
"""The attribute of a parameter `preslice` emptied: its shape as built."""


def built_shape(param: Parameter) -> tuple[int, ...]:
    """A parameter's shape as the model built it, also once `preslice` emptied it."""
    return getattr(param, BUILT_SHAPE, None) or tuple(param.shape)


def preslice(cell: Any, collectives: Collectives,
             groups: ShardGroups = DATA_GROUPS,
             params: Sequence[Parameter] | None = None) -> ms.Tensor:
    """Cut a freshly built unit to this rank's slice of its flat buffer at once, emptying
    its parameters (each keeps its shape as built, `built_shape`), so that a model built
    unit by unit never holds more than one unit whole (fully sharded data parallel then takes
    the slice instead of cutting it, see `FlatBucket`). Records the slice on the cell
    (`PRESLICED`).

    Args:
        cell: the unit (a decoder layer), its parameters whole.
        collectives: the groups the slice is taken over.
        groups: which groups (`EXPERT_DATA_GROUPS` for routed experts).
        params: the unit's parameters (default: the cell's trainable ones).

    Returns:
        This rank's slice.
    """
    params = list(cell.trainable_params() if params is None else params)
    flat = FlatShard([p.shape for p in params], collectives, groups)
    mine = flat.own_tensors(params)
    for param in params:
        setattr(param, BUILT_SHAPE, tuple(param.shape))
        param.set_data(ops.zeros((0,), param.dtype), slice_shape=True)
    setattr(cell, PRESLICED, mine)
    return mine


class FlatBucket:
    """Parameters laid out in one `FlatShard`, with this rank's slice of their values as
    `master` (a Parameter in their dtype, of shape `slice_shape`): one buffer of the sharded
    strategies. With `presliced` (`preslice`'s slice), the parameters are already empty and
    the slice given."""

    def __init__(self, name: str, params: Sequence[Parameter], collectives: Collectives,
                 presliced: ms.Tensor | None = None,
                 groups: ShardGroups = DATA_GROUPS):
        self.name = name
        self.params = list(params)
        self.flat = FlatShard([built_shape(p) for p in self.params], collectives, groups)
        if presliced is None:
            mine = self.flat.own_tensors(self.params)
        elif tuple(presliced.shape) != (self.flat.length,):
            raise ValueError(f"{name}: a slice of {presliced.shape[0]} elements was cut when "
                             f"the unit was built; its parameters now need "
                             f"{self.flat.length}")
        else:
            dtype = self.params[0].dtype  # a model may cast its parameters once built
            mine = presliced if presliced.dtype == dtype else ops.cast(presliced, dtype)
        mine = self.as_slice(mine)
        self.master = Parameter(ops.zeros((0,), mine.dtype), name=f"mf_sharded_{name}")
        # set, not given to Parameter(): a Parameter made from a tensor copies it into host
        # memory outside MindSpore's pool (the rank's whole share of the parameters, 127 MB
        # on a 4-rank 127M model, kept until the first update), while set_data keeps it
        self.master.set_data(mine, slice_shape=True)

    @property
    def slice_shape(self) -> tuple[int, ...]:
        """The shape `master` has: the slice's `length` elements, 1-D (a bucket whose slice is
        whole rows of one table may keep it 2-D, `VocabularyRows`)."""
        return (self.flat.length,)

    def as_slice(self, values: ms.Tensor) -> ms.Tensor:
        """`values` (this rank's slice, 1-D or of `slice_shape`) as a tensor of `slice_shape`
        that owns its memory: a reshaped slice would be a view, which MindSpore's in-place
        updates refuse and its kernels copy at every use."""
        if tuple(values.shape) == self.slice_shape:
            return values
        return fresh_copy(values.reshape(self.slice_shape))

    def reduce(self, grads: Sequence[ms.Tensor]) -> ms.Tensor:
        """Its parameters' gradients summed over the data-parallel ranks (reduce-scattered over
        the shard group, summed over the replicas): this rank's slice."""
        return self.flat.reduce_scatter_tensors(grads)

    def flat_master(self) -> ms.Tensor:
        """`master` as the 1-D slice the `FlatShard` collectives take (a view when 2-D).
        The Parameter itself, not `master.value()`: that is a copy in MindSpore 2.10."""
        return self.master if self.master.ndim == 1 else self.master.reshape(-1)
