"""Expert parallelism: routed experts split over the expert group, tokens sent to the ranks of
their experts and the experts' outputs sent back (the token dispatcher and combiner).

Each of the `size` ranks of the `expert` group holds `n_experts / size` consecutive experts
(rank r: experts `r * local .. (r + 1) * local - 1`). Every rank routes its own tokens; the
routing tables (expert indices `[tokens, top_k]`) are first all-gathered over the group, so
every rank knows, without further messages, how many rows it sends to and receives from each
other rank, and in which order. Two dispatchers (`parallelism.moe_token_dispatcher_type`):

- `alltoall` (Megatron-LM's `MoEAlltoAllTokenDispatcher`): one row per (token, chosen expert)
  pair goes to the expert's rank in one all-to-all; the expert outputs come back in the
  reverse all-to-all and are weighted and summed at the token's rank.
- `alltoall_deredundancy` (MindFormers' deredundant dispatcher): the group is cut into
  devices of `expert_node` consecutive ranks (`npu_nums_per_device`). A token goes once to
  each device that holds any of its experts (to the rank at the sender's own place in that
  device, over the `expert_peer` group), with its routing weights; the device's ranks
  all-gather what they received (`expert_node` group) and each runs its own experts on its
  pairs, weighting them; the weighted sums are reduce-scattered back to the rank that received
  the token and sent to the token's rank, which adds the devices' parts. Fewer rows cross
  between devices (one per token and device, not per pair), more move inside them.

The exchanges move different row counts between rank pairs (`expert_exchange`). Both
dispatchers give each token the sum over its experts of weight x expert(token), exactly as one
process does (up to the order of float additions), and the same gradients.

Phantom rows: MindSpore's backward fails on empty tensors (a gather from no rows or of no
index, an empty slice), and every rank must run each exchange's backward (a collective), also a
rank that no token reached. So a rank that would receive no row sends itself one, and a rank
whose experts would compute no pair computes one: its output is dropped or weighted by zero,
so results and gradients are those without it, and it is not counted in the loads.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

import attrs
import mindspore as ms
import numpy as np
from mindspore import Tensor, ops

from ..mesh import expert_share
from .collectives import Collectives
from .expert_exchange import Exchange, GatherRows, ScatterRows, row_counts, take_rows

Dispatcher = Literal["alltoall", "alltoall_deredundancy"]
RunExpert = Callable[[int, Tensor], Tensor]
"""(global expert index, its input rows `[rows, hidden]`) -> its output rows."""


class ExpertGroup:
    """This rank's expert-parallel group, its dispatcher and its collectives: what the MoE
    layers take, so that they never look up groups themselves.

    Args:
        collectives: this rank's collectives (the `expert`, `expert_node` and `expert_peer`
            groups are used).
        dispatcher: `"alltoall"` or `"alltoall_deredundancy"`.
    """

    def __init__(self, collectives: Collectives, dispatcher: Dispatcher = "alltoall"):
        if dispatcher not in ("alltoall", "alltoall_deredundancy"):
            raise ValueError(f"unknown token dispatcher {dispatcher!r}; use 'alltoall' or "
                             "'alltoall_deredundancy'")
        comm = collectives.comm
        self.collectives, self.dispatcher = collectives, dispatcher
        self.size, self.rank = comm.group_size("expert"), comm.group_rank("expert")
        self.node_size = comm.group_size("expert_node")
        self.exchange = Exchange(collectives, "expert")
        self.peer_exchange = Exchange(collectives, "expert_peer")
        self.gather_node = GatherRows(collectives, "expert_node")
        self.scatter_node = ScatterRows(collectives, "expert_node")

    def local_experts(self, n_experts: int) -> range:
        """The global indices of the experts this rank holds.

        Raises:
            PlanError: the experts do not divide evenly over the group.
        """
        return expert_share(n_experts, self.size, self.rank)

    def routing_tables(self, indices: Tensor) -> np.ndarray:
        """Every group rank's expert indices, `[size, tokens, top_k]` on the host: an
        all-gather (sent as float32, exact below 2**24, because the CPU backend's emulated
        all-gather over a group smaller than the world is a sum, which it has no int32 kernel
        for) and the dispatch's one read back to the host."""
        indices = indices.astype(ms.float32).expand_dims(0)
        gathered = indices if self.size == 1 else self.collectives.all_gather(indices, "expert")
        return np.rint(gathered.asnumpy()).astype(np.int64)

    def dispatch(self, flat: Tensor, indices: Tensor, weights: Tensor, n_experts: int,
                 run_expert: RunExpert) -> Dispatched:
        """The routed experts' weighted sum for each of this rank's tokens.

        Args:
            flat: this rank's tokens `[tokens, hidden]`.
            indices: their experts `[tokens, top_k]` (global indices, on the device).
            weights: their routing weights `[tokens, top_k]` (float32, differentiable).
            n_experts: the number of routed experts.
            run_expert: runs one of this rank's experts on its rows.

        Returns:
            The output `[tokens, hidden]` in `flat`'s dtype, and what this rank's experts did.
        """
        tables = self.routing_tables(indices)
        local = n_experts // self.size
        if self.dispatcher == "alltoall":
            return _all_to_all(self, flat, tables, weights, local, run_expert)
        return _deredundant(self, flat, tables, weights, local, run_expert)


@attrs.frozen
class Dispatched:
    """A dispatch's output and its counts."""

    output: Tensor
    indices: np.ndarray
    """This rank's routing `[tokens, top_k]`, as read back to the host."""
    load: np.ndarray
    """(token, expert) pairs each expert of this rank computed, int64 `[n_experts]` (zero for
    the other ranks' experts): over the group, the counts of the whole group's routing."""
    rows_received: int
    """Rows that reached this rank from the group (pairs, or tokens per device)."""


def _all_to_all(group: ExpertGroup, flat: Tensor, tables: np.ndarray, weights: Tensor,
                local: int, run_expert: RunExpert) -> Dispatched:
    """One row per (token, expert) pair to the expert's rank, and back; see the module.

    A rank that no pair reaches sends itself one phantom pair (its token 0 for its first
    expert, output dropped), so that no tensor between the exchanges is empty (module
    docstring)."""
    size, me = group.size, group.rank
    tokens, top_k = tables.shape[1:]
    owner = tables // local                                           # [source, token, slot]
    sent = np.stack([np.bincount(o.ravel(), minlength=size) for o in owner])  # [src, dst]
    idle = sent.sum(0) == 0
    sent = sent + np.diag(idle.astype(sent.dtype))
    width = int(sent.max())
    order = np.argsort(tables[me].reshape(-1), kind="stable")         # my pairs by expert
    phantom_at = int(sent[me, :me].sum())                             # my chunk to myself
    send_index = np.insert(order // top_k, phantom_at, 0) if idle[me] else order // top_k
    received = group.exchange(take_rows(flat, send_index), row_counts(sent[me]),
                              row_counts(sent[:, me]), width)
    # Each source's rows arrive sorted by expert; the experts run on them expert by expert.
    expert_of = np.concatenate([np.sort(t[o == me]) for t, o in zip(tables, owner, strict=True)]
                               + [np.array([me * local])] * int(idle[me]))
    by_expert = np.argsort(expert_of, kind="stable")
    outputs, load = _run_experts(run_expert, take_rows(received, by_expert),
                                 expert_of[by_expert], me * local, local)
    load[0] -= int(idle[me])
    back = group.exchange(take_rows(outputs, np.argsort(by_expert, kind="stable")),
                          row_counts(sent[:, me]), row_counts(sent[me]), width)
    sorted_at = np.arange(len(order))
    sorted_at += (sorted_at >= phantom_at) * int(idle[me])            # past my phantom
    per_slot = take_rows(back, sorted_at[np.argsort(order, kind="stable")])
    per_slot = per_slot.reshape(tokens, top_k, flat.shape[-1])
    mixed = (per_slot.astype(ms.float32) * weights.expand_dims(-1)).sum(1)
    return Dispatched(mixed.astype(flat.dtype), tables[me], _load(load, me, size),
                      len(expert_of) - int(idle[me]))


def _deredundant(group: ExpertGroup, flat: Tensor, tables: np.ndarray, weights: Tensor,
                 local: int, run_expert: RunExpert) -> Dispatched:
    """One row per (token, device) to the device, fanned out inside it; see the module.

    A rank that receives no row sends itself a phantom one (its token 0, with zero weights:
    none of the token's experts is on that device), and a rank whose experts have no pair
    runs its first expert on the device's first row with weight 0, so that no tensor between
    the exchanges is empty (module docstring); both add exact
    zeros."""
    size, me, node = group.size, group.rank, group.node_size
    devices, (my_device, place) = size // node, divmod(me, node)
    tokens, top_k = tables.shape[1:]
    device_of = tables // local // node                               # [source, token, slot]
    # goes[s, d, t]: source s sends token t to device d (once, whatever its experts there).
    goes = np.stack([[np.any(d == dev, axis=-1) for dev in range(devices)] for d in device_of])
    idle = [rank for rank in range(size) if not any(
        goes[dev * node + rank % node, rank // node].any() for dev in range(devices))]
    for rank in idle:
        goes[rank, rank // node, 0] = True
    sent = goes.sum(-1)                                               # [source, device]
    peers = [dev * node + place for dev in range(devices)]            # my expert_peer group
    width = int(sent[peers].max())
    send_token = np.concatenate([np.flatnonzero(goes[me, dev]) for dev in range(devices)])
    send_device = np.concatenate([np.full(sent[me, dev], dev) for dev in range(devices)])
    masked = np.where(device_of[me][send_token] == send_device[:, None], 1.0, 0.0)
    send_weights = take_rows(weights, send_token) * Tensor(masked.astype(np.float32))
    from_peers = row_counts(sent[peers, my_device])
    x = group.peer_exchange(take_rows(flat, send_token), row_counts(sent[me]), from_peers,
                            width)
    w = group.peer_exchange(send_weights, row_counts(sent[me]), from_peers, width)
    # The device's rows: member by member, then source device by source device, token order.
    sources = [dev * node + m for m in range(node) for dev in range(devices)]
    row_source = np.concatenate([np.full(sent[s, my_device], s) for s in sources])
    row_token = np.concatenate([np.flatnonzero(goes[s, my_device]) for s in sources])
    node_counts = row_counts(sent[sources, my_device].reshape(node, devices).sum(1))
    x_node = group.gather_node(x, node_counts)
    w_node = group.gather_node(w, node_counts)
    experts = tables[row_source, row_token]                           # [device rows, top_k]
    row, slot = np.nonzero(experts // local == me)                    # my pairs
    by_expert = np.argsort(experts[row, slot], kind="stable")
    row, slot = row[by_expert], slot[by_expert]
    expert_ids, no_pair = experts[row, slot], len(row) == 0
    if no_pair:
        row, slot, expert_ids = np.zeros(1, np.int64), np.zeros(1, np.int64), np.array([me * local])
    outputs, load = _run_experts(run_expert, take_rows(x_node, row), expert_ids, me * local,
                                 local)
    load[0] -= int(no_pair)
    pair_weights = take_rows(w_node.reshape(-1), row * top_k + slot) * (0.0 if no_pair else 1.0)
    weighted = outputs.astype(ms.float32) * pair_weights.expand_dims(-1)
    partial = _sum_into(weighted, row * top_k + slot, len(row_token) * top_k)
    partial = partial.reshape(len(row_token), top_k, flat.shape[-1]).sum(1)
    mine = group.scatter_node(partial, node_counts)
    back = group.peer_exchange(mine, from_peers, row_counts(sent[me]), width)
    routed = _sum_into(back, send_token * devices + send_device, tokens * devices)
    out = routed.reshape(tokens, devices, flat.shape[-1]).sum(1)
    received = int(sent[peers, my_device].sum()) - int(me in idle)
    return Dispatched(out.astype(flat.dtype), tables[me], _load(load, me, size), received)


def _run_experts(run_expert: RunExpert, rows: Tensor, expert_of: np.ndarray, first: int,
                 local: int) -> tuple[Tensor, np.ndarray]:
    """Each of this rank's experts (global `first .. first + local - 1`) on its consecutive
    rows (`expert_of` is sorted); the outputs in the same order and the count per expert."""
    counts = np.bincount(expert_of - first, minlength=local).astype(np.int64)
    outputs, start = [], 0
    for index, count in enumerate(counts.tolist()):
        if count:
            outputs.append(run_expert(first + index, rows[start:start + count]))
        start += count
    if not outputs:
        return rows, counts
    return (outputs[0] if len(outputs) == 1 else ops.cat(outputs)), counts


def _load(counts: np.ndarray, rank: int, size: int) -> np.ndarray:
    """This rank's per-expert counts placed among all the group's experts."""
    load = np.zeros(len(counts) * size, np.int64)
    load[rank * len(counts):(rank + 1) * len(counts)] = counts
    return load


def _sum_into(rows: Tensor, slots: np.ndarray, total: int) -> Tensor:
    """`[total, hidden]`: row i of `rows` at position `slots[i]`, zeros elsewhere (each slot
    at most once: a gather from the rows followed by one zero row)."""
    source = np.full(total, len(slots), np.int64)
    source[slots] = np.arange(len(slots))
    padded = ops.cat((rows, ops.zeros((1, rows.shape[-1]), rows.dtype)))
    return take_rows(padded, source)
