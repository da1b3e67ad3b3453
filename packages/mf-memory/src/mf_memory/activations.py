"""The activations a decoder layer keeps for backward, tensor by tensor (see `estimate` for
the notation).

The saved activations are those MindSpore's PyNative autograd keeps for the reference decoder
(tests/memory/decoder_model.py): listed with `mindspore.saved_tensors_hooks`, each op keeps
only the inputs its backward needs (a product with a constant keeps the constant, softmax its
output, a matmul both operands). Recompute and swap remove a layer's or a module's tensors.
Pure Python.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from mf_config import TrainConfig
from mf_config.layer_spec import layer_ids

from .mla_moe_activations import causal_lm_output_tensors, latent_layer_tensors
from .model_shape import ModelShape
from .saved import Geometry, Saved

SELECT_MODULES = ("attention", "mlp")
GATHERED_INPUTS = {"attention.qkv": "attention", "mlp.gate_up": "mlp"}
"""Column-parallel linears whose input is all-gathered over the sequence (recompute_comm)."""

def norm_tensors(prefix: str, module: str, rows: int, width: int, e: int) -> list[Saved]:
    """RMSNorm `x * rsqrt(mean(x^2) + eps) * w` keeps x, x^2 and x·rsqrt (rows·width each) and
    rsqrt (rows): square keeps x, mean keeps x^2, rsqrt its output, the weight product x̂."""
    return [Saved(f"{prefix}.input", module, rows * width, e),
            Saved(f"{prefix}.square", module, rows * width, e),
            Saved(f"{prefix}.rstd", module, rows, e),
            Saved(f"{prefix}.normalized", module, rows * width, e)]


def attention_tensors(shape: ModelShape, geo: Geometry, comm_recomputed: bool) -> list[Saved]:
    """Attention internals, per micro-batch (heads split by t):

    - qkv input T·h (all-gathered over the sequence with t > 1; T_sp·h when `recompute_comm`
      names `attention.qkv`, the gather being redone in backward);
    - q norm: q, q^2, q̂ T·a·d/t each and rsqrt T·a/t; k norm likewise with g heads;
    - rotated q T·a·d/t (the score matmul's operand);
    - plain path: k and v repeated to the a query heads T·a·d/t each, and the softmax output
      b·(a/t)·s·S (S x S per head; with cp, the local queries against all S keys);
    - flash attention: rotated k and v T·g·d/t each, and the softmax statistics b·(a/t)·s
      in float32, no probabilities;
    - attention output (the out projection's input) T·a·d/t.
    """
    t, e, T = geo.tp, geo.act_bytes, geo.tokens
    a, g, d = shape.num_attention_heads // t, shape.num_key_value_heads // t, shape.head_dim
    qkv_rows = geo.sp_tokens if comm_recomputed else T
    saved = [Saved("attention.qkv.input", "attention", qkv_rows * shape.hidden_size, e)]
    if shape.qk_norm:
        saved += norm_tensors("attention.q_norm", "attention", T * a, d, e)
        saved += norm_tensors("attention.k_norm", "attention", T * g, d, e)
    saved.append(Saved("attention.q_rotated", "attention", T * a * d, e))
    if geo.flash:
        saved += [Saved("attention.k_rotated", "attention", T * g * d, e),
                  Saved("attention.v", "attention", T * g * d, e),
                  Saved("attention.softmax_stats", "attention", T * a, 4)]
    else:
        saved += [Saved("attention.k_repeated", "attention", T * a * d, e),
                  Saved("attention.v_repeated", "attention", T * a * d, e),
                  Saved("attention.probs", "attention", T * a * geo.seq_length, e)]
    saved.append(Saved("attention.context", "attention", T * a * d, e))
    return saved


def mlp_tensors(shape: ModelShape, geo: Geometry, comm_recomputed: bool) -> list[Saved]:
    """MLP internals, per micro-batch: gate_up input T·h (all-gathered with t > 1, T_sp·h with
    `recompute_comm` on `mlp.gate_up`), then gate, silu(gate), up and their product (the down
    projection's input) T·f/t each."""
    e, T, f = geo.act_bytes, geo.tokens, shape.intermediate_size // geo.tp
    rows = geo.sp_tokens if comm_recomputed else geo.tokens
    return [Saved("mlp.gate_up.input", "mlp", rows * shape.hidden_size, e),
            *(Saved(f"mlp.{name}", "mlp", T * f, e)
              for name in ("gate", "silu", "up", "product"))]


def layer_tensors(shape: ModelShape, geo: Geometry,
                  comm_recomputed: frozenset[str] = frozenset(), layer: int = 0) -> list[Saved]:
    """Everything decoder layer `layer` keeps for backward, per micro-batch: DeepSeek-V3's
    (`mla_moe_activations.latent_layer_tensors`) for a latent-attention model, else:

    The layer input (the residual, also the input norm's input) and the post-attention
    residual are sequence-split (T_sp·h); see `norm_tensors`, `attention_tensors` and
    `mlp_tensors` for the rest. The residual additions keep nothing.
    """
    if shape.latent is not None:
        return latent_layer_tensors(shape, geo, layer)
    h, e = shape.hidden_size, geo.act_bytes
    return [*norm_tensors("input_norm", "input_norm", geo.sp_tokens, h, e),
            *attention_tensors(shape, geo, "attention" in comm_recomputed),
            *norm_tensors("post_norm", "post_norm", geo.sp_tokens, h, e),
            *mlp_tensors(shape, geo, "mlp" in comm_recomputed)]


# ----------------------------------------------------------------------------- treatments


@dataclass(frozen=True)
class LayerActivation:
    """One layer's saved activations on the device, per micro-batch."""

    layer: int
    full: int
    """Bytes without recompute or swap."""
    kept: int
    """Bytes kept on the device after recompute and swap."""
    treatment: str
    """`none`, `full recompute`, `recompute attention`, `swap`, ... (comma-separated)."""
    rebuilt: int = 0
    """Bytes rebuilt at once when this layer's recompute runs (0 without recompute)."""
    swapped: int = 0
    """Bytes offloaded to the host (0 without swap)."""


def layer_activation(layer: int, tensors: list[Saved], geo: Geometry, hidden: int, *,
                     full_recompute: bool, recompute_modules: Iterable[str],
                     swap_layer: bool, swap_modules: Iterable[str]) -> LayerActivation:
    """Apply recompute, then swap, to one layer's saved tensors.

    - full recompute: only the layer input T_sp·h·e is kept; all of `full` is rebuilt at once
      during this layer's backward;
    - recompute of a module (attention, mlp): its internals are dropped and its input
      T_sp·h·e (the norm's output) is kept; the internals are rebuilt during its backward;
    - swap of the layer: nothing stays on the device; swap of a module: its internals leave.
    """
    full = sum(s.bytes for s in tensors)
    treatment: list[str] = []
    module_input = geo.sp_tokens * hidden * geo.act_bytes
    if full_recompute:
        kept, rebuilt, treatment = module_input, full, ["full recompute"]
    else:
        kept, rebuilt = full, 0
        for module in recompute_modules:
            internals = sum(s.bytes for s in tensors if s.module == module)
            kept += module_input - internals
            rebuilt = max(rebuilt, internals)
            treatment.append(f"recompute {module}")
    swapped = 0
    if swap_layer:
        swapped, kept = kept, 0
        treatment.append("swap")
    else:
        for module in swap_modules:
            internals = (module_input if module in recompute_modules or full_recompute
                         else sum(s.bytes for s in tensors if s.module == module))
            swapped += internals
            kept -= internals
            treatment.append(f"swap {module}")
    return LayerActivation(layer, full, kept, ", ".join(treatment) or "none", rebuilt, swapped)


def _select_modules(config: TrainConfig) -> tuple[dict[str, set[int]], list[str]]:
    """recompute.select_module as module -> layer ids (mode select), and warnings."""
    rec = config.recompute
    if rec.mode != "select" or not rec.select_module:
        return {}, []
    chosen, warnings = {}, []
    for module, specs in rec.select_module.items():
        if module in SELECT_MODULES:
            chosen[module] = set(layer_ids(specs))
        else:
            warnings.append(f'recompute.select_module["{module}"]: the estimator models '
                            f"recompute of {', '.join(SELECT_MODULES)} only; counted as kept")
    return chosen, warnings


def _full_layers(config: TrainConfig) -> set[int]:
    rec = config.recompute
    if rec.mode != "full":
        return set()
    return set(layer_ids(rec.full_recompute_layer or []))


def _swap_layers(config: TrainConfig) -> tuple[set[int], dict[str, set[int]], list[str]]:
    """Layers swapped whole, module -> swapped layer ids, warnings (swap.enable only)."""
    swap = config.swap
    if not swap.enable:
        return set(), {}, []
    whole = {layer for entry in swap.layer_swap or [] for layer in layer_ids(
        entry.layers)}
    modules: dict[str, set[int]] = {}
    warnings = []
    for index, entry in enumerate(swap.op_swap or []):
        if entry.op_name in SELECT_MODULES:
            modules.setdefault(entry.op_name, set()).update(layer_ids(entry.layers))
        else:
            warnings.append(f"swap.op_swap[{index}].op_name: the estimator models swap of "
                            f"{', '.join(SELECT_MODULES)} only; {entry.op_name!r} counted as kept")
    return whole, modules, warnings


def _comm_recomputed(config: TrainConfig) -> dict[int, frozenset[str]]:
    """layer -> modules whose gathered linear input is not kept (recompute_comm)."""
    rc = config.recompute_comm
    if not rc.enable or not rc.select_module:
        return {}
    per_layer: dict[int, set[str]] = {}
    for path, specs in rc.select_module.items():
        modules = [GATHERED_INPUTS[path]] if path in GATHERED_INPUTS else (
            [path] if path in SELECT_MODULES else [])
        for layer in layer_ids(specs):
            per_layer.setdefault(layer, set()).update(modules)
    return {layer: frozenset(mods) for layer, mods in per_layer.items()}


def stage_layer_activations(config: TrainConfig, shape: ModelShape, geo: Geometry,
                            layers: Iterable[int]) -> tuple[list[LayerActivation], list[str]]:
    """Per-layer activations of a stage's layers, with the config's recompute and swap."""
    full_layers = _full_layers(config)
    select, warnings = _select_modules(config)
    swap_whole, swap_modules, swap_warnings = _swap_layers(config)
    comm = _comm_recomputed(config) if geo.tp > 1 else {}
    result = []
    for layer in layers:
        tensors = layer_tensors(shape, geo, comm.get(layer, frozenset()), layer)
        result.append(layer_activation(
            layer, tensors, geo, shape.hidden_size,
            full_recompute=layer in full_layers,
            recompute_modules=[m for m, ids in select.items() if layer in ids],
            swap_layer=layer in swap_whole,
            swap_modules=[m for m, ids in swap_modules.items() if layer in ids]))
    return result, warnings + swap_warnings


def transient_bytes(layers: list[LayerActivation], prefetch: int) -> int:
    """Memory needed once, not per micro-batch: the largest recompute rebuild (one layer's or
    module's internals exist again while its backward runs) plus `swap.default_prefetch`
    times the largest swapped layer's bytes (brought back ahead of their backward)."""
    rebuilt = max((layer.rebuilt for layer in layers), default=0)
    swapped = sorted((layer.swapped for layer in layers), reverse=True)
    return rebuilt + sum(swapped[:prefetch])


def backward_working_bytes(shape: ModelShape, geo: Geometry, last_stage: bool) -> int:
    """Memory the largest backward op needs beyond the saved tensors, once per stage.

    Every saved tensor is counted where it is kept; during backward, gradients of the same
    sizes appear while those tensors still live. The largest of them are:
    - plain attention: the softmax backward holds the gradient of the probabilities and of the
      scores at once, 2·b·(a/t)·s·S·e (flash attention never forms them: 0);
    - the loss (last stage): the gradients of the log-probabilities and of the logits,
      2·T·V/t·4 bytes (float32).
    The larger of the two is counted.
    """
    attention = 0 if geo.flash else (
        2 * geo.tokens * (shape.num_attention_heads // geo.tp) * geo.seq_length * geo.act_bytes)
    loss = 2 * geo.tokens * (shape.vocab_size // geo.tp) * 4 if last_stage else 0
    return max(attention, loss)


def output_tensors(shape: ModelShape, geo: Geometry) -> list[Saved]:
    """The last stage's extra activations, per micro-batch (for DeepSeek-V3, mf-train's loss:
    `mla_moe_activations.causal_lm_output_tensors`): the final norm (see
    `norm_tensors`), the head's input T·h (all-gathered with t > 1), and vocabulary-size
    tensors T·V/t: the logits and the cross-entropy's log-probabilities and softmax, all three
    in float32 (the loss is computed in float32)."""
    if shape.latent is not None:
        return causal_lm_output_tensors(shape, geo)
    h, e, vocab = shape.hidden_size, geo.act_bytes, shape.vocab_size // geo.tp
    return [*norm_tensors("final_norm", "output", geo.sp_tokens, h, e),
            Saved("head.input", "output", geo.tokens * h, e),
            *(Saved(f"loss.{name}", "output", geo.tokens * vocab, 4)
              for name in ("logits", "log_probs", "probs"))]


def embedding_tensors(geo: Geometry) -> list[Saved]:
    """The first stage's extra: the token ids T (int32) the embedding's backward indexes with.
    The embedding output is the first layer's input, counted there."""
    return [Saved("embedding.ids", "embedding", geo.tokens, 4)]


# ----------------------------------------------------------------------------- states


