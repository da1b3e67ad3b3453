"""What a pipeline stage calls on either model, written once: the pieces of a decoder-only
causal LM around its own `decoder` and `_head_logits` (`parts.PipelineModel`).

A model using `CausalLMPieces` has `settings` (`seq_length`, `max_position_embeddings`,
`hidden_size`), `places` (`attention_inputs.AttentionPlaces`), `embedding`, `compute_dtype`,
`tensor_group`, `context_group`, `part`, and its own `decoder(hidden, layers, attending) -> (hidden,
auxiliary loss or None)` and `_head_logits(hidden)`.
"""

from __future__ import annotations

from typing import Any

import mindspore as ms
from mindspore import Tensor

from .attention_inputs import Attending
from .blocks import causal_lm_loss, check_input_ids, is_sequence_parallel, tensor_size


class CausalLMPieces:
    """`attending`, `embed`, `head_loss`, `hidden_spec` and `logits` of a decoder-only causal
    LM."""

    settings: Any
    places: Any

    def attending(self, input_ids: Tensor, position_ids: Tensor | None = None,
                  actual_seq_len: Tensor | None = None,
                  attention_mask: Tensor | None = None) -> Attending:
        """Rotary positions and attention mask of a micro-batch (`AttentionPlaces.inputs`)."""
        return self.places.inputs(input_ids.shape[1], position_ids, actual_seq_len,
                                  attention_mask)

    def embed(self, input_ids: Tensor) -> Tensor:
        """`[batch, seq]` ids -> `[seq, batch, hidden]` (this rank's sequence slice under
        sequence parallelism)."""
        check_input_ids(input_ids, self.settings.seq_length,
                        self.settings.max_position_embeddings, self.tensor_group,
                        self.places.context_size)
        return self.embedding(input_ids.swapaxes(0, 1)).astype(self.compute_dtype)

    def head_loss(self, hidden: Tensor, labels: Tensor, loss_mask: Tensor | None) -> Tensor:
        """The last layer's output -> the masked mean cross-entropy (an auxiliary loss is the
        `decoder`'s)."""
        mask = None if loss_mask is None else loss_mask.swapaxes(0, 1)
        return causal_lm_loss(self._head_logits(hidden), labels.swapaxes(0, 1), mask,
                              self.tensor_group, self.context_group)

    def hidden_spec(self, batch: int, seq: int) -> tuple[tuple[int, ...], ms.Type]:
        """`[seq, batch, hidden]` in the compute dtype; `seq / tensor_parallel` under sequence
        parallelism."""
        if is_sequence_parallel(self.tensor_group):
            seq //= tensor_size(self.tensor_group)
        return (seq, batch, self.settings.hidden_size), self.compute_dtype

    def logits(self, input_ids: Tensor, position_ids: Tensor | None = None,
               actual_seq_len: Tensor | None = None,
               attention_mask: Tensor | None = None) -> Tensor:
        """`[batch, seq, vocab]` logits in the compute dtype (this rank's vocabulary slice
        under tensor parallelism)."""
        attending = self.attending(input_ids, position_ids, actual_seq_len, attention_mask)
        hidden, _ = self.decoder(self.embed(input_ids), self.part.layers, attending)
        return self._head_logits(hidden).swapaxes(0, 1)
