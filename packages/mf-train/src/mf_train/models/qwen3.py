"""Qwen3 dense decoder, Hugging Face's `Qwen3ForCausalLM` (transformers
`models/qwen3/modeling_qwen3.py`), for training in MindSpore PyNative.

    x = embed(ids)
    per layer: h = x + o_proj(attn(rope(q_norm(q)), rope(k_norm(k)), v))  on input_norm(x)
               x = h + down(silu(gate) * up)                              on post_norm(h)
    logits = head(final_norm(x))      (head = the embedding table when tied)

q/k norms are RMSNorms over each head's `head_dim` (Qwen3's addition to Qwen2), applied before
the rotary embedding; keys and values have `num_key_value_heads` heads shared by groups of
query heads. Our cells fuse q/k/v into `attention.qkv` and gate/up into `mlp.gate_up`;
`weight_maps()` gives each parameter's Hugging Face names, and `hf_weights.load_hf_state`
fills the model from a Hugging Face checkpoint.

The `model` section's keys are Hugging Face's `config.json` keys (`settings.qwen3.
Qwen3Settings`, MindSpore-free so that `mf-config validate` checks them), so a Qwen3
`config.json` maps straight over; keys that select behaviour this model does not have
(sliding windows, rope scaling, attention dropout, other activations) are rejected.
"""

from collections.abc import Callable, Sequence
from typing import Any

import mindspore as ms
import numpy as np
from mindspore import Parameter, Tensor, nn

from mf_config import ModelConfig
from mf_config.component_settings import settings_error, structure_settings
from mf_config.errors import Path
from mf_config.sections import declared_fields
from mf_config.yaml_source import Source
from mf_parallel.placement import ShardingTable

from ..registry import MODELS
from ..settings.qwen3 import Qwen3Settings
from .attention_inputs import Attending, AttentionPlaces
from .blocks import (
    AttentionCore,
    Embedding,
    Linear,
    ParamInit,
    RMSNorm,
    RotaryEmbedding,
    SwiGLU,
    apply_rotary,
    fuse_rows,
    linear,
    resolve_compute_dtype,
    same_dtype,
)
from .causal_lm import CausalLMPieces
from .context_attention import SequenceExchange
from .gathered_heads import GatheredHeads
from .hf_weights import WeightMap, held_elsewhere
from .kv_cache import LayerCache
from .parts import LayerStack, ModelPart, each_built
from .sharding import table_from_maps

PATH: Path = ("model",)


def qwen3_settings(raw: dict[str, Any], source: Source | None = None) -> Qwen3Settings:
    """The `model` section's structure keys as `Qwen3Settings`; `ConfigError` listing every
    problem (unknown key, wrong type, missing size, unsupported value) at `model.<key>`."""
    return structure_settings(Qwen3Settings, raw, PATH, source, owner="model type 'qwen3'",
                              also_allowed=declared_fields(ModelConfig))


# --- weights and their Hugging Face names -------------------------------------------------

def weight_maps(s: Qwen3Settings) -> list[WeightMap]:
    """Every parameter of the model with its Hugging Face names and full shapes."""
    v, h = s.vocab_size, s.hidden_size
    maps = [WeightMap("embedding.weight", ("model.embed_tokens.weight",), ((v, h),), 0)]
    for index in range(s.num_hidden_layers):
        maps += layer_weight_maps(s, index)
    maps.append(WeightMap("final_norm.weight", ("model.norm.weight",), ((h,),)))
    if not s.tie_word_embeddings:
        maps.append(WeightMap("head.weight", ("lm_head.weight",), ((v, h),), 0))
    return maps


def sharding_table(s: Qwen3Settings) -> ShardingTable:
    """Every parameter with what the placement record needs (`mf_parallel.placement`)."""
    return table_from_maps(weight_maps(s), tied=s.tie_word_embeddings, dtype=s.params_dtype)


def layer_weight_maps(s: Qwen3Settings, index: int) -> list[WeightMap]:
    """The parameters of decoder layer `index` (ours `decoder_layers.i.*`, HF
    `model.layers.i.*`)."""
    ours, hf = f"decoder_layers.{index}.", f"model.layers.{index}."
    h, d, i = s.hidden_size, s.head_size(), s.intermediate_size
    q, kv = s.num_attention_heads * d, s.kv_heads() * d
    attn = hf + "self_attn."
    maps = [
        WeightMap(ours + "input_norm.weight", (hf + "input_layernorm.weight",), ((h,),)),
        WeightMap(ours + "attention.qkv.weight",
                  tuple(f"{attn}{p}_proj.weight" for p in "qkv"), ((q, h), (kv, h), (kv, h)), 0),
    ]
    if s.attention_bias:
        maps.append(WeightMap(ours + "attention.qkv.bias",
                              tuple(f"{attn}{p}_proj.bias" for p in "qkv"), ((q,), (kv,), (kv,)),
                              0))
    maps += [
        WeightMap(ours + "attention.q_norm.weight", (attn + "q_norm.weight",), ((d,),)),
        WeightMap(ours + "attention.k_norm.weight", (attn + "k_norm.weight",), ((d,),)),
        WeightMap(ours + "attention.out.weight", (attn + "o_proj.weight",), ((h, q),), 1),
    ]
    if s.attention_bias:
        maps.append(WeightMap(ours + "attention.out.bias", (attn + "o_proj.bias",), ((h,),)))
    return [
        *maps,
        WeightMap(ours + "post_norm.weight", (hf + "post_attention_layernorm.weight",), ((h,),)),
        WeightMap(ours + "mlp.gate_up.weight", (hf + "mlp.gate_proj.weight",
                                                hf + "mlp.up_proj.weight"), ((i, h), (i, h)), 0),
        WeightMap(ours + "mlp.down.weight", (hf + "mlp.down_proj.weight",), ((h, i),), 1),
    ]


def initial_weights(maps: list[WeightMap], init: ParamInit) -> dict[str, np.ndarray]:
    """HF name -> initial full array: norms one, biases zero, other weights normal."""
    weights = {}
    for entry in maps:
        for name, shape in zip(entry.hf, entry.shapes, strict=True):
            if name.endswith("norm.weight"):
                weights[name] = init.ones(shape)
            elif name.endswith(".bias"):
                weights[name] = init.zeros(shape)
            else:
                weights[name] = init.normal(name, shape)
    return weights


# --- cells ---------------------------------------------------------------------------------

class Qwen3Attention(nn.Cell):
    """Grouped-query causal self-attention with per-head q/k RMSNorm and rotary embeddings.

    Input and output `[seq, batch, hidden]`; `qkv` holds `heads` query heads and `kv_heads`
    key and value heads (`tensor_counts`: a tensor-parallel rank holds its share of them;
    `tensor_partial`: the norms each rank then runs on its heads only).
    """

    tensor_counts = ("heads", "kv_heads")
    tensor_partial = ("q_norm", "k_norm")

    def __init__(self, s: Qwen3Settings, w: dict[str, np.ndarray], prefix: str,
                 rotary: RotaryEmbedding, core: AttentionCore):
        super().__init__()
        self.head_dim = s.head_size()
        self.heads, self.kv_heads = s.num_attention_heads, s.kv_heads()
        p = prefix + "self_attn."
        qkv = [w[f"{p}{name}_proj.weight"] for name in "qkv"]
        bias = ([w[f"{p}{name}_proj.bias"] for name in "qkv"] if s.attention_bias else None)
        self.qkv = Linear(fuse_rows(qkv), None if bias is None else fuse_rows(bias))
        self.q_norm = RMSNorm(self.head_dim, s.rms_norm_eps)
        self.k_norm = RMSNorm(self.head_dim, s.rms_norm_eps)
        self.out = Linear(w[p + "o_proj.weight"],
                          w[p + "o_proj.bias"] if s.attention_bias else None)
        self.tile = rotary.tile
        self.rotary = rotary
        self.exchange = SequenceExchange(None, core)
        self.gathered = (GatheredHeads(self.heads, self.kv_heads, self.head_dim)
                         if self.tile and not core.flash else None)

    def prepare_for_graph(self, dynamic: bool = False) -> None:
        """Before this layer is compiled: the strided views (see `gathered_heads`; the
        gathers' per-shape cells do not trace)."""
        self.gathered = None

    def construct(self, x: Tensor, cos: Tensor, sin: Tensor, mask: Tensor | None = None,
                  lengths: tuple[int, ...] | None = None) -> Tensor:
        qkv = self.qkv(x)
        if self.gathered is not None:
            return self.out(self._gathered(qkv, cos, sin, mask))
        q, k, v = self._rotated_heads(qkv, cos, sin)
        context = self.exchange.attend(q, k, v, mask, lengths)
        return self.out(context.reshape(qkv.shape[0], qkv.shape[1], self.heads * self.head_dim))

    def decode(self, x: Tensor, cos: Tensor, sin: Tensor, cache: LayerCache,
               mask: Tensor) -> Tensor:
        """`construct` for new positions only (one process): their keys and values appended
        to `cache`, their queries attending to every cached position (`mask`:
        `kv_cache.causal_mask`)."""
        qkv = self.qkv(x)
        q, k, v = self._rotated_heads(qkv, cos, sin)
        k, v = cache.append(k, v)
        context = self.exchange.attend(q, k, v, mask, None)
        return self.out(context.reshape(qkv.shape[0], qkv.shape[1], self.heads * self.head_dim))

    def _rotated_heads(self, qkv: Tensor, cos: Tensor, sin: Tensor
                       ) -> tuple[Tensor, Tensor, Tensor]:
        """The fused projection's queries and keys (normed per head, rotated) and values,
        `[seq, batch, heads, head_dim]` each."""
        q_size, kv_size = self.heads * self.head_dim, self.kv_heads * self.head_dim
        q = apply_rotary(self._heads(qkv[..., :q_size], self.heads, self.q_norm), cos, sin,
                         self.tile)
        k = apply_rotary(self._heads(qkv[..., q_size:q_size + kv_size], self.kv_heads,
                                     self.k_norm), cos, sin, self.tile)
        return q, k, self._heads(qkv[..., q_size + kv_size:], self.kv_heads)

    def _gathered(self, qkv: Tensor, cos: Tensor, sin: Tensor, mask: Tensor | None) -> Tensor:
        """The attention of `construct` without strided views (CPU, PyNative): q, k, v
        gathered into `[b, heads, s, d]`, normed and rotated there, and the output gathered
        back to `[s, b, heads * d]`."""
        q, k, v = self.gathered.split(qkv)
        q = self.gathered.rotate(self.q_norm(q), *self._tables(cos, sin, q))
        k = self.gathered.rotate(self.k_norm(k), *self._tables(cos, sin, k))
        return self.gathered.merge(self.exchange.core(q, k, v, mask))

    def _tables(self, cos: Tensor, sin: Tensor, x: Tensor) -> tuple[Tensor, Tensor]:
        cos, sin = self.rotary.head_tables(cos, sin, x.shape)
        return same_dtype(cos, x.dtype), same_dtype(sin, x.dtype)

    def _heads(self, x: Tensor, count: int, norm: nn.Cell | None = None) -> Tensor:
        """`[s, b, count * d]` -> `[s, b, count, d]`, normed per head when `norm` is given."""
        x = x.reshape(x.shape[0], x.shape[1], count, self.head_dim)
        return x if norm is None else norm(x)


class Qwen3DecoderLayer(nn.Cell):
    """Pre-norm residual block: `h = x + attention(input_norm(x))`,
    `out = h + mlp(post_norm(h))`. `sequence_norms` run on the whole hidden state (a
    sequence slice of it under sequence parallelism)."""

    sequence_norms = ("input_norm", "post_norm")

    def __init__(self, s: Qwen3Settings, w: dict[str, np.ndarray], index: int,
                 rotary: RotaryEmbedding, core: AttentionCore):
        super().__init__()
        p = f"model.layers.{index}."
        self.input_norm = RMSNorm(s.hidden_size, s.rms_norm_eps)
        self.attention = Qwen3Attention(s, w, p, rotary, core)
        self.post_norm = RMSNorm(s.hidden_size, s.rms_norm_eps)
        self.mlp = SwiGLU(w[p + "mlp.gate_proj.weight"], w[p + "mlp.up_proj.weight"],
                          w[p + "mlp.down_proj.weight"])

    def construct(self, x: Tensor, cos: Tensor, sin: Tensor, mask: Tensor | None = None,
                  lengths: tuple[int, ...] | None = None) -> Tensor:
        h = x + self.attention(self.input_norm(x), cos, sin, mask, lengths)
        return h + self.mlp(self.post_norm(h))

    def decode(self, x: Tensor, cos: Tensor, sin: Tensor, cache: LayerCache,
               mask: Tensor) -> Tensor:
        """`construct` for new positions, with the attention's keys and values cached."""
        h = x + self.attention.decode(self.input_norm(x), cos, sin, cache, mask)
        return h + self.mlp(self.post_norm(h))


@MODELS.register("Qwen3ForCausalLM", "qwen3")
class Qwen3ForCausalLM(CausalLMPieces, nn.Cell):
    """Qwen3 causal LM. `model(input_ids, labels, loss_mask=None, position_ids=None,
    actual_seq_len=None, attention_mask=None)` -> float32 scalar loss
    `sum(ce * mask) / max(sum(mask), 1)`; `model.logits(input_ids)` -> `[b, s, V]` (this rank's
    vocabulary slice under tensor parallelism). `input_ids`, `labels`: int32 `[b, s]`, labels
    already shifted. Packed documents: `position_ids` `[b, s]` restart the rotary positions,
    `actual_seq_len` (document ends) or `attention_mask` (dense, True = masked) keep each
    document to itself (`attention_inputs.AttentionPlaces`).

    Built from its settings alone, it is one process's model; `mf_train.parallelize` cuts it
    to a rank's part from outside (tensor, sequence and context parallelism), setting
    `tensor_group` and `context_group`; under context parallelism the inputs are this rank's
    tokens (`ContextGroup.spans`).

    Layer contract (mf-memory): `decoder_layers` (a `LayerStack`), `layer_ids`, `model_layers`;
    each layer has
    `input_norm`, `attention` (`qkv`, `q_norm`, `k_norm`, `out`), `post_norm`, `mlp`
    (`gate_up`, `down`). Parameter names: `weight_maps()`.

    Under tensor parallelism the training loop must sum the gradients of marked parameters
    over the group (the placement record's `grad_partial`, `GradientReducer`).
    """

    plain_model = True
    tensor_group = None
    context_group = None

    def __init__(self, settings: Qwen3Settings, *, seed: int | None = None,
                 source: Source | None = None, part: ModelPart | None = None,
                 layer_built: Callable[[nn.Cell], object] | None = None):
        super().__init__()
        found = settings.problems(PATH)
        if found:
            raise settings_error(found, source)
        self.part = part or ModelPart.whole(settings.num_hidden_layers)
        self.settings = settings
        self.layer_ids, self.model_layers = self.part.layers, settings.num_hidden_layers
        self.hf_ignored = ("lm_head.weight",) if settings.tie_word_embeddings else ()
        self.compute_dtype, self.params_dtype = _dtypes(settings)
        init = ParamInit(_seed(seed), settings.initializer_range)
        rotary = self.rotary = RotaryEmbedding(settings.head_size(), settings.rope_theta,
                                               settings.max_position_embeddings)
        core = AttentionCore(settings.head_size() ** -0.5, settings.use_flash_attention,
                             self.compute_dtype)
        self.places = AttentionPlaces(None, varlen=core.flash)
        vocab = (settings.vocab_size, settings.hidden_size)
        self.tied = settings.tie_word_embeddings
        if self.part.embedding or (self.part.head and self.tied):
            self.embedding = Embedding(init.normal("model.embed_tokens.weight", vocab))
        self.decoder_layers = LayerStack({
            i: each_built(Qwen3DecoderLayer(
                settings, initial_weights(layer_weight_maps(settings, i), init), i, rotary,
                core), layer_built)
            for i in self.part.layers})
        if self.part.head:
            self.final_norm = RMSNorm(settings.hidden_size, settings.rms_norm_eps)
            if not self.tied:
                self.head = Linear(init.normal("lm_head.weight", vocab))
            self.head_entry = None
        if self.params_dtype != ms.float32:
            for param in self.get_parameters():
                param.set_dtype(self.params_dtype)
        self.hf_ignored += held_elsewhere(weight_maps(settings), self)

    @classmethod
    def from_config(cls, config: ModelConfig, *, source: Source | None = None,
                    seed: int | None = None, part: ModelPart | None = None,
                    layer_built: Callable[[nn.Cell], object] | None = None,
                    ) -> "Qwen3ForCausalLM":
        """The model the `model` section describes (keys checked, see `Qwen3Settings`); only
        `part` of it on a pipeline stage; `layer_built` called with each decoder layer once
        built."""
        return cls(cls.settings_of(config, source), seed=seed, source=source, part=part,
                   layer_built=layer_built)

    @staticmethod
    def settings_of(config: ModelConfig, source: Source | None = None) -> Qwen3Settings:
        """The `model` section's settings, checked."""
        return qwen3_settings(config.extras, source)

    @classmethod
    def sharding_table(cls, config: ModelConfig, source: Source | None = None,
                       ) -> ShardingTable:
        """The whole model's sharding table from the `model` section, building nothing."""
        return sharding_table(qwen3_settings(config.extras, source))

    def weight_maps(self) -> list[WeightMap]:
        """The parameters this model (or pipeline part) holds, with their Hugging Face names."""
        names = {name for name, _ in self.parameters_and_names()}
        return [entry for entry in weight_maps(self.settings) if entry.ours in names]

    def hf_names(self) -> dict[str, tuple[str, ...]]:
        """Our parameter name -> its Hugging Face name(s) (fused parts in row order)."""
        return {entry.ours: entry.hf for entry in self.weight_maps()}

    def construct(self, input_ids: Tensor, labels: Tensor, loss_mask: Tensor | None = None,
                  position_ids: Tensor | None = None, actual_seq_len: Tensor | None = None,
                  attention_mask: Tensor | None = None) -> Tensor:
        if self._compiled_body is not None:
            return self._compiled_body(*self.body_inputs(input_ids, labels, loss_mask,
                                                         position_ids, actual_seq_len,
                                                         attention_mask))
        attending = self.attending(input_ids, position_ids, actual_seq_len, attention_mask)
        hidden, _ = self.decoder(self.embed(input_ids), self.part.layers, attending)
        return self.head_loss(hidden, labels, loss_mask)

    # --- one graph from the embedding to the loss (`compiled_layers`) -----------------

    _compiled_body: Callable[..., Tensor] | None = None

    def body_blocker(self) -> str | None:
        """Why the embedding lookup, layers, final norm, head and loss cannot be one compiled
        graph here, or None: they can where this rank holds the whole model, unsplit, with
        the whole vocabulary, and attention takes no per-document lengths (which a graph
        would hold as constants)."""
        if self.part != ModelPart.whole(self.model_layers):
            return "this rank holds part of the model (a pipeline stage)"
        if self.tensor_group is not None or self.context_group is not None:
            return "the layers communicate over a tensor or context group"
        if self.places.varlen:
            return "the attention kernel takes each micro-batch's document lengths"
        if self.vocabulary is not None:
            return "the vocabulary is split over the ranks"
        return None

    def compile_body(self) -> None:
        """Run the embedding lookup, the decoder layers, the final norm, the head and the
        loss as one graph (`mindspore.jit`) in every later forward pass; the input checks,
        attention mask and rotary tables are made on the host first (`body_inputs`).
        `body_blocker()` must be None."""
        # a plain tuple, set past Cell.__setattr__: the layers keep their one place (and
        # their parameters' names) in the model
        object.__setattr__(self, "_body_layers", tuple(
            self.decoder_layers.by_id(index) for index in self.part.layers))
        self._compiled_body = ms.jit(self._body)

    def gradient_graph(self, params: Sequence[Parameter]) -> Callable[..., tuple]:
        """The loss and its gradients with respect to `params` as ONE compiled graph, forward
        and backward (`compile_body` first): called as `(scale, *construct's arguments)`, it
        returns `(loss * scale, gradients)`, the scale a 0-d float32 tensor (an input, so a
        new value compiles nothing).

        Why one graph rather than PyNative's autograd around the compiled forward: the
        backward pass then needs no tape on the host, and on the CPU backend the step is
        1.1-1.4x faster (benchmarks/README.md, "speed.py")."""
        if self._compiled_body is None:
            raise RuntimeError("gradient_graph() needs compile_body() first")

        def scaled(scale: Tensor, *inputs: Tensor | None) -> Tensor:
            return self._body(*inputs) * scale

        graph = ms.jit(ms.value_and_grad(scaled, None, list(params)))

        def run(scale: Tensor, *model_inputs: Tensor | None) -> tuple:
            return graph(scale, *self.body_inputs(*model_inputs))
        return run

    def body_inputs(self, input_ids: Tensor, labels: Tensor, loss_mask: Tensor | None = None,
                    position_ids: Tensor | None = None, actual_seq_len: Tensor | None = None,
                    attention_mask: Tensor | None = None) -> tuple[Tensor | None, ...]:
        """`construct`'s arguments -> the compiled body's: the ids checked, the attention
        mask and the rotary tables made on the host."""
        self.check_ids(input_ids)
        attending = self.attending(input_ids, position_ids, actual_seq_len, attention_mask)
        cos, sin = self.rotary.at(attending.positions)
        return input_ids, cos, sin, attending.mask, labels, loss_mask

    def _body(self, input_ids: Tensor, cos: Tensor, sin: Tensor, mask: Tensor | None,
              labels: Tensor, loss_mask: Tensor | None) -> Tensor:
        hidden = self.lookup(input_ids)
        for layer in self._body_layers:
            hidden = layer(hidden, cos, sin, mask)
        return self.head_loss(hidden, labels, loss_mask)

    # --- pipeline pieces (`parts.PipelineModel`) ----------------------------------------

    def decoder(self, hidden: Tensor, layers: Sequence[int],
                attending: Attending) -> tuple[Tensor, None]:
        """`hidden` through the decoder layers of these global ids (no auxiliary loss)."""
        cos, sin = self.rotary.at(attending.positions)
        for index in layers:
            hidden = self.decoder_layers.by_id(index)(hidden, cos, sin, attending.mask,
                                                      attending.lengths)
        return hidden, None

    def _head_logits(self, x: Tensor) -> Tensor:
        x = self.final_norm(x)
        if not self.tied:
            return self.head(x)
        if self.head_entry is not None:
            x = self.head_entry(x)
        return linear(x, self.embedding.weight)


def _dtypes(s: Qwen3Settings) -> tuple[ms.Type, ms.Type]:
    """The compute and parameter dtypes on this backend."""
    target = ms.get_context("device_target")
    return (resolve_compute_dtype(s.compute_dtype, target, "model.compute_dtype"),
            resolve_compute_dtype(s.params_dtype, target, "model.params_dtype"))


def _seed(seed: int | None) -> int:
    """The init seed: the given one, else MindSpore's global seed (`ms.set_seed`), else 0."""
    if seed is not None:
        return seed
    return ms.get_seed() or 0
