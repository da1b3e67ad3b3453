"""The activations a DeepSeek-V3 decoder layer keeps for backward, tensor by tensor: multi-head
latent attention (MLA), then a dense SwiGLU or a mixture of experts (see `estimate` for the
notation; here also n heads, d_n / d_r / d_v the per-head nope / rope / value widths,
d_qk = d_n + d_r, r the kv compression rank, r_q the query one, E routed experts, k experts
per token, m an expert's width, f_s the shared experts' width).

What is listed is what MindSpore's PyNative autograd keeps for mf-train's DeepSeek-V3
(`mf_train.models.mla`, `moe`, `blocks`), listed with `mindspore.saved_tensors_hooks` and
attributed to source lines (benchmarks/memory_estimate_check.py checks the sum layer by
layer): a linear keeps its input (a fresh 2-D copy per linear), a product keeps the other
operand, softmax and sigmoid their output, a gather its indices.

Two things depend on the backend (`Geometry.tiled`, true on CPU): mf-train repeats the
broadcast operand of an element-wise product to the full shape there (`blocks.expand`), so the
RMSNorms keep their repeated rstd and weight and RoPE its repeated cos and sin tables, and the
causal mask is a full b·(n/t)·s·S boolean; elsewhere those are small constants.

Parallelism (Megatron-core's layout): with tensor parallelism t the down projections run on
the sequence-parallel shard T_sp, the up projections and attention on the gathered T tokens
and n/t heads; the mixture of experts takes the T_sp tokens, whose k routed copies each go to
one expert: with E/ep experts on each of ep ranks and balanced routing, a rank's experts see
T_sp·k rows on average whatever ep is (every rank sends its T_sp·k rows and receives as
many). Shared experts are tensor-parallel SwiGLUs on the gathered T tokens.
Pure Python.
"""

from __future__ import annotations

from mf_config.model_shape import ModelShape

from .saved import Geometry, Saved

INDEX_BYTES = 4
FLOAT32 = 4


def rms_norm_tensors(prefix: str, module: str, rows: int, width: int, geo: Geometry,
                     input_copies: int = 1) -> list[Saved]:
    """mf-train's RMSNorm (float32 inside, `blocks.RMSNorm`): the float32 input (x·x keeps it),
    rstd (rows, float32) and the normalised x̂ in the compute dtype (the weight product keeps
    it); tiled, also rstd repeated to rows·width (float32) and the weight repeated (compute
    dtype). `input_copies`: an input that is a view, in float32 (where the cast to float32
    is no copy), is copied by each of the three products that keep it (measured on MLA's
    latent norms)."""
    e = geo.act_bytes
    saved = [Saved(f"{prefix}.input", module, input_copies * rows * width, FLOAT32),
             Saved(f"{prefix}.rstd", module, rows, FLOAT32),
             Saved(f"{prefix}.normalized", module, rows * width, e)]
    if geo.tiled:
        saved += [Saved(f"{prefix}.rstd_repeated", module, rows * width, FLOAT32),
                  Saved(f"{prefix}.weight_repeated", module, rows * width, e)]
    return saved


def latent_attention_tensors(shape: ModelShape, geo: Geometry) -> list[Saved]:
    """MLA internals, per micro-batch (n/t heads on T tokens):

    - queries: `q_proj` input T·h; or `q_a_proj` input T_sp·h, its RMSNorm over r_q, `q_b_proj`
      input T·r_q;
    - keys/values: `kv_a_proj_with_mqa` input T_sp·h; the latent's RMSNorm over r; `kv_b_proj`
      input T·r. Both latent norms take a view (a linear's reshaped output, a slice of it),
      which each of the norm's three products keeping it copies in float32
      (`rms_norm_tensors`);
    - RoPE (tiled): cos and sin repeated for q, T·(n/t)·d_r each, and for the one shared k
      head, T·d_r each;
    - plain attention (mf-train's `SoftmaxAttention`, whose written-out backward keeps its
      inputs and outputs): q and k T·(n/t)·d_qk each, the causal mask (bytes) and the
      softmax output in float32 b·(n/t)·s·S each, v and the output T·(n/t)·d_v each;
    - flash attention: q, k and v (v zero-padded to d_qk when d_v differs) T·(n/t)·d_qk each,
      the softmax statistics T·(n/t) float32, and the padded output when padded;
    - `o_proj` input (the attention output) T·(n/t)·d_v.
    """
    lat = shape.latent
    assert lat is not None
    e, T, T_sp, h = geo.act_bytes, geo.tokens, geo.sp_tokens, shape.hidden_size
    n = shape.num_attention_heads // geo.tp
    qk, rope, dv = lat.qk_nope_head_dim + lat.qk_rope_head_dim, lat.qk_rope_head_dim, \
        lat.v_head_dim
    m = "attention"
    copies = 3 if e == FLOAT32 else 1
    saved: list[Saved] = []
    if lat.q_lora_rank is None:
        saved.append(Saved("mla.q_proj.input", m, T * h, e))
    else:
        saved += [Saved("mla.q_down.input", m, T_sp * h, e),
                  *rms_norm_tensors("mla.q_norm", m, T, lat.q_lora_rank, geo, copies),
                  Saved("mla.q_up.input", m, T * lat.q_lora_rank, e)]
    saved += [Saved("mla.kv_down.input", m, T_sp * h, e),
              *rms_norm_tensors("mla.kv_norm", m, T, lat.kv_lora_rank, geo, copies),
              Saved("mla.kv_up.input", m, T * lat.kv_lora_rank, e)]
    if geo.tiled:
        saved += [Saved("mla.rope.q_tables", m, 2 * T * n * rope, e),
                  Saved("mla.rope.k_tables", m, 2 * T * rope, e)]
    return saved + _core_tensors(T, n, qk, dv, geo) + [
        Saved("mla.o_proj.input", m, T * n * dv, e)]


def _core_tensors(T: int, n: int, qk: int, dv: int, geo: Geometry) -> list[Saved]:
    """Scores, softmax and the value product of `latent_attention_tensors`."""
    e, m = geo.act_bytes, "attention"
    if geo.flash:
        padded = dv != qk
        return [Saved("mla.q", m, T * n * qk, e), Saved("mla.k", m, T * n * qk, e),
                Saved("mla.v", m, T * n * qk, e),
                Saved("mla.softmax_stats", m, T * n, FLOAT32),
                *([Saved("mla.padded_output", m, T * n * qk, e)] if padded else [])]
    scores = T * n * geo.seq_length
    mask = scores if geo.tiled else geo.seq_length * geo.seq_length // geo.cp
    return [Saved("mla.q", m, T * n * qk, e), Saved("mla.k", m, T * n * qk, e),
            Saved("mla.causal_mask", m, mask, 1), Saved("mla.probs", m, scores, FLOAT32),
            Saved("mla.v", m, T * n * dv, e), Saved("mla.output", m, T * n * dv, e)]


def swiglu_tensors(prefix: str, rows: int, hidden: int, width: int, e: int) -> list[Saved]:
    """A SwiGLU on `rows` tokens: the gate_up input rows·h, then gate, silu(gate), up and
    the down projection's input rows·width each."""
    return [Saved(f"{prefix}.input", "mlp", rows * hidden, e),
            *(Saved(f"{prefix}.{name}", "mlp", rows * width, e)
              for name in ("gate", "silu", "up", "down_input"))]


def moe_tensors(shape: ModelShape, geo: Geometry) -> list[Saved]:
    """A mixture of experts' internals, per micro-batch, on T_moe = T_sp tokens:

    - router (float32): its input T_moe·h and transposed weight E·h, the sigmoid scores
      T_moe·E, the chosen indices T_moe·k (int32) and, normalising the weights, their sum
      T_moe and the k weights T_moe·k;
    - dispatch: the permutation indices out and back T_moe·k each (int32), the permuted tokens
      (the experts' inputs) and the returned expert outputs T_moe·k·h each (the returned ones
      in float32, where they are weighted and summed), and the weights T_moe·k; with expert
      parallelism (ep > 1, the all-to-all dispatcher, `mf_parallel.runtime.expert_dispatch`)
      also the rows each of the two exchanges sends and receives, 4·T_moe·k·h on average (each
      exchange keeps its input and output for its backward), the receiving side's two
      permutations 2·T_moe·k (int32) and the exchanges' row counts (4·ep + 1 int32);
    - routed experts: gate, silu, up and down input over the T_moe·k rows, m wide each;
    - shared experts: a SwiGLU of width f_s/t on the gathered T tokens;
    - balance loss (aux_loss_alpha > 0): the scores' sum T_moe and the normalised scores
      T_moe·E and the per-sequence expert fractions b·E, float32.
    """
    moe = shape.experts
    assert moe is not None
    e, h, E, k = geo.act_bytes, shape.hidden_size, moe.routed_experts, moe.experts_per_token
    T = geo.sp_tokens
    rows, m = T * k, moe.expert_intermediate_size
    saved = [Saved("router.input", "mlp", T * h, FLOAT32),
             Saved("router.weight_t", "mlp", E * h, FLOAT32),
             Saved("router.scores", "mlp", T * E, FLOAT32),
             Saved("router.indices", "mlp", rows, INDEX_BYTES),
             Saved("router.weight_sum", "mlp", T, FLOAT32),
             Saved("router.weights", "mlp", rows, FLOAT32),
             Saved("dispatch.indices", "mlp", 2 * rows, INDEX_BYTES),
             Saved("dispatch.permuted_tokens", "mlp", rows * h, e),
             Saved("dispatch.returned_outputs", "mlp", rows * h, FLOAT32),
             Saved("dispatch.weights", "mlp", rows, FLOAT32),
             *_exchange_tensors(rows, h, geo),
             *(Saved(f"experts.{name}", "mlp", rows * m, e)
               for name in ("gate", "silu", "up", "down_input"))]
    if moe.shared_experts:
        width = moe.shared_experts * m // geo.tp
        saved += swiglu_tensors("shared_experts", geo.tokens, h, width, e)
    if moe.balance_loss:
        saved += [Saved("balance_loss.score_sum", "mlp", T, FLOAT32),
                  Saved("balance_loss.scores", "mlp", T * E, FLOAT32),
                  Saved("balance_loss.fraction", "mlp", geo.micro_batch * E, FLOAT32)]
    return saved


def _exchange_tensors(rows: int, hidden: int, geo: Geometry) -> list[Saved]:
    """What expert parallelism's two token exchanges add (see `moe_tensors`)."""
    if geo.ep == 1:
        return []
    return [Saved("dispatch.exchanged_rows", "mlp", 4 * rows * hidden, geo.act_bytes),
            Saved("dispatch.receiver_indices", "mlp", 2 * rows, INDEX_BYTES),
            Saved("dispatch.row_counts", "mlp", 4 * geo.ep + 1, INDEX_BYTES)]


def latent_layer_tensors(shape: ModelShape, geo: Geometry, layer: int) -> list[Saved]:
    """Everything DeepSeek-V3 decoder layer `layer` keeps for backward, per micro-batch: the
    input and post-attention RMSNorms on T_sp tokens, MLA, and a dense SwiGLU of
    `intermediate_size` / t (the first `first_k_dense_replace` layers) or the mixture of
    experts. The residual additions keep nothing."""
    h = shape.hidden_size
    moe = shape.experts
    if moe is not None and layer >= moe.first_dense_layers:
        mlp = moe_tensors(shape, geo)
    else:
        mlp = swiglu_tensors("mlp", geo.tokens, h, shape.intermediate_size // geo.tp,
                             geo.act_bytes)
    return [*rms_norm_tensors("input_norm", "input_norm", geo.sp_tokens, h, geo),
            *latent_attention_tensors(shape, geo),
            *rms_norm_tensors("post_norm", "post_norm", geo.sp_tokens, h, geo),
            *mlp]


def causal_lm_output_tensors(shape: ModelShape, geo: Geometry) -> list[Saved]:
    """The last stage's extra activations with mf-train's loss (`blocks.causal_lm_loss`), per
    micro-batch: the final RMSNorm on T_sp tokens (`rms_norm_tensors`), the head's input T·h
    (gathered with t > 1), the float32 log-probabilities T·V/t (log_softmax keeps its output;
    the logits themselves are not kept), and per token the label index (int32), the valid-label
    mask (bool), the cross-entropy and the float mask (float32). A `loss_mask` from the data
    adds two more float32 T-sized tensors, left out."""
    h, T = shape.hidden_size, geo.tokens
    return [*rms_norm_tensors("final_norm", "output", geo.sp_tokens, h, geo),
            Saved("head.input", "output", T * h, geo.act_bytes),
            Saved("loss.log_probs", "output", T * (shape.vocab_size // geo.tp), FLOAT32),
            Saved("loss.labels", "output", T, INDEX_BYTES),
            Saved("loss.valid", "output", T, 1),
            Saved("loss.token_ce_and_mask", "output", 2 * T, FLOAT32)]
