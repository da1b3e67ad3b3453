"""DeepSeek-V3 multi-head latent attention (MLA; DeepSeek-V2 report section 2.1, Hugging Face
`DeepseekV3Attention`), for training (no KV cache, no weight absorption).

Queries: `q = q_b_proj(q_a_layernorm(q_a_proj(x)))`, or `q_proj(x)` when `q_lora_rank` is
None; per head `[q_nope (qk_nope_head_dim); q_rope (qk_rope_head_dim)]`.
Keys and values: `kv_a_proj_with_mqa(x) = [c (kv_lora_rank); k_rope (qk_rope_head_dim)]`;
`kv_b_proj(kv_a_layernorm(c))` gives per head `[k_nope; v (v_head_dim)]`; `k_rope` is one
head shared by all heads (MQA-style). RoPE rotates the rope parts only. With
`rope_interleave` (DeepSeek's layout, Hugging Face's default) the rotated pairs are dimensions
(2i, 2i+1): as Hugging Face does, the rope part is reordered to [even dims; odd dims] and then
rotated in the rotate-half convention; the reorder is the same for q and k, so the scores are
those of the interleaved rotation. Scores use `1 / sqrt(qk_nope_head_dim + qk_rope_head_dim)`
(no YaRN mscale: `rope_scaling` is null).

Sub-cells keep Hugging Face's names (`q_a_proj`, `kv_b_proj`, `o_proj`, ...), so the
checkpoint name of `attention.X.weight` is `self_attn.X.weight`. Activations are
`[sequence, batch, hidden]` (blocks.py's layout).
"""

from __future__ import annotations

from collections.abc import Callable

import mindspore as ms
import numpy as np
from mindspore import Tensor, ops

from .blocks import AttentionCore, Linear, RMSNorm, RotaryEmbedding, apply_rotary

Normal = Callable[[str, tuple[int, ...]], np.ndarray]
"""Draws the initial `[out, in]` weight of the sub-cell named by its Hugging Face suffix."""


class MultiLatentAttention(ms.nn.Cell):
    """`[seq, batch, hidden]` -> `[seq, batch, hidden]`, causal."""

    def __init__(self, *, hidden_size: int, num_heads: int, q_lora_rank: int | None,
                 kv_lora_rank: int, qk_nope_head_dim: int, qk_rope_head_dim: int,
                 v_head_dim: int, rms_norm_eps: float, rope_theta: float,
                 max_position_embeddings: int, rope_interleave: bool,
                 use_flash_attention: bool, compute_dtype: ms.Type, normal: Normal):
        super().__init__()
        self.num_heads = num_heads
        self.nope, self.rope_dim, self.v_dim = qk_nope_head_dim, qk_rope_head_dim, v_head_dim
        self.kv_lora_rank = kv_lora_rank
        self.rope_interleave = rope_interleave
        qk_head_dim = qk_nope_head_dim + qk_rope_head_dim
        if q_lora_rank is None:
            self.q_proj = Linear(normal("q_proj", (num_heads * qk_head_dim, hidden_size)))
        else:
            self.q_a_proj = Linear(normal("q_a_proj", (q_lora_rank, hidden_size)))
            self.q_a_layernorm = RMSNorm(q_lora_rank, rms_norm_eps)
            self.q_b_proj = Linear(normal("q_b_proj", (num_heads * qk_head_dim, q_lora_rank)))
        self.q_lora = q_lora_rank is not None
        self.kv_a_proj_with_mqa = Linear(
            normal("kv_a_proj_with_mqa", (kv_lora_rank + qk_rope_head_dim, hidden_size)))
        self.kv_a_layernorm = RMSNorm(kv_lora_rank, rms_norm_eps)
        self.kv_b_proj = Linear(
            normal("kv_b_proj", (num_heads * (qk_nope_head_dim + v_head_dim), kv_lora_rank)))
        self.o_proj = Linear(normal("o_proj", (hidden_size, num_heads * v_head_dim)))
        self.rotary = RotaryEmbedding(qk_rope_head_dim, rope_theta, max_position_embeddings)
        self.core = AttentionCore(qk_head_dim ** -0.5, use_flash_attention, compute_dtype)

    def construct(self, x: Tensor) -> Tensor:
        seq, batch = x.shape[0], x.shape[1]
        q = self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x))) if self.q_lora else self.q_proj(x)
        q = self._heads(q, self.num_heads)                           # [b, h, s, nope + rope]
        q_nope, q_rope = q[..., :self.nope], q[..., self.nope:]
        compressed = self.kv_a_proj_with_mqa(x)
        latent, k_rope = compressed[..., :self.kv_lora_rank], compressed[..., self.kv_lora_rank:]
        kv = self._heads(self.kv_b_proj(self.kv_a_layernorm(latent)), self.num_heads)
        k_nope, v = kv[..., :self.nope], kv[..., self.nope:]
        k_rope = self._heads(k_rope, 1)                              # [b, 1, s, rope]
        cos, sin = self.rotary.tables(seq)
        q_rope = apply_rotary(self._rope_layout(q_rope), cos, sin, self.rotary.tile)
        k_rope = apply_rotary(self._rope_layout(k_rope), cos, sin, self.rotary.tile)
        k_rope = ops.broadcast_to(k_rope, (batch, self.num_heads, seq, self.rope_dim))
        q = ops.cat((q_nope, q_rope), -1)
        k = ops.cat((k_nope, k_rope), -1)
        out = self._attend(q, k, v)                                  # [b, h, s, v_dim]
        out = out.transpose(2, 0, 1, 3).reshape(seq, batch, self.num_heads * self.v_dim)
        return self.o_proj(out)

    @staticmethod
    def _heads(x: Tensor, heads: int) -> Tensor:
        """`[s, b, heads * d]` -> `[b, heads, s, d]`."""
        seq, batch = x.shape[0], x.shape[1]
        return x.reshape(seq, batch, heads, -1).transpose(1, 2, 0, 3)

    def _rope_layout(self, x: Tensor) -> Tensor:
        """Interleaved pairs (2i, 2i+1) -> [evens; odds], so rotate-half rotates those pairs."""
        if not self.rope_interleave:
            return x
        shape = x.shape
        return x.reshape(*shape[:-1], shape[-1] // 2, 2).swapaxes(-1, -2).reshape(shape)

    def _attend(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        qk_dim = q.shape[-1]
        if not self.core.flash or self.v_dim == qk_dim:
            return self.core(q, k, v)
        # The flash kernel wants one head size: pad v with zeros and drop the padding (as HF).
        padded = ops.cat((v, ops.zeros((*v.shape[:-1], qk_dim - self.v_dim), v.dtype)), -1)
        return self.core(q, k, padded)[..., :self.v_dim]
