"""The reference model of the layer contract: a tiny Qwen3-style decoder, float32, on ops that
exist on the CPU backend (see shared/reference/mindspore-cpu.md).

embedding -> N x DecoderLayer -> final RMSNorm -> head (untied). A layer is
`x + attention(input_norm(x))`, then `h + mlp(post_norm(h))`; attention has one fused `qkv`
linear with grouped-query heads, per-head q/k RMSNorm (as Qwen3), rotary embeddings and a causal
softmax; the MLP has one fused `gate_up` linear, SwiGLU and `down`. Every weight is drawn from
`numpy.random.default_rng(seed)`, so two models built with the same arguments are identical
whatever MindSpore's own seed is.
"""

from __future__ import annotations

import numpy as np
from mindspore import Parameter, Tensor, mint, nn, ops


def _normal(rng: np.random.Generator, *shape: int, scale: float = 0.02) -> Tensor:
    return Tensor((rng.standard_normal(shape) * scale).astype(np.float32))


def _linear(rng: np.random.Generator, in_features: int, out_features: int) -> mint.nn.Linear:
    layer = mint.nn.Linear(in_features, out_features, bias=False)
    layer.weight.set_data(_normal(rng, out_features, in_features))
    return layer


class RMSNorm(nn.Cell):
    """`x / sqrt(mean(x^2) + eps) * weight` over the last dimension (ops.rms_norm has no CPU
    kernel)."""

    def __init__(self, size: int, eps: float = 1e-6):
        super().__init__()
        self.weight = Parameter(Tensor(np.ones(size, np.float32)), name="weight")
        self.eps = eps

    def construct(self, x: Tensor) -> Tensor:
        variance = ops.mean(ops.square(x), -1, keep_dims=True)
        return x * ops.rsqrt(variance + self.eps) * self.weight


def _rotary_tables(seq_length: int, head_dim: int, base: float = 10000.0) -> tuple[Tensor, Tensor]:
    inv_freq = 1.0 / base ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    angles = np.outer(np.arange(seq_length, dtype=np.float64), inv_freq)
    angles = np.concatenate([angles, angles], axis=-1)
    return Tensor(np.cos(angles).astype(np.float32)), Tensor(np.sin(angles).astype(np.float32))


def _rotate_half(x: Tensor) -> Tensor:
    half = x.shape[-1] // 2
    return ops.cat((-x[..., half:], x[..., :half]), -1)


class Attention(nn.Cell):
    """Causal grouped-query self-attention with rotary embeddings."""

    def __init__(self, rng: np.random.Generator, hidden_size: int, num_heads: int,
                 num_kv_heads: int, seq_length: int):
        super().__init__()
        if hidden_size % num_heads or num_heads % num_kv_heads:
            raise ValueError(f"hidden_size {hidden_size}, num_heads {num_heads} and num_kv_heads "
                             f"{num_kv_heads} must divide evenly")
        self.num_heads, self.num_kv_heads = num_heads, num_kv_heads
        self.head_dim = hidden_size // num_heads
        self.qkv = _linear(rng, hidden_size, (num_heads + 2 * num_kv_heads) * self.head_dim)
        self.q_norm = RMSNorm(self.head_dim)
        self.k_norm = RMSNorm(self.head_dim)
        self.out = _linear(rng, num_heads * self.head_dim, hidden_size)
        self.cos, self.sin = _rotary_tables(seq_length, self.head_dim)
        future = np.triu(np.ones((seq_length, seq_length), np.bool_), k=1)
        self.causal_bias = Tensor(np.where(future, -np.inf, 0.0).astype(np.float32))
        self.scale = 1.0 / float(np.sqrt(self.head_dim))

    def _heads(self, x: Tensor, count: int) -> Tensor:
        batch, seq = x.shape[0], x.shape[1]
        return x.reshape(batch, seq, count, self.head_dim).transpose(0, 2, 1, 3)

    def _rotate(self, x: Tensor) -> Tensor:
        seq = x.shape[2]
        return x * self.cos[:seq] + _rotate_half(x) * self.sin[:seq]

    def construct(self, x: Tensor) -> Tensor:
        batch, seq = x.shape[0], x.shape[1]
        q_size = self.num_heads * self.head_dim
        kv_size = self.num_kv_heads * self.head_dim
        qkv = self.qkv(x)
        q = self._heads(qkv[..., :q_size], self.num_heads)
        k = self._heads(qkv[..., q_size:q_size + kv_size], self.num_kv_heads)
        v = self._heads(qkv[..., q_size + kv_size:], self.num_kv_heads)
        q, k = self._rotate(self.q_norm(q)), self._rotate(self.k_norm(k))
        group = self.num_heads // self.num_kv_heads
        if group > 1:
            k, v = ops.repeat_interleave(k, group, 1), ops.repeat_interleave(v, group, 1)
        # An additive causal bias, not masked_fill: masked_fill materialises the broadcast mask
        # and fill values (several [b, a, s, s] temporaries on MindSpore's CPU backend).
        scores = mint.matmul(q * self.scale, k.swapaxes(-1, -2)) + self.causal_bias[:seq, :seq]
        probs = mint.nn.functional.softmax(scores, dim=-1)
        context = mint.matmul(probs, v).transpose(0, 2, 1, 3).reshape(batch, seq, q_size)
        return self.out(context)


class MLP(nn.Cell):
    """SwiGLU: `down(silu(gate) * up)` with gate and up from one fused linear."""

    def __init__(self, rng: np.random.Generator, hidden_size: int, intermediate_size: int):
        super().__init__()
        self.intermediate_size = intermediate_size
        self.gate_up = _linear(rng, hidden_size, 2 * intermediate_size)
        self.down = _linear(rng, intermediate_size, hidden_size)

    def construct(self, x: Tensor) -> Tensor:
        gate_up = self.gate_up(x)
        gate = gate_up[..., :self.intermediate_size]
        up = gate_up[..., self.intermediate_size:]
        return self.down(mint.nn.functional.silu(gate) * up)


class DecoderLayer(nn.Cell):
    """Pre-norm residual block: attention, then MLP."""

    def __init__(self, rng: np.random.Generator, hidden_size: int, intermediate_size: int,
                 num_heads: int, num_kv_heads: int, seq_length: int):
        super().__init__()
        self.input_norm = RMSNorm(hidden_size)
        self.attention = Attention(rng, hidden_size, num_heads, num_kv_heads, seq_length)
        self.post_norm = RMSNorm(hidden_size)
        self.mlp = MLP(rng, hidden_size, intermediate_size)

    def construct(self, x: Tensor) -> Tensor:
        h = x + self.attention(self.input_norm(x))
        return h + self.mlp(self.post_norm(h))


class DecoderModel(nn.Cell):
    """Token ids `[batch, seq]` -> logits `[batch, seq, vocab]`; honours the layer contract."""

    def __init__(self, vocab_size: int, hidden_size: int, intermediate_size: int,
                 num_layers: int, num_heads: int, num_kv_heads: int, seq_length: int,
                 seed: int = 0):
        super().__init__()
        rng = np.random.default_rng(seed)
        self.embedding = nn.Embedding(vocab_size, hidden_size)
        self.embedding.embedding_table.set_data(_normal(rng, vocab_size, hidden_size))
        self.decoder_layers = nn.CellList([
            DecoderLayer(rng, hidden_size, intermediate_size, num_heads, num_kv_heads, seq_length)
            for _ in range(num_layers)])
        self.final_norm = RMSNorm(hidden_size)
        self.head = _linear(rng, hidden_size, vocab_size)
        self.layer_offset = 0

    def construct(self, input_ids: Tensor) -> Tensor:
        x = self.embedding(input_ids)
        for layer in self.decoder_layers:
            x = layer(x)
        return self.head(self.final_norm(x))


def loss(model: nn.Cell, ids: Tensor, labels: Tensor) -> Tensor:
    """Mean next-token cross-entropy of `model(ids)` against `labels` (both `[batch, seq]`)."""
    logits = model(ids)
    return ops.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1))


def tiny_model(num_layers: int = 2, seed: int = 0, **overrides: int) -> DecoderModel:
    """The tests' default size: about 30k parameters."""
    sizes = {"vocab_size": 64, "hidden_size": 32, "intermediate_size": 64,
             "num_heads": 4, "num_kv_heads": 2, "seq_length": 16} | overrides
    return DecoderModel(num_layers=num_layers, seed=seed, **sizes)


def batch(model_seq: int = 16, batch_size: int = 2, vocab: int = 64,
          seed: int = 1) -> tuple[Tensor, Tensor]:
    """Deterministic (ids, labels) with labels = ids shifted by one."""
    tokens = np.random.default_rng(seed).integers(0, vocab, (batch_size, model_seq + 1))
    return Tensor(tokens[:, :-1].astype(np.int32)), Tensor(tokens[:, 1:].astype(np.int32))


def specs(*texts: str) -> list:
    """Layer specs from their config strings (`'0-3'`)."""
    from mf_config import LayerSpec

    return [LayerSpec.parse(t) for t in texts]


def loss_and_grads(model) -> tuple:
    """The loss and every parameter's gradient on the fixed batch, as numpy arrays."""
    import mindspore as ms

    ids, labels = batch()
    params = model.trainable_params()
    value, grads = ms.value_and_grad(lambda a, b: loss(model, a, b), None, params)(ids, labels)
    return value.asnumpy(), [g.asnumpy() for g in grads]
