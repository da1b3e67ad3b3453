"""Model FLOPs per trained token, from the model's shape: what MFU divides by the peak.

Pure Python (no MindSpore, no numpy): it reads `mf_config.model_shape.ModelShape`, the numbers
the model is built from. The count is that of PaLM's appendix B, torchtitan's
`get_num_flop_per_token` and Megatron-LM's `num_floating_point_operations`: the matrix
multiplications of one token's forward and backward pass in a sequence of `s` tokens,

    flops_per_token = 6 * W  +  6 * L * s * a * (d_qk + d_v)

* `W`, the matmul weights one token goes through: each decoder layer's attention projections
  and MLP (of a mixture of experts only the router, the shared experts and the `k` routed
  experts the token is sent to) and the output head (`h * V`, counted also when it is tied to
  the embedding: it is a matmul all the same). A multiply-add is 2 FLOPs forward and 4
  backward (the gradients of the input and of the weight): 6 per weight. Not counted: the
  embedding lookup, norms, activations, rotary embedding, softmax and the loss (no matmul).
* attention, per layer: the scores of the token's `a` query heads (`d_qk` wide) against the
  sequence's `s` keys, and the weighted sum of `s` values (`d_v` wide), `2 * s * a * (d_qk +
  d_v)` forward and twice that backward. The whole `s x s` score matrix is counted (no halving
  for the causal mask), as PaLM and torchtitan count it and as the attention here computes it
  (Megatron's `--causal` variant halves it).
* Recomputed forwards are not counted: these are model FLOPs (MFU), not hardware FLOPs.

Qwen3 (`a` query and `g` key/value heads of `d`, SwiGLU width `f`), per layer:
`W = h*(a + 2g)*d` (q, k, v) `+ a*d*h` (o) `+ 3*h*f` (gate, up, down); `d_qk = d_v = d`.

DeepSeek-V3 (multi-head latent attention, names of its config), per layer: q `h*a*(dn + dr)`
(with `q_lora_rank` r: `h*r + r*a*(dn + dr)`), `kv_a_proj_with_mqa` `h*(c + dr)` with `c =
kv_lora_rank`, `kv_b_proj` `c*a*(dn + dv)`, o `a*dv*h`; `d_qk = dn + dr`, `d_v = dv`. The first
`first_k_dense_replace` layers have a dense MLP (`3*h*f`); the others a router `h*E` and
`3*h*fe*(k + n_shared_experts)` (`fe = moe_intermediate_size`, `k = num_experts_per_tok`).
Multi-token-prediction layers are not counted (mf-train refuses them).
"""

from __future__ import annotations

from mf_config.model_shape import LatentAttentionShape, ModelShape


def layer_matmul_weights(shape: ModelShape, layer: int) -> int:
    """The matmul weights one token goes through in decoder layer `layer` (0-based).

    Args:
        shape: the model's shape.
        layer: which decoder layer (the first `first_dense_layers` of a mixture-of-experts
            model have a dense MLP).

    Returns:
        The weights of the layer's attention projections and of its MLP as one token uses it
        (of a mixture of experts: the router, the shared and the `k` routed experts).

    Raises:
        ValueError: the shape has latent attention or experts without their numbers.
    """
    return _attention_weights(shape) + _mlp_weights(shape, layer)


def attention_flops_per_token(shape: ModelShape, seq_length: int) -> int:
    """FLOPs of the attention scores and weighted values of one token, forward and backward,
    over every decoder layer: `6 * L * s * a * (d_qk + d_v)`.

    Args:
        shape: the model's shape.
        seq_length: `s`, the training sequence length (the keys each query is scored against).

    Returns:
        The FLOPs, an integer.
    """
    qk, v = _head_dims(shape)
    return 6 * shape.num_layers * seq_length * shape.num_attention_heads * (qk + v)


def matmul_weights_per_token(shape: ModelShape) -> int:
    """`W`: the matmul weights of every decoder layer one token goes through, plus the output
    head (`h * V`).

    Args:
        shape: the model's shape.

    Returns:
        The number of weights.
    """
    layers = sum(layer_matmul_weights(shape, layer) for layer in range(shape.num_layers))
    return layers + shape.hidden_size * shape.vocab_size


def flops_per_token(shape: ModelShape, seq_length: int) -> int:
    """Model FLOPs of training on one token: `6 * W + attention` (see the module docstring).

    Args:
        shape: the model's shape (`mf_config.components.model_shape`).
        seq_length: the training sequence length.

    Returns:
        The FLOPs of one token's forward and backward pass, recompute not counted.

    Raises:
        ValueError: the shape has latent attention or experts without their numbers, or the
            sequence length is not positive.
    """
    if seq_length <= 0:
        raise ValueError(f"seq_length must be positive, got {seq_length}")
    return 6 * matmul_weights_per_token(shape) + attention_flops_per_token(shape, seq_length)


def _head_dims(shape: ModelShape) -> tuple[int, int]:
    """(d_qk, d_v): the widths of a query/key head and of a value head."""
    if shape.latent_attention:
        latent = _latent(shape)
        return latent.qk_nope_head_dim + latent.qk_rope_head_dim, latent.v_head_dim
    return shape.head_dim, shape.head_dim


def _attention_weights(shape: ModelShape) -> int:
    h, a = shape.hidden_size, shape.num_attention_heads
    if not shape.latent_attention:
        d, g = shape.head_dim, shape.num_key_value_heads
        return h * (a + 2 * g) * d + a * d * h
    latent = _latent(shape)
    qk = latent.qk_nope_head_dim + latent.qk_rope_head_dim
    r, c = latent.q_lora_rank, latent.kv_lora_rank
    query = h * a * qk if r is None else h * r + r * a * qk
    keys_values = h * (c + latent.qk_rope_head_dim) + c * a * (latent.qk_nope_head_dim
                                                                + latent.v_head_dim)
    return query + keys_values + a * latent.v_head_dim * h


def _mlp_weights(shape: ModelShape, layer: int) -> int:
    h = shape.hidden_size
    if shape.routed_experts is None:
        return 3 * h * shape.intermediate_size
    experts = shape.experts
    if experts is None:
        raise ValueError("the model has routed experts but its shape does not give their "
                         "numbers (ModelShape.experts): its FLOPs per token are unknown")
    if layer < experts.first_dense_layers:
        return 3 * h * shape.intermediate_size
    active = experts.experts_per_token + experts.shared_experts
    return h * experts.routed_experts + 3 * h * experts.expert_intermediate_size * active


def _latent(shape: ModelShape) -> LatentAttentionShape:
    if shape.latent is None:
        raise ValueError("the model has latent attention but its shape does not give its "
                         "numbers (ModelShape.latent): its FLOPs per token are unknown")
    return shape.latent
