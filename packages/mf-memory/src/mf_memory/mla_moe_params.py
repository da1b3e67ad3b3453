"""Parameters of a DeepSeek-V3 decoder layer: multi-head latent attention, then a dense SwiGLU
(the first `first_k_dense_replace` layers) or a mixture of experts.

How parallelism splits them (Megatron-core's split of MLA and its MoE layer with "ETP 1"):
- MLA: the down projections (`q_a_proj`, `kv_a_proj_with_mqa`) and their RMSNorms are
  replicated over tensor parallelism; the up projections (`q_proj` or `q_b_proj`, `kv_b_proj`)
  are column-parallel (split by heads) and `o_proj` row-parallel;
- dense MLP and shared experts: column-parallel gate/up, row-parallel down;
- router (`gate`) and its routing bias: replicated (the bias is a buffer: no gradient, no
  optimizer state);
- routed experts: split over the expert-parallel ranks, E / ep whole experts on each, not
  split by tensor parallelism.

Notation: h hidden, n heads, d_n / d_r / d_v the per-head nope / rope / value widths,
r the kv compression rank, r_q the query compression rank, f the dense width, m one expert's
width, E routed experts, s shared experts. Pure Python.
"""

from __future__ import annotations

from mf_config.model_shape import ModelShape

from .param_groups import ParamGroup


def latent_attention_params(shape: ModelShape) -> list[ParamGroup]:
    """MLA's parameters.

    q: `q_proj` n·(d_n+d_r)·h, or `q_a_proj` r_q·h, its norm r_q and `q_b_proj`
    n·(d_n+d_r)·r_q; kv: `kv_a_proj_with_mqa` (r+d_r)·h, its norm r, `kv_b_proj`
    n·(d_n+d_v)·r; `o_proj` h·n·d_v.
    """
    lat = shape.latent
    assert lat is not None
    h, n = shape.hidden_size, shape.num_attention_heads
    qk = lat.qk_nope_head_dim + lat.qk_rope_head_dim
    groups = []
    norms = lat.kv_lora_rank
    if lat.q_lora_rank is None:
        groups.append(ParamGroup("mla.q_proj", n * qk * h, sharded=True, matrix=True))
    else:
        norms += lat.q_lora_rank
        groups += [ParamGroup("mla.q_down", lat.q_lora_rank * h, sharded=False,
                              matrix=True),
                   ParamGroup("mla.q_up", n * qk * lat.q_lora_rank, sharded=True,
                              matrix=True)]
    return [
        *groups,
        ParamGroup("mla.kv_down", (lat.kv_lora_rank + lat.qk_rope_head_dim) * h,
                   sharded=False, matrix=True),
        ParamGroup("mla.kv_up", n * (lat.qk_nope_head_dim + lat.v_head_dim)
                   * lat.kv_lora_rank, sharded=True, matrix=True),
        ParamGroup("mla.out", h * n * lat.v_head_dim, sharded=True, matrix=True),
        ParamGroup("mla.latent_norms", norms, sharded=False, matrix=False),
    ]


def swiglu_params(name: str, hidden: int, width: int) -> list[ParamGroup]:
    """A tensor-parallel SwiGLU: gate and up h·width each, down width·h."""
    return [ParamGroup(f"{name}.gate_up", 2 * hidden * width, sharded=True, matrix=True),
            ParamGroup(f"{name}.down", width * hidden, sharded=True, matrix=True)]


def moe_params(shape: ModelShape) -> list[ParamGroup]:
    """A mixture of experts: router E·h and routing bias E (replicated), routed experts
    E·3·h·m (split by expert parallelism), shared experts one SwiGLU of width s·m."""
    moe = shape.experts
    assert moe is not None
    h, e, m = shape.hidden_size, moe.routed_experts, moe.expert_intermediate_size
    groups = [ParamGroup("moe.router", e * h, sharded=False, matrix=True),
              ParamGroup("moe.router_bias", e, sharded=False, matrix=False, trainable=False),
              ParamGroup("moe.experts", e * 3 * h * m, sharded=False, matrix=True, expert=True)]
    if moe.shared_experts:
        groups += swiglu_params("moe.shared", h, moe.shared_experts * m)
    return groups


def latent_layer_params(shape: ModelShape, layer: int) -> list[ParamGroup]:
    """Decoder layer `layer`: MLA, two RMSNorms 2h (replicated), and a dense SwiGLU of
    `intermediate_size` before `first_k_dense_replace`, a mixture of experts from there."""
    moe = shape.experts
    mlp = (moe_params(shape) if moe is not None and layer >= moe.first_dense_layers
           else swiglu_params("mlp", shape.hidden_size, shape.intermediate_size))
    return [*latent_attention_params(shape),
            ParamGroup("norms", 2 * shape.hidden_size, sharded=False, matrix=False), *mlp]
