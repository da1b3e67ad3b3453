"""DeepSeek-V3 (mf_train.models.deepseek_v3): logits and loss against an independent numpy
reimplementation and against Hugging Face transformers' logits (golden file), MoE statistics,
the balance loss, gradients (finite, and the router's against finite differences), the layer
contract under recompute, Hugging Face names, and configuration errors."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("mindspore")

import mindspore as ms
from mindspore import Tensor

from mf_config import ConfigError, ModelConfig, RecomputeConfig, TrainConfig
from mf_config.layer_spec import LayerSpec
from mf_memory.layers import resolve_module
from mf_memory.recompute import apply_recompute
from mf_train.models import build_model
from mf_train.models.deepseek_v3 import (
    DeepseekV3ForCausalLM,
    deepseek_v3_settings,
    hf_parameter_names,
    layer_hf_names,
)
from mf_train.models.hf_weights import HFWeightsError
from mf_train.models.parts import ModelPart, PipelineModel
from mf_train.parallelize import build_parallel_model
from mf_train.registry import MODELS

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import deepseek_v3_reference as ref  # noqa: E402

ms.set_context(mode=ms.PYNATIVE_MODE)
ms.set_device("CPU")

GOLDEN = HERE / "golden" / "deepseek_v3_hf.npz"


def _model(cfg: dict, seed: int = 0) -> DeepseekV3ForCausalLM:
    return DeepseekV3ForCausalLM.from_config(ModelConfig(extras=dict(cfg)), seed=seed)


@pytest.fixture(scope="module", params=sorted(ref.CONFIGS))
def case(request: pytest.FixtureRequest) -> dict:
    """A model loaded with the reference's random weights, and the reference's results."""
    cfg = ref.CONFIGS[request.param]
    state = ref.random_hf_state(cfg)
    model = _model(cfg)
    model.load_hf_state(state)
    ids, labels, mask = ref.batch()
    logits, balance, counts = ref.forward(state, cfg, ids)
    return {"name": request.param, "cfg": cfg, "state": state, "model": model, "ids": ids,
            "labels": labels, "mask": mask, "logits": logits, "balance": balance,
            "counts": counts}


# --- numerics -----------------------------------------------------------------------------

def test_logits_match_the_numpy_reference_and_hugging_face(case: dict) -> None:
    logits = case["model"].logits(Tensor(case["ids"])).asnumpy()
    assert logits.shape == (2, 8, 64)
    np.testing.assert_allclose(logits, case["logits"], rtol=1e-5, atol=2e-5)
    golden = np.load(GOLDEN)
    assert (golden[f"{case['name']}.input_ids"] == case["ids"]).all()
    np.testing.assert_allclose(logits, golden[f"{case['name']}.logits"], rtol=1e-5, atol=3e-5)


def test_loss_is_masked_cross_entropy_plus_balance_loss(case: dict) -> None:
    model = case["model"]
    loss = model(Tensor(case["ids"]), Tensor(case["labels"]), Tensor(case["mask"])).asnumpy()
    expected = ref.cross_entropy(case["logits"], case["labels"], case["mask"]) + case["balance"]
    np.testing.assert_allclose(loss, expected, rtol=1e-5)
    np.testing.assert_allclose(model.balance_loss(), case["balance"], rtol=1e-5, atol=1e-9)
    assert (case["balance"] > 1e-3) == (case["cfg"]["aux_loss_alpha"] > 0)
    unmasked = model(Tensor(case["ids"]), Tensor(case["labels"])).asnumpy()
    np.testing.assert_allclose(
        unmasked, ref.cross_entropy(case["logits"], case["labels"]) + case["balance"], rtol=1e-5)


def test_tokens_per_expert_of_the_last_forward(case: dict) -> None:
    model, cfg = case["model"], case["cfg"]
    model.logits(Tensor(case["ids"]))
    counts = model.tokens_per_expert()
    moe_layers = list(range(cfg["first_k_dense_replace"], cfg["num_hidden_layers"]))
    assert sorted(counts) == moe_layers == model.moe_layers()
    for layer in moe_layers:
        assert counts[layer].tolist() == case["counts"][layer].tolist()
        assert counts[layer].sum() == case["ids"].size * cfg["num_experts_per_tok"]
    model.logits(Tensor(case["ids"][:1, :4]))      # only the last forward counts
    assert all(c.sum() == 4 * cfg["num_experts_per_tok"]
               for c in model.tokens_per_expert().values())


def _reference_router_gradient(case: dict, element: tuple[int, int], alpha: float) -> float:
    """d loss / d router[element] of layer 1, by central differences of the float64 reference
    (the routing does not change for so small a step)."""
    name, step = "model.layers.1.mlp.gate.weight", 1e-3
    cfg = {**case["cfg"], "aux_loss_alpha": alpha}
    losses = []
    for sign in (1, -1):
        state = dict(case["state"])
        state[name] = state[name].astype(np.float64).copy()
        state[name][element] += sign * step
        logits, balance, _ = ref.forward(state, cfg, case["ids"])
        losses.append(ref.cross_entropy(logits, case["labels"], case["mask"]) + balance)
    return (losses[0] - losses[1]) / (2 * step)


def test_gradients_are_finite_and_the_router_gradient_includes_the_balance_loss(
        case: dict) -> None:
    model = case["model"]
    params = model.trainable_params()
    assert not any("e_score_correction_bias" in p.name for p in params)
    inputs = (Tensor(case["ids"]), Tensor(case["labels"]), Tensor(case["mask"]))
    _, grads = ms.value_and_grad(model, None, params)(*inputs)
    by_name = {p.name: g.asnumpy() for p, g in zip(params, grads, strict=True)}
    assert all(np.isfinite(g).all() for g in by_name.values())
    assert all(g.any() for g in by_name.values()), [n for n, g in by_name.items() if not g.any()]
    router = by_name["decoder_layers.1.mlp.router.weight"]
    alpha = case["cfg"]["aux_loss_alpha"]
    for element in ((0, 0), (1, 3)):
        numeric = _reference_router_gradient(case, element, alpha)
        np.testing.assert_allclose(router[element], numeric, rtol=2e-3, atol=1e-7)
        if alpha:  # the balance loss' share is far above the tolerance: this test can fail
            without = _reference_router_gradient(case, element, 0.0)
            assert abs(numeric - without) > 0.02 * abs(numeric)


# --- layer contract and recompute ----------------------------------------------------------

def _loss_and_grads(model: DeepseekV3ForCausalLM) -> tuple[np.ndarray, list[np.ndarray]]:
    ids, labels, mask = ref.batch(seed=4)
    loss, grads = ms.value_and_grad(model, None, model.trainable_params())(
        Tensor(ids), Tensor(labels), Tensor(mask))
    return loss.asnumpy(), [g.asnumpy() for g in grads]


def test_layer_contract_and_recompute_give_bit_identical_gradients() -> None:
    cfg = ref.PLAIN                      # layer 0 dense, layer 1 MoE
    base = _model(cfg, seed=7)
    assert base.layer_ids == (0, 1) and len(base.decoder_layers) == 2
    for index, layer in enumerate(base.decoder_layers):
        for part in ("input_norm", "attention", "post_norm", "mlp"):
            resolve_module(layer, part, "recompute.select_module", index)
    expected_loss, expected = _loss_and_grads(base)
    configs = {
        "full": RecomputeConfig(mode="full", full_recompute_layer=[LayerSpec.parse("0-1")]),
        "select": RecomputeConfig(mode="select", select_module={
            "attention": [LayerSpec.parse("1")], "mlp": [LayerSpec.parse("0-1")]}),
    }
    for mode, config in configs.items():
        model = _model(cfg, seed=7)
        assert apply_recompute(model, config), mode
        loss, grads = _loss_and_grads(model)
        assert loss == expected_loss, mode
        for got, want in zip(grads, expected, strict=True):
            np.testing.assert_array_equal(got, want, err_msg=mode)


# --- weights and names ---------------------------------------------------------------------

def test_hugging_face_names() -> None:
    lora, plain = _model(ref.LORA).hf_names(), _model(ref.PLAIN).hf_names()
    assert lora["embedding.weight"] == ("model.embed_tokens.weight",)
    assert lora["head.weight"] == ("lm_head.weight",)
    assert lora["final_norm.weight"] == ("model.norm.weight",)
    assert lora["decoder_layers.0.input_norm.weight"] == ("model.layers.0.input_layernorm.weight",)
    assert lora["decoder_layers.2.post_norm.weight"] == (
        "model.layers.2.post_attention_layernorm.weight",)
    assert lora["decoder_layers.1.attention.kv_a_proj_with_mqa.weight"] == (
        "model.layers.1.self_attn.kv_a_proj_with_mqa.weight",)
    assert lora["decoder_layers.0.mlp.gate_up.weight"] == (
        "model.layers.0.mlp.gate_proj.weight", "model.layers.0.mlp.up_proj.weight")
    assert lora["decoder_layers.0.mlp.down.weight"] == ("model.layers.0.mlp.down_proj.weight",)
    assert lora["decoder_layers.1.mlp.router.e_score_correction_bias"] == (
        "model.layers.1.mlp.gate.e_score_correction_bias",)
    assert lora["decoder_layers.2.mlp.experts.3.gate_up.weight"] == (
        "model.layers.2.mlp.experts.3.gate_proj.weight",
        "model.layers.2.mlp.experts.3.up_proj.weight")
    assert lora["decoder_layers.1.mlp.shared_experts.down.weight"] == (
        "model.layers.1.mlp.shared_experts.down_proj.weight",)
    assert "decoder_layers.0.attention.q_a_layernorm.weight" in lora
    assert "decoder_layers.0.attention.q_proj.weight" in plain
    assert "head.weight" not in plain
    for config, names in ((ref.LORA, lora), (ref.PLAIN, plain)):
        hf = sorted(name for parts in names.values() for name in parts)
        assert hf == sorted(set(ref.random_hf_state(config)) - {"lm_head.weight"}
                            if config["tie_word_embeddings"] else ref.random_hf_state(config))
    with pytest.raises(KeyError, match="not a DeepSeek-V3 parameter"):
        hf_parameter_names("decoder_layers.0.feed_forward.weight")


def _stages(cfg: dict) -> list[DeepseekV3ForCausalLM]:
    """Two pipeline stages: layer 0 with the embedding, the other layers with the head."""
    layers = cfg["num_hidden_layers"]
    settings = deepseek_v3_settings(ModelConfig(extras=dict(cfg)))
    return [DeepseekV3ForCausalLM(settings, seed=0, part=part) for part in
            (ModelPart((0,), True, False), ModelPart(tuple(range(1, layers)), False, True))]


@pytest.mark.parametrize("cfg", [ref.LORA, ref.PLAIN], ids=["lora", "plain"])
def test_each_stage_loads_its_share_of_a_whole_hugging_face_checkpoint(cfg: dict) -> None:
    """Strictly: the other stage's weights are not errors; each stage holds the whole
    model's values of its own parameters, and the two stages hold every parameter once (a
    tied table on both). `layer_hf_names` lists a layer's weights as the built model has
    them."""
    state = ref.random_hf_state(cfg, seed=5)
    whole = _model(cfg)
    whole.load_hf_state(state)
    want = {name: p.asnumpy() for name, p in whole.parameters_and_names()}
    stages = _stages(cfg)
    for stage in stages:
        assert isinstance(stage, PipelineModel)
        stage.load_hf_state(state)
        for name, param in stage.parameters_and_names():
            np.testing.assert_array_equal(param.asnumpy(), want[name], err_msg=name)
    held = [set(dict(stage.parameters_and_names())) for stage in stages]
    assert held[0] | held[1] == set(want)
    assert held[0] & held[1] == ({"embedding.weight"} if cfg["tie_word_embeddings"] else set())
    settings = deepseek_v3_settings(ModelConfig(extras=dict(cfg)))
    for layer in range(cfg["num_hidden_layers"]):
        assert sorted(layer_hf_names(settings, layer)) == sorted(
            hf for ours, names in whole.hf_names().items()
            if ours.startswith(f"decoder_layers.{layer}.") for hf in names)


def test_the_pieces_of_two_stages_give_the_whole_models_loss() -> None:
    """embed -> layer 0 on stage 0, layers 1-2 on stage 1, head_loss: the cross-entropy, and
    the two stages' balance losses add up to the whole model's."""
    cfg = ref.LORA
    whole, (first, last) = _model(cfg), _stages(cfg)
    ids, labels, _ = ref.batch()
    ids, labels = Tensor(ids), Tensor(labels)
    hidden, first_balance = first.decoder(first.embed(ids), [0], first.attending(ids))
    hidden, last_balance = last.decoder(hidden, [1, 2], last.attending(ids))
    loss = last.head_loss(hidden, labels, None) + first_balance + last_balance
    assert float(loss.asnumpy()) == pytest.approx(float(whole(ids, labels).asnumpy()), rel=1e-6)
    assert float(first_balance.asnumpy()) == 0.0  # layer 0 is dense
    assert float(last_balance.asnumpy()) > 0.0
    assert first.hidden_spec(2, 16) == ((16, 2, cfg["hidden_size"]), ms.float32)


def test_hf_state_round_trip_and_load_errors() -> None:
    state = ref.random_hf_state(ref.PLAIN, seed=5)
    model = _model(ref.PLAIN)
    model.load_hf_state({**state, "lm_head.weight": state["model.embed_tokens.weight"]})
    back = model.hf_state()
    assert sorted(back) == sorted(state)
    for name, value in state.items():
        np.testing.assert_array_equal(back[name], value, err_msg=name)
    broken = dict(state)
    del broken["model.layers.1.mlp.experts.2.up_proj.weight"]
    broken["model.layers.0.self_attn.kv_b_proj.weight"] = np.zeros((3, 3), np.float32)
    broken["model.layers.5.mlp.gate.weight"] = np.zeros((4, 32), np.float32)
    with pytest.raises(HFWeightsError) as error:
        model.load_hf_state(broken)
    message = str(error.value)
    assert "model.layers.1.mlp.experts.2.up_proj.weight: missing" in message
    assert "model.layers.0.self_attn.kv_b_proj.weight: shape (3, 3)" in message
    assert "model.layers.5.mlp.gate.weight: not a weight" in message


def test_initial_weights_are_seeded_and_follow_hugging_face_init() -> None:
    cfg = {**ref.LORA, "initializer_range": 0.05}
    a, b, c = _model(cfg, seed=1).hf_state(), _model(cfg, seed=1).hf_state(), \
        _model(cfg, seed=2).hf_state()
    assert all((a[name] == b[name]).all() for name in a)
    assert not (a["model.layers.1.mlp.gate.weight"] == c["model.layers.1.mlp.gate.weight"]).all()
    assert (a["model.layers.1.mlp.gate.e_score_correction_bias"] == 0).all()
    assert (a["model.layers.1.self_attn.kv_a_layernorm.weight"] == 1).all()
    weights = np.concatenate([a[name].ravel() for name in a if name.endswith("proj.weight")])
    assert abs(weights.std() - 0.05) < 0.005 and abs(weights.mean()) < 0.005


# --- configuration -------------------------------------------------------------------------

def test_registered_and_built_by_build_model() -> None:
    for name in ("deepseek_v3", "DeepseekV3ForCausalLM"):
        assert MODELS.get(name, ("model", "model_type")) is DeepseekV3ForCausalLM
    model = build_model(ModelConfig(model_type="deepseek_v3", extras=dict(ref.PLAIN)), seed=0)
    assert isinstance(model, DeepseekV3ForCausalLM)


@pytest.mark.parametrize(("key", "value", "message"), [
    ("num_nextn_predict_layers", 1, "multi-token prediction is not implemented"),
    ("mtp_num_layers", 2, "multi-token prediction is not implemented"),
    ("rope_scaling", {"type": "yarn", "factor": 40}, "YaRN) is not implemented"),
    ("num_key_value_heads", 1, "must equal num_attention_heads (2)"),
    ("qk_rope_head_dim", 5, "must be even"),
    ("n_group", 3, "must divide n_routed_experts (4)"),
    ("topk_group", 3, "must be <= n_group (2)"),
    ("num_experts_per_tok", 3, "must be <= topk_group * experts per group (1 * 2)"),
    ("seq_length", 65, "must be <= max_position_embeddings (64)"),
    ("hidden_act", "gelu", "must be one of 'silu'"),
    ("attention_bias", True, "must be one of False"),
    ("scoring_func", "softmax", "must be one of 'sigmoid'"),
    ("topk_method", "greedy", "must be one of 'noaux_tc'"),
    ("seq_aux", False, "must be one of True"),
    ("aux_loss_alpha", -0.1, "must be >= 0"),
    ("moe_router_bias_update_rate", -0.001, "must be >= 0"),
    ("moe_router_bias_update_rate", 2.0, "must be <= 1"),
    ("hidden_szie", 32, "hidden_szie"),
    ("vocab_size", 0, "must be positive"),
    ("hidden_size", 2**31, "must be <= 2147483647"),
])
def test_configuration_errors_name_the_key(key: str, value: object, message: str) -> None:
    extras = {**ref.LORA, key: value}
    if value is None:
        del extras[key]
    with pytest.raises(ConfigError) as error:
        _model(extras)
    text = str(error.value)
    assert f"model.{key}" in text and message in text, text


def test_hugging_face_config_keys_are_accepted() -> None:
    extras = {**ref.LORA, "bos_token_id": 0, "eos_token_id": 1, "torch_dtype": "bfloat16",
              "transformers_version": "4.57.6", "use_cache": True, "pretraining_tp": 1,
              "topk_method": "noaux_tc", "scoring_func": "sigmoid", "seq_aux": True,
              "ep_size": 1, "moe_layer_freq": 1, "num_nextn_predict_layers": 0,
              "rope_scaling": None, "attention_dropout": 0.0, "q_lora_rank": 12}
    assert isinstance(_model(extras), DeepseekV3ForCausalLM)
    assert isinstance(_model({**extras, "rope_scaling": {"rope_type": "default"}}),
                      DeepseekV3ForCausalLM)


class _Group:
    size, rank, sequence_parallel = 2, 0, True


def test_a_tensor_size_that_does_not_divide_the_heads_is_refused() -> None:
    """Before anything starts (validation) and when the model is built; the model builds on
    a tensor group whose size divides every split width."""
    odd = {**ref.LORA, "num_attention_heads": 3, "num_key_value_heads": None}
    with pytest.raises(ConfigError, match=r"model\.num_attention_heads: 3 is not divisible by "
                                          r"parallelism\.tensor_parallel \(2\)"):
        build_parallel_model(ModelConfig(model_type="deepseek_v3", extras=odd),
                             tensor_group=_Group())
    data = {"model": {"model_type": "deepseek_v3", **odd}, "training": {},
            "train_dataset": {"dataloader": {"type": "x"}},
            "parallelism": {"tensor_parallel": 2}}
    with pytest.raises(ConfigError, match=r"model\.num_attention_heads: 3 is not divisible"):
        TrainConfig.from_dict(data)  # when the file is validated, before anything starts
    data["model"] = {"model_type": "deepseek_v3", **ref.LORA}
    TrainConfig.from_dict(data)


def test_hugging_face_sizes_are_the_defaults() -> None:
    """The spec's skeleton gives only the vocabulary, width, layers and heads."""
    settings = deepseek_v3_settings(ModelConfig(extras={}))
    # auxiliary-loss-free balancing is on, at DeepSeek-V3's rate
    assert (settings.moe_router_enable_expert_bias, settings.moe_router_bias_update_rate) == \
        (True, 0.001)
    assert (settings.vocab_size, settings.hidden_size, settings.intermediate_size,
            settings.moe_intermediate_size, settings.num_hidden_layers,
            settings.num_attention_heads, settings.n_routed_experts,
            settings.num_experts_per_tok, settings.kv_lora_rank, settings.qk_nope_head_dim,
            settings.qk_rope_head_dim, settings.v_head_dim) == (
        129280, 7168, 18432, 2048, 61, 128, 256, 8, 512, 128, 64, 128)
    assert (settings.n_group, settings.topk_group, settings.q_lora_rank) == (1, 1, None)


def test_inputs_longer_than_seq_length_are_rejected() -> None:
    model = _model({**ref.PLAIN, "seq_length": 4})
    with pytest.raises(ValueError, match=r"8 tokens is longer than model\.seq_length \(4\)"):
        model.logits(Tensor(ref.batch()[0]))
