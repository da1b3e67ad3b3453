"""Attention's layout gathers and the written-out softmax attention against numpy (values
and gradients), and a Qwen3 model on them against the same model on strided views."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("mindspore")

import mindspore as ms
from mindspore import Tensor

from mf_train.models import blocks, gathered_heads
from mf_train.models.qwen3 import Qwen3ForCausalLM, qwen3_settings

ms.set_context(mode=ms.PYNATIVE_MODE)
ms.set_device("CPU")

RNG = np.random.default_rng(11)


def f32(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


def grads_of(fn, inputs: list[np.ndarray], weights: list[np.ndarray]) -> list[np.ndarray]:
    """Gradients of `sum_i <fn(inputs)_i, weights_i>` with respect to every input."""
    def objective(*xs):
        outs = fn(*xs)
        outs = outs if isinstance(outs, tuple) else (outs,)
        total = None
        for out, weight in zip(outs, weights, strict=True):
            term = (out * Tensor(weight)).sum()
            total = term if total is None else total + term
        return total
    got = ms.grad(objective, tuple(range(len(inputs))))(*(Tensor(x) for x in inputs))
    return [g.asnumpy() for g in (got if isinstance(got, tuple) else (got,))]


def test_fused_heads_gathers_q_k_v_into_heads_layout() -> None:
    seq, batch, heads, kv_heads, dim = 5, 2, 4, 2, 3
    qkv = f32(seq, batch, (heads + 2 * kv_heads) * dim)
    split = gathered_heads.FusedHeads(seq, batch, heads, kv_heads, dim)
    parts = qkv.reshape(seq, batch, heads + 2 * kv_heads, dim).transpose(1, 2, 0, 3)
    want = (parts[:, :heads], parts[:, heads:heads + kv_heads], parts[:, heads + kv_heads:])
    for got, expected in zip(split(Tensor(qkv)), want, strict=True):
        np.testing.assert_array_equal(got.asnumpy(), expected)
    weights = [f32(*part.shape) for part in want]
    (grad,) = grads_of(split, [qkv], weights)
    np.testing.assert_array_equal(grad, np.concatenate(weights, 1).transpose(2, 0, 1, 3)
                                  .reshape(qkv.shape))


def test_heads_to_sequence_and_swiglu_activation_values_and_gradients() -> None:
    x = f32(2, 3, 4, 5)
    back = gathered_heads.heads_to_sequence(2, 3, 4, 5)
    np.testing.assert_array_equal(back(Tensor(x)).asnumpy(), x.transpose(2, 0, 1, 3))
    weight = f32(4, 2, 3, 5)
    (grad,) = grads_of(back, [x], [weight])
    np.testing.assert_array_equal(grad, weight.transpose(1, 2, 0, 3))

    y = f32(4, 2, 6)
    activation = gathered_heads.SwiGLUActivation(8, 3)
    gate, up = y[..., :3].astype(np.float64), y[..., 3:].astype(np.float64)
    sig = 1 / (1 + np.exp(-gate))
    np.testing.assert_allclose(activation(Tensor(y)).asnumpy(), gate * sig * up, rtol=1e-5,
                               atol=1e-6)
    w = f32(4, 2, 3)
    (grad,) = grads_of(activation, [y], [w])
    d_gate = w * up * (sig + gate * sig * (1 - sig))  # d silu(g) = sig + g sig (1 - sig)
    np.testing.assert_allclose(grad, np.concatenate([d_gate, w * gate * sig], -1), rtol=1e-5,
                               atol=1e-6)


def test_gathered_rotary_equals_rotate_half_rope_and_its_gradient() -> None:
    dim, seq, batch, heads = 8, 6, 2, 3
    rotary = blocks.RotaryEmbedding(dim, theta=50.0, max_position=16)
    positions = np.stack([np.arange(seq), np.array([0, 1, 2, 0, 1, 2])])  # two documents
    cos, sin = rotary.at(positions)  # [seq, batch, 1, dim]
    x = f32(batch, heads, seq, dim)
    cos_h, sin_h = rotary.head_tables(cos, sin, x.shape)
    layout = gathered_heads.GatheredHeads(heads, heads, dim)
    plain_cos, plain_sin = (t.asnumpy().transpose(1, 2, 0, 3) for t in (cos, sin))

    def rope(a: np.ndarray) -> np.ndarray:
        rotated = np.concatenate([-a[..., dim // 2:], a[..., :dim // 2]], -1)
        return a * plain_cos + rotated * plain_sin

    got = layout.rotate(Tensor(x), cos_h, sin_h).asnumpy()
    np.testing.assert_allclose(got, rope(x), rtol=1e-6, atol=1e-6)
    weight = f32(*x.shape)
    (grad,) = grads_of(lambda a: layout.rotate(a, cos_h, sin_h), [x], [weight])
    # rope is linear: its gradient is the transpose applied to the weight
    half = dim // 2
    w_cos, w_sin = weight * plain_cos, weight * plain_sin
    want = w_cos + np.concatenate([w_sin[..., half:], -w_sin[..., :half]], -1)
    np.testing.assert_allclose(grad, want, rtol=1e-5, atol=1e-6)
    assert rotary.head_tables(cos, sin, x.shape)[0] is cos_h  # one build per forward pass


@pytest.mark.parametrize("kv_heads", [6, 2])
def test_softmax_attention_values_and_gradients_equal_numpy(kv_heads: int) -> None:
    """With as many kv heads as query heads, and grouped (query head i uses kv head i // 3)."""
    b, h, s, d, scale = 2, 6, 5, 4, 0.5
    q, k_kv, v_kv = f32(b, h, s, d), f32(b, kv_heads, s, d), f32(b, kv_heads, s, d)
    k, v = (np.repeat(x, h // kv_heads, 1) for x in (k_kv, v_kv))
    hidden = np.triu(np.ones((s, s), bool), 1)
    hidden = np.ascontiguousarray(np.broadcast_to(hidden, (b, h, s, s)))
    attention = blocks.SoftmaxAttention(scale)
    scores = np.where(hidden, -np.inf, q @ k.swapaxes(-1, -2) * scale)
    p = np.exp(scores - scores.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    out, probs = attention(Tensor(q), Tensor(k_kv), Tensor(v_kv), Tensor(hidden))
    np.testing.assert_allclose(out.asnumpy(), p @ v, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(probs.asnumpy(), p, rtol=1e-5, atol=1e-6)

    w = f32(b, h, s, d)
    got = grads_of(lambda q_, k_, v_: attention(q_, k_, v_, Tensor(hidden))[0],
                   [q, k_kv, v_kv], [w])
    d_p = w @ v.swapaxes(-1, -2)
    d_s = p * (d_p - (d_p * p).sum(-1, keepdims=True))
    copies = (b, kv_heads, h // kv_heads, s, d)  # a kv head's gradient: the sum of its copies'
    want = [d_s @ k * scale, (d_s.swapaxes(-1, -2) @ q * scale).reshape(copies).sum(2),
            (p.swapaxes(-1, -2) @ w).reshape(copies).sum(2)]
    for g, expected in zip(got, want, strict=True):
        np.testing.assert_allclose(g, expected, rtol=1e-4, atol=1e-5)


TINY = {"vocab_size": 64, "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8,
        "max_position_embeddings": 16, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
        "tie_word_embeddings": True}


@pytest.mark.parametrize("packed", [False, True])
def test_qwen3_on_gathers_equals_qwen3_on_strided_views(packed: bool) -> None:
    """The same weights, loss and every gradient with the gathers (the CPU default) and
    with the views a compiled layer uses, two samples, packed documents or not."""
    ids, labels = RNG.integers(0, 64, (2, 12)), RNG.integers(0, 64, (2, 12))
    positions = np.stack([np.arange(12), np.r_[np.arange(5), np.arange(7)]]) if packed \
        else None

    def loss_and_grads(views: bool) -> tuple[float, dict[str, np.ndarray]]:
        model = Qwen3ForCausalLM(qwen3_settings(TINY), seed=3)
        if views:
            for _, cell in model.cells_and_names():
                if hasattr(cell, "prepare_for_graph"):
                    cell.prepare_for_graph(dynamic=True)  # every view and slice
        assert (model.decoder_layers.by_id(0).attention.gathered is None) == views
        params = model.trainable_params()
        args = [Tensor(ids.astype(np.int32)), Tensor(labels.astype(np.int32))]
        if positions is not None:
            args += [None, Tensor(positions.astype(np.int32))]
        loss, grads = ms.value_and_grad(lambda *a: model(*a), None, params)(*args)
        named = zip(params, grads, strict=True)
        return float(loss.asnumpy()), {p.name: g.asnumpy() for p, g in named}

    loss_views, grads_views = loss_and_grads(True)
    loss_gathered, grads_gathered = loss_and_grads(False)
    assert loss_gathered == pytest.approx(loss_views, rel=1e-6)
    assert grads_gathered.keys() == grads_views.keys()
    for name, grad in grads_views.items():
        np.testing.assert_allclose(grads_gathered[name], grad, rtol=1e-4, atol=1e-6,
                                   err_msg=name)
