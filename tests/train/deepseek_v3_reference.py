"""An independent float64 numpy DeepSeek-V3 (forward, loss, routing, balance loss), written from
the Hugging Face definition (transformers' modeling_deepseek_v3.py) and the DeepSeek-V3 report,
over a Hugging Face state dict (`model.layers.{i}.self_attn.kv_b_proj.weight`, ...).

It is deliberately written differently from mf_train's model: one token at a time for the
router, complex-pair rotation for the interleaved RoPE (DeepSeek's own `view_as_complex` form,
not Hugging Face's permute-then-rotate-half), explicit loops over heads.
"""

from __future__ import annotations

from typing import Any

import numpy as np

State = dict[str, np.ndarray]

# Tiny configurations (Hugging Face keys, plus mf's aux_loss_alpha) shared by the tests and the
# golden generator. LORA: q_lora_rank set, group-limited routing (2 groups, 1 kept), a shared
# expert, a dense first layer, untied head, interleaved RoPE, a balance loss. PLAIN: plain
# q_proj, no group limit, two shared experts, unnormalised weights, rotate-half RoPE, tied.
LORA: dict[str, Any] = {
    "vocab_size": 64, "hidden_size": 32, "intermediate_size": 48, "moe_intermediate_size": 16,
    "num_hidden_layers": 3, "num_attention_heads": 2, "num_key_value_heads": 2,
    "n_shared_experts": 1, "n_routed_experts": 4, "num_experts_per_tok": 2,
    "routed_scaling_factor": 2.5, "n_group": 2, "topk_group": 1, "norm_topk_prob": True,
    "first_k_dense_replace": 1, "q_lora_rank": 12, "kv_lora_rank": 16, "qk_nope_head_dim": 8,
    "qk_rope_head_dim": 4, "v_head_dim": 6, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
    "rope_interleave": True, "max_position_embeddings": 64, "tie_word_embeddings": False,
    "aux_loss_alpha": 0.1,
}
PLAIN: dict[str, Any] = {
    **LORA, "num_hidden_layers": 2, "q_lora_rank": None, "n_shared_experts": 2, "n_group": 1,
    "topk_group": 1, "norm_topk_prob": False, "rope_interleave": False, "rope_theta": 500.0,
    "tie_word_embeddings": True, "aux_loss_alpha": 0.0,
}
CONFIGS = {"lora": LORA, "plain": PLAIN}


def batch(seed: int = 1, size: int = 2, seq: int = 8, vocab: int = 64,
          ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """int32 input ids and labels `[size, seq]`, and a float32 loss mask with some zeros."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, vocab, (size, seq)).astype(np.int32)
    labels = rng.integers(0, vocab, (size, seq)).astype(np.int32)
    mask = (rng.uniform(size=(size, seq)) > 0.25).astype(np.float32)
    return ids, labels, mask


def random_hf_state(cfg: dict[str, Any], seed: int = 0, std: float = 0.2) -> State:
    """A Hugging Face state dict for `cfg` with random weights (norm weights near 1, a nonzero
    correction bias), so that every path (routing included) is exercised."""
    rng = np.random.default_rng(seed)
    h, heads = cfg["hidden_size"], cfg["num_attention_heads"]
    qk = cfg["qk_nope_head_dim"] + cfg["qk_rope_head_dim"]
    state: State = {}

    def linear(name: str, out: int, inp: int) -> None:
        state[name] = rng.standard_normal((out, inp)) * std

    def norm(name: str, size: int) -> None:
        state[name] = 1.0 + 0.1 * rng.standard_normal(size)

    def mlp(prefix: str, inter: int) -> None:
        linear(f"{prefix}.gate_proj.weight", inter, h)
        linear(f"{prefix}.up_proj.weight", inter, h)
        linear(f"{prefix}.down_proj.weight", h, inter)

    state["model.embed_tokens.weight"] = rng.standard_normal((cfg["vocab_size"], h))
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}"
        norm(f"{p}.input_layernorm.weight", h)
        norm(f"{p}.post_attention_layernorm.weight", h)
        a = f"{p}.self_attn"
        if cfg.get("q_lora_rank") is None:
            linear(f"{a}.q_proj.weight", heads * qk, h)
        else:
            linear(f"{a}.q_a_proj.weight", cfg["q_lora_rank"], h)
            norm(f"{a}.q_a_layernorm.weight", cfg["q_lora_rank"])
            linear(f"{a}.q_b_proj.weight", heads * qk, cfg["q_lora_rank"])
        linear(f"{a}.kv_a_proj_with_mqa.weight", cfg["kv_lora_rank"] + cfg["qk_rope_head_dim"], h)
        norm(f"{a}.kv_a_layernorm.weight", cfg["kv_lora_rank"])
        linear(f"{a}.kv_b_proj.weight",
               heads * (cfg["qk_nope_head_dim"] + cfg["v_head_dim"]), cfg["kv_lora_rank"])
        linear(f"{a}.o_proj.weight", h, heads * cfg["v_head_dim"])
        if i < cfg["first_k_dense_replace"]:
            mlp(f"{p}.mlp", cfg["intermediate_size"])
            continue
        linear(f"{p}.mlp.gate.weight", cfg["n_routed_experts"], h)
        state[f"{p}.mlp.gate.e_score_correction_bias"] = 0.05 * rng.standard_normal(
            cfg["n_routed_experts"])
        for e in range(cfg["n_routed_experts"]):
            mlp(f"{p}.mlp.experts.{e}", cfg["moe_intermediate_size"])
        if cfg["n_shared_experts"]:
            mlp(f"{p}.mlp.shared_experts", cfg["moe_intermediate_size"] * cfg["n_shared_experts"])
    state["model.norm.weight"] = 1.0 + 0.1 * rng.standard_normal(h)
    if not cfg.get("tie_word_embeddings", False):
        state["lm_head.weight"] = rng.standard_normal((cfg["vocab_size"], h)) * std
    return {name: value.astype(np.float32) for name, value in state.items()}


def rms_norm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * weight


def silu(x: np.ndarray) -> np.ndarray:
    return x / (1.0 + np.exp(-x))


def swiglu(state: State, prefix: str, x: np.ndarray) -> np.ndarray:
    gate = x @ state[f"{prefix}.gate_proj.weight"].T
    up = x @ state[f"{prefix}.up_proj.weight"].T
    return (silu(gate) * up) @ state[f"{prefix}.down_proj.weight"].T


def rope(x: np.ndarray, theta: float, interleave: bool) -> np.ndarray:
    """Rotate `x` `[seq, d]` by position: dimension pairs (2i, 2i+1) when `interleave` (DeepSeek's
    layout), (i, i + d/2) otherwise, by angle `pos * theta^(-2i/d)`."""
    seq, d = x.shape
    angles = np.arange(seq)[:, None] * theta ** (-np.arange(0, d, 2) / d)[None, :]
    if interleave:
        pairs = x[:, 0::2] + 1j * x[:, 1::2]
    else:
        pairs = x[:, : d // 2] + 1j * x[:, d // 2:]
    rotated = pairs * np.exp(1j * angles)
    if interleave:
        out = np.empty_like(x)
        out[:, 0::2], out[:, 1::2] = rotated.real, rotated.imag
        return out
    return np.concatenate([rotated.real, rotated.imag], axis=-1)


def attention(state: State, cfg: dict[str, Any], prefix: str, x: np.ndarray,
              max_logits: np.ndarray | None = None) -> np.ndarray:
    """Multi-head latent attention of one sequence `x` `[seq, hidden]`; each head's largest
    pre-softmax logit (over the keys its queries see) raises `max_logits[head]` to it."""
    eps, heads = cfg["rms_norm_eps"], cfg["num_attention_heads"]
    nope, rot, vd = cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"], cfg["v_head_dim"]
    interleave = cfg.get("rope_interleave", True)
    seq = x.shape[0]
    if cfg.get("q_lora_rank") is None:
        q = x @ state[f"{prefix}.q_proj.weight"].T
    else:
        latent = rms_norm(x @ state[f"{prefix}.q_a_proj.weight"].T,
                          state[f"{prefix}.q_a_layernorm.weight"], eps)
        q = latent @ state[f"{prefix}.q_b_proj.weight"].T
    q = q.reshape(seq, heads, nope + rot)
    compressed = x @ state[f"{prefix}.kv_a_proj_with_mqa.weight"].T
    latent_kv, k_rot = compressed[:, :cfg["kv_lora_rank"]], compressed[:, cfg["kv_lora_rank"]:]
    kv = rms_norm(latent_kv, state[f"{prefix}.kv_a_layernorm.weight"], eps)
    kv = (kv @ state[f"{prefix}.kv_b_proj.weight"].T).reshape(seq, heads, nope + vd)
    k_rot = rope(k_rot, cfg["rope_theta"], interleave)
    scale = (nope + rot) ** -0.5
    future = np.triu(np.ones((seq, seq), bool), k=1)
    outputs = []
    for head in range(heads):
        q_rot = rope(q[:, head, nope:], cfg["rope_theta"], interleave)
        scores = q[:, head, :nope] @ kv[:, head, :nope].T + q_rot @ k_rot.T
        scores = np.where(future, -np.inf, scores * scale)
        if max_logits is not None:
            max_logits[head] = max(max_logits[head], scores.max())
        probs = np.exp(scores - scores.max(-1, keepdims=True))
        probs /= probs.sum(-1, keepdims=True)
        outputs.append(probs @ kv[:, head, nope:])
    return np.concatenate(outputs, axis=-1) @ state[f"{prefix}.o_proj.weight"].T


def route(state: State, cfg: dict[str, Any], prefix: str,
          x: np.ndarray) -> tuple[list[list[int]], list[list[float]], np.ndarray]:
    """Per token: chosen experts (best first), their weights, and all sigmoid scores."""
    n, groups = cfg["n_routed_experts"], cfg["n_group"]
    per_group = n // groups
    scores = 1.0 / (1.0 + np.exp(-(x @ state[f"{prefix}.gate.weight"].T)))
    bias = state.get(f"{prefix}.gate.e_score_correction_bias", np.zeros(n))
    chosen, weights = [], []
    for token_scores in scores:
        biased = token_scores + bias
        group_score = [sum(sorted(biased[g * per_group:(g + 1) * per_group])[-2:])
                       for g in range(groups)]
        kept = sorted(range(groups), key=lambda g: -group_score[g])[:cfg["topk_group"]]
        eligible = [e for e in range(n) if e // per_group in kept]
        experts = sorted(eligible, key=lambda e: -biased[e])[:cfg["num_experts_per_tok"]]
        w = np.array([token_scores[e] for e in experts])
        if cfg.get("norm_topk_prob", True):
            w = w / (w.sum() + 1e-20)
        chosen.append(experts)
        weights.append(list(w * cfg["routed_scaling_factor"]))
    return chosen, weights, scores


def moe(state: State, cfg: dict[str, Any], prefix: str, x: np.ndarray) -> np.ndarray:
    chosen, weights, _ = route(state, cfg, prefix, x)
    out = np.zeros_like(x)
    for t in range(x.shape[0]):
        for e, w in zip(chosen[t], weights[t], strict=True):
            out[t] += w * swiglu(state, f"{prefix}.experts.{e}", x[t:t + 1])[0]
    if cfg["n_shared_experts"]:
        out += swiglu(state, f"{prefix}.shared_experts", x)
    return out


def balance_loss(state: State, cfg: dict[str, Any], prefix: str, x: np.ndarray) -> float:
    """Sequence-wise balance loss of one sequence `x` (report eqs. 17-20), before alpha."""
    n, k = cfg["n_routed_experts"], cfg["num_experts_per_tok"]
    chosen, _, scores = route(state, cfg, prefix, x)
    seq = x.shape[0]
    f = np.zeros(n)
    for experts in chosen:
        for e in experts:
            f[e] += n / (k * seq)
    p = (scores / scores.sum(-1, keepdims=True)).mean(0)
    return float((f * p).sum())


def forward(state: State, cfg: dict[str, Any], input_ids: np.ndarray,
            max_logits: np.ndarray | None = None,
            ) -> tuple[np.ndarray, float, dict[int, np.ndarray]]:
    """Logits `[b, s, V]`, the alpha-weighted balance loss summed over MoE layers and averaged
    over sequences, and tokens per expert of each MoE layer; `max_logits` `[layers, heads]`
    (-inf to start) gets each head's largest attention logit over the batch."""
    st = {name: value.astype(np.float64) for name, value in state.items()}
    eps = cfg["rms_norm_eps"]
    head = st.get("lm_head.weight", st["model.embed_tokens.weight"])
    logits, aux = [], 0.0
    counts: dict[int, np.ndarray] = {}
    for ids in input_ids:
        h = st["model.embed_tokens.weight"][ids]
        for i in range(cfg["num_hidden_layers"]):
            p = f"model.layers.{i}"
            h = h + attention(st, cfg, f"{p}.self_attn",
                              rms_norm(h, st[f"{p}.input_layernorm.weight"], eps),
                              None if max_logits is None else max_logits[i])
            x = rms_norm(h, st[f"{p}.post_attention_layernorm.weight"], eps)
            if i < cfg["first_k_dense_replace"]:
                h = h + swiglu(st, f"{p}.mlp", x)
                continue
            h = h + moe(st, cfg, f"{p}.mlp", x)
            aux += cfg.get("aux_loss_alpha", 0.0) * balance_loss(st, cfg, f"{p}.mlp", x)
            chosen, _, _ = route(st, cfg, f"{p}.mlp", x)
            layer_counts = counts.setdefault(i, np.zeros(cfg["n_routed_experts"], np.int64))
            for experts in chosen:
                layer_counts[experts] += 1
        logits.append(rms_norm(h, st["model.norm.weight"], eps) @ head.T)
    return np.stack(logits), aux / len(input_ids), counts


def cross_entropy(logits: np.ndarray, labels: np.ndarray,
                  loss_mask: np.ndarray | None = None) -> float:
    """sum(ce * mask) / max(sum(mask), 1) over all tokens."""
    shifted = logits - logits.max(-1, keepdims=True)
    log_probs = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
    ce = -np.take_along_axis(log_probs, labels[..., None], axis=-1)[..., 0]
    mask = np.ones_like(ce) if loss_mask is None else loss_mask.astype(np.float64)
    return float((ce * mask).sum() / max(mask.sum(), 1.0))
