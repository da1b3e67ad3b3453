"""Where a micro-batch's tokens sit, and which keys each query may see: what attention takes
besides the hidden states.

Two things move tokens away from "position t of one causal sequence":
- packed documents (mf-data's `reset_position_ids`, `reset_attention_mask`): rotary positions
  restart after each end of document, and a token sees only the earlier tokens of its own
  document. The micro-batch says so with `position_ids` and either the compact document ends
  (`actual_seq_len`, `create_compressed_eod_mask`, as MindFormers passes it to flash attention)
  or the dense `[1, S, S]` mask (`create_attention_mask`);
- context parallelism: a rank holds some chunks of the sequence (`ContextGroup.spans`), and
  after the attention exchanges its queries and keys are other chunks again
  (`query_order`, `key_order`).

`AttentionPlaces.inputs` turns both into one `Attending`: the rotary positions of this rank's
tokens and a boolean mask over (query, key) by global token index, built on the host with
numpy for each micro-batch (the loader never builds `[S, S]` masks for the compact form). The
plain causal case without context parallelism gives no mask: the attention core's cached
causal mask serves it. Where attention runs a fused variable-length kernel (Ascend's flash
attention, `varlen=True`) and the whole sequence is here, the compact form is handed on as
it is instead (`Attending.lengths`: the documents' cumulative ends over the batch's tokens,
the `actual_seq_qlen` of the kernel's TND layout), and no mask is built.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from mindspore import Tensor, ops

from mf_parallel.runtime.context_parallel import ULYSSES


@dataclass(frozen=True)
class Attending:
    """What every layer's attention takes for one micro-batch on this rank."""

    positions: np.ndarray
    """Rotary positions of this rank's tokens: `[seq]` (the same in every sample) or
    `[batch, seq]`."""
    mask: Tensor | None
    """Bool `[batch or 1, 1, queries, keys]`, True where a query may not see a key, in the
    order attention sees them; None: causal over one whole sequence (no context split), or
    over each of `lengths`' documents."""
    lengths: tuple[int, ...] | None = None
    """For a variable-length kernel: the cumulative ends of the documents over the batch's
    tokens laid end to end (sample after sample); None: not used."""


class AttentionPlaces:
    """Builds `Attending` for this rank's micro-batches.

    Args:
        context: this rank's context group (None or one rank: the whole sequence is here).
        varlen: attention runs a variable-length kernel that takes document ends
            (`AttentionCore.flash`): the compact form is passed on, not turned into a mask.
    """

    def __init__(self, context: Any = None, varlen: bool = False):
        self.context = context if context is not None and context.size > 1 else None
        self.varlen = varlen
        self._orders: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
        self._causal: dict[int, Tensor] = {}

    @property
    def context_size(self) -> int:
        return 1 if self.context is None else self.context.size

    def inputs(self, local_seq: int, position_ids: Tensor | np.ndarray | None = None,
               actual_seq_len: Tensor | np.ndarray | None = None,
               attention_mask: Tensor | np.ndarray | None = None) -> Attending:
        """The rotary positions and the mask of one micro-batch.

        Args:
            local_seq: tokens per sample on this rank (the whole sequence / context size).
            position_ids: `[batch, local_seq]` rotary positions of this rank's tokens (None:
                their places in the sequence).
            actual_seq_len: `[batch, P]` ends of the documents of each sample, padded with the
                sequence length (None: one document per sample).
            attention_mask: `[batch or 1, 1, rows, seq]` bool, True = masked, rows the whole
                sequence or this rank's tokens (None: causal, or `actual_seq_len`'s).

        Returns:
            What the layers' attention takes.
        """
        own, queries, keys = self._orders_of(local_seq * self.context_size)
        positions = own if position_ids is None else _host(position_ids).astype(np.int64)
        if actual_seq_len is not None and self.varlen and self.context is None:
            return Attending(positions, None, cumulative_lengths(_host(actual_seq_len),
                                                                 local_seq))
        if actual_seq_len is not None:
            return Attending(positions, Tensor(_document_mask(_host(actual_seq_len), queries,
                                                              keys)))
        if attention_mask is not None:
            return Attending(positions, self._dense_rows(_host(attention_mask), own, queries,
                                                         keys))
        return Attending(positions, self._causal_mask(queries, keys))

    def _orders_of(self, seq: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Global indices of this rank's tokens, of its queries and of its keys."""
        if seq not in self._orders:
            if self.context is None:
                every = np.arange(seq)
                self._orders[seq] = (every, every, every)
            else:
                own = np.array([i for span in self.context.spans(seq) for i in span])
                self._orders[seq] = (own, np.array(self.context.query_order(seq)),
                                     np.array(self.context.key_order(seq)))
        return self._orders[seq]

    def _causal_mask(self, queries: np.ndarray, keys: np.ndarray) -> Tensor | None:
        if self.context is None:
            return None
        if len(queries) not in self._causal:
            self._causal = {len(queries): Tensor(_later(queries, keys)[None, None])}
        return self._causal[len(queries)]

    def _dense_rows(self, mask: np.ndarray, own: np.ndarray, queries: np.ndarray,
                    keys: np.ndarray) -> Tensor:
        """The given mask's rows of the queries and columns of the keys, in attention's order.
        Rows the loader cut to this rank's tokens are gathered over the Ulysses block first
        (its queries are the block's tokens)."""
        mask = mask.astype(bool, copy=False)
        seq = mask.shape[-1]
        if mask.shape[-2] == seq:
            rows = mask[..., queries, :]
        elif mask.shape[-2] != len(own):
            raise ValueError(f"attention_mask has {mask.shape[-2]} rows; expected the whole "
                             f"sequence ({seq}) or this rank's tokens ({len(own)})")
        elif len(queries) == len(own):
            rows = mask
        else:
            return self._gathered_rows(mask, keys)
        return Tensor(rows[..., keys])

    def _gathered_rows(self, mask: np.ndarray, keys: np.ndarray) -> Tensor:
        """The rows of every member of this rank's Ulysses block, member after member, at the
        keys' columns: gathered and cut on the device (nothing read back inside the step)."""
        rows = Tensor(np.ascontiguousarray(np.moveaxis(mask, -2, 0)).astype(np.float32))
        gathered = ops.moveaxis(self.context.collectives.all_gather(rows, ULYSSES), 0, -2)
        return ops.gather(gathered, Tensor(keys.astype(np.int32)), gathered.ndim - 1) > 0.5


def cumulative_lengths(ends: np.ndarray, seq: int) -> tuple[int, ...]:
    """The document ends of every sample (MindFormers' `actual_seq_len`, padded with `seq`)
    as cumulative ends over the samples' tokens laid end to end: the `actual_seq_qlen` of a
    TND-layout flash attention (each sample's last document ends at its length)."""
    ends = np.asarray(ends).reshape(len(ends), -1)
    out: list[int] = []
    for index, row in enumerate(ends):
        inside = sorted({int(e) for e in row if 0 < int(e) < seq})
        out += [index * seq + e for e in (*inside, seq)]
    return tuple(out)


def _host(t: Tensor | np.ndarray) -> np.ndarray:
    return t.asnumpy() if isinstance(t, Tensor) else np.asarray(t)


def _later(queries: np.ndarray, keys: np.ndarray) -> np.ndarray:
    """`[queries, keys]` True where the key comes after the query."""
    return keys[None, :] > queries[:, None]


def _document_mask(ends: np.ndarray, queries: np.ndarray, keys: np.ndarray) -> np.ndarray:
    """`[batch, 1, queries, keys]`: masked where the key is later or in another document.
    Document of token t: how many document ends (exclusive) are <= t."""
    ends = np.sort(ends.reshape(ends.shape[0], -1), axis=-1)
    doc_q = np.stack([np.searchsorted(row, queries, side="right") for row in ends])
    doc_k = np.stack([np.searchsorted(row, keys, side="right") for row in ends])
    other = doc_q[:, :, None] != doc_k[:, None, :]
    return (other | _later(queries, keys)[None])[:, None]


