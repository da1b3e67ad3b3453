"""The model an estimate is about: its shape, from the model's own typed settings, and its
parameters.

The shape is `mf_config.model_shape.ModelShape`, computed by the settings class the model's
package declares (for Qwen3, mf-train's `Qwen3Settings`; for DeepSeek-V3 `DeepseekV3Settings`):
the same defaults the model is built with. Dense decoders with grouped-query attention are
modelled, and DeepSeek-V3's layers (multi-head latent attention, a mixture of experts after
`first_k_dense_replace` dense layers: `mla_moe_params`). Pure Python.
"""

from __future__ import annotations

from mf_config import ConfigError, ModelConfig
from mf_config.components import declared_types, model_shape, model_type_name
from mf_config.model_shape import ModelShape

from .mla_moe_params import latent_layer_params
from .param_groups import ParamGroup


class EstimateError(ValueError):
    """The config lacks what the estimate needs, or asks for what it cannot model; says which."""


def shape_of(model: ModelConfig) -> ModelShape:
    """The model's shape; `EstimateError` when its type has no declared settings, or it has
    mixture-of-experts / latent-attention layers without giving their numbers."""
    try:
        shape = model_shape(model)
    except ConfigError as exc:
        raise EstimateError(str(exc)) from None
    if shape is None:
        known = ", ".join(declared_types("models")) or "none (install mf-train)"
        raise EstimateError(f"model: no installed package declares the settings of model type "
                            f"{model_type_name(model)!r}, so its shape is unknown; declared: "
                            f"{known}")
    if ((shape.routed_experts is not None and shape.experts is None)
            or (shape.latent_attention and shape.latent is None)):
        raise EstimateError(f"model: {model_type_name(model)!r} has mixture-of-experts / "
                            "multi-head latent attention layers but its settings do not give "
                            "their numbers (ModelShape.experts / .latent), so the estimator "
                            "cannot model them")
    return shape


def is_moe_layer(shape: ModelShape, layer: int) -> bool:
    """Whether decoder layer `layer` has a mixture of experts (after the dense ones)."""
    return shape.experts is not None and layer >= shape.experts.first_dense_layers


def layer_params(shape: ModelShape, layer: int = 0) -> list[ParamGroup]:
    """Decoder layer `layer`'s parameters: DeepSeek-V3's (`mla_moe_params.latent_layer_params`)
    for a latent-attention model, else a dense layer's:

    attention: q h·a·d, k and v h·g·d each, o a·d·h (sharded by heads); q/k norms d each
    (replicated); two RMSNorms h each (replicated); MLP gate and up h·f each, down f·h (sharded).
    """
    if shape.latent is not None:
        return latent_layer_params(shape, layer)
    h, d, f = shape.hidden_size, shape.head_dim, shape.intermediate_size
    a, g = shape.num_attention_heads, shape.num_key_value_heads
    groups = [
        ParamGroup("attention.qkv", h * (a + 2 * g) * d, sharded=True, matrix=True),
        ParamGroup("attention.out", a * d * h, sharded=True, matrix=True),
        ParamGroup("norms", 2 * h, sharded=False, matrix=False),
        ParamGroup("mlp.gate_up", 2 * h * f, sharded=True, matrix=True),
        ParamGroup("mlp.down", f * h, sharded=True, matrix=True),
    ]
    if shape.qk_norm:
        groups.append(ParamGroup("attention.qk_norm", 2 * d, sharded=False, matrix=False))
    return groups


def embedding_params(shape: ModelShape) -> list[ParamGroup]:
    """The first stage's extra: the embedding table V·h, split over the vocabulary."""
    return [ParamGroup("embedding", shape.vocab_size * shape.hidden_size, sharded=True,
                       matrix=False)]


def output_params(shape: ModelShape, shares_embedding_stage: bool) -> list[ParamGroup]:
    """The last stage's extra: final norm h (replicated) and head V·h (vocabulary-split).

    A tied head reuses the embedding table, so it costs nothing when the embedding is on the
    same stage; on a different stage (pipeline parallelism) the last stage holds a copy.
    """
    groups = [ParamGroup("final_norm", shape.hidden_size, sharded=False, matrix=False)]
    if not shape.tie_word_embeddings or not shares_embedding_stage:
        groups.append(ParamGroup("head", shape.vocab_size * shape.hidden_size, sharded=True,
                                 matrix=False))
    return groups


def parameter_count(shape: ModelShape) -> int:
    """All parameters of the model (one copy, no parallelism)."""
    groups = ([g for layer in range(shape.num_layers) for g in layer_params(shape, layer)]
              + embedding_params(shape) + output_params(shape, shares_embedding_stage=True))
    return sum(group.count for group in groups)


