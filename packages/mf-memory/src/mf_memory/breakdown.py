"""What a memory estimate is made of, in the words a user reads: parameters and activations by
part of the model (routed experts, dispatch, MLA, ...), and the model settings the estimate
took from defaults because the config does not write them. Pure Python.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from mf_config import ModelConfig
from mf_config.model_shape import ModelShape

from .param_groups import ParamGroup
from .saved import Saved

PARAMETER_PARTS = (  # (name prefix, label), first match wins; printed in this order
    ("mla.", "MLA (latent attention)"), ("attention.", "attention"),
    ("mlp.", "dense MLP"), ("moe.router", "router"), ("moe.experts", "routed experts"),
    ("moe.shared", "shared experts"), ("", "embedding, head and norms"))
ACTIVATION_PARTS = (
    ("mla.", "MLA (latent attention)"), ("attention.", "attention"),
    ("mlp.", "dense MLP"), ("router.", "router"), ("balance_loss.", "router"),
    ("dispatch.", "dispatch (tokens to and from the experts)"),
    ("experts.", "routed experts"), ("shared_experts.", "shared experts"),
    ("", "norms"))


def _label(name: str, parts: tuple[tuple[str, str], ...]) -> str:
    return next(label for prefix, label in parts if name.startswith(prefix))


def _by_label(items: Iterable[tuple[str, int]], parts: tuple[tuple[str, str], ...]
              ) -> tuple[tuple[str, int], ...]:
    """Sum (label, bytes) pairs per label, in the order of `parts`, dropping zeros."""
    sums = dict.fromkeys((label for _, label in parts), 0)
    for label, nbytes in items:
        sums[label] += nbytes
    return tuple((label, nbytes) for label, nbytes in sums.items() if nbytes)


def parameter_parts(groups: list[ParamGroup], held: Callable[[list[ParamGroup]], int]
                    ) -> tuple[tuple[str, int], ...]:
    """Parameter bytes one device holds, by part of the model.

    Args:
        groups: the stage's parameter groups.
        held: bytes a device holds of some groups (after tensor/expert parallel splits and
            the FSDP slicing that applies).

    Returns:
        (label, bytes) per part, in model order.
    """
    return _by_label(((_label(g.name, PARAMETER_PARTS), held([g])) for g in groups),
                     PARAMETER_PARTS)


def activation_parts(tensors: Iterable[Saved]) -> tuple[tuple[str, int], ...]:
    """Saved-activation bytes by part of the model (one micro-batch, before recompute/swap)."""
    return _by_label(((_label(s.name, ACTIVATION_PARTS), s.bytes) for s in tensors),
                     ACTIVATION_PARTS)


LATENT_MOE_FIELDS: dict[str, Callable[[ModelShape], object]] = {
    "n_routed_experts": lambda s: s.experts and s.experts.routed_experts,
    "num_experts_per_tok": lambda s: s.experts and s.experts.experts_per_token,
    "moe_intermediate_size": lambda s: s.experts and s.experts.expert_intermediate_size,
    "n_shared_experts": lambda s: s.experts and s.experts.shared_experts,
    "first_k_dense_replace": lambda s: s.experts and s.experts.first_dense_layers,
    "kv_lora_rank": lambda s: s.latent and s.latent.kv_lora_rank,
    "q_lora_rank": lambda s: s.latent and s.latent.q_lora_rank,
    "qk_nope_head_dim": lambda s: s.latent and s.latent.qk_nope_head_dim,
    "qk_rope_head_dim": lambda s: s.latent and s.latent.qk_rope_head_dim,
    "v_head_dim": lambda s: s.latent and s.latent.v_head_dim,
}
"""The MoE and MLA keys of the `model` section (Hugging Face's DeepseekV3Config names) and
where the shape holds each."""


def defaulted_fields(model: ModelConfig, shape: ModelShape) -> tuple[tuple[str, object], ...]:
    """The MoE/MLA keys (and `intermediate_size`, when dense layers use it) the config does
    not write, with the value the model's settings default them to.

    Args:
        model: the `model` section as written.
        shape: the shape its settings computed.

    Returns:
        (key, value) for each key taken from the defaults; empty for a model without experts
        or latent attention.
    """
    if shape.experts is None and shape.latent is None:
        return ()
    found = [(key, value(shape)) for key, value in LATENT_MOE_FIELDS.items()
             if key not in model.extras]
    dense = shape.experts is None or shape.experts.first_dense_layers > 0
    if dense and "intermediate_size" not in model.extras:
        found.append(("intermediate_size", shape.intermediate_size))
    return tuple(found)


def dense_width_warning(model: ModelConfig, shape: ModelShape) -> str | None:
    """A warning naming `model.intermediate_size` when dense layers exist in a mixture-of-
    experts model but the config does not give their width (so a default is estimated)."""
    moe = shape.experts
    if moe is None or moe.first_dense_layers == 0 or "intermediate_size" in model.extras:
        return None
    source = "" if "first_k_dense_replace" in model.extras else ", by default"
    return (f"model.intermediate_size: not given, but the first {moe.first_dense_layers} "
            f"layer(s) are dense (model.first_k_dense_replace = {moe.first_dense_layers}"
            f"{source}); their MLP is estimated at the default width "
            f"{shape.intermediate_size}: write model.intermediate_size (or set "
            f"first_k_dense_replace: 0) to estimate the model you mean")
