"""What a pipeline stage calls on either model, written once: the pieces of a decoder-only
causal LM around its own `decoder` and `_head_logits` (`parts.PipelineModel`).

A model using `CausalLMPieces` has `settings` (`seq_length`, `max_position_embeddings`,
`hidden_size`), `places` (`attention_inputs.AttentionPlaces`), `embedding`, `compute_dtype`,
`tensor_group`, `context_group`, `part`, `tied`, `final_norm`, `head` (untied), and its own
`decoder(hidden, layers, attending) -> (hidden, auxiliary loss or None)` and
`_head_logits(hidden)`.

Under FSDP the layout may split the vocabulary over the data-parallel shard group
(`use_sharded_vocabulary`, mf-parallel's `sharded_vocabulary`): while the embedding table
holds this rank's rows, `embed` and `head_loss` move the tokens to the rows instead.
"""

from __future__ import annotations

from typing import Any

import mindspore as ms
import numpy as np
from mindspore import Parameter, Tensor

from .attention_inputs import Attending
from .blocks import (
    causal_lm_loss,
    check_input_ids,
    is_sequence_parallel,
    masked_token_mean,
    same_dtype,
    tensor_size,
)
from .kv_cache import KVCache, causal_mask


class CausalLMPieces:
    """`attending`, `embed`, `head_loss`, `hidden_spec`, `logits` and `decode` of a
    decoder-only causal LM."""

    settings: Any
    places: Any
    vocabulary: Any = None
    """mf-parallel's `ShardedVocabulary` when the layout splits the vocabulary over the shard
    group (`use_sharded_vocabulary`), else None."""

    def vocabulary_tables(self) -> list[Parameter]:
        """The `[vocabulary, hidden]` parameters: the embedding table and an untied head."""
        return [self.embedding.weight] + ([] if self.tied else [self.head.weight])

    def use_sharded_vocabulary(self, vocabulary: Any) -> None:
        """Embed and compute the loss with `vocabulary` whenever the embedding table holds
        this rank's rows of it (FSDP puts them there for the forward and backward passes)."""
        self.vocabulary = vocabulary

    def _rows_only(self) -> bool:
        return self.vocabulary is not None and self.vocabulary.holds_rows(self.embedding.weight)

    def attending(self, input_ids: Tensor, position_ids: Tensor | None = None,
                  actual_seq_len: Tensor | None = None,
                  attention_mask: Tensor | None = None) -> Attending:
        """Rotary positions and attention mask of a micro-batch (`AttentionPlaces.inputs`)."""
        return self.places.inputs(input_ids.shape[1], position_ids, actual_seq_len,
                                  attention_mask)

    def embed(self, input_ids: Tensor) -> Tensor:
        """`[batch, seq]` ids -> `[seq, batch, hidden]` (this rank's sequence slice under
        sequence parallelism)."""
        self.check_ids(input_ids)
        return self.lookup(input_ids)

    def check_ids(self, input_ids: Tensor) -> None:
        """Refuse ids whose shape this model cannot take (on the host, before any kernel)."""
        check_input_ids(input_ids, self.settings.seq_length,
                        self.settings.max_position_embeddings, self.tensor_group,
                        self.places.context_size)

    def lookup(self, input_ids: Tensor) -> Tensor:
        """`embed` without the checks: nothing on the host, so a compiled graph can hold it."""
        ids = input_ids.swapaxes(0, 1)
        if self._rows_only():
            return self.vocabulary.embed(self.embedding.weight, ids).astype(self.compute_dtype)
        return self.embedding(ids).astype(self.compute_dtype)

    def head_loss(self, hidden: Tensor, labels: Tensor, loss_mask: Tensor | None) -> Tensor:
        """The last layer's output -> the masked mean cross-entropy (an auxiliary loss is the
        `decoder`'s)."""
        mask = None if loss_mask is None else loss_mask.swapaxes(0, 1)
        if self._rows_only():
            normed = self.final_norm(hidden)
            table = same_dtype((self.embedding if self.tied else self.head).weight, normed.dtype)
            return masked_token_mean(
                lambda targets: self.vocabulary.token_cross_entropy(normed, table, targets),
                labels.swapaxes(0, 1), mask, self.context_group)
        return causal_lm_loss(self._head_logits(hidden), labels.swapaxes(0, 1), mask,
                              self.tensor_group, self.context_group)

    def hidden_spec(self, batch: int, seq: int) -> tuple[tuple[int, ...], ms.Type]:
        """`[seq, batch, hidden]` in the compute dtype; `seq / tensor_parallel` under sequence
        parallelism."""
        if is_sequence_parallel(self.tensor_group):
            seq //= tensor_size(self.tensor_group)
        return (seq, batch, self.settings.hidden_size), self.compute_dtype

    def decode(self, input_ids: Tensor, cache: KVCache) -> Tensor:
        """The logits `[batch, new, vocabulary]` (as `logits`) of `input_ids`
        (`[batch, new]`) at the positions after the `cache.length` cached ones; each decoder
        layer's `decode` appends what its attention keeps of them to `cache`, so a new token
        costs one position's forward (`kv_cache`). One process, the whole model."""
        start, count = cache.length, input_ids.shape[1]
        cos, sin = self.rotary.at(np.arange(start, start + count))
        mask = causal_mask(start, count)
        hidden = self.lookup(input_ids)
        for index in self.part.layers:
            hidden = self.decoder_layers.by_id(index).decode(hidden, cos, sin,
                                                             cache.layer(index), mask)
        cache.length += count
        return self._head_logits(hidden).swapaxes(0, 1)

    def logits(self, input_ids: Tensor, position_ids: Tensor | None = None,
               actual_seq_len: Tensor | None = None,
               attention_mask: Tensor | None = None) -> Tensor:
        """`[batch, seq, vocab]` logits in the compute dtype (this rank's vocabulary slice
        under tensor parallelism). Needs the whole vocabulary: under a sharded vocabulary,
        call it inside the layout's `whole_model()`."""
        if self._rows_only():
            raise RuntimeError("logits() needs the whole vocabulary, and the embedding holds "
                               "this rank's rows of it: call it inside the layout's "
                               "whole_model()")
        attending = self.attending(input_ids, position_ids, actual_seq_len, attention_mask)
        hidden, _ = self.decoder(self.embed(input_ids), self.part.layers, attending)
        return self._head_logits(hidden).swapaxes(0, 1)
