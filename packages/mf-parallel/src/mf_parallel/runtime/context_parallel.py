"""Context parallelism at run time: the exchanges attention needs when the sequence is split.

Each context rank holds `seq / context` tokens (`mf_parallel.sequence.context_spans`: with a
causal mask an early and a late chunk). Attention needs every key of the sequence, so it
exchanges along the sequence dimension (dim 0 of `[seq, batch, heads, head_dim]`):

- `colossal`: keys and values all-gathered over the context group (Megatron-LM's
  `cp_comm_type: all_gather`); backward reduce-scatters their gradients.
- `ulysses`: an all-to-all turns `[seq / u, heads]` into `[seq, heads / u]` for queries,
  keys and values (DeepSpeed-Ulysses), attention runs on whole sequences of a slice of the
  heads, and the inverse all-to-all brings the output back; each exchange's backward is the
  other.
- `hybrid`: Ulysses inside blocks of `context_ulysses` ranks (`context_ulysses` groups), then
  keys and values all-gathered over the blocks (`context_ring` groups).

With `overlap` (`context_parallel_async`) the all-gather of keys and values is started
without waiting (`start_gather`) so that attention over this rank's own keys runs while the
other ranks' keys are under way; `JoinGathered` then attaches the gathered tensor to the
gradient (its backward is the reduce-scatter, as `GatherSequence`'s).

The exchanged tokens arrive in group-rank order, so the keys of the gathered sequence are in
the order `key_order` gives (each rank's spans, rank after rank), not 0..seq-1: attention
masks by global token index, never by place.

On CPU the exchanges are `Collectives`' emulations over all-reduce (no AllGather or AlltoAll
kernels there); on Ascend and GPU the native collectives.
"""

from __future__ import annotations

from mindspore import Tensor, nn, ops

from ..sequence import context_spans
from .collectives import Collectives, Pending

KIND, ULYSSES, RING = "context", "context_ulysses", "context_ring"


class ContextGroup:
    """This rank's context group and its two sub-groups, with the exchanges between them.

    Args:
        collectives: this rank's collectives (the `context`, `context_ulysses` and
            `context_ring` groups are used).
        causal: whether the sequence is split with causal load balancing
            (`context_parallel_mask_type: causal`).
        overlap: start the all-gather of keys and values without waiting and attend to this
            rank's own keys meanwhile (`context_parallel_async`).
    """

    def __init__(self, collectives: Collectives, causal: bool = True, overlap: bool = False):
        comm = collectives.comm
        self.collectives = collectives
        self.causal = causal
        self.overlap = overlap
        self.size, self.rank = comm.group_size(KIND), comm.group_rank(KIND)
        self.ulysses, self.ulysses_rank = comm.group_size(ULYSSES), comm.group_rank(ULYSSES)
        self.ring, self.ring_rank = comm.group_size(RING), comm.group_rank(RING)

    def method(self) -> str:
        """`colossal`, `ulysses` or `hybrid`, from the sub-group sizes."""
        if self.ulysses == 1:
            return "colossal"
        return "ulysses" if self.ring == 1 else "hybrid"

    def spans(self, seq_length: int, rank: int | None = None) -> list[range]:
        """The parts of a `seq_length`-token sequence that context rank `rank` (this one by
        default) holds, in order."""
        return context_spans(seq_length, self.size, self.rank if rank is None else rank,
                             self.causal)

    def query_order(self, seq_length: int) -> list[int]:
        """Global indices of the queries attention sees here (after the Ulysses exchange):
        the tokens of this rank's Ulysses block, rank after rank."""
        first = self.rank - self.ulysses_rank
        return _indices(self.spans(seq_length, r) for r in range(first, first + self.ulysses))

    def key_order(self, seq_length: int) -> list[int]:
        """Global indices of the keys attention sees here (after every exchange): the whole
        sequence, context rank after rank (blocks are consecutive context ranks)."""
        if self.ring == 1:
            return self.query_order(seq_length)
        return _indices(self.spans(seq_length, r) for r in range(self.size))

    def all_reduce(self, x: Tensor) -> Tensor:
        """Sum over the context group (the loss's token count)."""
        return self.collectives.all_reduce(x, KIND)

    def start_gather(self, x: Tensor) -> Pending:
        """Start the all-gather of `x` along dim 0 over the `context_ring` group; attach its
        result with `JoinGathered` for the gradient."""
        return self.collectives.start_all_gather(x, RING)


def _indices(spans_of_ranks) -> list[int]:
    return [index for spans in spans_of_ranks for span in spans for index in span]


class _Exchange(nn.Cell):
    """A forward exchange whose `bprop` is its conjugate, over one context sub-group."""

    def __init__(self, group: ContextGroup):
        super().__init__()
        self.group = group


class GatherSequence(_Exchange):
    """All-gather along dim 0 over the `context_ring` group; reduce-scatter backward (each
    rank's keys serve every rank's queries, so their gradients are summed)."""

    def construct(self, x: Tensor) -> Tensor:
        return self.group.collectives.all_gather(x, RING)

    def bprop(self, x: Tensor, out: Tensor, dout: Tensor) -> tuple[Tensor]:
        return (self.group.collectives.reduce_scatter(dout, RING),)


class JoinGathered(_Exchange):
    """`(x, gathered) -> gathered`, where `gathered` is `x` all-gathered over the
    `context_ring` group by `ContextGroup.start_gather`: the forward passes the finished
    buffer on, the backward gives `x` the reduce-scatter of its gradient (as `GatherSequence`).
    """

    def construct(self, x: Tensor, gathered: Tensor) -> Tensor:
        return gathered

    def bprop(self, x: Tensor, gathered: Tensor, out: Tensor,
              dout: Tensor) -> tuple[Tensor, Tensor]:
        return (self.group.collectives.reduce_scatter(dout, RING), ops.zeros_like(gathered))


def sequence_to_heads(collectives: Collectives, x: Tensor, ways: int) -> Tensor:
    """`[s, b, h, d]` -> `[ways * s, b, h / ways, d]` over the `context_ulysses` group: head
    chunk i goes to member i, which gets every member's tokens in member order."""
    s, b, h, d = x.shape
    x = x.reshape(s, b, ways, h // ways, d).transpose(2, 0, 1, 3, 4)
    return collectives.all_to_all(x.reshape(ways * s, b, h // ways, d), ULYSSES)


def heads_to_sequence(collectives: Collectives, x: Tensor, ways: int) -> Tensor:
    """The inverse of `sequence_to_heads`: `[ways * s, b, h', d]` -> `[s, b, ways * h', d]`."""
    x = collectives.all_to_all(x, ULYSSES)
    total, b, h, d = x.shape
    s = total // ways
    return x.reshape(ways, s, b, h, d).transpose(1, 2, 0, 3, 4).reshape(s, b, ways * h, d)


class SequenceToHeads(_Exchange):
    """Ulysses' first exchange (`sequence_to_heads`); its inverse backward."""

    def construct(self, x: Tensor) -> Tensor:
        return sequence_to_heads(self.group.collectives, x, self.group.ulysses)

    def bprop(self, x: Tensor, out: Tensor, dout: Tensor) -> tuple[Tensor]:
        return (heads_to_sequence(self.group.collectives, dout, self.group.ulysses),)


class HeadsToSequence(_Exchange):
    """Ulysses' second exchange (`heads_to_sequence`); its inverse backward."""

    def construct(self, x: Tensor) -> Tensor:
        return heads_to_sequence(self.group.collectives, x, self.group.ulysses)

    def bprop(self, x: Tensor, out: Tensor, dout: Tensor) -> tuple[Tensor]:
        return (sequence_to_heads(self.group.collectives, dout, self.group.ulysses),)
