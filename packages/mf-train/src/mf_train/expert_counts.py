"""Tokens per expert of a step over every rank that routes different tokens.

A mixture-of-experts model (`tokens_per_expert()`: global layer index -> int counts
`[n_routed_experts]` of its last forward) routes, on each rank, the tokens of that rank's
micro-batches. Different ranks route different tokens along the `loss` group (data x context:
different samples or sequence chunks) and along the `tensor` group (under sequence parallelism
each tensor rank routes its slice of the sequence); ranks of one pipeline stage and the same
coordinates elsewhere route the same tokens. The step's counts are therefore the sum over its
micro-batches (`StepCounts`) and then over the loss and tensor groups (`global_counts`): the
same numbers on every rank, so a decision taken from them (the auxiliary-loss-free bias) stays
identical everywhere, and a multi-rank run sees what one process with the whole batch sees.

Counts travel as float32 (the collectives every backend has): exact while an expert receives
fewer than 2**24 tokens in a step.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
from mindspore import Tensor

from mf_parallel.runtime import Collectives

ROUTING_GROUPS = ("loss", "tensor")
"""The group kinds whose ranks route different tokens, summed over in this order."""

Counts = dict[int, np.ndarray]
"""Global layer index -> tokens per expert (int64 `[n_routed_experts]`)."""


class StepCounts:
    """This rank's counts of one step: the sum of every micro-batch's forward.

    Args:
        model: the model, with `tokens_per_expert()` (or the method `method` names, such as
            `expert_load()`: the same shape of counts).
        method: the model's method that gives the last forward's counts.
    """

    def __init__(self, model: Any, method: str = "tokens_per_expert"):
        self.model = model
        self.method = method
        self.counts: Counts = {}

    def add_last_forward(self) -> None:
        """Add the model's last forward (call once per micro-batch, after its backward: a
        recomputed forward routes the same tokens again, so reading after the backward
        counts each micro-batch once)."""
        for layer, counts in getattr(self.model, self.method)().items():
            counts = np.asarray(counts, dtype=np.int64)
            previous = self.counts.get(layer)
            self.counts[layer] = counts.copy() if previous is None else previous + counts

    def take(self) -> Counts:
        """The step's counts (the last forward's, when none was added); the next step starts
        from zero."""
        if not self.counts:
            self.add_last_forward()
        counts, self.counts = self.counts, {}
        return counts


def global_counts(local: Mapping[int, np.ndarray], collectives: Collectives | None) -> Counts:
    """The step's counts summed over the ranks that route different tokens.

    Args:
        local: this rank's counts of the step (every micro-batch).
        collectives: this rank's collectives (None: one process). Every rank of the loss and
            tensor groups must call this at the same step with the same layers.

    Returns:
        The summed counts, the same on every rank of those groups.
    """
    layers = sorted(local)
    if collectives is None or not layers:
        return {layer: np.asarray(local[layer], np.int64) for layer in layers}
    stacked = _reduce(np.stack([local[layer] for layer in layers]), collectives)
    return dict(zip(layers, stacked, strict=True))


def per_rank_counts(local: Mapping[int, np.ndarray], collectives: Collectives | None,
                    ) -> tuple[list[int], Counts]:
    """Every routing rank's own counts of the step, on every rank (for monitoring: the
    buffer is the group's size times larger than `global_counts`').

    Args:
        local: this rank's counts of the step.
        collectives: this rank's collectives (None: one process).

    Returns:
        The global ranks of the rows (loss-group position major, tensor position minor) and
        layer -> int64 `[ranks, n_routed_experts]`; each layer's rows sum to its
        `global_counts`.
    """
    layers = sorted(local)
    ranks = routing_ranks(collectives)
    if not layers:
        return ranks, {}
    mine = np.stack([local[layer] for layer in layers])
    table = np.zeros((len(ranks), *mine.shape), np.int64)
    table[ranks.index(_rank(collectives))] = mine
    if collectives is not None:
        table = _reduce(table, collectives)
    return ranks, {layer: table[:, index] for index, layer in enumerate(layers)}


def routing_ranks(collectives: Collectives | None) -> list[int]:
    """The global ranks of this rank's loss x tensor group, in the order of `per_rank_counts`'
    rows (the tensor coordinate varies fastest in mf-parallel's rank order)."""
    if collectives is None:
        return [0]
    comm = collectives.comm
    return [base - comm.rank + rank for base in comm.group_ranks["loss"]
            for rank in comm.group_ranks["tensor"]]


def _rank(collectives: Collectives | None) -> int:
    return 0 if collectives is None else collectives.comm.rank


def _reduce(array: np.ndarray, collectives: Collectives) -> np.ndarray:
    """Sum over the routing groups, as float32, back to int64."""
    tensor = Tensor(array.astype(np.float32))
    for kind in ROUTING_GROUPS:
        tensor = collectives.all_reduce(tensor, kind)
    return np.rint(tensor.asnumpy()).astype(np.int64)
