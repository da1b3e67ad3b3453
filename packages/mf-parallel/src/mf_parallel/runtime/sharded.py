"""Sharded data parallelism for the `optim` and `optim_grads` strategies, with HSDP.

ZeRO's first two stages, over a flat buffer of all parameters (padded to a multiple of the
shard degree; each rank owns one contiguous slice):

- `optim` (ZeRO-1): gradients are all-reduced whole; each rank keeps the optimizer state of
  its slice only, updates that slice, and the slices are all-gathered back into the model.
- `optim_grads` (ZeRO-2): gradients are reduce-scattered instead, so each rank also keeps only
  its slice of the gradients.

With HSDP (replicate > 1) the slices are taken over the `shard` group and the reduced slices
are then summed over the `replicate` group. AdamW is element-wise, so updating slices gives
the same parameters as updating whole tensors: the tests compare against plain data parallel.

Not here yet: `optim_grads_params` (parameters sharded between steps and gathered around
forward and backward), which needs per-layer hooks to honour `reshard_after_forward_policy`.
"""

from __future__ import annotations

from collections.abc import Sequence

import mindspore as ms
from mindspore import Parameter, mint, ops
from mindspore.experimental.optim import AdamW

from .collectives import Collectives

STRATEGIES = ("optim", "optim_grads")


class ShardedDataParallel:
    """Reduces gradients and steps AdamW on this rank's slice of the flattened parameters."""

    def __init__(self, params: Sequence[Parameter], collectives: Collectives, strategy: str, *,
                 lr: float, betas: tuple[float, float] = (0.9, 0.95), eps: float = 1e-8,
                 weight_decay: float = 0.0, average: bool = True):
        if strategy not in STRATEGIES:
            raise ValueError(f"unsupported data_parallel_shard_strategy {strategy!r}; this "
                             f"runtime implements {', '.join(STRATEGIES)}")
        self.params = list(params)
        self.collectives = collectives
        self.strategy = strategy
        self.average = average
        comm = collectives.comm
        self.shards, self.replicas = comm.group_size("shard"), comm.group_size("replicate")
        self.numels = [int(p.size) for p in self.params]
        total = sum(self.numels)
        self.slice_length = -(-total // self.shards)
        self.padding = self.slice_length * self.shards - total
        start = comm.group_rank("shard") * self.slice_length
        self.master = Parameter(self._flat(self.params)[start:start + self.slice_length].copy(),
                                name="mf_sharded_master")
        self.optimizer = AdamW([self.master], lr=lr, betas=betas, eps=eps,
                               weight_decay=weight_decay)

    def step(self, grads: Sequence[ms.Tensor]) -> None:
        """Reduce `grads`, update this rank's slice, and gather the new parameters."""
        my_grad = self._reduced_slice(self._flat(grads))
        if self.average:
            my_grad = my_grad * (1.0 / (self.shards * self.replicas))
        self.optimizer((my_grad,))
        full = self.collectives.all_gather(self.master.value(), "shard")
        pieces = mint.split(full[:full.shape[0] - self.padding], self.numels)
        for param, piece in zip(self.params, pieces, strict=True):
            param.set_data(piece.reshape(param.shape))

    def held_bytes(self) -> dict[str, int]:
        """Bytes this rank keeps between steps for parameters, gradients and optimizer state."""
        full = sum(self.numels) * 4
        mine = self.slice_length * 4
        return {"params": full + mine,  # the model's full parameters and the master slice
                "grads": mine if self.strategy == "optim_grads" else full,
                "optimizer": 2 * mine}  # AdamW's two moments, for the slice only

    def _reduced_slice(self, flat: ms.Tensor) -> ms.Tensor:
        if self.strategy == "optim":
            summed = self.collectives.all_reduce(flat, "data")
            start = self.collectives.comm.group_rank("shard") * self.slice_length
            return summed[start:start + self.slice_length]
        mine = self.collectives.reduce_scatter(flat, "shard")
        return self.collectives.all_reduce(mine, "replicate")

    def _flat(self, tensors: Sequence[ms.Tensor]) -> ms.Tensor:
        parts = [t.reshape(-1) for t in tensors]
        if self.padding:
            parts.append(ops.zeros(self.padding, parts[0].dtype))
        return ops.cat(parts)
