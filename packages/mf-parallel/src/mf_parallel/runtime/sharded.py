"""Sharded data parallelism for the `optim` and `optim_grads` strategies, with HSDP.

ZeRO's first two stages, over one flat buffer of all parameters (see `flat_shard`):

- `optim` (ZeRO-1): gradients are all-reduced whole; each rank keeps the optimizer state of
  its slice only, updates that slice, and the slices are all-gathered back into the model.
- `optim_grads` (ZeRO-2): gradients are reduce-scattered instead, so each rank also keeps only
  its slice of the gradients.

The optimizer's math is the caller's: `reduce_grads(grads)` returns this rank's reduced slice,
the caller updates its slice (any element-wise optimizer: AdamW with per-element weight decay
in mf-train), and `publish([slice])` gathers the new slices into the model's parameters.
`step(grads)` does all three with `mindspore.experimental.optim.AdamW` (one lr, one weight
decay) when the wrapper was built with `lr`. AdamW is element-wise, so updating slices gives the
same parameters as updating whole tensors: the tests compare against plain data parallel. The
third stage, `optim_grads_params`, is `fully_sharded.FullyShardedDataParallel`.
"""

from __future__ import annotations

from collections.abc import Sequence

import mindspore as ms
from mindspore import Parameter, ops
from mindspore.experimental.optim import AdamW

from .collectives import Collectives
from .flat_shard import FlatShard

STRATEGIES = ("optim", "optim_grads")


class ShardedDataParallel:
    """Reduces gradients to this rank's slice of the flattened parameters and gathers updated
    slices back; with `lr`, also steps its own AdamW on the slice (`step`).

    `buffers` is `[self]`: one flat buffer with `.params`, `.flat` (its `FlatShard`) and
    `.master` (this rank's slice, in the parameters' dtype), the shape `FullyShardedDataParallel`
    gives per unit, so an injected optimizer treats both alike.

    Args:
        params: the model's trainable parameters (gradients come in this order).
        collectives: this rank's collectives; slices are over the `shard` group (and
            summed over `replicate` with HSDP).
        strategy: `"optim"` (ZeRO-1: shard optimizer state) or `"optim_grads"` (ZeRO-2: and
            gradients).
        lr: with a learning rate, `step` runs AdamW on the slice; without, the caller updates
            the slices (`reduce_grads`, then `publish`).
        betas, eps, weight_decay: the built-in AdamW's settings.
        average: average the gradients over the data-parallel ranks instead of summing.

    Raises:
        ValueError: an unknown strategy (`optim_grads_params` is `FullyShardedDataParallel`).
    """

    def __init__(self, params: Sequence[Parameter], collectives: Collectives, strategy: str, *,
                 lr: float | None = None, betas: tuple[float, float] = (0.9, 0.95),
                 eps: float = 1e-8, weight_decay: float = 0.0, average: bool = True):
        if strategy not in STRATEGIES:
            hint = (" (use fully_sharded.FullyShardedDataParallel)"
                    if strategy == "optim_grads_params" else "")
            raise ValueError(f"ShardedDataParallel implements {', '.join(STRATEGIES)}, not "
                             f"{strategy!r}{hint}")
        self.params = list(params)
        self.collectives = collectives
        self.strategy = strategy
        self.average = average
        self.flat = FlatShard([p.shape for p in self.params], collectives)
        self.master = Parameter(self.flat.own(self.flat.flatten(self.params)),
                                name="mf_sharded_master")
        self.optimizer = None if lr is None else AdamW(
            [self.master], lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)

    @property
    def buffers(self) -> list[ShardedDataParallel]:
        """The flat buffers whose slices `reduce_grads` and `publish` exchange: this one."""
        return [self]

    def step(self, grads: Sequence[ms.Tensor]) -> None:
        """Reduce `grads`, update this rank's slice with the built-in AdamW, and gather the
        new parameters."""
        if self.optimizer is None:
            raise RuntimeError("ShardedDataParallel was built without lr: the caller updates "
                               "the slices (reduce_grads, then publish)")
        self.optimizer(tuple(self.reduce_grads(grads)))
        self._gather()

    def reduce_grads(self, grads: Sequence[ms.Tensor]) -> list[ms.Tensor]:
        """Reduce the gradients to this rank's slice (a collective: all ranks call it).

        Args:
            grads: the gradients, aligned with `params`.

        Returns:
            A list of one slice (one buffer): summed over the data-parallel ranks, averaged
            when `average`.
        """
        if len(grads) != len(self.params):
            raise ValueError(f"expected {len(self.params)} gradients, got {len(grads)}")
        mine = self._reduced_slice(self.flat.flatten(grads))
        if self.average:
            mine = mine * (1.0 / (self.flat.shards * self.flat.replicas))
        return [mine]

    def publish(self, slices: Sequence[ms.Tensor]) -> None:
        """Take this rank's updated slice and gather every rank's slice into the model's
        parameters (a collective: all ranks call it).

        Args:
            slices: one slice, as `reduce_grads` gives it.
        """
        if len(slices) != 1 or tuple(slices[0].shape) != (self.flat.length,):
            raise ValueError(f"publish expects one slice of {self.flat.length} elements, got "
                             f"{[tuple(s.shape) for s in slices]}")
        self.master.set_data(ops.cast(slices[0], self.master.dtype))
        self._gather()

    def _gather(self) -> None:
        for param, full in zip(self.params, self.flat.all_gather(self.master.value()),
                               strict=True):
            param.set_data(full)

    def held_bytes(self) -> dict[str, int]:
        """Bytes this rank keeps between steps for parameters, gradients and optimizer state."""
        full = self.flat.total * 4
        mine = self.flat.length * 4
        return {"params": full + mine,  # the model's full parameters and the master slice
                "grads": mine if self.strategy == "optim_grads" else full,
                "optimizer": 2 * mine}  # AdamW's two moments, for the slice only

    def _reduced_slice(self, flat: ms.Tensor) -> ms.Tensor:
        if self.strategy == "optim":
            return self.flat.own(self.collectives.all_reduce(flat, "data"))
        return self.flat.reduce_scatter(flat)
