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

The `model` keys are `settings.deepseek_v3.DeepseekV3Settings` (MindSpore-free, so that
`mf-config validate` checks them). Not implemented, rejected at the configuration:
multi-token prediction (`num_nextn_predict_layers`/`mtp_num_layers` > 0), YaRN (`rope_scaling`
not null), tensor parallelism (the settings refuse it) and expert parallelism (mf-train
refuses it before launch). The auxiliary-loss-free bias (`e_score_correction_bias`) is used for
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

"""

import re
from typing import Any

import mindspore as ms
import numpy as np
from mindspore import Tensor, mint, nn, ops

from mf_config import ModelConfig
from mf_config.component_settings import settings_error
from mf_config.components import structure_model_settings
from mf_config.errors import Path
from mf_config.yaml_source import Source
from mf_parallel.runtime.expert_dispatch import ExpertGroup

from ..registry import MODELS
from ..settings.deepseek_v3 import DeepseekV3Settings
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


def deepseek_v3_settings(config: ModelConfig, source: Source | None = None) -> DeepseekV3Settings:
    """The settings of `config.extras`, checked; `ConfigError` lists every problem by path."""
    return structure_model_settings(DeepseekV3Settings, config, source)


class DeepseekV3DecoderLayer(nn.Cell):
    """`x [seq, batch, hidden]` -> (`x + attention + mlp`, the layer's balance loss).

    The balance loss leaves the layer as an output, not as an attribute set in the forward:
    under recompute (`Cell.recompute()`, mf-memory) a tensor kept aside from a recomputed
    cell has no gradient path (measured: the router's gradient then misses its share), while
    outputs are differentiated correctly. Dense layers return a float32 zero.
    """

    def __init__(self, s: DeepseekV3Settings, index: int, init: ParamInit,
                 compute_dtype: ms.Type, expert_group: ExpertGroup | None = None):
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
            make_mlp=make_mlp, expert_group=expert_group)

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
    Single process: `from_config` rejects a tensor group of size > 1.
    """

    compile_blocker = "its MoE layers route tokens to experts on the host (numpy)"

    def __init__(self, settings: DeepseekV3Settings, *, tensor_group: Any = None,
                 seed: int | None = None, source: Source | None = None,
                 expert_group: ExpertGroup | None = None):
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
            DeepseekV3DecoderLayer(s, index, init, self.compute_dtype, expert_group)
            for index in range(s.num_hidden_layers)])
        self.final_norm = RMSNorm(s.hidden_size, s.rms_norm_eps)
        self.tied = s.tie_word_embeddings
        if not self.tied:
            self.head = Linear(init.normal("lm_head.weight", (s.vocab_size, s.hidden_size)))
        self.hf_ignored = (("lm_head.weight",) if self.tied else ()) + _other_ranks_experts(
            s, expert_group)
        self.last_balance_loss: Tensor | None = None
        _cast_parameters(self, params_dtype)

    @classmethod
    def from_config(cls, config: ModelConfig, *, tensor_group: Any = None,
                    source: Source | None = None, seed: int | None = None,
                    expert_group: ExpertGroup | None = None) -> "DeepseekV3ForCausalLM":
        """The model the `model` section describes (keys checked, see `DeepseekV3Settings`);
        `tensor_group` must be None or of size 1. `seed` draws the initial weights (default:
        MindSpore's global seed, else 0); `expert_group` splits the routed experts (None: all
        on this rank)."""
        return cls(deepseek_v3_settings(config, source), tensor_group=tensor_group, seed=seed,
                   source=source, expert_group=expert_group)

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

    def expert_load(self) -> dict[int, np.ndarray]:
        """Global layer index -> (token, expert) pairs this rank's experts computed in the
        last forward (int64 `[n_routed_experts]`, zero for experts other ranks hold); equal to
        `tokens_per_expert()` without expert parallelism."""
        return {self.layer_offset + index: layer.mlp.last_expert_load.copy()
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


def _other_ranks_experts(s: DeepseekV3Settings,
                         expert_group: ExpertGroup | None) -> tuple[str, ...]:
    """The Hugging Face names of the routed experts other ranks hold (expert parallelism):
    a rank loads its own share of a whole checkpoint."""
    if expert_group is None or expert_group.size == 1:
        return ()
    held = set(expert_group.local_experts(s.n_routed_experts))
    return tuple(f"model.layers.{layer}.mlp.experts.{e}.{proj}.weight"
                 for layer in range(s.first_k_dense_replace, s.num_hidden_layers)
                 for e in range(s.n_routed_experts) if e not in held
                 for proj in ("gate_proj", "up_proj", "down_proj"))


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
