"""The vocabulary split over the data-parallel shard group: under FSDP the embedding table and
the output head stay where each rank holds them, and the tokens travel instead.

A causal LM's embedding table (and its untied head) is `[vocabulary, hidden]`: a quarter of a
127M-parameter Qwen3 with 32,000 tokens. Gathered whole for every forward pass, with its
gradient produced whole by autograd before any hook can reduce it, it was the largest
transient of an FSDP rank. Here each rank of the shard group keeps the rows of its FSDP slice,
`[r V/R, (r+1) V/R)` (the table is a unit of its own, so its slice is whole rows), and:

- **embedding**: the ranks' token ids are all-gathered, each rank looks up those in its rows
  (zeros for the others) and the partial embeddings are reduce-scattered back, so each rank
  gets its own tokens' embeddings; backward all-gathers their gradients and scatters them into
  the rank's rows;
- **head and loss**: the final hidden states are all-gathered (`[R s, b, h]`), each rank
  computes its vocabulary slice of every token's logits and the vocabulary-parallel
  cross-entropy (max, sum of exponentials and target logit all-reduced over the group), then
  keeps its own tokens' losses; backward all-gathers the gradients of those losses, so every
  rank holds every token's, and reduce-scatters the hidden states' gradient.

These are Megatron's vocabulary-parallel embedding and cross-entropy over the tensor group
(`tensor_parallel`'s regions, over the `shard` group here), with the tokens gathered first
because data-parallel ranks hold different ones. The gradient of a rank's rows is then the
sum over the shard group's tokens: exactly its slice of the reduce-scattered whole gradient, so
the optimizer, the norm and the checkpoints see the same slices as before. Per step each rank
moves the hidden states (`R b s h` elements, gathered and reduce-scattered twice) instead of
the table (gathered, `V h`) and its gradient (reduce-scattered).
"""

from __future__ import annotations

import mindspore as ms
from mindspore import Tensor, ops

from ..vocabulary_rows import keeps_vocabulary_rows
from .collectives import Collectives
from .tensor_parallel import (
    GatherFromSequenceRegion,
    ReduceScatterToSequenceRegion,
    ScatterToSequenceRegion,
    TensorGroup,
    linear_rows,
    rows_in_range,
    vocab_parallel_cross_entropy,
)

SHARD_KIND = "shard"


class ShardedVocabulary:
    """The embedding lookup and the head's cross-entropy with `[vocabulary, ...]` tables split
    by rows over the shard group, each rank passing its own tokens and getting their results.

    Args:
        collectives: this rank's collectives.
        vocab_size: the vocabulary (`vocabulary_rows.keeps_vocabulary_rows` must hold).
        kind: the group the rows are split over.
    """

    def __init__(self, collectives: Collectives, vocab_size: int, kind: str = SHARD_KIND):
        self.group = TensorGroup(collectives, sequence_parallel=True, kind=kind)
        if self.group.size > 1 and not keeps_vocabulary_rows(vocab_size, self.group.size):
            raise ValueError(f"a vocabulary of {vocab_size} does not split over "
                             f"{self.group.size} ranks (vocabulary_rows)")
        self.rows = vocab_size // self.group.size
        """The rows each rank holds."""
        self.start = self.group.rank * self.rows
        self.gather_tokens = GatherFromSequenceRegion(self.group)
        self.scatter_tokens = ReduceScatterToSequenceRegion(self.group)
        self.own_tokens = ScatterToSequenceRegion(self.group)

    def holds_rows(self, table: Tensor) -> bool:
        """Whether `table` holds this rank's rows now (FSDP puts them in place for the forward
        and backward passes; whole or empty otherwise)."""
        return table.ndim == 2 and table.shape[0] == self.rows

    def embed(self, table: Tensor, ids: Tensor) -> Tensor:
        """This rank's tokens' embeddings.

        Args:
            table: this rank's rows of the embedding table, `[V / R, h]`.
            ids: this rank's token ids, `[s, b]` (the same shape on every rank of the group).

        Returns:
            `[s, b, h]`.
        """
        return self.scatter_tokens(rows_in_range(table, self._every(ids), self.start))

    def token_cross_entropy(self, hidden: Tensor, head: Tensor, labels: Tensor) -> Tensor:
        """Per-token cross-entropy of this rank's tokens, in float32.

        Args:
            hidden: this rank's final hidden states, `[s, b, h]` (the same shape on every
                rank of the group).
            head: this rank's rows of the output head (or tied embedding), `[V / R, h]`, in
                the hidden states' dtype.
            labels: this rank's targets, `[s, b]`, in `[0, V)`.

        Returns:
            `[s, b]`.
        """
        every = self.gather_tokens(hidden)
        logits = linear_rows(every, head).astype(ms.float32)
        return self.own_tokens(vocab_parallel_cross_entropy(logits, self._every(labels),
                                                            self.group))

    def _every(self, ids: Tensor) -> Tensor:
        """Every rank's ids, gathered along dim 0 in group order (as float32, see
        `vocabulary_rows.EXACT_IDS`)."""
        every = self.group.ops.all_gather(ops.stop_gradient(ids).astype(ms.float32))
        return every.astype(ids.dtype)
