"""Attention over a sequence split across context ranks: the exchanges around the attention
core (`mf_parallel.runtime.context_parallel`), and with `context_parallel_async` the overlap
of the key/value all-gather with attention over this rank's own keys.

Blocking (the default): queries, keys and values go through the Ulysses all-to-all, keys and
values through the ring's all-gather, the core attends to every key at once, and the output
goes back through the inverse all-to-all.

Overlapped: the ring's all-gather of keys and values is started without waiting; meanwhile
the core attends to the keys this rank already holds (its own block of the gathered order);
then to the other ranks' keys; the two partial results are merged by their log-sum-exp
(`merge_partials`, the online-softmax step of ring and flash attention). Only the forward
overlaps: the backward's reduce-scatter of the key and value gradients blocks. The partial
attention is the plain path's; with a fused flash kernel the blocking path runs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import mindspore as ms
from mindspore import Tensor, nn, ops

from mf_parallel.runtime.context_parallel import (
    GatherSequence,
    HeadsToSequence,
    JoinGathered,
    SequenceToHeads,
)

from .blocks import AttentionCore

Attention = Callable[[Tensor, Tensor, Tensor, Tensor | None, tuple[int, ...] | None], Tensor]
"""Attention on `[batch, heads, seq, dim]` with `AttentionCore`'s mask and lengths."""


class SequenceExchange(nn.Cell):
    """Attention's exchanges over a context group, on `[seq, batch, heads, dim]`; plain
    attention without one.

    Args:
        context: this rank's context group (None: the whole sequence is here).
        core: the attention core (its plain path computes the overlapped partials).
    """

    def __init__(self, context: Any, core: AttentionCore):
        super().__init__()
        ulysses = context is not None and context.ulysses > 1
        ring = context is not None and context.ring > 1
        self.context = context
        self.core = core
        self.to_heads = SequenceToHeads(context) if ulysses else None
        self.to_sequence = HeadsToSequence(context) if ulysses else None
        self.gather = GatherSequence(context) if ring else None
        self.join = JoinGathered(context) if ring else None
        self.overlap = ring and context.overlap and not core.flash

    def prepare_for_graph(self, dynamic: bool = False) -> None:
        """Before a layer attending through this is compiled (`AttentionCore`'s)."""
        self.core.prepare_for_graph(dynamic)

    def attend(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None,
               lengths: tuple[int, ...] | None, attention: Attention | None = None) -> Tensor:
        """Attention of this rank's queries over the whole sequence's keys.

        Args:
            q, k, v: `[seq, batch, heads, dim]` of this rank's tokens.
            mask, lengths: `AttentionCore`'s, in the order the exchanges give
                (`attention_inputs.AttentionPlaces`).
            attention: the blocking path's attention on `[batch, heads, seq, dim]` (the core
                by default; DeepSeek-V3's pads the values for the flash kernel).

        Returns:
            `[seq, batch, heads, v_dim]` of this rank's tokens.
        """
        q, k, v = self._to_heads(q), self._to_heads(k), self._to_heads(v)
        if self.overlap:
            out = self._overlapped(q, k, v, mask)
        else:
            if self.gather is not None:
                k, v = self.gather(k), self.gather(v)
            attention = attention or self.core
            out = attention(_bhsd(q), _bhsd(k), _bhsd(v), mask, lengths).transpose(2, 0, 1, 3)
        return out if self.to_sequence is None else self.to_sequence(out)

    def _to_heads(self, x: Tensor) -> Tensor:
        return x if self.to_heads is None else self.to_heads(x)

    def _overlapped(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None) -> Tensor:
        if mask is None:
            raise ValueError("overlapped context attention needs the mask by global token "
                             "index (attention_inputs.AttentionPlaces builds it)")
        pending_k, pending_v = self.context.start_gather(k), self.context.start_gather(v)
        own, rows = self.context.ring_rank, k.shape[0]
        local = self.core.partial(_bhsd(q), _bhsd(k), _bhsd(v),
                                  mask[..., own * rows:(own + 1) * rows])
        keys = _others(self.join(k, pending_k.wait()), own, rows)
        values = _others(self.join(v, pending_v.wait()), own, rows)
        others = self.core.partial(_bhsd(q), _bhsd(keys), _bhsd(values),
                                   _others(mask, own, rows, axis=-1))
        return merge_partials(local, others, v.dtype).transpose(2, 0, 1, 3)


def merge_partials(first: tuple[Tensor, Tensor], second: tuple[Tensor, Tensor],
                   dtype: ms.Type) -> Tensor:
    """Softmax attention over two sets of keys from each set's own: `(out, lse)` pairs, `out`
    normalised over its keys and `lse` the log-sum-exp of its scores (`[..., sq, 1]`).

    Returns:
        `exp(lse1 - lse) * out1 + exp(lse2 - lse) * out2` with `lse = logaddexp(lse1, lse2)`,
        in `dtype`.
    """
    (out1, lse1), (out2, lse2) = first, second
    top = ops.maximum(lse1, lse2)  # logaddexp (no CPU kernel), without overflow
    lse = top + ops.log(ops.exp(lse1 - top) + ops.exp(lse2 - top))
    merged = ops.exp(lse1 - lse) * out1.astype(ms.float32) + ops.exp(lse2 - lse) * out2.astype(
        ms.float32)
    return merged.astype(dtype)


def _bhsd(x: Tensor) -> Tensor:
    """`[seq, batch, heads, dim]` -> `[batch, heads, seq, dim]`."""
    return x.transpose(1, 2, 0, 3)


def _others(x: Tensor, own: int, rows: int, axis: int = 0) -> Tensor:
    """`x` without its `own`-th block of `rows` along `axis` (the other ranks' keys)."""
    size = x.shape[axis]
    parts = [ops.narrow(x, axis, start, length)
             for start, length in ((0, own * rows), ((own + 1) * rows, size - (own + 1) * rows))
             if length > 0]
    return parts[0] if len(parts) == 1 else ops.cat(parts, axis)
