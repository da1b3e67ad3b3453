"""Weight-decay groups, Muon's routing, and the configuration errors of the optimizers."""

from __future__ import annotations

import logging
import warnings

import mindspore as ms
import numpy as np
import pytest
from mindspore import Parameter, Tensor

from mf_config import ConfigError, OptimizerConfig, TrainConfig
from mf_config.converter import converter
from mf_config.yaml_source import load_text
from mf_train.optim import AdamW, Muon, build_optimizer, gets_weight_decay, rule_matches
from mf_train.optim.muon import MuonSettings, ns_schedule
from mf_train.preflight.support import support_issues
from mf_train.preflight.support_rules import Target
from mf_train.registry import OPTIMIZERS

ms.set_context(mode=ms.PYNATIVE_MODE)

NAMES = {"model.embed_tokens.weight": (16, 8), "model.layers.0.self_attn.qkv.weight": (24, 8),
         "model.layers.0.self_attn.qkv.bias": (24,), "model.layers.0.mlp.down.weight": (8, 16),
         "model.layers.0.input_norm.weight": (8,), "model.norm.weight": (8,),
         "lm_head.weight": (16, 8), "router.bias": (4, 2)}


def named_params() -> list[tuple[str, Parameter]]:
    return [(name, Parameter(Tensor(np.zeros(shape, np.float32)), name=name))
            for name, shape in NAMES.items()]


def errors(info: pytest.ExceptionInfo) -> list[str]:
    return [str(issue) for issue in info.value.errors]


# ----- rules -----

def test_a_rule_matches_equal_substring_or_pattern() -> None:
    assert rule_matches("lm_head.weight", "lm_head.weight")
    assert rule_matches("model.layers.0.input_norm.weight", "norm")
    assert rule_matches("model.layers.3.mlp.down.weight", "model.layers.*.down.*")
    assert rule_matches("model.layers.3.mlp.down.weight", "*.layers.[0-3].*")
    assert not rule_matches("model.layers.3.mlp.down.weight", "model.layers.*.up.*")
    assert not rule_matches("model.norm.weight", "Norm")  # case-sensitive everywhere
    assert not rule_matches("model.norm.weight", "layers.*")  # a pattern matches the whole name


def test_weight_decay_defaults_spare_1d_parameters_and_biases() -> None:
    assert gets_weight_decay("w", 2)
    assert not gets_weight_decay("norm.weight", 1)
    assert not gets_weight_decay("router.bias", 2)  # 2-D, but a bias by name
    assert gets_weight_decay("scalar", 0)  # MindFormers spares exactly the 1-D ones


def test_include_beats_exclude_beats_defaults() -> None:
    assert not gets_weight_decay("model.embed_tokens.weight", 2, exclude=["embed"])
    assert gets_weight_decay("model.embed_tokens.weight", 2, include=["embed_tokens"],
                             exclude=["embed"])
    assert gets_weight_decay("model.norm.weight", 1, include=["model.norm.weight"])
    assert gets_weight_decay("x.bias", 1, include=["*.bias"], exclude=["x.bias"])


def test_groups_summary_follows_the_configured_rules() -> None:
    config = OptimizerConfig(weight_decay=0.1, weight_decay_include=["model.norm.weight"],
                             weight_decay_exclude=["embed", "lm_head.*"])
    summary = build_optimizer(config, named_params()).groups_summary()
    assert summary == {
        "weight_decay": ["model.layers.0.self_attn.qkv.weight", "model.layers.0.mlp.down.weight",
                         "model.norm.weight"],
        "no_weight_decay": ["model.embed_tokens.weight", "model.layers.0.self_attn.qkv.bias",
                            "model.layers.0.input_norm.weight", "lm_head.weight",
                            "router.bias"]}


def test_decay_groups_get_the_configured_decay_and_others_none() -> None:
    opt = build_optimizer(OptimizerConfig(weight_decay=0.25), named_params())
    decay = dict(zip(opt.names, opt.weight_decays, strict=True))
    assert decay["model.layers.0.mlp.down.weight"] == 0.25
    assert decay["model.norm.weight"] == 0.0
    assert decay["router.bias"] == 0.0


def test_a_rule_that_matches_nothing_warns(caplog: pytest.LogCaptureFixture) -> None:
    config = OptimizerConfig(weight_decay_exclude=["norm", "nrom"])
    with caplog.at_level(logging.WARNING, logger="mf_train.optim"):
        build_optimizer(config, named_params())
    assert [(record.levelname, record.getMessage()) for record in caplog.records] == [
        ("WARNING", "optimizer.weight_decay_exclude: ['nrom'] match no parameter name")]


def test_an_empty_rule_is_an_error() -> None:
    with pytest.raises(ConfigError) as info:
        build_optimizer(OptimizerConfig(weight_decay_include=["bias", ""]), named_params())
    assert errors(info) == ["<config>: optimizer.weight_decay_include[1]: an empty rule matches "
                            "every parameter name; give a name, a part of one, or a pattern "
                            "such as '*.norm.weight'"]


# ----- Muon routing -----

def test_muon_takes_hidden_matrices_and_adamw_the_rest() -> None:
    summary = build_optimizer(OptimizerConfig(type="Muon"), named_params()).groups_summary()
    assert summary["muon"] == ["model.layers.0.self_attn.qkv.weight",
                               "model.layers.0.mlp.down.weight", "router.bias"]
    assert summary["adamw"] == ["model.embed_tokens.weight", "model.layers.0.self_attn.qkv.bias",
                                "model.layers.0.input_norm.weight", "model.norm.weight",
                                "lm_head.weight"]


def test_muon_adamw_include_is_configurable() -> None:
    config = OptimizerConfig(type="muon", extras={"adamw_include": ["*.down.*"]})
    summary = build_optimizer(config, named_params()).groups_summary()
    assert "model.layers.0.mlp.down.weight" in summary["adamw"]
    assert "model.embed_tokens.weight" in summary["muon"]


def test_muon_adamw_betas_and_eps_default_to_the_section_and_can_be_overridden() -> None:
    plain = build_optimizer(OptimizerConfig(type="Muon", betas=[0.8, 0.9], eps=1e-6),
                            named_params())
    assert (plain.moments.betas, plain.moments.eps) == ((0.8, 0.9), 1e-6)
    config = OptimizerConfig(type="Muon", extras={"adamw_betas": [0.95, 0.95],
                                                  "adamw_eps": 1e-7})
    custom = build_optimizer(config, named_params())
    assert (custom.moments.betas, custom.moments.eps) == ((0.95, 0.95), 1e-7)


def test_ns_coefficients_accept_a_triple_or_segments() -> None:
    assert ns_schedule(MuonSettings(ns_steps=2, ns_coefficients=[1, 2, 3]), set()) == (
        (1.0, 2.0, 3.0), (1.0, 2.0, 3.0))
    segmented = MuonSettings(ns_coefficients=[[[3.4445, -4.775, 2.0315], 2], [[2, -1.5, 0.5], 1]])
    assert ns_schedule(segmented, set()) == ((3.4445, -4.775, 2.0315), (3.4445, -4.775, 2.0315),
                                             (2.0, -1.5, 0.5))


# ----- configuration errors -----

def test_registry_resolves_names_and_aliases() -> None:
    assert OPTIMIZERS.get("AdamW", ("optimizer", "type")) is AdamW
    assert OPTIMIZERS.get("adamw", ("optimizer", "type")) is AdamW
    assert OPTIMIZERS.get("Muon", ("optimizer", "type")) is Muon
    assert OPTIMIZERS.get("muon", ("optimizer", "type")) is Muon


def test_unknown_optimizer_type() -> None:
    with pytest.raises(ConfigError) as info:
        build_optimizer(OptimizerConfig(type="Lion"), named_params())
    assert errors(info) == ["<config>: optimizer.type: unknown optimizer type 'Lion'; "
                            "registered: AdamW, Muon, adamw, muon; or give a 'module:Class' path"]


def test_adamw_takes_no_extra_settings() -> None:
    config = OptimizerConfig(extras={"amsgrad": True, "use_fused": True})
    with pytest.raises(ConfigError) as info:
        build_optimizer(config, named_params())
    allowed = "type, betas, eps, weight_decay, weight_decay_include, weight_decay_exclude"
    assert errors(info) == [
        f"<config>: optimizer.amsgrad: Unknown configuration keys for optimizer type 'AdamW': "
        f"['amsgrad']; allowed keys: {allowed}",
        f"<config>: optimizer.use_fused: Unknown configuration keys for optimizer type 'AdamW': "
        f"['use_fused']; allowed keys: {allowed}"]


@pytest.mark.parametrize("betas", [[0.9], [0.9, 1.0], [-0.1, 0.9], [0.9, 0.95, 0.99]])
def test_betas_must_be_two_numbers_in_0_1(betas) -> None:
    with pytest.raises(ConfigError) as info:
        build_optimizer(OptimizerConfig(betas=betas), named_params())
    assert errors(info) == [f"<config>: optimizer.betas: must be two numbers [beta1, beta2], "
                            f"each >= 0 and < 1, got {betas}"]


@pytest.mark.parametrize(("extras", "expected"), [
    ({"momentum": 1.5}, "optimizer.momentum: must be <= 1, got 1.5"),
    ({"ns_steps": 0}, "optimizer.ns_steps: must be positive, got 0"),
    ({"nesterov": "yes"}, "optimizer.nesterov: expected true or false, got 'yes' (a string)"),
    ({"matched_adamw_rms": 0}, "optimizer.matched_adamw_rms: must be positive, got 0.0"),
    ({"adamw_betas": [0.9]}, "optimizer.adamw_betas: must be two numbers [beta1, beta2], each "
                             ">= 0 and < 1, got [0.9]"),
    ({"ns_coefficients": [1, 2]}, "optimizer.ns_coefficients: expected three numbers [a, b, c], "
                                  "or segments [[[a, b, c], count], ...] with counts >= 1"),
    ({"ns_coefficients": [[[1, 2, 3], 2]], "ns_steps": 5},
     "optimizer.ns_steps: is 5 but the ns_coefficients segments add up to 2 steps"),
    ({"adamw_include": ["lm_head", ""]}, "optimizer.adamw_include[1]: an empty rule matches every "
                                         "parameter name; give a name, a part of one, or a "
                                         "pattern such as '*.norm.weight'"),
])
def test_muon_setting_errors(extras, expected) -> None:
    with pytest.raises(ConfigError) as info:
        build_optimizer(OptimizerConfig(type="Muon", extras=extras), named_params())
    assert errors(info) == [f"<config>: {expected}"]


def test_muon_rejects_unknown_keys_with_the_allowed_list() -> None:
    with pytest.raises(ConfigError) as info:
        build_optimizer(OptimizerConfig(type="Muon", extras={"comm_strategy": "allgather"}),
                        named_params())
    (message,) = errors(info)
    assert message.startswith("<config>: optimizer.comm_strategy: Unknown configuration keys")
    assert "momentum, nesterov, ns_steps" in message


def test_qk_clip_threshold_without_qk_clip_is_said_to_have_no_effect() -> None:
    config = OptimizerConfig(type="Muon", extras={"qk_clip_threshold": 100})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        build_optimizer(config, named_params())
    train = TrainConfig.from_dict({"model": {"model_type": "x"}, "training": {},
                                   "train_dataset": {"dataloader": {"type": "x"}},
                                   "optimizer": {"type": "Muon", "qk_clip_threshold": 100}})
    assert [str(issue) for issue in support_issues(Target(train))] == [
        "<config>: optimizer.qk_clip_threshold: warning: has no effect: "
        "optimizer.qk_clip_enabled is false"]


def test_errors_carry_the_yaml_line() -> None:
    source = load_text("optimizer:\n  type: Muon\n  betas: [0.9, 0.95]\n  momentum: 2\n",
                       "train.yaml")
    config = converter.structure(source.data["optimizer"], OptimizerConfig)
    with pytest.raises(ConfigError) as info:
        build_optimizer(config, named_params(), source)
    assert errors(info) == ["train.yaml:4: optimizer.momentum: must be <= 1, got 2.0"]
