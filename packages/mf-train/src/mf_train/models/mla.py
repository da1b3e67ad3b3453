"""DeepSeek-V3 multi-head latent attention (MLA; DeepSeek-V2 report section 2.1, Hugging Face
`DeepseekV3Attention`), for training, and for decoding with the compressed cache (`decode`;
no weight absorption).

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

Tensor parallelism (applied from outside by `mf_train.parallelize` with a tensor group of
size t > 1), split as Megatron-core's MLA splits it:
the heads are divided by t (rank r holds heads `[r h/t, (r+1) h/t)`). The input is gathered
along the sequence once (sequence parallelism; a copy into the tensor region without it);
the low-rank down projections `q_a_proj` and `kv_a_proj_with_mqa` and their RMSNorms
(`q_a_layernorm`, `kv_a_layernorm`) are replicated and run on that whole input, so the shared
latent and the one-head `k_rope` exist whole on every rank; the up projections (`q_proj` or
`q_b_proj`, and `kv_b_proj`, head-major rows) keep this rank's heads' rows and need no
communication; `o_proj` is row-parallel (reduce-scatter back to the sequence slice). Each rank
differentiates the replicated weights through its own heads only, so their gradients are
partial: they are marked (`tensor_partial`) and summed over the tensor group by the training
loop, as Megatron sums the gradients of sequence-parallel parameters. Megatron runs
the down projections on the sequence slice and gathers their smaller outputs instead; the
result is the same, this way gathers one tensor, not three.

Context parallelism (a `ContextGroup`): queries, keys (`[k_nope; k_rope]` per head) and values
go through the context exchanges after the rotation (`context_attention.SequenceExchange`);
the rotary tables of this rank's tokens come from the model (`RotaryEmbedding.at`), so one
rotation serves every layer and positions may restart inside packed samples.
"""

from __future__ import annotations

from collections.abc import Callable

import mindspore as ms
import numpy as np
from mindspore import Tensor, ops

from .blocks import AttentionCore, Linear, RMSNorm, apply_rotary, tiles_broadcasts
from .context_attention import SequenceExchange
from .kv_cache import LayerCache

Normal = Callable[[str, tuple[int, ...]], np.ndarray]
"""Draws the initial `[out, in]` weight of the sub-cell named by its Hugging Face suffix."""


class MultiLatentAttention(ms.nn.Cell):
    """`[seq, batch, hidden]` -> `[seq, batch, hidden]`, causal (this rank's sequence slice
    in and out under sequence parallelism, module docstring).

    For tensor parallelism applied from outside (`mf_train.parallelize`): `entry` (None
    here) brings the input into the tensor region once for every projection
    (`gathers_input`), `num_heads` counts this rank's heads (`tensor_counts`), and
    `tensor_partial` names the replicated cells differentiated through this rank's heads only.
    """

    gathers_input = True
    tensor_counts = ("num_heads",)
    tensor_partial = ("q_a_proj", "q_a_layernorm", "kv_a_proj_with_mqa", "kv_a_layernorm")

    def __init__(self, *, hidden_size: int, num_heads: int, q_lora_rank: int | None,
                 kv_lora_rank: int, qk_nope_head_dim: int, qk_rope_head_dim: int,
                 v_head_dim: int, rms_norm_eps: float, rope_interleave: bool,
                 use_flash_attention: bool, compute_dtype: ms.Type, normal: Normal):
        super().__init__()
        self.num_heads = num_heads
        self.entry = None
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
        self.tile = tiles_broadcasts()
        self.core = AttentionCore(qk_head_dim ** -0.5, use_flash_attention, compute_dtype)
        self.exchange = SequenceExchange(None, self.core)

    def construct(self, x: Tensor, cos: Tensor, sin: Tensor, mask: Tensor | None = None,
                  lengths: tuple[int, ...] | None = None) -> Tensor:
        """`cos`, `sin`: `RotaryEmbedding.at` tables of the `qk_rope_head_dim` rotation for
        this rank's tokens; `mask`: `AttentionCore`'s."""
        batch = x.shape[1]
        # Token rows `[s * b, hidden]`; gathering them along dim 0 gathers the sequence. The
        # projections take the gathered tensor itself, which communication recompute
        # (mf-memory) recognises among the saved tensors and drops.
        rows = x.reshape(-1, x.shape[-1])
        if self.entry is not None:
            rows = self.entry(rows)
        seq = rows.shape[0] // batch
        q = (self.q_b_proj(self.q_a_layernorm(self.q_a_proj(rows))) if self.q_lora
             else self.q_proj(rows))
        q = self._heads(q.reshape(seq, batch, -1), self.num_heads)  # [s, b, h, nope + rope]
        q_nope, q_rope = q[..., :self.nope], q[..., self.nope:]
        compressed = self.kv_a_proj_with_mqa(rows).reshape(seq, batch, -1)
        latent, k_rope = compressed[..., :self.kv_lora_rank], compressed[..., self.kv_lora_rank:]
        kv = self._heads(self.kv_b_proj(self.kv_a_layernorm(latent)), self.num_heads)
        k_nope, v = kv[..., :self.nope], kv[..., self.nope:]
        k_rope = self._heads(k_rope, 1)                              # [s, b, 1, rope]
        q_rope = apply_rotary(self._rope_layout(q_rope), cos, sin, self.tile)
        k_rope = apply_rotary(self._rope_layout(k_rope), cos, sin, self.tile)
        k_rope = ops.broadcast_to(k_rope, (seq, batch, self.num_heads, self.rope_dim))
        out = self.exchange.attend(ops.cat((q_nope, q_rope), -1), ops.cat((k_nope, k_rope), -1),
                                   v, mask, lengths, self._attend)   # [s, b, h, v_dim]
        return self.o_proj(out.reshape(seq, batch, self.num_heads * self.v_dim))

    def decode(self, x: Tensor, cos: Tensor, sin: Tensor, cache: LayerCache,
               mask: Tensor) -> Tensor:
        """`construct` for new positions (one process) with the compressed cache of DeepSeek-V2
        (section 2.1.2): each position keeps its normed latent (`kv_lora_rank` numbers) and
        its rotated one-head rope key (`qk_rope_head_dim`), not the heads' keys and values;
        the keys' nope part and the values of every cached position are expanded from the
        latents by `kv_b_proj` at each step (no weight absorption). `mask`:
        `kv_cache.causal_mask`."""
        seq, batch = x.shape[0], x.shape[1]
        rows = x.reshape(-1, x.shape[-1])
        q = (self.q_b_proj(self.q_a_layernorm(self.q_a_proj(rows))) if self.q_lora
             else self.q_proj(rows))
        q = self._heads(q.reshape(seq, batch, -1), self.num_heads)
        q_nope, q_rope = q[..., :self.nope], q[..., self.nope:]
        compressed = self.kv_a_proj_with_mqa(rows).reshape(seq, batch, -1)
        latent, k_rope = compressed[..., :self.kv_lora_rank], compressed[..., self.kv_lora_rank:]
        k_rope = apply_rotary(self._rope_layout(self._heads(k_rope, 1)), cos, sin, self.tile)
        latent, k_rope = cache.append(self.kv_a_layernorm(latent), k_rope)
        total = latent.shape[0]
        kv = self._heads(self.kv_b_proj(latent), self.num_heads)
        k_nope, v = kv[..., :self.nope], kv[..., self.nope:]
        k_rope = ops.broadcast_to(k_rope, (total, batch, self.num_heads, self.rope_dim))
        q_rope = apply_rotary(self._rope_layout(q_rope), cos, sin, self.tile)
        out = self.exchange.attend(ops.cat((q_nope, q_rope), -1), ops.cat((k_nope, k_rope), -1),
                                   v, mask, None, self._attend)
        return self.o_proj(out.reshape(seq, batch, self.num_heads * self.v_dim))

    def qk_clip_scales(self, gamma: Tensor) -> list[tuple[ms.Parameter, Tensor]]:
        """Kimi K2's QK-clip of this layer's heads (Kimi K2 report, MuonClip): head h's
        logits scaled by `gamma[h]` through the rows of its own query and key parts:
        `q_nope` and `k_nope` by sqrt(gamma_h) each, `q_rope` by gamma_h; the rotary key,
        one head shared by all (`kv_a_proj_with_mqa`), and the values stay as they are.

        Args:
            gamma: `[heads]` float32, one factor per head of this rank (1: unchanged).

        Returns:
            (weight, row factors `[rows, 1]`) of the query projection (`q_b_proj`, or
            `q_proj` without a query LoRA) and of `kv_b_proj` (head-major rows).
        """
        heads = self.num_heads
        root = ops.broadcast_to(ops.sqrt(gamma).reshape(heads, 1), (heads, self.nope))
        query = ops.cat((root, ops.broadcast_to(gamma.reshape(heads, 1),
                                                (heads, self.rope_dim))), 1)
        key = ops.cat((root, ops.ones((heads, self.v_dim), gamma.dtype)), 1)
        projection = self.q_b_proj if self.q_lora else self.q_proj
        return [(projection.weight, query.reshape(-1, 1)),
                (self.kv_b_proj.weight, key.reshape(-1, 1))]

    @staticmethod
    def _heads(x: Tensor, heads: int) -> Tensor:
        """`[s, b, heads * d]` -> `[s, b, heads, d]`."""
        seq, batch = x.shape[0], x.shape[1]
        return x.reshape(seq, batch, heads, -1)

    def _rope_layout(self, x: Tensor) -> Tensor:
        """Interleaved pairs (2i, 2i+1) -> [evens; odds], so rotate-half rotates those pairs."""
        if not self.rope_interleave:
            return x
        shape = x.shape
        return x.reshape(*shape[:-1], shape[-1] // 2, 2).swapaxes(-1, -2).reshape(shape)

    def _attend(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None,
                lengths: tuple[int, ...] | None) -> Tensor:
        qk_dim = q.shape[-1]
        if not self.core.flash or self.v_dim == qk_dim:
            return self.core(q, k, v, mask, lengths)
        # The flash kernel wants one head size: pad v with zeros and drop the padding (as HF).
        padded = ops.cat((v, ops.zeros((*v.shape[:-1], qk_dim - self.v_dim), v.dtype)), -1)
        return self.core(q, k, padded, mask, lengths)[..., :self.v_dim]
