"""The shared model blocks against numpy written from their definitions (Hugging Face's Qwen3
modules and the formulas in their docstrings)."""

from __future__ import annotations

import logging

import numpy as np
import pytest

pytest.importorskip("mindspore")

import mindspore as ms
from mindspore import Tensor

from mf_config import ConfigError
from mf_train.models import blocks, context_attention

ms.set_context(mode=ms.PYNATIVE_MODE)
ms.set_device("CPU")

RNG = np.random.default_rng(7)


def f32(*shape: int, scale: float = 1.0) -> np.ndarray:
    return (RNG.standard_normal(shape) * scale).astype(np.float32)


def softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


# --- RMSNorm ---------------------------------------------------------------------------------

def test_rms_norm_puts_eps_inside_the_square_root() -> None:
    x = f32(3, 5, scale=0.3)
    weight = f32(5)
    norm = blocks.RMSNorm(5, eps=0.25)  # large eps: inside vs outside the sqrt differ a lot
    norm.weight.set_data(Tensor(weight))
    want = weight * x / np.sqrt((x.astype(np.float64) ** 2).mean(-1, keepdims=True) + 0.25)
    np.testing.assert_allclose(norm(Tensor(x)).asnumpy(), want, rtol=1e-6, atol=1e-6)


# --- rotary ----------------------------------------------------------------------------------

def test_rotary_tables_follow_the_default_rope_frequencies() -> None:
    cos, sin = blocks.RotaryEmbedding(8, theta=100.0, max_position=16).tables(5)
    inv_freq = [100.0 ** (-0 / 8), 100.0 ** (-2 / 8), 100.0 ** (-4 / 8), 100.0 ** (-6 / 8)]
    angle = 3 * inv_freq[2]  # position 3, frequency 2, and its duplicate at 2 + 4
    assert cos.shape == (5, 8)
    np.testing.assert_allclose(cos.asnumpy()[3, [2, 6]], [np.cos(angle)] * 2, rtol=1e-6)
    np.testing.assert_allclose(sin.asnumpy()[3, [2, 6]], [np.sin(angle)] * 2, rtol=1e-6)


def test_rotate_half_rope_rotates_pairs_i_and_i_plus_half() -> None:
    """HF's rotate-half: the pair (x_i, x_{i+d/2}) is the complex number x_i + j x_{i+d/2}
    multiplied by exp(j * p * theta^(-2i/d))."""
    d, seq, theta = 8, 6, 50.0
    x = f32(2, 3, seq, d)
    rotary = blocks.RotaryEmbedding(d, theta, max_position=seq)
    got = blocks.apply_rotary(Tensor(x), *rotary.tables(seq)).asnumpy()
    z = x[..., : d // 2] + 1j * x[..., d // 2:]
    angles = np.arange(seq)[:, None] * theta ** (-np.arange(0, d, 2) / d)[None, :]
    rotated = z * np.exp(1j * angles)
    np.testing.assert_allclose(got, np.concatenate([rotated.real, rotated.imag], -1),
                               rtol=1e-5, atol=1e-6)


def test_rotary_rejects_sequences_longer_than_max_positions() -> None:
    with pytest.raises(ValueError, match="max_position_embeddings"):
        blocks.RotaryEmbedding(4, 10000.0, max_position=8).tables(9)


def test_rotary_takes_a_custom_frequency_rule_and_scaling() -> None:
    inv_freq = np.array([0.5, 0.25])
    rotary = blocks.RotaryEmbedding(4, 1.0, 8, inv_freq=inv_freq, attention_scaling=2.0)
    cos, sin = rotary.tables(3)
    np.testing.assert_allclose(cos.asnumpy()[2], 2 * np.cos([1.0, 0.5, 1.0, 0.5]), rtol=1e-6)
    np.testing.assert_allclose(sin.asnumpy()[2], 2 * np.sin([1.0, 0.5, 1.0, 0.5]), rtol=1e-6)


# --- attention -------------------------------------------------------------------------------

def numpy_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, scale: float,
                    mask: np.ndarray | None = None) -> np.ndarray:
    """Softmax attention; `mask` True = hidden (None: causal)."""
    group = q.shape[1] // k.shape[1]
    k, v = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)  # HF repeat_kv
    scores = q @ k.swapaxes(-1, -2) * scale
    seq = q.shape[2]
    hidden = np.triu(np.ones((seq, seq), bool), 1) if mask is None else mask
    scores = np.where(hidden, -np.inf, scores)
    return softmax(scores) @ v


def test_causal_attention_with_grouped_kv_heads_matches_numpy() -> None:
    q, k, v = f32(2, 4, 6, 8), f32(2, 2, 6, 8), f32(2, 2, 6, 5)  # v may be narrower
    got = blocks.AttentionCore(0.3)(Tensor(q), Tensor(k), Tensor(v)).asnumpy()
    np.testing.assert_allclose(got, numpy_attention(q, k, v, 0.3), rtol=1e-5, atol=1e-6)


def test_attention_does_not_look_ahead() -> None:
    q, k, v = f32(1, 2, 5, 4), f32(1, 2, 5, 4), f32(1, 2, 5, 4)
    core = blocks.AttentionCore(0.5)
    before = core(Tensor(q), Tensor(k), Tensor(v)).asnumpy()
    k[:, :, 3:], v[:, :, 3:] = 9.0, -9.0
    after = core(Tensor(q), Tensor(k), Tensor(v)).asnumpy()
    np.testing.assert_array_equal(before[:, :, :3], after[:, :, :3])
    assert not np.allclose(before[:, :, 3:], after[:, :, 3:])


def test_flash_attention_on_cpu_falls_back_to_the_plain_path_and_says_so_once(caplog) -> None:
    blocks._flash_notes.clear()
    with caplog.at_level(logging.WARNING, logger="mf_train.models"):
        first = blocks.AttentionCore(0.3, use_flash_attention=True)
        blocks.AttentionCore(0.3, use_flash_attention=True)
    assert not first.flash
    notes = [r.getMessage() for r in caplog.records if "use_flash_attention" in r.getMessage()]
    assert len(notes) == 1
    assert "CPU" in notes[0] and "plain softmax attention" in notes[0]
    q = f32(1, 2, 4, 8)
    np.testing.assert_allclose(first(Tensor(q), Tensor(q), Tensor(q)).asnumpy(),
                               numpy_attention(q, q, q, 0.3), rtol=1e-5, atol=1e-6)


def test_partials_over_two_key_sets_merge_to_attention_over_all_keys() -> None:
    """The overlapped context attention's arithmetic: attention over some keys and over the
    rest, merged by log-sum-exp, is attention over all of them, in value and gradient, also
    for queries that see none of one set's keys (the early chunk's queries and later keys)."""
    q, k, v = f32(2, 4, 6, 8), f32(2, 2, 10, 8), f32(2, 2, 10, 5)
    mask = RNG.random((2, 1, 6, 10)) < 0.4
    mask[:, :, :, 0] = False                       # every query sees some key
    mask[:, :, 1, 4:] = True                       # query 1 sees none of the second set
    core = blocks.AttentionCore(0.3)
    want = numpy_attention(q, k, v, 0.3, mask)

    def merged(q, k, v):
        first = core.partial(q, k[:, :, :4], v[:, :, :4], Tensor(mask[..., :4]))
        second = core.partial(q, k[:, :, 4:], v[:, :, 4:], Tensor(mask[..., 4:]))
        return context_attention.merge_partials(first, second, ms.float32)

    def whole(q, k, v):
        return core(q, k, v, Tensor(mask))

    inputs = [Tensor(x) for x in (q, k, v)]
    np.testing.assert_allclose(merged(*inputs).asnumpy(), want, rtol=1e-5, atol=1e-6)
    weights = Tensor(f32(2, 4, 6, 5))
    grads = ms.grad(lambda *x: (merged(*x) * weights).sum(), (0, 1, 2))(*inputs)
    expected = ms.grad(lambda *x: (whole(*x) * weights).sum(), (0, 1, 2))(*inputs)
    for got, reference in zip(grads, expected, strict=True):
        assert np.isfinite(got.asnumpy()).all()
        np.testing.assert_allclose(got.asnumpy(), reference.asnumpy(), rtol=1e-4, atol=1e-5)


# --- MLP and fused rows ----------------------------------------------------------------------

def test_swiglu_is_down_of_silu_gate_times_up() -> None:
    gate, up, down, x = f32(6, 4), f32(6, 4), f32(4, 6), f32(3, 2, 4)
    mlp = blocks.SwiGLU(gate, up, down)
    g, u = x @ gate.T, x @ up.T
    want = (g / (1 + np.exp(-g)) * u) @ down.T
    np.testing.assert_allclose(mlp(Tensor(x)).asnumpy(), want, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(mlp.gate_up.weight.asnumpy(), np.concatenate([gate, up]))


def test_fuse_rows_gives_each_tensor_parallel_rank_its_rows_of_every_part() -> None:
    a, b = np.arange(4)[:, None], np.arange(10, 16)[:, None]
    fused = blocks.fuse_rows([a, b], shards=2)
    assert fused.ravel().tolist() == [0, 1, 10, 11, 12, 2, 3, 13, 14, 15]
    back = blocks.split_rows(fused, [4, 6], shards=2)
    assert [part.ravel().tolist() for part in back] == [a.ravel().tolist(), b.ravel().tolist()]
    with pytest.raises(ValueError, match="cannot be split over 3"):
        blocks.fuse_rows([a], shards=3)


# --- loss ------------------------------------------------------------------------------------

def numpy_token_ce(logits: np.ndarray, labels: np.ndarray) -> np.ndarray:
    z = logits.astype(np.float64)
    log_probs = z - z.max(-1, keepdims=True)
    log_probs -= np.log(np.exp(log_probs).sum(-1, keepdims=True))
    return -np.take_along_axis(log_probs, labels[..., None], -1)[..., 0]


def test_token_cross_entropy_matches_log_softmax() -> None:
    logits, labels = f32(3, 2, 7, scale=3.0), RNG.integers(0, 7, (3, 2)).astype(np.int32)
    got = blocks.token_cross_entropy(Tensor(logits), Tensor(labels)).asnumpy()
    np.testing.assert_allclose(got, numpy_token_ce(logits, labels), rtol=1e-5)


def test_causal_lm_loss_is_the_mask_weighted_mean_and_ignores_negative_labels() -> None:
    logits = f32(4, 2, 7, scale=2.0)
    labels = np.array([[1, -100], [3, 4], [6, 0], [2, 2]], np.int32)
    mask = np.array([[1, 1], [0, 1], [1, 1], [0.5, 1]], np.float32)
    ce = numpy_token_ce(logits, np.maximum(labels, 0))
    weights = mask * (labels >= 0)
    want = (ce * weights).sum() / weights.sum()
    got = blocks.causal_lm_loss(Tensor(logits), Tensor(labels), Tensor(mask))
    assert got.shape == () and got.dtype == ms.float32
    np.testing.assert_allclose(got.asnumpy(), want, rtol=1e-5)
    unmasked = blocks.causal_lm_loss(Tensor(logits), Tensor(np.maximum(labels, 0)))
    np.testing.assert_allclose(unmasked.asnumpy(), ce.mean(), rtol=1e-5)


def test_causal_lm_loss_with_nothing_to_learn_is_zero() -> None:
    """max(sum(mask), 1) in the denominator: an all-masked batch gives 0, not NaN."""
    logits, labels = f32(2, 2, 5), np.zeros((2, 2), np.int32)
    got = blocks.causal_lm_loss(Tensor(logits), Tensor(labels), Tensor(np.zeros((2, 2))))
    assert float(got.asnumpy()) == 0.0


# --- dtypes and init -------------------------------------------------------------------------

def test_bfloat16_compute_on_cpu_falls_back_to_float32_with_a_warning(caplog) -> None:
    with caplog.at_level(logging.WARNING, logger="mf_train.models"):
        assert blocks.resolve_compute_dtype("bfloat16", "CPU") == ms.float32
    assert "model.compute_dtype: bfloat16" in caplog.text and "float32" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="mf_train.models"):
        assert blocks.resolve_compute_dtype("float32", "CPU") == ms.float32
        assert blocks.resolve_compute_dtype("bfloat16", "Ascend") == ms.bfloat16
        assert blocks.resolve_compute_dtype("float16", "GPU") == ms.float16
    assert caplog.text == ""


def test_an_unknown_dtype_is_a_config_error_at_its_key() -> None:
    with pytest.raises(ConfigError, match=r"model\.params_dtype: must be one of"):
        blocks.resolve_compute_dtype("fp8", "CPU", "model.params_dtype")


def test_param_init_is_seeded_per_name_and_order_free() -> None:
    init = blocks.ParamInit(seed=5, std=0.02)
    a = init.normal("model.layers.0.mlp.up_proj.weight", (64, 32))
    init.normal("something.else", (3,))
    np.testing.assert_array_equal(a, init.normal("model.layers.0.mlp.up_proj.weight", (64, 32)))
    assert not np.array_equal(a, init.normal("model.layers.1.mlp.up_proj.weight", (64, 32)))
    assert not np.array_equal(a, blocks.ParamInit(6, 0.02).normal(
        "model.layers.0.mlp.up_proj.weight", (64, 32)))
    assert a.dtype == np.float32
    assert abs(a.mean()) < 0.003 and 0.018 < a.std() < 0.022


@pytest.mark.parametrize("shape", [(5, 7), (4, 6), (33,), ()])
def test_param_init_drawn_in_blocks_equals_one_draw(monkeypatch, shape) -> None:
    """Drawn a few values at a time (blocks that do not divide the tensor, or divide it
    exactly), the values are numpy's one-shot float64 draw times std, cast to float32: the
    weights every model and golden file were made with."""
    import zlib

    monkeypatch.setattr(blocks, "DRAW_BLOCK", 4)
    got = blocks.ParamInit(seed=9, std=0.02).normal("model.embed_tokens.weight", shape)
    rng = np.random.default_rng([9, zlib.crc32(b"model.embed_tokens.weight")])
    want = (rng.standard_normal(shape) * 0.02).astype(np.float32)
    assert got.dtype == np.float32 and got.shape == want.shape
    np.testing.assert_array_equal(got, want)
