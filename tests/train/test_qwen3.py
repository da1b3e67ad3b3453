"""Qwen3ForCausalLM: logits and loss against a numpy reimplementation of Hugging Face's
Qwen3 (written here from modeling_qwen3.py), gradients, the layer contract, recompute, the
Hugging Face name mapping, tensor-parallel shards, and the settings' errors."""

from __future__ import annotations

import functools
import json
import logging
import re
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("mindspore")

import mindspore as ms
from mindspore import Tensor
from tensor_groups import tensor_group

from mf_config import ConfigError, LayerSpec, ModelConfig, RecomputeCommConfig, RecomputeConfig
from mf_memory.layers import decoder_layers, layer_offset, resolve_module
from mf_memory.recompute import apply_recompute, apply_recompute_comm
from mf_parallel.runtime.tensor_parallel import SEQUENCE_PARALLEL_ATTRIBUTE
from mf_train.models import HFWeightsError, build_model, hf_names, hf_state, load_hf_state
from mf_train.models.qwen3 import Qwen3ForCausalLM, qwen3_settings
from mf_train.parallelize import build_parallel_model

GOLDEN = Path(__file__).resolve().parent / "golden"
sys.path.insert(0, str(GOLDEN))
from qwen3_tiny import VARIANTS, golden_batch, weight  # noqa: E402

ms.set_context(mode=ms.PYNATIVE_MODE)
ms.set_device("CPU")

# head_dim 12 != hidden / heads (8), GQA 4 query heads on 2 kv heads: both paths exercised.
SIZES = {"vocab_size": 96, "hidden_size": 32, "intermediate_size": 48,
         "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
         "head_dim": 12, "rms_norm_eps": 1e-5, "rope_theta": 500.0,
         "max_position_embeddings": 64}
BATCH, SEQ = 2, 10


def config(**overrides) -> ModelConfig:
    return ModelConfig(model_type="qwen3", extras=SIZES | overrides)


def tokens(seed: int = 1) -> tuple[np.ndarray, np.ndarray]:
    data = np.random.default_rng(seed).integers(0, SIZES["vocab_size"], (BATCH, SEQ + 1))
    return data[:, :-1].astype(np.int32), data[:, 1:].astype(np.int32)


# --- the reference: Hugging Face's Qwen3 in numpy (float64) ---------------------------------

def hf_weights(extras: dict, seed: int = 0) -> dict[str, np.ndarray]:
    """Random HF-named weights, larger than the init so every part of the model matters."""
    rng = np.random.default_rng(seed)
    v, h, i = extras["vocab_size"], extras["hidden_size"], extras["intermediate_size"]
    d, nq, nkv = extras["head_dim"], extras["num_attention_heads"], extras["num_key_value_heads"]

    def normal(*shape, scale=0.2):
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    def norm(n):
        return (1 + rng.standard_normal(n) * 0.3).astype(np.float32)

    w = {"model.embed_tokens.weight": normal(v, h, scale=1.0), "model.norm.weight": norm(h)}
    if not extras.get("tie_word_embeddings", False):
        w["lm_head.weight"] = normal(v, h)
    for layer in range(extras["num_hidden_layers"]):
        p = f"model.layers.{layer}."
        w |= {p + "input_layernorm.weight": norm(h), p + "post_attention_layernorm.weight": norm(h),
              p + "self_attn.q_proj.weight": normal(nq * d, h),
              p + "self_attn.k_proj.weight": normal(nkv * d, h),
              p + "self_attn.v_proj.weight": normal(nkv * d, h),
              p + "self_attn.o_proj.weight": normal(h, nq * d),
              p + "self_attn.q_norm.weight": norm(d), p + "self_attn.k_norm.weight": norm(d),
              p + "mlp.gate_proj.weight": normal(i, h), p + "mlp.up_proj.weight": normal(i, h),
              p + "mlp.down_proj.weight": normal(h, i)}
        if extras.get("attention_bias", False):
            w |= {p + f"self_attn.{n}_proj.bias": normal(w[p + f"self_attn.{n}_proj.weight"]
                                                         .shape[0]) for n in "qkvo"}
    return w


def np_rms(x, weight, eps):
    return weight * (x / np.sqrt((x * x).mean(-1, keepdims=True) + eps))


def np_linear(x, w, name, bias=False):
    y = x @ w[name + ".weight"].T.astype(np.float64)
    return y + w[name + ".bias"] if bias else y


def np_rope(x, theta):
    """HF apply_rotary_pos_emb: x * cos + rotate_half(x) * sin, x [b, heads, s, d]."""
    d, s = x.shape[-1], x.shape[-2]
    inv_freq = 1.0 / theta ** (np.arange(0, d, 2) / d)
    angles = np.outer(np.arange(s), inv_freq)
    emb = np.concatenate([angles, angles], -1)
    rotated = np.concatenate([-x[..., d // 2:], x[..., : d // 2]], -1)
    return x * np.cos(emb) + rotated * np.sin(emb)


def np_attention(x, w, p, e):
    b, s, _ = x.shape
    d, nq, nkv = e["head_dim"], e["num_attention_heads"], e["num_key_value_heads"]
    bias = e.get("attention_bias", False)
    q = np_linear(x, w, p + "q_proj", bias).reshape(b, s, nq, d)
    k = np_linear(x, w, p + "k_proj", bias).reshape(b, s, nkv, d)
    v = np_linear(x, w, p + "v_proj", bias).reshape(b, s, nkv, d)
    q = np_rms(q, w[p + "q_norm.weight"], e["rms_norm_eps"]).transpose(0, 2, 1, 3)
    k = np_rms(k, w[p + "k_norm.weight"], e["rms_norm_eps"]).transpose(0, 2, 1, 3)
    v = v.transpose(0, 2, 1, 3)
    q, k = np_rope(q, e["rope_theta"]), np_rope(k, e["rope_theta"])
    k, v = np.repeat(k, nq // nkv, axis=1), np.repeat(v, nq // nkv, axis=1)  # repeat_kv
    scores = q @ k.transpose(0, 1, 3, 2) / np.sqrt(d)
    scores = np.where(np.triu(np.ones((s, s), bool), 1), -np.inf, scores)
    probs = np.exp(scores - scores.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    context = (probs @ v).transpose(0, 2, 1, 3).reshape(b, s, nq * d)
    return np_linear(context, w, p + "o_proj", bias)


def np_logits(w: dict, e: dict, ids: np.ndarray) -> np.ndarray:
    eps = e["rms_norm_eps"]
    x = w["model.embed_tokens.weight"].astype(np.float64)[ids]
    for layer in range(e["num_hidden_layers"]):
        p = f"model.layers.{layer}."
        x = x + np_attention(np_rms(x, w[p + "input_layernorm.weight"], eps), w,
                             p + "self_attn.", e)
        h = np_rms(x, w[p + "post_attention_layernorm.weight"], eps)
        gate, up = np_linear(h, w, p + "mlp.gate_proj"), np_linear(h, w, p + "mlp.up_proj")
        x = x + np_linear(gate / (1 + np.exp(-gate)) * up, w, p + "mlp.down_proj")
    x = np_rms(x, w["model.norm.weight"], eps)
    head = w["model.embed_tokens.weight" if e.get("tie_word_embeddings") else "lm_head.weight"]
    return x @ head.T.astype(np.float64)


def np_loss(logits, labels, mask):
    z = logits - logits.max(-1, keepdims=True)
    log_probs = z - np.log(np.exp(z).sum(-1, keepdims=True))
    ce = -np.take_along_axis(log_probs, labels[..., None], -1)[..., 0]
    return (ce * mask).sum() / max(mask.sum(), 1.0)


def loaded_model(**overrides) -> tuple[Qwen3ForCausalLM, dict, dict]:
    extras = SIZES | overrides
    model = build_model(config(**overrides))
    weights = hf_weights(extras)
    load_hf_state(model, weights)
    return model, weights, extras


# --- forward and loss --------------------------------------------------------------------

@pytest.mark.parametrize("overrides", [{}, {"tie_word_embeddings": True, "attention_bias": True}],
                         ids=["untied", "tied-with-bias"])
def test_logits_match_the_numpy_qwen3(overrides) -> None:
    model, weights, extras = loaded_model(**overrides)
    ids, _ = tokens()
    got = model.logits(Tensor(ids)).asnumpy()
    assert got.shape == (BATCH, SEQ, SIZES["vocab_size"]) and got.dtype == np.float32
    want = np_logits(weights, extras, ids)
    # float32 against float64: 1e-5 of the logits' scale (|logits| reaches ~10 here)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
    assert hasattr(model, "head") is not overrides.get("tie_word_embeddings", False)


def test_loss_is_the_loss_mask_weighted_mean_of_token_cross_entropy() -> None:
    model, weights, extras = loaded_model()
    ids, labels = tokens()
    want_logits = np_logits(weights, extras, ids)
    mask = np.ones((BATCH, SEQ), np.float32)
    mask[0, :4] = 0.0
    mask[1, -1] = 0.0
    got = model(Tensor(ids), Tensor(labels), Tensor(mask)).asnumpy()
    np.testing.assert_allclose(got, np_loss(want_logits, labels, mask), rtol=1e-5)
    plain = model(Tensor(ids), Tensor(labels)).asnumpy()
    np.testing.assert_allclose(plain, np_loss(want_logits, labels, np.ones_like(mask)), rtol=1e-5)
    assert abs(float(got) - float(plain)) > 1e-3  # the mask changed the value


def test_gradients_are_finite_and_a_small_sgd_step_lowers_the_loss() -> None:
    model = build_model(config(), seed=3)
    ids, labels = tokens()
    params = model.trainable_params()
    loss, grads = ms.value_and_grad(model, None, params)(Tensor(ids), Tensor(labels))
    assert len(grads) == len(params) == 19
    for param, grad in zip(params, grads, strict=True):
        assert np.isfinite(grad.asnumpy()).all(), param.name
        assert np.abs(grad.asnumpy()).max() > 0, param.name
    for param, grad in zip(params, grads, strict=True):
        param.set_data(param - 0.5 * grad)
    after = model(Tensor(ids), Tensor(labels))
    assert float(after.asnumpy()) < float(loss.asnumpy()) - 1e-3


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_logits_and_loss_match_hugging_face_transformers(variant) -> None:
    """Golden values of transformers' Qwen3ForCausalLM (golden/make_qwen3_golden.py)."""
    golden = np.load(GOLDEN / "qwen3_hf.npz")
    names = [str(name) for name in golden[f"{variant}/names"]]
    shapes = json.loads(str(golden[f"{variant}/shapes"]))
    model = build_model(ModelConfig(architectures="Qwen3ForCausalLM", extras=VARIANTS[variant]))
    assert sorted(n for parts in hf_names(model).values() for n in parts) == sorted(names)
    load_hf_state(model, {n: weight(n, tuple(s)) for n, s in zip(names, shapes, strict=True)})
    ids, labels = golden_batch()
    want = golden[f"{variant}/logits"]
    got = model.logits(Tensor(ids.astype(np.int32))).asnumpy()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
    # HF shifts its labels inside; ours come shifted, the last position has no target.
    shifted = np.concatenate([labels[:, 1:], np.full((len(labels), 1), -100)], axis=1)
    loss = model(Tensor(ids.astype(np.int32)), Tensor(shifted.astype(np.int32)))
    assert float(loss.asnumpy()) == pytest.approx(float(golden[f"{variant}/loss"]), abs=1e-5)


# --- layout and the layer contract ---------------------------------------------------------

def test_parameter_names_follow_the_layout() -> None:
    model = build_model(config())
    names = [name for name, _ in model.parameters_and_names()]
    layer = ["input_norm.weight", "attention.qkv.weight", "attention.q_norm.weight",
             "attention.k_norm.weight", "attention.out.weight", "post_norm.weight",
             "mlp.gate_up.weight", "mlp.down.weight"]
    assert names == (["embedding.weight"] + [f"decoder_layers.{i}.{n}" for i in range(2)
                                              for n in layer] + ["final_norm.weight",
                                                                 "head.weight"])
    qkv = model.decoder_layers[0].attention.qkv.weight
    assert qkv.shape == ((4 + 2 + 2) * 12, 32)


def test_layer_contract_resolves_the_named_modules() -> None:
    model = build_model(config())
    layers = decoder_layers(model)
    assert len(layers) == 2 and layer_offset(model) == 0
    for path in ("attention", "mlp", "attention.qkv", "mlp.gate_up", "mlp.down",
                 "input_norm", "post_norm", "attention.out"):
        assert resolve_module(layers[1], path, "test") is not None


def grads_after(recompute: RecomputeConfig | None) -> list[np.ndarray]:
    model = build_model(config(), seed=11)
    if recompute is not None:
        apply_recompute(model, recompute)
    ids, labels = tokens()
    params = model.trainable_params()
    _, grads = ms.value_and_grad(model, None, params)(Tensor(ids), Tensor(labels))
    return [g.asnumpy() for g in grads]


@functools.cache
def baseline_grads() -> list[np.ndarray]:
    return grads_after(None)


@pytest.mark.parametrize("recompute", [
    RecomputeConfig(mode="full", full_recompute_layer=[LayerSpec.parse("0-1")]),
    RecomputeConfig(mode="select", select_module={"attention": [LayerSpec.parse("0")],
                                                  "mlp": [LayerSpec.parse("0-1")],
                                                  "attention.qkv": [LayerSpec.parse("1")]}),
], ids=["full", "select"])
def test_recompute_gives_bit_identical_gradients(recompute) -> None:
    for got, want in zip(grads_after(recompute), baseline_grads(), strict=True):
        np.testing.assert_array_equal(got, want)


# --- Hugging Face names --------------------------------------------------------------------

def test_hf_names_map_fused_weights_to_their_parts() -> None:
    names = hf_names(build_model(config(attention_bias=True)))
    assert names["embedding.weight"] == ("model.embed_tokens.weight",)
    assert names["decoder_layers.1.attention.qkv.weight"] == tuple(
        f"model.layers.1.self_attn.{p}_proj.weight" for p in "qkv")
    assert names["decoder_layers.1.attention.qkv.bias"] == tuple(
        f"model.layers.1.self_attn.{p}_proj.bias" for p in "qkv")
    assert names["decoder_layers.0.mlp.gate_up.weight"] == (
        "model.layers.0.mlp.gate_proj.weight", "model.layers.0.mlp.up_proj.weight")
    assert names["decoder_layers.0.attention.out.bias"] == ("model.layers.0.self_attn.o_proj.bias",)
    assert names["decoder_layers.0.post_norm.weight"] == (
        "model.layers.0.post_attention_layernorm.weight",)
    assert names["final_norm.weight"] == ("model.norm.weight",)
    assert names["head.weight"] == ("lm_head.weight",)
    assert "head.weight" not in hf_names(build_model(config(tie_word_embeddings=True)))


def test_hf_state_round_trips_the_loaded_weights_exactly() -> None:
    model, weights, _ = loaded_model(attention_bias=True)
    state = hf_state(model)
    assert sorted(state) == sorted(weights)
    for name, value in weights.items():
        np.testing.assert_array_equal(state[name], value, err_msg=name)
    fused = model.decoder_layers[0].attention.qkv.weight.asnumpy()
    np.testing.assert_array_equal(fused[:48], weights["model.layers.0.self_attn.q_proj.weight"])


def test_load_hf_state_reports_every_missing_misshaped_and_unknown_weight() -> None:
    model = build_model(config())
    weights = hf_weights(SIZES)
    del weights["model.layers.1.self_attn.k_proj.weight"]
    weights["model.norm.weight"] = np.ones(31, np.float32)
    weights["model.layers.0.self_attn.rotary.inv_freq"] = np.ones(6, np.float32)
    with pytest.raises(HFWeightsError) as error:
        load_hf_state(model, weights)
    text = str(error.value)
    assert "model.layers.1.self_attn.k_proj.weight: missing" in text
    assert "model.norm.weight: shape (31,), expected (32,)" in text
    assert "model.layers.0.self_attn.rotary.inv_freq: not a weight" in text


def test_a_tied_model_accepts_and_ignores_lm_head() -> None:
    model, weights, _ = loaded_model(tie_word_embeddings=True)
    load_hf_state(model, weights | {"lm_head.weight": weights["model.embed_tokens.weight"]})


# --- initialisation ------------------------------------------------------------------------

def test_init_is_seeded_normal_with_initializer_range_and_unit_norms() -> None:
    a = build_model(config(initializer_range=0.05), seed=4)
    b = build_model(config(initializer_range=0.05), seed=4)
    c = build_model(config(initializer_range=0.05), seed=5)
    one_layer = build_model(config(initializer_range=0.05, num_hidden_layers=1), seed=4)
    first = a.decoder_layers[0].mlp.down.weight.asnumpy()
    np.testing.assert_array_equal(first, b.decoder_layers[0].mlp.down.weight.asnumpy())
    np.testing.assert_array_equal(first, one_layer.decoder_layers[0].mlp.down.weight.asnumpy())
    assert not np.array_equal(first, c.decoder_layers[0].mlp.down.weight.asnumpy())
    table = a.embedding.weight.asnumpy()
    assert 0.045 < table.std() < 0.055 and abs(table.mean()) < 0.005
    np.testing.assert_array_equal(a.decoder_layers[1].attention.k_norm.weight.asnumpy(),
                                  np.ones(12, np.float32))


def test_seed_defaults_to_mindsporess_global_seed() -> None:
    ms.set_seed(4)
    try:
        implicit = build_model(config())
    finally:
        ms.set_seed(0)
    explicit = build_model(config(), seed=4)
    np.testing.assert_array_equal(implicit.head.weight.asnumpy(), explicit.head.weight.asnumpy())


# --- tensor-parallel construction (no communication happens while building) --------------

def test_tensor_parallel_shards_put_together_equal_the_single_process_weights() -> None:
    single = build_model(config(attention_bias=True), seed=2)
    ranks = [build_parallel_model(config(attention_bias=True), seed=2, tensor_group=tensor_group(r))
             for r in range(2)]
    weights = hf_state(single)
    for rank, model in enumerate(ranks):
        params = dict(model.parameters_and_names())
        layer = "decoder_layers.1.attention."
        q, k, v = (weights[f"model.layers.1.self_attn.{p}_proj.weight"] for p in "qkv")
        want_qkv = np.concatenate([np.split(q, 2)[rank], np.split(k, 2)[rank],
                                   np.split(v, 2)[rank]])
        np.testing.assert_array_equal(params[layer + "qkv.weight"].asnumpy(), want_qkv)
        o = weights["model.layers.1.self_attn.o_proj.weight"]
        np.testing.assert_array_equal(params[layer + "out.weight"].asnumpy(),
                                      np.split(o, 2, axis=1)[rank])
        gate, up = (weights[f"model.layers.0.mlp.{p}_proj.weight"] for p in ("gate", "up"))
        np.testing.assert_array_equal(params["decoder_layers.0.mlp.gate_up.weight"].asnumpy(),
                                      np.concatenate([np.split(gate, 2)[rank],
                                                      np.split(up, 2)[rank]]))
        np.testing.assert_array_equal(params["embedding.weight"].asnumpy(),
                                      np.split(weights["model.embed_tokens.weight"], 2)[rank])
        # load_hf_state hands each rank the same shards
        load_hf_state(model, weights)
        np.testing.assert_array_equal(params[layer + "qkv.weight"].asnumpy(), want_qkv)


@pytest.mark.parametrize("sequence_parallel", [True, False])
def test_tensor_parallel_marks_the_parameters_whose_gradients_need_a_sum(
        sequence_parallel) -> None:
    group = tensor_group(0, sequence_parallel=sequence_parallel)
    model = build_parallel_model(config(), tensor_group=group)
    marked = {name for name, param in model.parameters_and_names()
              if getattr(param, SEQUENCE_PARALLEL_ATTRIBUTE, False)}
    per_head = {f"decoder_layers.{i}.attention.{n}_norm.weight" for i in range(2) for n in "qk"}
    sliced = {f"decoder_layers.{i}.{n}_norm.weight" for i in range(2)
              for n in ("input", "post")} | {"final_norm.weight"}
    assert marked == (per_head | sliced if sequence_parallel else per_head)


def test_recompute_comm_finds_the_gathers_of_the_fused_projections() -> None:
    model = build_parallel_model(config(), tensor_group=tensor_group(0))
    wrapped = apply_recompute_comm(model, RecomputeCommConfig(
        enable=True, select_module={"attention.qkv": [LayerSpec.parse("0-1")],
                                    "mlp.gate_up": [LayerSpec.parse("1")]}))
    assert wrapped == ["layers[0].attention.qkv.enter", "layers[1].attention.qkv.enter",
                       "layers[1].mlp.gate_up.enter"]


def test_a_tensor_group_of_one_is_the_single_process_model() -> None:
    model = build_parallel_model(config(), seed=2, tensor_group=tensor_group(0, size=1))
    assert model.tensor_group is None
    ids, labels = tokens()
    want = build_model(config(), seed=2)(Tensor(ids), Tensor(labels)).asnumpy()
    assert model(Tensor(ids), Tensor(labels)).asnumpy() == want


def test_tensor_parallel_sizes_must_divide_heads_and_vocabulary() -> None:
    with pytest.raises(ConfigError) as error:
        build_parallel_model(config(num_key_value_heads=1, vocab_size=95),
                    tensor_group=tensor_group(0))
    text = str(error.value)
    assert "model.num_key_value_heads: 1 is not divisible by parallelism.tensor_parallel" in text
    assert "model.vocab_size: 95 is not divisible" in text


# --- settings ------------------------------------------------------------------------------

def test_build_model_dispatches_on_architectures_then_model_type() -> None:
    by_arch = build_model(ModelConfig(architectures="Qwen3ForCausalLM", extras=SIZES))
    by_type = build_model(ModelConfig(model_type="qwen3", extras=SIZES))
    as_listed = build_model(ModelConfig(architectures=["Qwen3ForCausalLM"], extras=SIZES))
    assert type(by_arch) is type(by_type) is type(as_listed) is Qwen3ForCausalLM
    with pytest.raises(ConfigError, match=r"model\.architectures: unknown model type 'Llama'"):
        build_model(ModelConfig(architectures="Llama", model_type="qwen3", extras=SIZES))
    with pytest.raises(ConfigError, match=r"model\.model_type: required"):
        build_model(ModelConfig(extras=SIZES))


def test_a_qwen3_config_json_maps_straight_over() -> None:
    """The keys of Qwen3-0.6B's config.json (its `architectures` list is the model section's
    own field: test_build_model_dispatches_on_architectures_then_model_type)."""
    config_json = {
        "attention_bias": False, "attention_dropout": 0.0, "bos_token_id": 151643,
        "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu", "hidden_size": 1024,
        "initializer_range": 0.02, "intermediate_size": 3072, "max_position_embeddings": 40960,
        "max_window_layers": 28, "num_attention_heads": 16, "num_hidden_layers": 28,
        "num_key_value_heads": 8, "rms_norm_eps": 1e-06, "rope_scaling": None,
        "rope_theta": 1000000, "sliding_window": None, "tie_word_embeddings": True,
        "torch_dtype": "bfloat16", "transformers_version": "4.51.0", "use_cache": True,
        "use_sliding_window": False, "vocab_size": 151936}
    settings = qwen3_settings(config_json)
    assert settings.head_size() == 128 and settings.kv_heads() == 8
    assert settings.rope_theta == 1e6 and settings.tie_word_embeddings


@pytest.mark.parametrize(("extra", "message"), [
    ({"hiden_size": 32}, "model.hiden_size"),
    ({"hidden_size": "32"}, "model.hidden_size: expected an integer"),
    ({"hidden_act": "gelu"}, "model.hidden_act: must be one of 'silu'"),
    ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}},
     "model.rope_scaling: only null is implemented"),
    ({"use_sliding_window": True}, "model.use_sliding_window: only false is implemented"),
    ({"attention_dropout": 0.1}, "model.attention_dropout: only 0.0 is implemented"),
    ({"layer_types": ["full_attention", "sliding_attention"]},
     "model.layer_types: only 'full_attention' is implemented, got 'sliding_attention'"),
    ({"num_key_value_heads": 3}, "model.num_key_value_heads: 3 does not divide"),
    ({"head_dim": None, "hidden_size": 30}, "model.hidden_size: 30 is not divisible"),
    ({"seq_length": 65}, "model.seq_length: 65 exceeds max_position_embeddings (64)"),
    ({"rms_norm_eps": 0}, "model.rms_norm_eps: must be positive"),
    ({"compute_dtype": "fp16"}, "model.compute_dtype: must be one of"),
])
def test_settings_errors_name_the_key(extra, message) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        build_model(config(**extra))


def test_missing_structure_sizes_are_listed_together() -> None:
    raw = {k: v for k, v in SIZES.items() if k not in ("vocab_size", "num_hidden_layers")}
    with pytest.raises(ConfigError) as error:
        qwen3_settings(raw)
    assert "model.vocab_size: required" in str(error.value)
    assert "model.num_hidden_layers: required" in str(error.value)


def test_rope_scaling_of_the_default_type_is_no_scaling() -> None:
    assert qwen3_settings(SIZES | {"rope_scaling": {"rope_type": "default"}}).rope_scaling


def test_bfloat16_compute_on_cpu_runs_in_float32_and_says_so(caplog) -> None:
    with caplog.at_level(logging.WARNING, logger="mf_train.models"):
        model = build_model(config(compute_dtype="bfloat16", params_dtype="bfloat16"), seed=2)
    assert "model.compute_dtype: bfloat16" in caplog.text
    assert "model.params_dtype: bfloat16" in caplog.text
    ids, labels = tokens()
    assert model.logits(Tensor(ids)).dtype == ms.float32
    want = build_model(config(), seed=2)(Tensor(ids), Tensor(labels)).asnumpy()
    assert model(Tensor(ids), Tensor(labels)).asnumpy() == want


def test_inputs_longer_than_the_model_allows_are_refused() -> None:
    model = build_model(config(seq_length=8))
    ids, _ = tokens()
    with pytest.raises(ValueError, match=r"10 tokens is longer than model\.seq_length \(8\)"):
        model.logits(Tensor(ids))
