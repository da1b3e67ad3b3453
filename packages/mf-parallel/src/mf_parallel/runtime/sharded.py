"""Sharded data parallelism for the `optim` and `optim_grads` strategies, with HSDP.

ZeRO's first two stages, over one flat buffer of all parameters (see `flat_shard`):

- `optim` (ZeRO-1): gradients are kept whole (accumulated by the caller over a step's
  micro-batches) and reduced to this rank's slice at the end; each rank keeps the optimizer
  state of its slice only, updates that slice, and the slices are all-gathered back into the
  model.
- `optim_grads` (ZeRO-2): gradients are reduce-scattered as they are produced
  (`grad_shards.ShardedGradients`), so each rank also keeps only its slice of the gradients.

The parameters are sharded by buffer, one per unit (mf-train passes the decoder layers, as
for FSDP), so the transient buffers of a reduction or a gather are one unit's size (each
tensor cut into one chunk per rank, `flat_shard.FlatShard`).
The gradients are reduced to this rank's slice of each buffer by `grad_shards.ShardedGradients`
with `grad_reduce.GradientReducer` (each buffer's `FlatBucket.reduce`); the caller updates the
slices (any element-wise optimizer: AdamW with per-element weight decay in mf-train), and
`publish(slices)` gathers the new slices into the model's parameters. AdamW is element-wise, so
updating slices gives the same parameters as updating whole tensors: the tests compare against
plain data parallel. The third stage, `optim_grads_params`, is
`fully_sharded.FullyShardedDataParallel`.
"""

from __future__ import annotations

from collections.abc import Sequence

import mindspore as ms
from mindspore import Parameter, ops

from .collectives import Collectives
from .flat_shard import DATA_GROUPS, EXPERT_DATA_GROUPS, FlatBucket, ShardGroups

STRATEGIES = ("optim", "optim_grads")


class ShardedDataParallel:
    """This rank's slices of the flattened parameters, in flat buffers whose gradients the
    caller reduces (`FlatBucket.reduce`), and the gather of updated slices back.

    The parameters are laid out in flat buffers (`FlatBucket`), one per unit given (a decoder
    layer, say) and one for the parameters no unit holds, so that every transient buffer of a
    reduction or gather is one unit's size, never the model's; without units, one buffer of
    all. `buffers` lists them, each with `.params`, `.flat` (its `FlatShard`), `.master`
    (this rank's slice, in the parameters' dtype, of shape `.slice_shape`) and `.as_slice`
    (`FlatBucket`), the shape `FullyShardedDataParallel` gives per unit, so an injected
    optimizer treats both alike.

    Args:
        params: the model's trainable parameters (gradients come in this order).
        collectives: this rank's collectives; slices are over the `shard` group (and
            summed over `replicate` with HSDP).
        strategy: `"optim"` (ZeRO-1: shard optimizer state) or `"optim_grads"` (ZeRO-2: and
            gradients).
        units: groups of `params`, each laid out in its own buffer (in this order, then the
            rest); None: one buffer.
        groups: the groups the slices are taken over: `flat_shard.DATA_GROUPS`, or
            `EXPERT_DATA_GROUPS` for routed experts.
        expert_units: routed experts under expert parallelism: groups of `params` each in a
            buffer of its own (after the units'), sliced over the expert-data group
            (`EXPERT_DATA_GROUPS`: the ranks holding the same experts).
        reduce_dtype: the dtype the gradients are reduced in (None: their own).

    Raises:
        ValueError: an unknown strategy (`optim_grads_params` is `FullyShardedDataParallel`),
            or a unit holding a parameter twice or one not in `params`.
    """

    def __init__(self, params: Sequence[Parameter], collectives: Collectives, strategy: str, *,
                 units: Sequence[Sequence[Parameter]] | None = None,
                 groups: ShardGroups = DATA_GROUPS,
                 expert_units: Sequence[Sequence[Parameter]] = (),
                 reduce_dtype: ms.Type | None = None):
        if strategy not in STRATEGIES:
            hint = (" (use fully_sharded.FullyShardedDataParallel)"
                    if strategy == "optim_grads_params" else "")
            raise ValueError(f"ShardedDataParallel implements {', '.join(STRATEGIES)}, not "
                             f"{strategy!r}{hint}")
        self.params = list(params)
        self.collectives = collectives
        self.strategy = strategy
        experts = {id(p) for unit in expert_units for p in unit}
        self._buffers = [FlatBucket(f"bucket{i}", group, collectives, groups=(
                             EXPERT_DATA_GROUPS if id(group[0]) in experts else groups))
                         for i, group in enumerate(_groups(self.params,
                                                           [*(units or []), *expert_units]))]
        for bucket in self._buffers:
            bucket.flat.reduce_dtype = reduce_dtype

    @property
    def buffers(self) -> list[FlatBucket]:
        """The flat buffers whose slices are reduced and published, in order."""
        return list(self._buffers)

    @property
    def scatters(self) -> bool:
        """Whether gradients are reduce-scattered (ZeRO-2) rather than all-reduced whole."""
        return self.strategy == "optim_grads"

    def publish(self, slices: Sequence[ms.Tensor]) -> None:
        """Take this rank's updated slices and gather every rank's slices into the model's
        parameters, buffer by buffer (a collective: all ranks call it).

        Args:
            slices: one slice per buffer, in `buffers` order.
        """
        lengths = [bucket.flat.length for bucket in self._buffers]
        if [tuple(s.shape) for s in slices] != [(n,) for n in lengths]:
            raise ValueError(f"publish expects slices of {lengths} elements, got "
                             f"{[tuple(s.shape) for s in slices]}")
        for bucket, mine in zip(self._buffers, slices, strict=True):
            bucket.master.set_data(mine if mine.dtype == bucket.master.dtype
                                   else ops.cast(mine, bucket.master.dtype))
        self._gather()

    def _gather(self) -> None:
        """Every rank's slices gathered into the model's parameters, written into each
        parameter's own tensor (never swapped for the gathered one): whatever holds a
        parameter's tensor, a compiled graph of `context.compile` that captured it at its
        first call, reads the published values."""
        for bucket in self._buffers:
            for param, full in zip(bucket.params, bucket.flat.all_gather(bucket.master),
                                   strict=True):
                ops.assign(param, full)

    def held_bytes(self) -> dict[str, int]:
        """Bytes this rank keeps between steps for parameters, gradients and optimizer state."""
        full = sum(bucket.flat.total for bucket in self._buffers) * 4
        mine = sum(bucket.flat.length for bucket in self._buffers) * 4
        return {"params": full + mine,  # the model's full parameters and the master slices
                "grads": mine if self.scatters else full,
                "optimizer": 2 * mine}  # AdamW's two moments, for the slices only


def _groups(params: list[Parameter], units: Sequence[Sequence[Parameter]],
            ) -> list[list[Parameter]]:
    """The units' parameters (in `params`' order within each), then the rest (if any)."""
    position = {id(p): i for i, p in enumerate(params)}
    taken: set[int] = set()
    groups = []
    for index, unit in enumerate(units):
        for param in unit:
            if id(param) not in position:
                raise ValueError(f"unit {index} holds {param.name!r}, which is not among the "
                                 "parameters")
            if id(param) in taken:
                raise ValueError(f"{param.name!r} is in two units")
            taken.add(id(param))
        if unit:
            groups.append(sorted(unit, key=lambda p: position[id(p)]))
    rest = [p for p in params if id(p) not in taken]
    return groups + ([rest] if rest else [])
