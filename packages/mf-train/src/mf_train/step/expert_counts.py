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

from collections.abc import Collection, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:  # MindSpore is imported where tensors are made: mf-train's launcher,
    # which imports the monitors' package, imports none
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

    def add_last_forward(self, layers: Collection[int] | None = None) -> None:
        """Add the model's last forward of these layers (None: all; call once per micro-batch
        and layer, after its backward: a recomputed forward routes the same tokens again, so
        reading after the backward counts each micro-batch once)."""
        for layer, counts in getattr(self.model, self.method)().items():
            if layers is not None and layer not in layers:
                continue
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


def global_counts(local: Mapping[int, np.ndarray],
                  collectives: Collectives | None) -> dict[int, Tensor]:
    """The step's counts summed over the ranks that route different tokens, left on the
    device (the bias update uses them there: nothing is read back inside the step).

    Args:
        local: this rank's counts of the step (every micro-batch).
        collectives: this rank's collectives (None: one process). Every rank of the loss and
            tensor groups must call this at the same step with the same layers.

    Returns:
        Layer -> the summed counts (float32 `[n_routed_experts]`, exact), the same on every
        rank of those groups.
    """
    layers = sorted(local)
    if not layers:
        return {}
    stacked = _summed(np.stack([local[layer] for layer in layers]), collectives)
    return {layer: stacked[index] for index, layer in enumerate(layers)}


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


def _summed(array: np.ndarray, collectives: Collectives | None) -> Tensor:
    """Sum over the routing groups, as float32, on the device."""
    from mindspore import Tensor

    tensor = Tensor(array.astype(np.float32))
    for kind in ROUTING_GROUPS if collectives is not None else ():
        tensor = collectives.all_reduce(tensor, kind)
    return tensor


def _reduce(array: np.ndarray, collectives: Collectives) -> np.ndarray:
    """Sum over the routing groups, back to int64 on the host (`_summed`)."""
    return np.rint(_summed(array, collectives).asnumpy()).astype(np.int64)


def across_stages(tables: Mapping[int, np.ndarray], ranks: list[int],
                  collectives: Collectives | None,
                  ) -> dict[int, tuple[list[int], np.ndarray]]:
    """Every pipeline stage's per-rank tables on every rank of this rank's pipeline group,
    each with the global ranks of its rows (for monitoring: a stage holds only its layers).

    Args:
        tables: layer -> `[len(ranks), n]` int64 (`per_rank_counts`' of this stage); one
            shape on every stage that has any.
        ranks: the global ranks of this stage's rows (`routing_ranks`).
        collectives: this rank's collectives (None: one process). Every rank of the
            pipeline group must call this at the same step.

    Returns:
        layer -> (the global ranks of its rows on the stage holding it, its table). The
        routing groups of two stages are the same shape apart: rank order is the mesh's, so
        a row's rank on another stage is this stage's plus the difference of the two
        stages' ranks in the pipeline group.
    """
    if collectives is None or collectives.comm.group_size("pipeline") == 1:
        return {layer: (ranks, table) for layer, table in tables.items()}
    from mindspore import Tensor

    comm = collectives.comm
    stage_ranks = comm.group_ranks["pipeline"]
    stage = stage_ranks.index(comm.rank)
    mine = [next(iter(tables.values())).shape[1] if tables else 0, max(tables, default=-1) + 1]
    width, layers = (int(n) for n in collectives.all_reduce(
        Tensor(np.array(mine, np.float32)), "pipeline", op="max").asnumpy())
    if not width or not layers:
        return {}
    dense = np.zeros((layers, len(ranks), width + 1), np.float32)
    for layer, table in tables.items():
        dense[layer, :, :width] = table
        dense[layer, :, width] = stage + 1  # which stage holds it (0: none)
    dense = collectives.all_reduce(Tensor(dense), "pipeline").asnumpy()
    merged = {}
    for layer in range(layers):
        holder = int(np.rint(dense[layer, 0, width])) - 1
        if holder >= 0:
            shift = stage_ranks[holder] - comm.rank
            merged[layer] = ([rank + shift for rank in ranks],
                             np.rint(dense[layer, :, :width]).astype(np.int64))
    return merged
