"""Attention's layout changes as row gathers, for the CPU backend in PyNative.

The linear layers work on `[seq, batch, features]`, attention on `[batch, heads, seq, dim]`.
Slicing q, k and v out of the fused projection and transposing them makes strided views,
which MindSpore 2.10 turns contiguous with a generic `Contiguous` kernel (1.1 ms for a
`[512, 1, 8, 64]` transpose that an element-wise copy does in 0.08 ms; 16 % of the 28M
model's step on CPU, more with the gradients' transposes). Here every layout change is one
gather of whole rows of `head_dim` values (0.3 ms for the same move) whose backward is the
gather by the inverse permutation (a custom bprop), so no strided view is ever made:

- `FusedHeads`: the fused `[s, b, (hq + 2 hkv) d]` projection -> q `[b, hq, s, d]`, k and
  v `[b, hkv, s, d]` (`blocks.SoftmaxAttention` repeats them over their query group).
- `heads_to_sequence`: `[b, h, s, d]` -> `[s, b, h, d]`, the attention output back, and
  `rotate_half`: `[x1, x2] -> [x2, x1]` over the last dimension, the sign of rotary's
  `rotate_half` folded into the sine table (`RotaryEmbedding.head_tables`): each a
  `Permutation`.
- `SwiGLUActivation`: `silu(gate) * up` of SwiGLU's fused `[..., 2n]`, the halves gathered,
  its backward written out from the input alone.

`GatheredHeads` builds them per input shape on first use. Graphs (`mindspore.jit`) transpose
without the generic kernel, so compiled layers keep the views (`prepare_for_graph`), except
SwiGLU's activation cell, which a graph of fixed shapes holds (a compiled 28M step 10 %
faster); a graph of any shape (`dynamic`) takes the slices.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from mindspore import Tensor, mint, nn, ops


def _index(values: np.ndarray) -> Tensor:
    return Tensor(np.ascontiguousarray(values).reshape(-1).astype(np.int32))


def _built(cache: dict, key: tuple[int, ...], build: Callable[..., nn.Cell]) -> nn.Cell:
    """The cell `cache` holds for `key`, built as `build(*key)` on first use."""
    if key not in cache:
        cache[key] = build(*key)
    return cache[key]


class Permutation(nn.Cell):
    """`x`'s entries along `axis` taken in `order`; the backward takes them back by the
    inverse order. With `rows`, `x` is first seen as rows of `rows` values (`axis` 0 then
    permutes whole rows) and the result reshaped to `shape`."""

    def __init__(self, order: np.ndarray, axis: int = -1, rows: int | None = None,
                 shape: tuple[int, ...] | None = None):
        super().__init__()
        order = np.asarray(order).reshape(-1)
        self.order, self.inverse = _index(order), _index(np.argsort(order))
        self.axis, self.rows, self.shape = axis, rows, shape

    def construct(self, x: Tensor) -> Tensor:
        if self.rows is None:
            return ops.gather(x, self.order, self.axis)
        return ops.gather(x.reshape(-1, self.rows), self.order, self.axis).reshape(self.shape)

    def bprop(self, x: Tensor, out: Tensor, dout: Tensor) -> tuple[Tensor]:
        if self.rows is None:
            return (ops.gather(dout, self.inverse, self.axis),)
        back = ops.gather(dout.reshape(-1, self.rows), self.inverse, self.axis)
        return (back.reshape(x.shape),)


class FusedHeads(nn.Cell):
    """q `[b, hq, s, d]`, k and v `[b, hkv, s, d]` out of the fused projection
    `[s, b, (hq + 2 hkv) d]` (rows `[q heads; k heads; v heads]`)."""

    def __init__(self, seq: int, batch: int, heads: int, kv_heads: int, head_dim: int):
        super().__init__()
        rows = np.arange(seq * batch * (heads + 2 * kv_heads)).reshape(seq, batch, -1)
        order = np.concatenate([rows[:, :, :heads].transpose(1, 2, 0).ravel(),
                                rows[:, :, heads:].reshape(seq, batch, 2, kv_heads)
                                .transpose(2, 1, 3, 0).ravel()])
        self.order, self.inverse = _index(order), _index(np.argsort(order))  # as Permutation
        self.q_shape = (batch, heads, seq, head_dim)
        self.kv_shape = (batch, kv_heads, seq, head_dim)
        self.q_rows, self.kv_rows = batch * heads * seq, batch * kv_heads * seq
        self.dim = head_dim

    def construct(self, qkv: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        rows = ops.gather(qkv.reshape(-1, self.dim), self.order, 0)
        q, kv = self.q_rows, self.kv_rows
        return (rows[:q].reshape(self.q_shape), rows[q:q + kv].reshape(self.kv_shape),
                rows[q + kv:].reshape(self.kv_shape))

    def bprop(self, qkv: Tensor, out: tuple, dout: tuple) -> tuple[Tensor]:
        rows = ops.cat([d.reshape(-1, self.dim) for d in dout], 0)
        return (ops.gather(rows, self.inverse, 0).reshape(qkv.shape),)


def heads_to_sequence(batch: int, heads: int, seq: int, head_dim: int) -> Permutation:
    """`[b, h, s, d]` -> `[s, b, h, d]`."""
    rows = np.arange(batch * heads * seq).reshape(batch, heads, seq).transpose(2, 0, 1)
    return Permutation(rows, axis=0, rows=head_dim, shape=(seq, batch, heads, head_dim))


def rotate_half(dim: int) -> Permutation:
    """`[x1, x2] -> [x2, x1]` over the last dimension (rotary's `rotate_half` without its
    sign, which `RotaryEmbedding.head_tables` puts in the sine table)."""
    return Permutation(np.concatenate([np.arange(dim // 2, dim), np.arange(dim // 2)]))


class SwiGLUActivation(nn.Cell):
    """`silu(gate) * up` of `[..., 2n]` (`[gate, up]`), the halves gathered contiguous; the
    backward recomputes them from the input (kept as Megatron's fused SwiGLU keeps it) and
    stacks their gradients, so neither half nor silu(gate) is saved."""

    def __init__(self, rows: int, half: int):
        super().__init__()
        self.first, self.second = _index(np.arange(rows) * 2), _index(np.arange(rows) * 2 + 1)
        self.half = half

    def _halves(self, x: Tensor) -> tuple[Tensor, Tensor]:
        rows = x.reshape(-1, self.half)
        return ops.gather(rows, self.first, 0), ops.gather(rows, self.second, 0)

    def construct(self, x: Tensor) -> Tensor:
        gate, up = self._halves(x)
        return (mint.nn.functional.silu(gate) * up).reshape(*x.shape[:-1], self.half)

    def bprop(self, x: Tensor, out: Tensor, dout: Tensor) -> tuple[Tensor]:
        gate, up = self._halves(x)
        sig = ops.sigmoid(gate)
        d_out = dout.reshape(-1, self.half)
        d_up = d_out * (gate * sig)
        d_gate = d_out * up * (sig * (1 + gate * (1 - sig)))
        return (ops.stack((d_gate, d_up), 1).reshape(x.shape),)


class GatheredHeads:
    """One attention block's gathers, built per input shape on first use.

    Args:
        heads, kv_heads: this rank's query and key/value heads.
        head_dim: the head size.
    """

    def __init__(self, heads: int, kv_heads: int, head_dim: int):
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, head_dim
        self._split: dict[tuple[int, ...], FusedHeads] = {}
        self._merge: dict[tuple[int, ...], Permutation] = {}
        self.rotate_half = rotate_half(head_dim)

    def split(self, qkv: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """The fused projection `[s, b, ...]` -> q `[b, heads, s, d]`, k, v
        `[b, kv_heads, s, d]`."""
        key = (qkv.shape[0], qkv.shape[1], self.heads, self.kv_heads, self.head_dim)
        return _built(self._split, key, FusedHeads)(qkv)

    def merge(self, out: Tensor) -> Tensor:
        """Attention's `[b, heads, s, d]` -> `[s, b, heads * d]`."""
        batch, seq = out.shape[0], out.shape[2]
        merge = _built(self._merge, (batch, self.heads, seq, self.head_dim), heads_to_sequence)
        return merge(out).reshape(seq, batch, self.heads * self.head_dim)

    def rotate(self, x: Tensor, cos: Tensor, signed_sin: Tensor) -> Tensor:
        """Rotary on `[b, h, s, d]` with `RotaryEmbedding.head_tables`' tables."""
        return x * cos + self.rotate_half(x) * signed_sin


def swiglu_activation(cache: dict[tuple[int, int], SwiGLUActivation], x: Tensor) -> Tensor:
    """`silu(gate) * up` of `x` `[..., 2n]` through the `SwiGLUActivation` cached for its
    shape."""
    return _built(cache, (int(np.prod(x.shape[:-1])), x.shape[-1] // 2), SwiGLUActivation)(x)
