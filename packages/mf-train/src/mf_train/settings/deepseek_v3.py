"""The `model` section of a DeepSeek-V3 run: Hugging Face `DeepseekV3Config` names, checked.

Sizes default as Hugging Face defaults them (the 671B model's, which is also what MindFormers'
config class does), so the spec's skeleton, which writes only the vocabulary, width, layers
and heads, is a complete model. Two defaults differ, because Hugging Face's presume the 256
experts of the full model: `n_group`/`topk_group` are 1 (no group limit, where Hugging Face's
8/4 fail for fewer experts) and `q_lora_rank` is null (a plain q_proj, where Hugging Face's
1536 would dwarf a small model). Keys Hugging Face writes into config.json that change nothing
in training are accepted and reported as having no effect; those naming a feature not built
are accepted only at their neutral value.

Auxiliary-loss-free load balancing (DeepSeek-V3 report, section 2.1.2) has Megatron's names,
which MindFormers' Megatron-style configuration also uses: `moe_router_enable_expert_bias`
(default true, as DeepSeek-V3 trains; MindFormers' older `moe_config.balance_via_topk_bias`) and
`moe_router_bias_update_rate` (default 0.001, DeepSeek-V3's gamma; MindFormers' older
`moe_config.topk_bias_update_rate`). After every step each MoE layer's
`e_score_correction_bias` moves by `rate * sign(mean(counts) - counts)`, from the tokens per
expert of the whole step (every micro-batch, every rank); `mf_train.step.expert_bias` does it. A
rate of 0 or the switch off turns it off (the rate then has no effect, and `mf-train` says so).

No `from __future__ import annotations` here: cattrs reads the field types at run time.
"""

from typing import Any, Literal

from mf_config.errors import Path
from mf_config.model_shape import (
    ExpertShape,
    LatentAttentionShape,
    ModelSettings,
    ModelShape,
    ulysses_heads_problem,
)
from mf_config.sections import MAX_DIMENSION, Dtype, TrainConfig, section, setting

TOKENIZER = "token ids belong to the tokenizer and the data"
DTYPES = "compute_dtype and params_dtype decide"


def size(default: int, help: str) -> Any:
    """A positive width or count with Hugging Face's default."""
    return setting(default, f"{help} (Hugging Face's default {default}).", gt=0,
                   le=MAX_DIMENSION)


@section
class DeepseekV3Settings(ModelSettings):
    """The `model` keys of DeepSeek-V3: Hugging Face's `DeepseekV3Config` names, plus mf's
    `seq_length`, dtypes, flash attention and `aux_loss_alpha`."""

    vocab_size: int = size(129280, "Vocabulary size")
    hidden_size: int = size(7168, "Model width")
    intermediate_size: int = size(18432, "SwiGLU width of the dense layers")
    moe_intermediate_size: int = size(2048, "SwiGLU width of each expert")
    num_hidden_layers: int = size(61, "Decoder layers")
    num_attention_heads: int = size(128, "Attention heads")
    num_key_value_heads: int | None = setting(
        None, "Must equal num_attention_heads (MLA has per-head keys); null means that.", gt=0)
    n_shared_experts: int = setting(1, "Shared experts (always active).", ge=0,
                                    le=MAX_DIMENSION)
    n_routed_experts: int = size(256, "Routed experts per MoE layer")
    num_experts_per_tok: int = size(8, "Routed experts per token, top k")
    routed_scaling_factor: float = setting(2.5, "Scale of the routed experts' weights.", gt=0)
    n_group: int = setting(1, "Expert groups of group-limited routing (1: no limit).", gt=0,
                           le=MAX_DIMENSION)
    topk_group: int = setting(1, "Groups a token may route to.", gt=0, le=MAX_DIMENSION)
    norm_topk_prob: bool = setting(True, "Normalise the chosen experts' weights to sum 1.")
    first_k_dense_replace: int = setting(3, "Leading layers with a dense MLP.", ge=0,
                                         le=MAX_DIMENSION)
    q_lora_rank: int | None = setting(
        None, "Query compression rank; null (or absent) for a plain q_proj.", gt=0,
        le=MAX_DIMENSION)
    kv_lora_rank: int = size(512, "Key/value compression rank")
    qk_nope_head_dim: int = size(128, "Per-head query/key width without RoPE")
    qk_rope_head_dim: int = size(64, "Per-head query/key width with RoPE, even")
    v_head_dim: int = size(128, "Per-head value width")
    rms_norm_eps: float = setting(1e-6, "RMSNorm epsilon.", gt=0)
    rope_theta: float = setting(10000.0, "RoPE base.", gt=0)
    rope_interleave: bool = setting(True, "RoPE on dimension pairs (2i, 2i+1), DeepSeek's layout.")
    rope_scaling: dict[str, Any] | None = setting(
        None, "Only null or rope_type 'default' (YaRN is not implemented).")
    max_position_embeddings: int = setting(4096, "Longest sequence (RoPE positions).", gt=0,
                                           le=MAX_DIMENSION)
    tie_word_embeddings: bool = setting(False, "Head shares the embedding's weight.")
    initializer_range: float = setting(0.02, "Std of the normal initial weights.", ge=0)
    seq_length: int | None = setting(None, "Training sequence length (<= max positions).", gt=0,
                                     le=MAX_DIMENSION)
    use_flash_attention: bool = setting(False, "Flash attention where it has a kernel.")
    compute_dtype: Dtype = setting("float32", "Activation and matmul dtype (float32 on CPU, "
                                              "with a warning otherwise).")
    params_dtype: Dtype = setting("float32", "Dtype the parameters are kept in (the routing "
                                             "bias stays float32).")
    aux_loss_alpha: float = setting(
        0.0, "Sequence-wise balance loss coefficient (DeepSeek-V3 used 1e-4).", ge=0)
    moe_router_enable_expert_bias: bool = setting(
        True, "Auxiliary-loss-free balancing: update e_score_correction_bias every step "
              "(DeepSeek-V3 trains with it; Megatron's default is false).")
    moe_router_bias_update_rate: float = setting(
        0.001, "Step of the bias update, bias += rate * sign(mean load - load) (DeepSeek-V3's "
               "gamma; 0 turns the update off).", ge=0, le=1)
    seq_aux: Literal[True] = setting(True, "Sequence-wise balance loss (the only one built).")
    num_nextn_predict_layers: int = setting(0, "Multi-token prediction layers: only 0.", ge=0,
                                            le=MAX_DIMENSION)
    mtp_num_layers: int = setting(0, "Multi-token prediction layers: only 0.", ge=0,
                                  le=MAX_DIMENSION)
    hidden_act: Literal["silu"] = setting("silu", "MLP activation: silu only.")
    attention_bias: Literal[False] = setting(False, "Attention projection biases: false only.")
    attention_dropout: float = setting(0.0, "Attention dropout: 0 only.", ge=0, le=0)
    topk_method: Literal["noaux_tc"] = setting("noaux_tc", "Routing: noaux_tc only.")
    scoring_func: Literal["sigmoid"] = setting("sigmoid", "Router scores: sigmoid only.")
    moe_layer_freq: Literal[1] = setting(1, "Every layer after the dense ones is MoE: 1 only.")
    ep_size: Literal[1] = setting(1, "Hugging Face's expert-parallel size: 1 only.")
    pretraining_tp: int = setting(1, "Hugging Face bookkeeping of the original training.",
                                  no_effect="Hugging Face bookkeeping")
    use_cache: bool = setting(True, "Key/value cache of generation.",
                              no_effect="training keeps no key/value cache")
    bos_token_id: int | None = setting(None, "Begin-of-sequence id.", no_effect=TOKENIZER)
    eos_token_id: int | list[int] | None = setting(None, "End-of-sequence id(s).",
                                                   no_effect=TOKENIZER)
    pad_token_id: int | None = setting(None, "Padding id.", no_effect=TOKENIZER)
    torch_dtype: str | None = setting(None, "Hugging Face's dtype.", no_effect=DTYPES)
    dtype: str | None = setting(None, "Hugging Face's dtype.", no_effect=DTYPES)
    transformers_version: str | None = setting(None, "Version that wrote config.json.",
                                               no_effect="Hugging Face bookkeeping")

    def shape(self) -> ModelShape:
        return ModelShape(
            vocab_size=self.vocab_size, hidden_size=self.hidden_size,
            num_layers=self.num_hidden_layers, num_attention_heads=self.num_attention_heads,
            num_key_value_heads=self.num_attention_heads,
            head_dim=self.qk_nope_head_dim + self.qk_rope_head_dim,
            intermediate_size=self.intermediate_size,
            tie_word_embeddings=self.tie_word_embeddings, seq_length=self.seq_length,
            mtp_layers=self.num_nextn_predict_layers or self.mtp_num_layers,
            routed_experts=self.n_routed_experts, latent_attention=True,
            experts=ExpertShape(
                routed_experts=self.n_routed_experts, experts_per_token=self.num_experts_per_tok,
                expert_intermediate_size=self.moe_intermediate_size,
                shared_experts=self.n_shared_experts,
                first_dense_layers=min(self.first_k_dense_replace, self.num_hidden_layers),
                balance_loss=self.aux_loss_alpha > 0),
            latent=LatentAttentionShape(
                kv_lora_rank=self.kv_lora_rank, q_lora_rank=self.q_lora_rank,
                qk_nope_head_dim=self.qk_nope_head_dim, qk_rope_head_dim=self.qk_rope_head_dim,
                v_head_dim=self.v_head_dim),
            params_dtype=self.params_dtype, compute_dtype=self.compute_dtype,
            use_flash_attention=self.use_flash_attention)

    def layer_modules(self, layer: int) -> frozenset[str]:
        """The modules of decoder layer `layer` (`models.deepseek_v3.DeepseekV3DecoderLayer`):
        the query projection by `q_lora_rank`, a dense MLP in the first
        `first_k_dense_replace` layers, then the router, every expert and the shared ones."""
        query = ("q_a_proj", "q_a_layernorm", "q_b_proj") if self.q_lora_rank else ("q_proj",)
        attention = (*query, "kv_a_proj_with_mqa", "kv_a_layernorm", "kv_b_proj", "o_proj",
                     "exchange")
        if layer < self.first_k_dense_replace:
            mlp: tuple[str, ...] = ("gate_up", "down")
        else:
            experts = [f"experts.{e}{part}" for e in range(self.n_routed_experts)
                       for part in ("", ".gate_up", ".down")]
            shared = ("shared_experts", "shared_experts.gate_up", "shared_experts.down") \
                if self.n_shared_experts else ()
            mlp = ("router", "experts", *experts, *shared)
        return frozenset(("input_norm", "attention", "post_norm", "mlp",
                          *(f"attention.{name}" for name in attention),
                          *(f"mlp.{name}" for name in mlp)))

    def problems(self, path: Path) -> list[tuple[Path, str]]:
        found: list[tuple[Path, str]] = []

        def problem(key: str, message: str) -> None:
            found.append(((*path, key), message))

        for key in ("num_nextn_predict_layers", "mtp_num_layers"):
            if getattr(self, key) > 0:
                problem(key, f"multi-token prediction is not implemented for DeepSeek-V3; set "
                             f"{key} to 0 (got {getattr(self, key)})")
        if not _plain_rope(self.rope_scaling):
            problem("rope_scaling", "RoPE scaling (YaRN) is not implemented for DeepSeek-V3; "
                                    "only null (or rope_type 'default') is allowed")
        if self.num_key_value_heads not in (None, self.num_attention_heads):
            problem("num_key_value_heads", f"must equal num_attention_heads "
                    f"({self.num_attention_heads}) or be null: multi-head latent attention has "
                    f"one key per head (got {self.num_key_value_heads})")
        if self.qk_rope_head_dim % 2:
            problem("qk_rope_head_dim", f"must be even (RoPE rotates pairs), got "
                                        f"{self.qk_rope_head_dim}")
        found += self._routing_problems(path)
        if self.seq_length is not None and self.seq_length > self.max_position_embeddings:
            problem("seq_length", f"must be <= max_position_embeddings "
                                  f"({self.max_position_embeddings}), got {self.seq_length}")
        return found

    def _routing_problems(self, path: Path) -> list[tuple[Path, str]]:
        experts, groups = self.n_routed_experts, self.n_group
        if min(experts, groups, self.topk_group, self.num_experts_per_tok) < 1:
            return []  # reported by the bounds already
        if experts % groups:
            return [((*path, "n_group"), f"must divide n_routed_experts ({experts}) into equal "
                                         f"groups, got {groups}")]
        if self.topk_group > groups:
            return [((*path, "topk_group"), f"must be <= n_group ({groups}), got "
                                            f"{self.topk_group}")]
        reachable = self.topk_group * (experts // groups)
        if self.num_experts_per_tok > reachable:
            return [((*path, "num_experts_per_tok"), f"must be <= topk_group * experts per group "
                     f"({self.topk_group} * {experts // groups}), the experts a token may "
                     f"reach; got {self.num_experts_per_tok}")]
        return []

    def config_problems(self, config: TrainConfig, path: Path) -> list[tuple[Path, str]]:
        tp = config.parallelism.tensor_parallel
        return (self.tensor_parallel_problems(tp, path)
                + self.context_parallel_problems(tp, config.parallelism.ulysses_degree(), path))

    def tensor_parallel_problems(self, tp: int, path: Path = ("model",),
                                 ) -> list[tuple[Path, str]]:
        """Widths that `tp` tensor-parallel ranks split and that do not divide by it: the
        attention heads, the vocabulary, the dense MLP (when a layer has it) and the shared
        experts' MLP (when an MoE layer has them). The routed experts are not split."""
        if tp == 1:
            return []
        dense = min(self.first_k_dense_replace, self.num_hidden_layers) > 0
        shared = self.num_hidden_layers > self.first_k_dense_replace and self.n_shared_experts > 0
        widths = [("num_attention_heads", self.num_attention_heads, ""),
                  ("vocab_size", self.vocab_size, "")]
        if dense:
            widths.append(("intermediate_size", self.intermediate_size, ""))
        if shared:
            widths.append(("moe_intermediate_size",
                           self.moe_intermediate_size * self.n_shared_experts,
                           " (the shared experts' width, moe_intermediate_size * "
                           "n_shared_experts)"))
        return [((*path, key), f"{value}{why} is not divisible by "
                               f"parallelism.tensor_parallel ({tp})")
                for key, value, why in widths if value % tp]

    def context_parallel_problems(self, tp: int, ulysses: int, path: Path = ("model",),
                                  ) -> list[tuple[Path, str]]:
        """The heads (MLA's keys have as many as its queries) that the Ulysses all-to-all over
        `ulysses` ranks, after `tp` tensor ranks took their share, must split and do not."""
        if ulysses == 1 or self.num_attention_heads % (tp * ulysses) == 0:
            return []
        return [((*path, "num_attention_heads"),
                 ulysses_heads_problem(self.num_attention_heads, tp, ulysses))]


def _plain_rope(rope_scaling: dict[str, Any] | None) -> bool:
    if rope_scaling is None:
        return True
    kind = rope_scaling.get("rope_type", rope_scaling.get("type"))
    return kind == "default" and set(rope_scaling) <= {"rope_type", "type", "rope_theta"}
