"""The estimator on DeepSeek-V3 (multi-head latent attention, a mixture of experts) against
hand-computed figures for a tiny model, and against the bytes MindSpore saves for it.

The tiny model: V 64, h 16, 2 layers (layer 0 dense with f 24, layer 1 MoE), n 2 heads,
d_nope 4, d_rope 2, d_v 4 (d_qk 6), kv rank r 8, no query compression, E 4 routed experts of
width m 8, top k 2, one shared expert; micro-batch b 2 of S 8 tokens (T 16), float32 (e 4),
CPU (broadcast operands repeated: `Geometry.tiled`).
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

from mf_config import TrainConfig
from mf_memory.estimate import estimate
from mf_memory.model_shape import layer_params, parameter_count, shape_of

MODEL: dict[str, Any] = {
    "model_type": "deepseek_v3", "vocab_size": 64, "hidden_size": 16, "intermediate_size": 24,
    "moe_intermediate_size": 8, "num_hidden_layers": 2, "first_k_dense_replace": 1,
    "num_attention_heads": 2, "n_routed_experts": 4, "num_experts_per_tok": 2,
    "n_shared_experts": 1, "kv_lora_rank": 8, "q_lora_rank": None, "qk_nope_head_dim": 4,
    "qk_rope_head_dim": 2, "v_head_dim": 4, "max_position_embeddings": 8, "seq_length": 8}
BASE: dict[str, Any] = {
    "context": {"device_target": "CPU"},
    "model": MODEL,
    "train_dataset": {"dataloader": {"type": "Mock"}},
    "training": {"local_batch_size": 2, "global_batch_size": 2},
}

# Parameters, one copy.
MLA = (2 * 6 * 16        # q_proj: n (d_nope + d_rope) x h
       + (8 + 2) * 16    # kv_a_proj_with_mqa: (r + d_rope) x h
       + 2 * (4 + 4) * 8  # kv_b_proj: n (d_nope + d_v) x r
       + 16 * 2 * 4      # o_proj: h x n d_v
       + 8)              # kv_a_layernorm: r
NORMS = 2 * 16
DENSE_MLP = 3 * 16 * 24
ROUTER, BIAS = 4 * 16, 4
EXPERTS = 4 * 3 * 16 * 8  # E x (gate, up, down) x h x m
SHARED = 3 * 16 * 8
OUTER = 64 * 16 + 16 + 64 * 16  # embedding, final norm, untied head
DENSE_LAYER = MLA + NORMS + DENSE_MLP
MOE_LAYER = MLA + NORMS + ROUTER + BIAS + EXPERTS + SHARED
PARAMS = DENSE_LAYER + MOE_LAYER + OUTER


def norm(rows: int, width: int, copies: int = 1) -> int:
    """mf-train's RMSNorm, tiled: float32 input (x `copies`), rstd, x̂, repeated rstd and
    weight: bytes."""
    return 4 * ((copies + 3) * rows * width + rows)


T = 16
# Saved activations per layer, bytes (e = 4).
MLA_SAVED = 4 * (
    T * 16          # q_proj input
    + T * 16        # kv_a_proj_with_mqa input
    + T * 8         # kv_b_proj input
    + 2 * T * 2 * 2  # RoPE cos, sin repeated for q: T x n x d_rope
    + 2 * T * 2     # and for the shared k head
    + 2 * T * 2 * 6  # q, k: T x n x d_qk
    + T * 2 * 8     # softmax output: T x n x S
    + 2 * T * 2 * 4  # v and the attention's output (kept by its written-out backward)
    + T * 2 * 4     # o_proj input
) + T * 2 * 8 + norm(T, 8, copies=3)  # causal mask (bool), the latent's norm
DENSE_SAVED = 4 * (T * 16 + 4 * T * 24)  # gate_up input; gate, silu, up, down input
ROWS = T * 2  # T x top k
MOE_SAVED = 4 * (
    T * 16 + 4 * 16 + T * 4  # router: input, transposed weight, sigmoid scores
    + ROWS + T + ROWS       # chosen indices, weights' sum, weights
    + 2 * ROWS              # dispatch permutation out and back
    + ROWS * 16 * 2         # permuted tokens, returned expert outputs
    + ROWS                  # weights in the combine
    + 4 * ROWS * 8          # experts: gate, silu, up, down input over T k rows
    + T * 16 + 4 * T * 8    # shared expert
)
LAYER_0 = 2 * norm(T, 16) + MLA_SAVED + DENSE_SAVED
LAYER_1 = 2 * norm(T, 16) + MLA_SAVED + MOE_SAVED


def config(model: dict[str, Any] | None = None, **sections: dict[str, Any]) -> TrainConfig:
    """BASE with model keys and whole sections changed."""
    data = copy.deepcopy(BASE)
    data["model"].update(model or {})
    data.update(sections)
    return TrainConfig.from_dict(data)


def test_parameters_per_layer_and_in_all() -> None:
    shape = shape_of(config().model)
    assert sum(g.count for g in layer_params(shape, 0)) == DENSE_LAYER == 1800
    assert sum(g.count for g in layer_params(shape, 1)) == MOE_LAYER == 2636
    assert parameter_count(shape) == PARAMS == 6500


def test_parameter_count_matches_the_built_model() -> None:
    pytest.importorskip("mindspore")
    from mf_train.models.deepseek_v3 import DeepseekV3ForCausalLM

    model = DeepseekV3ForCausalLM.from_config(config().model, seed=0)
    assert sum(p.size for p in model.get_parameters()) == PARAMS


def test_one_process_holds_everything() -> None:
    result = estimate(config(), world_size=1)
    assert result.params == 4 * PARAMS
    assert result.grads == 4 * (PARAMS - BIAS)  # the routing bias takes no gradient
    assert result.optimizer == 8 * (PARAMS - BIAS)  # AdamW: two float32 moments
    assert [la.full for la in result.layer_activations] == [LAYER_0, LAYER_1]
    assert (LAYER_0, LAYER_1) == (26_304, 32_640)
    assert result.routed_experts == (4, 4, 1)
    parts = dict(result.activation_parts)
    assert parts["dispatch (tokens to and from the experts)"] == 4 * (2 * ROWS + 2 * ROWS
                                                                         * 16 + ROWS)
    assert parts["routed experts"] == 4 * 4 * ROWS * 8


def test_pipeline_stages_hold_their_layers() -> None:
    """2 stages: stage 0 the embedding and the dense layer 0, stage 1 the MoE layer 1, the
    final norm and the untied head; the built stages hold the same counts."""
    two = config(parallelism={"pipeline_parallel": 2}, training={"local_batch_size": 2,
                                                                 "global_batch_size": 4})
    first, last = (estimate(two, world_size=2, stage=stage) for stage in (0, 1))
    assert first.held_params == DENSE_LAYER + 64 * 16
    assert last.held_params == MOE_LAYER + 16 + 64 * 16
    assert (first.params, last.params) == (4 * first.held_params, 4 * last.held_params)
    assert [la.full for la in last.layer_activations] == [LAYER_1]  # micro-batches of 2
    pytest.importorskip("mindspore")
    from mf_train.models.deepseek_v3 import DeepseekV3ForCausalLM
    from mf_train.models.parts import ModelPart

    for result, part in ((first, ModelPart((0,), True, False)),
                         (last, ModelPart((1,), False, True))):
        model = DeepseekV3ForCausalLM.from_config(two.model, seed=0, part=part)
        assert sum(p.size for p in model.get_parameters()) == result.held_params


def test_query_compression_and_the_balance_loss() -> None:
    result = estimate(config({"q_lora_rank": 4, "aux_loss_alpha": 0.01}), world_size=1)
    q_lora = (4 * 16 + 4 + 2 * 6 * 4) - 2 * 6 * 16  # q_a_proj, its norm, q_b_proj - q_proj
    assert result.parameter_count == PARAMS + 2 * q_lora
    # q_a_proj input T h, its norm over r_q (a view: 3 copies), q_b_proj input T r_q, no
    # q_proj input; the balance loss: scores' sum T, normalised scores T E, fractions b E
    q_saved = 4 * (T * 16 + T * 4) + norm(T, 4, copies=3) - 4 * T * 16
    balance = 4 * (T + T * 4 + 2 * 4)
    assert [la.full for la in result.layer_activations] == [LAYER_0 + q_saved,
                                                           LAYER_1 + q_saved + balance]


def test_expert_parallel_divides_the_routed_experts() -> None:
    two = {"expert_parallel": 2, "data_parallel_shard_strategy": "optim"}
    result = estimate(config(parallelism=two, training={"local_batch_size": 2,
                                                       "global_batch_size": 4}), world_size=2)
    # EP 2 over the 2 data ranks: 2 whole experts each; an expert-data group of one rank
    assert result.routed_experts == (4, 2, 1)
    assert result.params == 4 * (PARAMS - EXPERTS // 2)
    # ZeRO-1: the slices of the rest over 2 ranks (moments and float32 master, 12 B each),
    # the experts whole with their own AdamW (8 B)
    assert result.optimizer == 12 * ((PARAMS - EXPERTS - BIAS) // 2) + 8 * (EXPERTS // 2)
    # each rank's experts see T k rows on average, as in one process; the two exchanges keep
    # the rows they send and receive (4 x T k rows of h), the receiving side's two
    # permutations (T k each, int32) and the row counts (4 ep + 1, int32)
    exchange = 4 * (4 * ROWS * 16) + 4 * 2 * ROWS + 4 * (4 * 2 + 1)
    assert [la.full for la in result.layer_activations] == [LAYER_0, LAYER_1 + exchange]
    dered = estimate(config(parallelism={**two, "moe_token_dispatcher_type":
                                         "alltoall_deredundancy", "npu_nums_per_device": 1},
                            training={"local_batch_size": 2, "global_batch_size": 4}),
                     world_size=2)
    assert dered.layer_activations == result.layer_activations
    assert any("deredundant dispatcher's buffers are estimated as the all-to-all" in w
               for w in dered.warnings)


def test_fsdp_slices_experts_with_their_layer_or_over_their_expert_data_ranks() -> None:
    fsdp = estimate(config(training={"local_batch_size": 2, "global_batch_size": 8}),
                    world_size=4)
    # flat buffers: layer 0, layer 1 with its experts (the routing bias takes no gradient:
    # outside, whole), the embedding and the untied head kept as rows (4 ranks divide the
    # vocabulary of 64), the final norm's root; each rank keeps a quarter of each
    table, norm = 64 * 16, 16
    layer_0, layer_1 = DENSE_LAYER, MOE_LAYER - BIAS
    buffers = [layer_0, layer_1, table, table, norm]
    assert fsdp.routed_experts == (4, 4, 4)
    assert fsdp.params == 4 * (sum(b // 4 for b in buffers) + BIAS)
    # the head's rows and the final norm are reduced as backward starts; layer 1 with its
    # experts once its attention's gradients are there (an expert without tokens then gives
    # zeros), then layer 0, then the embedding's rows
    assert fsdp.grads == 4 * sum(b // 4 for b in buffers) + 4 * max(layer_0, layer_1)
    with_ep = estimate(config(parallelism={"expert_parallel": 2},
                              training={"local_batch_size": 2, "global_batch_size": 8}),
                       world_size=4)
    # 2 experts per rank, FSDP units of their own over the 2-rank expert-data group: a
    # quarter of the experts' parameters on each rank, and their AdamW state (the moments,
    # 8 B per element as the rest's)
    layer_1 = MOE_LAYER - BIAS - EXPERTS
    buffers = [layer_0, layer_1, table, table, norm]
    assert with_ep.routed_experts == (4, 2, 2)
    assert with_ep.params == 4 * (sum(b // 4 for b in buffers) + EXPERTS // 4 + BIAS)
    assert with_ep.optimizer == 8 * sum(b // 4 for b in buffers) + 8 * (EXPERTS // 4)
    # FSDP's backward: everything reduced during it (layer 1, its experts, whole beside it
    # until then, layer 0), and the experts' float32 sums
    assert with_ep.grads == 4 * sum(b // 4 for b in buffers) + 4 * (
        EXPERTS // 2 + max(layer_0, layer_1) + EXPERTS // 4)
    # gathered: the final norm's root, and with layer 1 its experts (2 of them); the tables
    # never
    assert with_ep.gathered_params == 4 * (norm + max(layer_0, layer_1 + EXPERTS // 2))
    # under ZeRO-2 they stay whole between steps, in buffers of their own (moments and a
    # float32 master, 12 B per element of their slices)
    zero = estimate(config(parallelism={"expert_parallel": 2,
                                        "data_parallel_shard_strategy": "optim_grads"},
                           training={"local_batch_size": 2, "global_batch_size": 8}),
                    world_size=4)
    assert zero.params == 4 * (DENSE_LAYER + MOE_LAYER - EXPERTS // 2 + OUTER)
    assert zero.optimizer == 12 * sum(b // 4 for b in buffers) + 12 * (EXPERTS // 4)


def test_tensor_parallel_splits_mla_as_megatron_does() -> None:
    shape = shape_of(config().model)
    by_name = {g.name: g.per_device(tp=2, ep=2) for g in layer_params(shape, 1)}
    assert by_name == {
        "mla.q_proj": 2 * 6 * 16 // 2, "mla.kv_up": 2 * 8 * 8 // 2,
        "mla.out": 16 * 8 // 2,                                   # split by heads
        "mla.kv_down": 10 * 16, "mla.latent_norms": 8, "norms": 32,  # replicated
        "moe.router": 64, "moe.router_bias": 4,                    # replicated
        "moe.experts": EXPERTS // 2,                               # by EP, whole experts
        "moe.shared.gate_up": 2 * 16 * 8 // 2, "moe.shared.down": 8 * 16 // 2}


def test_defaults_are_named_and_a_missing_dense_width_warned() -> None:
    model = {k: v for k, v in MODEL.items() if k not in ("intermediate_size", "kv_lora_rank")}
    data = copy.deepcopy(BASE)
    data["model"] = model
    result = estimate(TrainConfig.from_dict(data), world_size=1)
    assert dict(result.defaulted) == {"kv_lora_rank": 512, "intermediate_size": 18432}
    assert any(w.startswith("model.intermediate_size: not given, but the first 1 layer(s) "
                            "are dense (model.first_k_dense_replace = 1)")
               for w in result.warnings)
    none_dense = estimate(config({"first_k_dense_replace": 0}), world_size=1)
    assert not any("intermediate_size" in w for w in none_dense.warnings)


def test_saved_bytes_match_mindspore_layer_by_layer() -> None:
    ms = pytest.importorskip("mindspore")
    import numpy as np

    from mf_train.models.deepseek_v3 import DeepseekV3ForCausalLM

    ms.set_context(mode=ms.PYNATIVE_MODE)
    ms.set_device("CPU")
    model = DeepseekV3ForCausalLM.from_config(config().model, seed=0)
    params = {p.data_ptr() for p in model.get_parameters()}
    where, saved = ["outside"], {}

    def attributed(index: int, construct: Any) -> Any:
        def run(*inputs: Any) -> Any:
            where[0] = str(index)
            try:
                return construct(*inputs)
            finally:
                where[0] = "outside"
        return run

    for index, layer in enumerate(model.decoder_layers):
        layer.construct = attributed(index, layer.construct)

    def pack(t: Any) -> Any:
        if t.data_ptr() not in params:
            saved.setdefault(where[0], {})[t.data_ptr()] = t.nbytes
        return t

    def forward(ids: Any, labels: Any) -> Any:
        with ms.saved_tensors_hooks(pack, lambda t: t):
            return model(ids, labels)

    rng = np.random.default_rng(0)
    ids, labels = (ms.Tensor(rng.integers(0, 64, (2, 8)).astype(np.int32)) for _ in range(2))
    loss, _ = ms.value_and_grad(forward, None, model.trainable_params())(ids, labels)
    float(loss.asnumpy())
    measured = [sum(saved[str(i)].values()) for i in range(2)]
    assert measured == [LAYER_0, LAYER_1]
