"""DeepSeek-V3 for causal language modelling (`model_type: deepseek_v3`,
`architectures: DeepseekV3ForCausalLM`), as Hugging Face transformers defines it, on one process
or tensor parallel.

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
multi-token prediction (`num_nextn_predict_layers`/`mtp_num_layers` > 0) and YaRN
(`rope_scaling` not null). Expert parallelism (applied from outside, `mf_train.parallelize`)
builds only this rank's routed experts (`ModelPart.experts`) and dispatches tokens to the
others' (moe.py). The auxiliary-loss-free
bias (`e_score_correction_bias`, a non-trainable Parameter saved with the model) chooses the
experts; with `moe_router_enable_expert_bias` and `moe_router_bias_update_rate` > 0 the trainer
moves it after every step (`update_expert_bias`, driven by `mf_train.step.expert_bias`).

Tensor parallelism (applied from outside, a tensor group of size t > 1, always with sequence
parallelism in the trainer), as Megatron-core splits DeepSeek-V3: the embedding, the untied
head and the cross-entropy are vocabulary parallel and the activations between layers are
sequence slices `[s/t, b, h]`, as in Qwen3; attention is split by heads (mla.py says how); the
dense MLP and the shared experts are column (`gate_up`) / row (`down`) parallel SwiGLUs; the
router and the routed experts are replicated over the tensor group (no expert tensor
parallelism) and run on this rank's sequence slice, and the balance loss is summed over the
slices (moe.py). Every replicated parameter whose gradient on a rank covers only part of the
work (the norms, the router, the routed experts on sequence slices; MLA's down projections on
its heads) is marked (`mf_train.parallelize`), and the training loop sums its gradient over the
tensor group. The settings refuse, before launch, a t that does not divide the heads, the
vocabulary or an MLP width (`DeepseekV3Settings.tensor_parallel_problems`).

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

Hugging Face checkpoints of DeepSeek-V3 also hold its multi-token-prediction modules as layers
`model.layers.{num_hidden_layers + k}` (`num_nextn_predict_layers` of them: a decoder layer plus
`enorm`, `hnorm`, `eh_proj` and `shared_head`); mf does not train MTP, so `hf_skipped` names
them and loading leaves them out with one log line. Their FP8 weights are dequantised by the
reader (`checkpoint/fp8.py`).

"""

import re
from collections.abc import Callable, Iterable, Mapping, Sequence

import mindspore as ms
import numpy as np
from mindspore import Tensor, mint, nn, ops

from mf_config import ModelConfig
from mf_config.components import structure_model_settings
from mf_config.errors import Path
from mf_config.yaml_source import Source
from mf_parallel.placement import ShardingTable

from ..registry import MODELS
from ..settings.deepseek_v3 import DeepseekV3Settings
from .attention_inputs import Attending, AttentionPlaces
from .blocks import (
    Embedding,
    Linear,
    ParamInit,
    RMSNorm,
    RotaryEmbedding,
    SwiGLU,
    linear,
    resolve_compute_dtype,
)
from .causal_lm import CausalLMPieces
from .hf_weights import WeightMap, WeightSource, held_elsewhere
from .hf_weights import hf_names as _hf_names
from .hf_weights import hf_state as _hf_state
from .hf_weights import load_hf_state as _load_hf_state
from .kv_cache import LayerCache
from .mla import MultiLatentAttention
from .moe import MoE
from .parts import LayerStack, ModelPart, each_built
from .sharding import table_from_maps

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
                 compute_dtype: ms.Type, experts: Sequence[int] | None = None):
        super().__init__()
        hf = f"model.layers.{index}"
        self.is_moe = index >= s.first_k_dense_replace
        self.input_norm = RMSNorm(s.hidden_size, s.rms_norm_eps)
        self.attention = MultiLatentAttention(
            hidden_size=s.hidden_size, num_heads=s.num_attention_heads,
            q_lora_rank=s.q_lora_rank, kv_lora_rank=s.kv_lora_rank,
            qk_nope_head_dim=s.qk_nope_head_dim, qk_rope_head_dim=s.qk_rope_head_dim,
            v_head_dim=s.v_head_dim, rms_norm_eps=s.rms_norm_eps,
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
            make_mlp=make_mlp, experts=experts)

    def construct(self, x: Tensor, cos: Tensor, sin: Tensor, mask: Tensor | None = None,
                  lengths: tuple[int, ...] | None = None) -> tuple[Tensor, Tensor]:
        h = x + self.attention(self.input_norm(x), cos, sin, mask, lengths)
        if not self.is_moe:
            return h + self.mlp(self.post_norm(h)), ops.zeros((), ms.float32)
        out, balance = self.mlp(self.post_norm(h))
        return h + out, balance

    def decode(self, x: Tensor, cos: Tensor, sin: Tensor, cache: LayerCache,
               mask: Tensor) -> Tensor:
        """`construct` for new positions, the attention with MLA's compressed cache (the
        routing is per token, so a token alone is routed as in the whole sequence)."""
        h = x + self.attention.decode(self.input_norm(x), cos, sin, cache, mask)
        if not self.is_moe:
            return h + self.mlp(self.post_norm(h))
        return h + self.mlp(self.post_norm(h))[0]


@MODELS.register("DeepseekV3ForCausalLM", "deepseek_v3")
class DeepseekV3ForCausalLM(CausalLMPieces, nn.Cell):
    """DeepSeek-V3 causal LM. `model(input_ids, labels, loss_mask=None)` -> float32 scalar:
    `sum(ce * mask) / max(sum(mask), 1)` + the balance loss; `model.logits(input_ids)` ->
    `[b, s, V]`. `input_ids`, `labels`: int32 `[b, s]`, labels already shifted.

    Layer contract (mf-memory): `decoder_layers` (a `LayerStack`), `layer_ids`,
    `model_layers`; each layer has
    `input_norm`, `attention` (MLA: `q_proj` or `q_a_proj`/`q_a_layernorm`/`q_b_proj`,
    `kv_a_proj_with_mqa`, `kv_a_layernorm`, `kv_b_proj`, `o_proj`), `post_norm`, `mlp` (dense:
    `gate_up`, `down`; MoE: `router`, `experts`, `shared_experts`). Unlike Qwen3's, a layer
    returns `(hidden, balance_loss)` (see `DeepseekV3DecoderLayer`), and an MoE `mlp` returns
    `(output, balance_loss)`.

    MoE statistics: `tokens_per_expert()`, `moe_layers()`, `balance_loss()` (last forward).

    A pipeline stage builds its `part` only (`parts.ModelPart`) and runs its pieces (`embed`,
    `decoder`, `head_loss`, `parts.PipelineModel`); `decoder` returns the balance loss of its
    layers beside the hidden states, which the stage adds to what it differentiates.

    Under tensor parallelism (module docstring) `logits` is this rank's vocabulary slice,
    `tokens_per_expert()` counts this rank's sequence slice, and the training loop must sum
    the gradients of marked parameters over the group (`GradientReducer.partial_sum`).
    """

    compile_blocker = ("its MoE layers read the routing back to the host to give each expert "
                       "its tokens (one read per layer; the routing runs on the device)")

    plain_model = True
    tensor_group = None
    context_group = None

    def __init__(self, settings: DeepseekV3Settings, *, seed: int | None = None,
                 source: Source | None = None, part: ModelPart | None = None,
                 layer_built: Callable[[nn.Cell], object] | None = None):
        super().__init__()
        s = self.settings = settings
        self.rotary = RotaryEmbedding(s.qk_rope_head_dim, s.rope_theta,
                                      s.max_position_embeddings)
        self.part = part or ModelPart.whole(s.num_hidden_layers)
        self.layer_ids, self.model_layers = self.part.layers, s.num_hidden_layers
        target = ms.get_context("device_target")
        self.compute_dtype = resolve_compute_dtype(s.compute_dtype, target)
        self.params_dtype = resolve_compute_dtype(s.params_dtype, target, "model.params_dtype")
        init = ParamInit(_seed(seed), s.initializer_range)
        vocab = (s.vocab_size, s.hidden_size)
        self.tied = s.tie_word_embeddings
        if self.part.embedding or (self.part.head and self.tied):
            self.embedding = Embedding(init.normal("model.embed_tokens.weight", vocab))
        self.decoder_layers = LayerStack({
            index: each_built(DeepseekV3DecoderLayer(s, index, init, self.compute_dtype,
                                                     self.part.experts), layer_built)
            for index in self.part.layers})
        flash = any(layer.attention.core.flash for layer in self.decoder_layers)
        self.places = AttentionPlaces(None, varlen=flash)
        if self.part.head:
            self.final_norm = RMSNorm(s.hidden_size, s.rms_norm_eps)
            if not self.tied:
                self.head = Linear(init.normal("lm_head.weight", vocab))
            self.head_entry = None
        self.last_balance_loss: Tensor | None = None
        _cast_parameters(self, self.params_dtype)
        self.hf_ignored = (("lm_head.weight",) if self.tied else ()) + held_elsewhere(
            settings_weight_maps(s), self)

    @classmethod
    def from_config(cls, config: ModelConfig, *, source: Source | None = None,
                    seed: int | None = None, part: ModelPart | None = None,
                    layer_built: Callable[[nn.Cell], object] | None = None,
                    ) -> "DeepseekV3ForCausalLM":
        """The model the `model` section describes (keys checked, see `DeepseekV3Settings`).
        `seed` draws the initial weights (default: MindSpore's global seed, else 0); only
        `part` of the model (its layers, its routed experts) on a pipeline stage or an
        expert-parallel rank; `layer_built` is called with each decoder layer once built."""
        return cls(deepseek_v3_settings(config, source), seed=seed, source=source, part=part,
                   layer_built=layer_built)

    @staticmethod
    def settings_of(config: ModelConfig, source: Source | None = None) -> DeepseekV3Settings:
        """The `model` section's settings, checked."""
        return deepseek_v3_settings(config, source)

    def compilable_parts(self) -> list[tuple[str, int, nn.Cell, bool]]:
        """The cells of the decoder layers that compile on their own (`context.compile`),
        where a whole MoE layer does not (`compile_blocker`): `(part, layer id, cell,
        dynamic)` for each layer's attention, the dense layers' MLP, the MoE layers' router,
        routed experts and shared experts. A routed expert runs on as many tokens as the
        routing sent it: its graph takes any number (`dynamic`); the routing read, the
        token permutation and the weighted sum stay in PyNative."""
        parts: list[tuple[str, int, nn.Cell, bool]] = []
        for index, layer in zip(self.layer_ids, self.decoder_layers, strict=True):
            parts.append(("attention", index, layer.attention, False))
            if not layer.is_moe:
                parts.append(("dense MLP", index, layer.mlp, False))
                continue
            parts.append(("router", index, layer.mlp.router, False))
            parts += [("routed experts", index, expert, True) for expert in layer.mlp.experts]
            if layer.mlp.shared_experts is not None:
                parts.append(("shared experts", index, layer.mlp.shared_experts, False))
        return parts

    # --- forward ------------------------------------------------------------------------

    def construct(self, input_ids: Tensor, labels: Tensor, loss_mask: Tensor | None = None,
                  position_ids: Tensor | None = None, actual_seq_len: Tensor | None = None,
                  attention_mask: Tensor | None = None) -> Tensor:
        attending = self.attending(input_ids, position_ids, actual_seq_len, attention_mask)
        hidden, balance = self.decoder(self.embed(input_ids), self.part.layers, attending)
        return self.head_loss(hidden, labels, loss_mask) + balance

    # --- pipeline pieces (`parts.PipelineModel`) ----------------------------------------

    def decoder(self, hidden: Tensor, layers: Sequence[int],
                attending: Attending) -> tuple[Tensor, Tensor]:
        """`hidden` through the decoder layers of these global ids, and the balance loss of
        those layers (a float32 scalar, also kept as `last_balance_loss`)."""
        balance = ops.zeros((), ms.float32)
        cos, sin = self.rotary.at(attending.positions)
        for index in layers:
            hidden, layer_balance = self.decoder_layers.by_id(index)(
                hidden, cos, sin, attending.mask, attending.lengths)
            balance = balance + layer_balance
        self.last_balance_loss = balance
        return hidden, balance

    def _head_logits(self, h: Tensor) -> Tensor:
        """Logits `[seq, batch, vocab]` of the last layer's output."""
        h = self.final_norm(h)
        if not self.tied:
            return self.head(h)
        if self.head_entry is not None:  # the whole sequence, this rank's vocabulary
            return linear(self.head_entry(h), self.embedding.weight)
        return mint.matmul(h, self.embedding.weight.astype(h.dtype).T)

    # --- MoE statistics -----------------------------------------------------------------

    def moe_layers(self) -> list[int]:
        """Global indices of the MoE layers."""
        return [index for index, layer in self._layers() if layer.is_moe]

    def tokens_per_expert(self) -> dict[int, np.ndarray]:
        """Global layer index -> tokens routed to each expert (int64 `[n_routed_experts]`) in
        the last forward; each sums to tokens * num_experts_per_tok."""
        return {index: layer.mlp.last_tokens_per_expert.copy()
                for index, layer in self._layers() if layer.is_moe}

    def expert_load(self) -> dict[int, np.ndarray]:
        """Global layer index -> (token, expert) pairs this rank's experts computed in the
        last forward (int64 `[n_routed_experts]`, zero for experts other ranks hold); equal to
        `tokens_per_expert()` without expert parallelism."""
        return {index: layer.mlp.last_expert_load.copy()
                for index, layer in self._layers() if layer.is_moe}

    @property
    def expert_bias_update_rate(self) -> float:
        """The auxiliary-loss-free update rate; 0.0 when the update is off."""
        s = self.settings
        return s.moe_router_bias_update_rate if s.moe_router_enable_expert_bias else 0.0

    def update_expert_bias(self, counts: Mapping[int, Tensor]) -> None:
        """Move each MoE layer's `e_score_correction_bias` by one auxiliary-loss-free step,
        on the device.

        Args:
            counts: global layer index -> the step's tokens per expert summed over every rank
                that routes different tokens (float32, `mf_train.step.expert_counts.global_counts`).
        """
        for index, layer in self._layers():
            if layer.is_moe and index in counts:
                layer.mlp.router.update_bias(counts[index], self.expert_bias_update_rate)

    def _layers(self) -> Iterable[tuple[int, "DeepseekV3DecoderLayer"]]:
        """(global id, layer) of the layers this model (or pipeline part) holds."""
        return zip(self.decoder_layers.ids, self.decoder_layers, strict=True)

    def balance_loss(self) -> float:
        """The balance-loss part of the last forward's loss (0.0 before any forward)."""
        if self.last_balance_loss is None:
            return 0.0
        return float(self.last_balance_loss.asnumpy())

    # --- Hugging Face weights -----------------------------------------------------------

    @classmethod
    def sharding_table(cls, config: ModelConfig, source: Source | None = None,
                       ) -> ShardingTable:
        """The whole model's sharding table from the `model` section, building nothing."""
        return sharding_table(deepseek_v3_settings(config, source))

    def weight_maps(self) -> list[WeightMap]:
        """The parameters this model (or its part) holds, with their Hugging Face names, full
        shapes and the axis tensor parallelism splits them along (`settings_weight_maps`)."""
        names = {name for name, _ in self.parameters_and_names()}
        return [entry for entry in settings_weight_maps(self.settings) if entry.ours in names]

    def hf_skipped(self, names: Iterable[str]) -> tuple[set[str], str]:
        """The multi-token-prediction tensors among HF `names` and why they are left out.

        A layer index >= `num_hidden_layers` is MTP when it holds one of the MTP-only modules
        (`enorm`, `hnorm`, `eh_proj`, `shared_head`); other surplus layers stay unknown, so a
        checkpoint with more decoder layers than the model is still refused.
        """
        layers: dict[int, set[str]] = {}
        for name in names:
            match = _HF_LAYER.match(name)
            if match and int(match.group(1)) >= self.settings.num_hidden_layers:
                layers.setdefault(int(match.group(1)), set()).add(name)
        mtp = sorted(index for index, found in layers.items()
                     if any(_HF_LAYER.match(name).group(2) in _MTP_ONLY for name in found))
        skipped = {name for index in mtp for name in layers[index]}
        where = ", ".join(f"model.layers.{index}" for index in mtp)
        return skipped, (f"the multi-token-prediction layer(s) {where} (num_nextn_predict_layers"
                         f"): mf does not train multi-token prediction")

    def hf_names(self) -> dict[str, tuple[str, ...]]:
        return _hf_names(self)

    def load_hf_state(self, weights: WeightSource | Mapping[str, np.ndarray],
                      strict: bool = True) -> None:
        _load_hf_state(self, weights, strict)

    def hf_state(self) -> dict[str, np.ndarray]:
        return _hf_state(self)


_LAYER = re.compile(r"decoder_layers\.(\d+)\.(.+)")
_HF_LAYER = re.compile(r"model\.layers\.(\d+)\.([^.]+)")
_MTP_ONLY = {"enorm", "hnorm", "eh_proj", "shared_head"}
_TOP = {"embedding.weight": "model.embed_tokens.weight",
        "final_norm.weight": "model.norm.weight", "head.weight": "lm_head.weight"}
_SUBLAYER = {"input_norm": "input_layernorm", "post_norm": "post_attention_layernorm",
             "attention": "self_attn", "mlp": "mlp"}
_MLP_PART = {"router": "gate", "down": "down_proj"}


_ROW_SPLIT = ("q_proj", "q_b_proj", "kv_b_proj", "gate_up")  # column parallel: output rows
_COLUMN_SPLIT = ("o_proj", "down")                            # row parallel: input columns


def tensor_split_axis(ours: str) -> int | None:
    """The axis tensor parallelism splits our parameter `ours` along (0: rows, 1: columns),
    or None when every tensor rank holds it whole (norms, MLA's down projections, the router
    and the routed experts)."""
    if ours in ("embedding.weight", "head.weight"):
        return 0
    parts = ours.split(".")
    if "experts" in parts or "router" in parts or len(parts) < 2:
        return None
    if parts[-2] in _ROW_SPLIT:
        return 0
    return 1 if parts[-2] in _COLUMN_SPLIT else None


def settings_weight_maps(s: DeepseekV3Settings) -> list[WeightMap]:
    """Every parameter of the whole model (every routed expert) with its Hugging Face names,
    full shapes and tensor-parallel axis, from the settings alone, in the model's order."""
    h, heads = s.hidden_size, s.num_attention_heads
    qk = s.qk_nope_head_dim + s.qk_rope_head_dim
    shapes: list[tuple[str, tuple[int, ...]]] = [("embedding.weight", (s.vocab_size, h))]

    def mlp(prefix: str, size: int) -> None:
        shapes.extend([(f"{prefix}.gate_up.weight", (2 * size, h)),
                       (f"{prefix}.down.weight", (h, size))])

    for index in range(s.num_hidden_layers):
        layer = f"decoder_layers.{index}."
        attention = layer + "attention."
        shapes.append((layer + "input_norm.weight", (h,)))
        if s.q_lora_rank is None:
            shapes.append((attention + "q_proj.weight", (heads * qk, h)))
        else:
            shapes += [(attention + "q_a_proj.weight", (s.q_lora_rank, h)),
                       (attention + "q_a_layernorm.weight", (s.q_lora_rank,)),
                       (attention + "q_b_proj.weight", (heads * qk, s.q_lora_rank))]
        shapes += [
            (attention + "kv_a_proj_with_mqa.weight", (s.kv_lora_rank + s.qk_rope_head_dim, h)),
            (attention + "kv_a_layernorm.weight", (s.kv_lora_rank,)),
            (attention + "kv_b_proj.weight",
             (heads * (s.qk_nope_head_dim + s.v_head_dim), s.kv_lora_rank)),
            (attention + "o_proj.weight", (h, heads * s.v_head_dim)),
            (layer + "post_norm.weight", (h,))]
        if index < s.first_k_dense_replace:
            mlp(layer + "mlp", s.intermediate_size)
            continue
        shapes += [(layer + "mlp.router.weight", (s.n_routed_experts, h)),
                   (layer + "mlp.router.e_score_correction_bias", (s.n_routed_experts,))]
        for expert in range(s.n_routed_experts):
            mlp(f"{layer}mlp.experts.{expert}", s.moe_intermediate_size)
        if s.n_shared_experts:
            mlp(layer + "mlp.shared_experts", s.moe_intermediate_size * s.n_shared_experts)
    shapes.append(("final_norm.weight", (h,)))
    if not s.tie_word_embeddings:
        shapes.append(("head.weight", (s.vocab_size, h)))
    maps = []
    for name, shape in shapes:
        hf = hf_parameter_names(name)
        part = (shape[0] // len(hf), *shape[1:])
        maps.append(WeightMap(name, hf, tuple(part for _ in hf), tensor_split_axis(name)))
    return maps


def sharding_table(s: DeepseekV3Settings) -> ShardingTable:
    """Every parameter with what the placement record needs (`mf_parallel.placement`); the
    routing bias is float32 and not trained (`_cast_parameters`, `Router`)."""
    biases = {entry.ours for entry in settings_weight_maps(s)
              if entry.ours.endswith("e_score_correction_bias")}
    return table_from_maps(settings_weight_maps(s), tied=s.tie_word_embeddings,
                           dtype=s.params_dtype, experts=s.n_routed_experts, frozen=biases,
                           float32=biases)


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


def layer_hf_names(s: DeepseekV3Settings, layer: int) -> tuple[str, ...]:
    """The Hugging Face names of decoder layer `layer`'s weights (every routed expert's),
    from the settings alone."""
    return tuple(name for entry in settings_weight_maps(s)
                 if entry.ours.startswith(f"decoder_layers.{layer}.") for name in entry.hf)


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
