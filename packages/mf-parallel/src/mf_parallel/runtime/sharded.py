"""Sharded data parallelism for the `optim` and `optim_grads` strategies, with HSDP.

ZeRO's first two stages, over one flat buffer of all parameters (see `flat_shard`):

- `optim` (ZeRO-1): gradients are all-reduced whole; each rank keeps the optimizer state of
  its slice only, updates that slice, and the slices are all-gathered back into the model.
- `optim_grads` (ZeRO-2): gradients are reduce-scattered instead, so each rank also keeps only
  its slice of the gradients.

AdamW is element-wise, so updating slices gives the same parameters as updating whole
tensors: the tests compare against plain data parallel. The third stage,
`optim_grads_params`, is `fully_sharded.FullyShardedDataParallel`.
"""

from __future__ import annotations

from collections.abc import Sequence

import mindspore as ms
from mindspore import Parameter
from mindspore.experimental.optim import AdamW

from .collectives import Collectives
from .flat_shard import FlatShard

STRATEGIES = ("optim", "optim_grads")


class ShardedDataParallel:
    """Reduces gradients and steps AdamW on this rank's slice of the flattened parameters."""

    def __init__(self, params: Sequence[Parameter], collectives: Collectives, strategy: str, *,
                 lr: float, betas: tuple[float, float] = (0.9, 0.95), eps: float = 1e-8,
                 weight_decay: float = 0.0, average: bool = True):
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
        self.optimizer = AdamW([self.master], lr=lr, betas=betas, eps=eps,
                               weight_decay=weight_decay)

    def step(self, grads: Sequence[ms.Tensor]) -> None:
        """Reduce `grads`, update this rank's slice, and gather the new parameters."""
        my_grad = self._reduced_slice(self.flat.flatten(grads))
        if self.average:
            my_grad = my_grad * (1.0 / (self.flat.shards * self.flat.replicas))
        self.optimizer((my_grad,))
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
