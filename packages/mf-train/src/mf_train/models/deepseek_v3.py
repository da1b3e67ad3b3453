"""DeepSeek-V3 for causal language modelling (`model_type: deepseek_v3`,
`architectures: DeepseekV3ForCausalLM`), single process, as Hugging Face transformers defines it.

embedding -> N decoder layers -> final RMSNorm -> head (tied to the embedding or not). A layer is
`h = x + attention(input_norm(x))`, `y = h + mlp(post_norm(h))`; attention is multi-head latent
attention (mla.py); the mlp is a dense SwiGLU of `intermediate_size` in the first
`first_k_dense_replace` layers and the mixture of experts (moe.py) after them. Activations are
`[seq, batch, hidden]` inside (blocks.py's layout).

Loss: `model(input_ids, labels, loss_mask=None)` = the masked mean token cross-entropy
(`sum(ce * mask) / max(sum(mask), 1)`) + the sequence-wise balance loss of every MoE layer
(`aux_loss_alpha` times DeepSeek-V3 report eq. 17, averaged over the batch's sequences,
summed over MoE layers, as Megatron adds each layer's auxiliary loss). `aux_loss_alpha` is the
key of DeepSeek's own config.json (Megatron calls it `moe_aux_loss_coeff`); it defaults to 0.0
(Megatron's default, and Hugging Face's training loss has no balance term); DeepSeek-V3 used
1e-4 (report section 4.2; its config.json says 0.001).

Not implemented, rejected at the configuration: multi-token prediction
(`num_nextn_predict_layers`/`mtp_num_layers` > 0), YaRN (`rope_scaling` not null), tensor and
expert parallelism. The auxiliary-loss-free bias (`e_score_correction_bias`) is used for
routing and loaded from checkpoints, but not updated during training.

Parameter names (stable; checkpoints use them) and their Hugging Face names (`i` a layer,
`e` an expert; `hf_names()` gives the whole table for a built model):

    embedding.weight                       model.embed_tokens.weight
    final_norm.weight                      model.norm.weight
    head.weight (untied only)              lm_head.weight
  under decoder_layers.i. / model.layers.i.:
    input_norm.weight                      input_layernorm.weight
    post_norm.weight                       post_attention_layernorm.weight
    attention.X.weight                     self_attn.X.weight   (X: q_proj, or q_a_proj,
                                           q_a_layernorm, q_b_proj; kv_a_proj_with_mqa,
                                           kv_a_layernorm, kv_b_proj, o_proj)
    mlp.gate_up.weight (rows [gate; up])   mlp.gate_proj.weight, mlp.up_proj.weight
    mlp.down.weight                        mlp.down_proj.weight
    mlp.router.weight                      mlp.gate.weight
    mlp.router.e_score_correction_bias     mlp.gate.e_score_correction_bias
    mlp.experts.e.{gate_up, down}.weight   mlp.experts.e.{gate_proj + up_proj, down_proj}.weight
    mlp.shared_experts.{gate_up, down}...  mlp.shared_experts.{gate_proj + up_proj, down_proj}...

No `from __future__ import annotations` here: cattrs reads the settings' field types at run time.
"""

import re
from typing import Any, Literal

import mindspore as ms
import numpy as np
from mindspore import Tensor, mint, nn, ops

from mf_config import ModelConfig, ParallelismConfig
from mf_config.component_settings import settings_error, structure_settings
from mf_config.errors import Path
from mf_config.sections import Dtype, Section, section, setting
from mf_config.yaml_source import Source

from ..registry import MODELS
from .blocks import (
    Embedding,
    Linear,
    ParamInit,
    RMSNorm,
    SwiGLU,
    causal_lm_loss,
    check_input_ids,
    resolve_compute_dtype,
    tensor_size,
)
from .hf_weights import WeightMap
from .hf_weights import hf_names as _hf_names
from .hf_weights import hf_state as _hf_state
from .hf_weights import load_hf_state as _load_hf_state
from .mla import MultiLatentAttention
from .moe import MoE

PATH: Path = ("model",)


@section
class DeepseekV3Settings(Section):
    """The `model` keys of DeepSeek-V3: Hugging Face's `DeepseekV3Config` names, plus mf's
    `seq_length`, dtypes, flash attention and `aux_loss_alpha`.

    Sizes are required (as for Qwen3: Hugging Face's defaults are the 671B model's). Other
    keys default as Hugging Face does, except `n_group`/`topk_group` (1: no group limit, where
    Hugging Face's 8/4 presume 256 experts) and `q_lora_rank` (null: a plain q_proj). Keys
    Hugging Face writes into config.json that change nothing here are accepted; those naming
    a feature not built are accepted only at their neutral value."""

    vocab_size: int = setting(None, "Vocabulary size (required).", gt=0)
    hidden_size: int = setting(None, "Model width (required).", gt=0)
    intermediate_size: int = setting(None, "SwiGLU width of the dense layers (required).", gt=0)
    moe_intermediate_size: int = setting(None, "SwiGLU width of each expert (required).", gt=0)
    num_hidden_layers: int = setting(None, "Decoder layers (required).", gt=0)
    num_attention_heads: int = setting(None, "Attention heads (required).", gt=0)
    num_key_value_heads: int | None = setting(
        None, "Must equal num_attention_heads (MLA has per-head keys); null means that.", gt=0)
    n_shared_experts: int = setting(1, "Shared experts (always active).", ge=0)
    n_routed_experts: int = setting(None, "Routed experts per MoE layer (required).", gt=0)
    num_experts_per_tok: int = setting(None, "Routed experts per token, top k (required).", gt=0)
    routed_scaling_factor: float = setting(2.5, "Scale of the routed experts' weights.", gt=0)
    n_group: int = setting(1, "Expert groups of group-limited routing (1: no limit).", gt=0)
    topk_group: int = setting(1, "Groups a token may route to.", gt=0)
    norm_topk_prob: bool = setting(True, "Normalise the chosen experts' weights to sum 1.")
    first_k_dense_replace: int = setting(3, "Leading layers with a dense MLP.", ge=0)
    q_lora_rank: int | None = setting(
        None, "Query compression rank; null (or absent) for a plain q_proj.", gt=0)
    kv_lora_rank: int = setting(None, "Key/value compression rank (required).", gt=0)
    qk_nope_head_dim: int = setting(None, "Per-head query/key width without RoPE (required).",
                                    gt=0)
    qk_rope_head_dim: int = setting(None, "Per-head query/key width with RoPE, even "
                                          "(required).", gt=0)
    v_head_dim: int = setting(None, "Per-head value width (required).", gt=0)
    rms_norm_eps: float = setting(1e-6, "RMSNorm epsilon.", gt=0)
    rope_theta: float = setting(10000.0, "RoPE base.", gt=0)
    rope_interleave: bool = setting(True, "RoPE on dimension pairs (2i, 2i+1), DeepSeek's layout.")
    rope_scaling: dict[str, Any] | None = setting(
        None, "Only null or rope_type 'default' (YaRN is not implemented).")
    max_position_embeddings: int = setting(4096, "Longest sequence (RoPE positions).", gt=0)
    tie_word_embeddings: bool = setting(False, "Head shares the embedding's weight.")
    initializer_range: float = setting(0.02, "Std of the normal initial weights.", ge=0)
    seq_length: int | None = setting(None, "Training sequence length (<= max positions).", gt=0)
    use_flash_attention: bool = setting(False, "Flash attention where it has a kernel.")
    compute_dtype: Dtype = setting("float32", "Activation and matmul dtype (float32 on CPU, "
                                              "with a warning otherwise).")
    params_dtype: Dtype = setting("float32", "Dtype the parameters are kept in (the routing "
                                             "bias stays float32).")
    aux_loss_alpha: float = setting(
        0.0, "Sequence-wise balance loss coefficient (DeepSeek-V3 used 1e-4).", ge=0)
    seq_aux: Literal[True] = setting(True, "Sequence-wise balance loss (the only one built).")
    num_nextn_predict_layers: int = setting(0, "Multi-token prediction layers: only 0.", ge=0)
    mtp_num_layers: int = setting(0, "Multi-token prediction layers: only 0.", ge=0)
    hidden_act: Literal["silu"] = setting("silu", "MLP activation: silu only.")
    attention_bias: Literal[False] = setting(False, "Attention projection biases: false only.")
    attention_dropout: float = setting(0.0, "Attention dropout: 0 only.", ge=0, le=0)
    topk_method: Literal["noaux_tc"] = setting("noaux_tc", "Routing: noaux_tc only.")
    scoring_func: Literal["sigmoid"] = setting("sigmoid", "Router scores: sigmoid only.")
    moe_layer_freq: Literal[1] = setting(1, "Every layer after the dense ones is MoE: 1 only.")
    ep_size: Literal[1] = setting(1, "Hugging Face's expert-parallel size: 1 only.")
    pretraining_tp: int = setting(1, "Ignored (Hugging Face bookkeeping).")
    use_cache: bool = setting(True, "Ignored (inference).")
    bos_token_id: int | None = setting(None, "Ignored (tokenizer).")
    eos_token_id: int | list[int] | None = setting(None, "Ignored (tokenizer).")
    pad_token_id: int | None = setting(None, "Ignored (tokenizer).")
    torch_dtype: str | None = setting(None, "Ignored: compute_dtype and params_dtype decide.")
    dtype: str | None = setting(None, "Ignored: compute_dtype and params_dtype decide.")
    transformers_version: str | None = setting(None, "Ignored.")


def deepseek_v3_settings(config: ModelConfig, source: Source | None = None) -> DeepseekV3Settings:
    """The settings of `config.extras`, checked; `ConfigError` lists every problem by path."""
    settings = structure_settings(DeepseekV3Settings, config.extras, PATH, source)
    found = _consistency_problems(settings)
    if found:
        raise settings_error(found, source)
    return settings


_REQUIRED = ("vocab_size", "hidden_size", "intermediate_size", "moe_intermediate_size",
             "num_hidden_layers", "num_attention_heads", "n_routed_experts",
             "num_experts_per_tok", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim",
             "v_head_dim")


def _consistency_problems(s: DeepseekV3Settings) -> list[tuple[Path, str]]:
    found: list[tuple[Path, str]] = [((*PATH, name), "required: a positive integer")
                                     for name in _REQUIRED if getattr(s, name) is None]
    if found:
        return found

    def problem(key: str, message: str) -> None:
        found.append(((*PATH, key), message))

    for key in ("num_nextn_predict_layers", "mtp_num_layers"):
        if getattr(s, key) > 0:
            problem(key, f"multi-token prediction is not implemented for DeepSeek-V3; set {key} "
                         f"to 0 (got {getattr(s, key)})")
    if not _plain_rope(s.rope_scaling):
        problem("rope_scaling", "RoPE scaling (YaRN) is not implemented for DeepSeek-V3; only "
                                "null (or rope_type 'default') is allowed")
    if s.num_key_value_heads not in (None, s.num_attention_heads):
        problem("num_key_value_heads", f"must equal num_attention_heads "
                f"({s.num_attention_heads}) or be null: multi-head latent attention has one key "
                f"per head (got {s.num_key_value_heads})")
    if s.qk_rope_head_dim % 2:
        problem("qk_rope_head_dim", f"must be even (RoPE rotates pairs), got {s.qk_rope_head_dim}")
    if s.n_routed_experts % s.n_group:
        problem("n_group", f"must divide n_routed_experts ({s.n_routed_experts}) into equal "
                           f"groups, got {s.n_group}")
    elif s.topk_group > s.n_group:
        problem("topk_group", f"must be <= n_group ({s.n_group}), got {s.topk_group}")
    elif s.num_experts_per_tok > s.topk_group * (s.n_routed_experts // s.n_group):
        problem("num_experts_per_tok", f"must be <= topk_group * experts per group "
                f"({s.topk_group} * {s.n_routed_experts // s.n_group}), the experts a token "
                f"may reach; got {s.num_experts_per_tok}")
    if s.seq_length is not None and s.seq_length > s.max_position_embeddings:
        problem("seq_length", f"must be <= max_position_embeddings "
                              f"({s.max_position_embeddings}), got {s.seq_length}")
    return found


def _plain_rope(rope_scaling: dict[str, Any] | None) -> bool:
    if rope_scaling is None:
        return True
    kind = rope_scaling.get("rope_type", rope_scaling.get("type"))
    return kind == "default" and set(rope_scaling) <= {"rope_type", "type", "rope_theta"}


class DeepseekV3DecoderLayer(nn.Cell):
    """`x [seq, batch, hidden]` -> (`x + attention + mlp`, the layer's balance loss).

    The balance loss leaves the layer as an output, not as an attribute set in the forward:
    under recompute (`Cell.recompute()`, mf-memory) a tensor kept aside from a recomputed
    cell has no gradient path (measured: the router's gradient then misses its share), while
    outputs are differentiated correctly. Dense layers return a float32 zero.
    """

    def __init__(self, s: DeepseekV3Settings, index: int, init: ParamInit,
                 compute_dtype: ms.Type):
        super().__init__()
        hf = f"model.layers.{index}"
        self.is_moe = index >= s.first_k_dense_replace
        self.input_norm = RMSNorm(s.hidden_size, s.rms_norm_eps)
        self.attention = MultiLatentAttention(
            hidden_size=s.hidden_size, num_heads=s.num_attention_heads,
            q_lora_rank=s.q_lora_rank, kv_lora_rank=s.kv_lora_rank,
            qk_nope_head_dim=s.qk_nope_head_dim, qk_rope_head_dim=s.qk_rope_head_dim,
            v_head_dim=s.v_head_dim, rms_norm_eps=s.rms_norm_eps, rope_theta=s.rope_theta,
            max_position_embeddings=s.max_position_embeddings,
            rope_interleave=s.rope_interleave, use_flash_attention=s.use_flash_attention,
            compute_dtype=compute_dtype,
            normal=lambda name, shape: init.normal(f"{hf}.self_attn.{name}.weight", shape))
        self.post_norm = RMSNorm(s.hidden_size, s.rms_norm_eps)

        def make_mlp(name: str, size: int) -> SwiGLU:
            prefix = f"{hf}.mlp.{name}" if name else f"{hf}.mlp"
            return SwiGLU(init.normal(f"{prefix}.gate_proj.weight", (size, s.hidden_size)),
                          init.normal(f"{prefix}.up_proj.weight", (size, s.hidden_size)),
                          init.normal(f"{prefix}.down_proj.weight", (s.hidden_size, size)))

        if not self.is_moe:
            self.mlp = make_mlp("", s.intermediate_size)
            return
        self.mlp = MoE(
            moe_intermediate_size=s.moe_intermediate_size, n_routed_experts=s.n_routed_experts,
            num_experts_per_tok=s.num_experts_per_tok, n_shared_experts=s.n_shared_experts,
            n_group=s.n_group, topk_group=s.topk_group, norm_topk_prob=s.norm_topk_prob,
            routed_scaling_factor=s.routed_scaling_factor, aux_loss_alpha=s.aux_loss_alpha,
            router_weight=init.normal(f"{hf}.mlp.gate.weight",
                                      (s.n_routed_experts, s.hidden_size)),
            make_mlp=make_mlp)

    def construct(self, x: Tensor) -> tuple[Tensor, Tensor]:
        h = x + self.attention(self.input_norm(x))
        if not self.is_moe:
            return h + self.mlp(self.post_norm(h)), ops.zeros((), ms.float32)
        out, balance = self.mlp(self.post_norm(h))
        return h + out, balance


@MODELS.register("DeepseekV3ForCausalLM", "deepseek_v3")
class DeepseekV3ForCausalLM(nn.Cell):
    """DeepSeek-V3 causal LM. `model(input_ids, labels, loss_mask=None)` -> float32 scalar:
    `sum(ce * mask) / max(sum(mask), 1)` + the balance loss; `model.logits(input_ids)` ->
    `[b, s, V]`. `input_ids`, `labels`: int32 `[b, s]`, labels already shifted.

    Layer contract (mf-memory): `decoder_layers`, `layer_offset = 0`; each layer has
    `input_norm`, `attention` (MLA: `q_proj` or `q_a_proj`/`q_a_layernorm`/`q_b_proj`,
    `kv_a_proj_with_mqa`, `kv_a_layernorm`, `kv_b_proj`, `o_proj`), `post_norm`, `mlp` (dense:
    `gate_up`, `down`; MoE: `router`, `experts`, `shared_experts`). Unlike Qwen3's, a layer
    returns `(hidden, balance_loss)` (see `DeepseekV3DecoderLayer`), and an MoE `mlp` returns
    `(output, balance_loss)`.

    MoE statistics: `tokens_per_expert()`, `moe_layers()`, `balance_loss()` (last forward).
    Single process: `from_config` rejects a tensor group of size > 1; `check_parallelism`
    rejects `parallelism.tensor_parallel` or `expert_parallel` > 1.
    """

    def __init__(self, settings: DeepseekV3Settings, *, tensor_group: Any = None,
                 seed: int | None = None, source: Source | None = None):
        super().__init__()
        if tensor_size(tensor_group) > 1:
            raise settings_error([(("parallelism", "tensor_parallel"),
                                   f"tensor parallelism is not implemented for DeepSeek-V3; "
                                   f"set parallelism.tensor_parallel to 1 (got "
                                   f"{tensor_size(tensor_group)})")], source)
        s = self.settings = settings
        self.tensor_group = None
        self.layer_offset = 0
        target = ms.get_context("device_target")
        self.compute_dtype = resolve_compute_dtype(s.compute_dtype, target)
        params_dtype = resolve_compute_dtype(s.params_dtype, target, "model.params_dtype")
        init = ParamInit(_seed(seed), s.initializer_range)
        self.embedding = Embedding(init.normal("model.embed_tokens.weight",
                                               (s.vocab_size, s.hidden_size)))
        self.decoder_layers = nn.CellList([
            DeepseekV3DecoderLayer(s, index, init, self.compute_dtype)
            for index in range(s.num_hidden_layers)])
        self.final_norm = RMSNorm(s.hidden_size, s.rms_norm_eps)
        self.tied = s.tie_word_embeddings
        if not self.tied:
            self.head = Linear(init.normal("lm_head.weight", (s.vocab_size, s.hidden_size)))
        self.hf_ignored = ("lm_head.weight",) if self.tied else ()
        self.last_balance_loss: Tensor | None = None
        _cast_parameters(self, params_dtype)

    @classmethod
    def from_config(cls, config: ModelConfig, *, tensor_group: Any = None,
                    source: Source | None = None, seed: int | None = None,
                    ) -> "DeepseekV3ForCausalLM":
        """The model the `model` section describes (keys checked, see `DeepseekV3Settings`);
        `tensor_group` must be None or of size 1. `seed` draws the initial weights (default:
        MindSpore's global seed, else 0)."""
        return cls(deepseek_v3_settings(config, source), tensor_group=tensor_group, seed=seed,
                   source=source)

    @staticmethod
    def check_parallelism(parallelism: ParallelismConfig, source: Source | None = None) -> None:
        """`ConfigError` if the layout asks for what DeepSeek-V3 does not implement yet."""
        found: list[tuple[Path, str]] = []
        for key, what in (("tensor_parallel", "tensor"), ("expert_parallel", "expert")):
            if getattr(parallelism, key) > 1:
                found.append((("parallelism", key), f"{what} parallelism is not implemented for "
                              f"DeepSeek-V3; set parallelism.{key} to 1 (got "
                              f"{getattr(parallelism, key)})"))
        if found:
            raise settings_error(found, source)

    # --- forward ------------------------------------------------------------------------

    def construct(self, input_ids: Tensor, labels: Tensor,
                  loss_mask: Tensor | None = None) -> Tensor:
        logits, balance = self._forward(input_ids)
        mask = None if loss_mask is None else loss_mask.swapaxes(0, 1)
        return causal_lm_loss(logits, labels.swapaxes(0, 1), mask) + balance

    def logits(self, input_ids: Tensor) -> Tensor:
        """`[batch, seq, vocab]` logits (float32 unless the compute dtype is lower)."""
        return self._forward(input_ids)[0].swapaxes(0, 1)

    def _forward(self, input_ids: Tensor) -> tuple[Tensor, Tensor]:
        """Logits `[seq, batch, vocab]` and the balance loss summed over layers."""
        self._check_ids(input_ids)
        h = self.embedding(input_ids.swapaxes(0, 1)).astype(self.compute_dtype)
        balance = ops.zeros((), ms.float32)
        for layer in self.decoder_layers:
            h, layer_balance = layer(h)
            balance = balance + layer_balance
        h = self.final_norm(h)
        if self.tied:
            logits = mint.matmul(h, self.embedding.weight.astype(h.dtype).T)
        else:
            logits = self.head(h)
        self.last_balance_loss = balance
        return logits, balance

    def _check_ids(self, input_ids: Tensor) -> None:
        check_input_ids(input_ids, self.settings.seq_length,
                        self.settings.max_position_embeddings)

    # --- MoE statistics -----------------------------------------------------------------

    def moe_layers(self) -> list[int]:
        """Global indices of the MoE layers."""
        return [self.layer_offset + index for index, layer in enumerate(self.decoder_layers)
                if layer.is_moe]

    def tokens_per_expert(self) -> dict[int, np.ndarray]:
        """Global layer index -> tokens routed to each expert (int64 `[n_routed_experts]`) in
        the last forward; each sums to tokens * num_experts_per_tok."""
        return {self.layer_offset + index: layer.mlp.last_tokens_per_expert.copy()
                for index, layer in enumerate(self.decoder_layers) if layer.is_moe}

    def balance_loss(self) -> float:
        """The balance-loss part of the last forward's loss (0.0 before any forward)."""
        if self.last_balance_loss is None:
            return 0.0
        return float(self.last_balance_loss.asnumpy())

    # --- Hugging Face weights -----------------------------------------------------------

    def weight_maps(self) -> list[WeightMap]:
        """Each parameter with the Hugging Face weights it holds (module table)."""
        maps = []
        for name, param in self.parameters_and_names():
            hf = hf_parameter_names(name)
            rows = param.shape[0] // len(hf)
            shapes = tuple((rows, *param.shape[1:]) for _ in hf)
            maps.append(WeightMap(name, hf, shapes))
        return maps

    def hf_names(self) -> dict[str, tuple[str, ...]]:
        return _hf_names(self)

    def load_hf_state(self, tensors: dict[str, np.ndarray], strict: bool = True) -> None:
        _load_hf_state(self, tensors, strict)

    def hf_state(self) -> dict[str, np.ndarray]:
        return _hf_state(self)


_LAYER = re.compile(r"decoder_layers\.(\d+)\.(.+)")
_TOP = {"embedding.weight": "model.embed_tokens.weight",
        "final_norm.weight": "model.norm.weight", "head.weight": "lm_head.weight"}
_SUBLAYER = {"input_norm": "input_layernorm", "post_norm": "post_attention_layernorm",
             "attention": "self_attn", "mlp": "mlp"}
_MLP_PART = {"router": "gate", "down": "down_proj"}


def hf_parameter_names(ours: str) -> tuple[str, ...]:
    """The Hugging Face names one of our parameters holds (two for a fused `gate_up`)."""
    if ours in _TOP:
        return (_TOP[ours],)
    match = _LAYER.fullmatch(ours)
    parts = match.group(2).split(".") if match else []
    if not parts or parts[0] not in _SUBLAYER:
        raise KeyError(f"{ours}: not a DeepSeek-V3 parameter name")
    parts[0] = _SUBLAYER[parts[0]]
    if parts[0] == "mlp":
        parts = [_MLP_PART.get(part, part) for part in parts]
    prefix = f"model.layers.{match.group(1)}."
    if len(parts) >= 2 and parts[-2] == "gate_up":
        stem = ".".join(parts[:-2])
        return (f"{prefix}{stem}.gate_proj.{parts[-1]}", f"{prefix}{stem}.up_proj.{parts[-1]}")
    return (prefix + ".".join(parts),)


def _cast_parameters(model: nn.Cell, dtype: ms.Type) -> None:
    """Keep the parameters in `dtype`, except the routing bias (float32, as HF's buffer)."""
    if dtype == ms.float32:
        return
    for name, param in model.parameters_and_names():
        if not name.endswith("e_score_correction_bias"):
            param.set_dtype(dtype)


def _seed(seed: int | None) -> int:
    """The init seed: the given one, else MindSpore's global seed (`ms.set_seed`), else 0
    (Qwen3's rule)."""
    if seed is not None:
        return seed
    return ms.get_seed() or 0
