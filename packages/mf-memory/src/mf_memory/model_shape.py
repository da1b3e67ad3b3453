"""The model an estimate is about: its shape and its parameters, from the `model` section.

A Qwen3-style dense decoder given by its Hugging Face structure fields (`vocab_size`,
`hidden_size`, `intermediate_size`, `num_hidden_layers`, `num_attention_heads`,
`num_key_value_heads`, `head_dim`, `tie_word_embeddings`); MoE/MLA fields are refused for now.
Pure Python.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mf_config import ModelConfig

MOE_FIELDS = ("n_routed_experts", "num_experts", "moe_intermediate_size", "kv_lora_rank",
              "q_lora_rank", "first_k_dense_replace")



class EstimateError(ValueError):
    """The config lacks what the estimate needs, or asks for what it cannot model; says which."""


# ----------------------------------------------------------------------------- the model


@dataclass(frozen=True)
class ModelShape:
    """Structure numbers of a dense decoder (Hugging Face field names)."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    tie_word_embeddings: bool = False
    qk_norm: bool = True

    @classmethod
    def from_config(cls, model: ModelConfig) -> ModelShape:
        """Read the structure fields; `EstimateError` names a missing field or a MoE/MLA one."""
        moe = [name for name in MOE_FIELDS if model.get(name) not in (None, 0)]
        if moe:
            raise EstimateError(
                f"model.{moe[0]}: mixture-of-experts / multi-head latent attention models "
                f"(fields {', '.join('model.' + n for n in moe)}) are not supported yet; the "
                "estimator models dense Qwen3-style decoders")
        sizes = {name: _count(model, name) for name in
                 ("vocab_size", "hidden_size", "intermediate_size", "num_attention_heads")}
        layers = model.get("num_hidden_layers", model.get("num_layers"))
        if not is_positive(layers):
            raise EstimateError("model.num_hidden_layers: required (a positive integer), "
                                f"got {layers!r}")
        heads = sizes["num_attention_heads"]
        kv_heads = model.get("num_key_value_heads", heads)
        head_dim = model.get("head_dim", sizes["hidden_size"] // heads)
        for name, value in (("num_key_value_heads", kv_heads), ("head_dim", head_dim)):
            if not is_positive(value):
                raise EstimateError(f"model.{name}: must be a positive integer, got {value!r}")
        if heads % kv_heads:
            raise EstimateError(f"model.num_key_value_heads ({kv_heads}) must divide "
                                f"model.num_attention_heads ({heads})")
        return cls(vocab_size=sizes["vocab_size"], hidden_size=sizes["hidden_size"],
                   intermediate_size=sizes["intermediate_size"], num_layers=layers,
                   num_heads=heads, num_kv_heads=kv_heads, head_dim=head_dim,
                   tie_word_embeddings=bool(model.get("tie_word_embeddings", False)),
                   qk_norm=bool(model.get("qk_layernorm", model.get("qk_norm", True))))


def is_positive(value: Any) -> bool:
    return type(value) is int and value > 0


def _count(model: ModelConfig, name: str) -> int:
    value = model.get(name)
    if not is_positive(value):
        raise EstimateError(f"model.{name}: required (a positive integer), got {value!r}")
    return value


@dataclass(frozen=True)
class ParamGroup:
    """Parameters of one kind on one device: `sharded` ones are split by tensor parallelism."""

    name: str
    count: int
    sharded: bool
    matrix: bool
    """A hidden 2-D weight (Muon updates these; embeddings, head and norms use AdamW)."""

    def per_device(self, tp: int) -> int:
        """`count / tp` for sharded groups (rounded up), `count` for replicated ones."""
        return -(-self.count // tp) if self.sharded else self.count


def layer_params(shape: ModelShape) -> list[ParamGroup]:
    """One decoder layer's parameters.

    attention: q h·a·d, k and v h·g·d each, o a·d·h (sharded by heads); q/k norms d each
    (replicated); two RMSNorms h each (replicated); MLP gate and up h·f each, down f·h (sharded).
    """
    h, d, f = shape.hidden_size, shape.head_dim, shape.intermediate_size
    a, g = shape.num_heads, shape.num_kv_heads
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
    groups = (layer_params(shape) * shape.num_layers + embedding_params(shape)
              + output_params(shape, shares_embedding_stage=True))
    return sum(group.count for group in groups)


