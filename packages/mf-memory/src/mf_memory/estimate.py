"""Per-device memory of a training job, worked out from its configuration alone.

`estimate(config, world_size)` returns the bytes one device holds at its fullest: parameters,
gradients, optimizer state, parameters gathered by FSDP, saved activations of every decoder
layer, and the logits and loss of the last pipeline stage; under pipeline parallelism, the
inputs of the micro-batches in flight and one chunk's activations, as mf-train's stages run.
Every figure is a formula over the config's numbers, written in the docstring of the function
that computes it; no constant is fitted to measurements.

Model: a Qwen3-style dense decoder, its numbers (`ModelShape`: vocabulary, width, layers,
heads, key/value heads, head dim, MLP width, tied head, dtypes) from the typed settings its
package declares (`model_shape.shape_of`), so the estimate uses the defaults the model is built
with. The saved activations are those
MindSpore's PyNative autograd keeps for the reference decoder (tests/memory/decoder_model.py):
listed with `mindspore.saved_tensors_hooks`, each op keeps only the inputs its backward needs
(a product with a constant keeps the constant, softmax its output, a matmul both operands).
DeepSeek-V3 (multi-head latent attention, a mixture of experts after `first_k_dense_replace`
dense layers) is modelled as mf-train builds it: its parameters and their split in
`mla_moe_params` (routed experts divided by expert parallelism and kept whole on each rank
that holds them, or, without expert parallelism, sliced by FSDP/ZeRO over the shard group with
the rest), its saved tensors in
`mla_moe_activations` (equal to the bytes MindSpore saves, layer by layer, on CPU).

Notation in the formulas: b micro-batch, S sequence length, s = S / cp the local sequence,
T = b s local tokens, t tensor parallel, T_sp = T / t when t > 1 (sequence parallelism is on
whenever tensor parallelism is) else T, h hidden, a query heads, g key/value heads, d head
dim, f intermediate, V vocabulary, e bytes per activation element.

Pure Python: never imports MindSpore or numpy.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import attrs

from mf_config import LayerSpec, TrainConfig
from mf_config.components import sequence_length as planned_sequence_length
from mf_parallel import Plan, make_plan

from .activations import (
    Geometry,
    LayerActivation,
    Saved,
    backward_working_bytes,
    embedding_tensors,
    layer_tensors,
    output_tensors,
    stage_layer_activations,
    transient_bytes,
)
from .breakdown import activation_parts, defaulted_fields, dense_width_warning, parameter_parts
from .model_shape import (
    EstimateError,
    ModelShape,
    ParamGroup,
    embedding_params,
    layer_params,
    output_params,
    parameter_count,
    shape_of,
)

DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "fp32": 4, "fp16": 2, "bf16": 2}
OPTIMIZER_STATES = {"adamw": 2, "adam": 2, "muon": 1, "sgd": 1}
"""float32 buffers per parameter: Adam's two moments, Muon's / SGD's momentum."""
GIB, MIB = 1024**3, 1024**2


def size(nbytes: int) -> str:
    """`12.34 GiB` from 1 GiB, `1,234.5 MiB` from 1 MiB, `48.6 KiB` below: bytes as the
    summaries print them (`mf-memory estimate`, mf-train's logs)."""
    if abs(nbytes) >= GIB:
        return f"{nbytes / GIB:,.2f} GiB"
    if abs(nbytes) >= MIB:
        return f"{nbytes / MIB:,.1f} MiB"
    return f"{nbytes / 1024:,.1f} KiB"

def dtype_bytes(name: str, path: str) -> int:
    """Bytes per element of a dtype name; `EstimateError` naming `path` otherwise."""
    try:
        return DTYPE_BYTES[str(name).lower()]
    except KeyError:
        raise EstimateError(f"{path}: unknown dtype {name!r}; allowed: float32, bfloat16, "
                            "float16") from None


def param_dtype(shape: ModelShape) -> tuple[int, int]:
    """(parameter bytes, activation bytes): the model's `params_dtype` and `compute_dtype`."""
    return (dtype_bytes(shape.params_dtype, "model.params_dtype"),
            dtype_bytes(shape.compute_dtype, "model.compute_dtype"))


def optimizer_bytes(groups: list[ParamGroup], tp: int, optimizer: str, param_bytes: int,
                    ep: int = 1) -> int:
    """Optimizer state, unsharded by FSDP: AdamW/Adam two float32 moments per parameter (8 B);
    Muon one float32 momentum (4 B) on hidden matrices, AdamW's 8 B on the rest (embedding,
    head, norms); SGD one momentum (4 B); plus a float32 master copy (4 B) when parameters are
    16-bit. Buffers (`trainable` False) have none; routed experts count E / ep."""
    kind = optimizer.lower()
    if kind not in OPTIMIZER_STATES:
        raise EstimateError(f"optimizer.type: {optimizer!r} is not modelled; known: AdamW, "
                            "Adam, Muon, SGD")
    master = 4 if param_bytes < 4 else 0
    total = 0
    for group in groups:
        if not group.trainable:
            continue
        states = OPTIMIZER_STATES[kind] if group.matrix or kind != "muon" else 2
        total += group.per_device(tp, ep) * (4 * states + master)
    return total


def shard(nbytes: int, degree: int) -> int:
    """`nbytes / degree`, rounded up (each FSDP rank keeps one slice)."""
    return -(-nbytes // degree)


@dataclass(frozen=True)
class Split:
    """How one device's share of the parameters is cut: tensor and expert parallel degrees,
    and the FSDP/ZeRO shard degrees of the dense part (the shard group) and of the routed
    experts (`expert_shard_degree`)."""

    tp: int
    ep: int
    dense_shard: int
    expert_shard: int

    def shard_of(self, group: ParamGroup) -> int:
        """The FSDP/ZeRO degree that slices `group`."""
        return self.expert_shard if group.expert else self.dense_shard

    def full_bytes(self, groups: list[ParamGroup], nbytes: int,
                   trainable_only: bool = False) -> int:
        """Bytes of `groups` on one device before FSDP/ZeRO slicing."""
        return sum(g.per_device(self.tp, self.ep) * nbytes for g in groups
                   if g.trainable or not trainable_only)

    def sharded_bytes(self, groups: list[ParamGroup], nbytes: int,
                      trainable_only: bool = False) -> int:
        """Bytes of `groups` on one device after FSDP/ZeRO slicing (per slicing group)."""
        dense = [g for g in groups if not g.expert]
        experts = [g for g in groups if g.expert]
        return (shard(self.full_bytes(dense, nbytes, trainable_only), self.dense_shard)
                + shard(self.full_bytes(experts, nbytes, trainable_only), self.expert_shard))


def expert_shard_degree(plan: Plan) -> int:
    """The FSDP/ZeRO degree that slices the routed experts, as mf-train runs them: without
    expert parallelism they are sliced with the rest over the shard group; with it, each rank
    keeps its experts, their gradients and their optimizer state whole (mf-train's
    `ExpertParallel` updates them with their own optimizer and only sums their gradients over
    the expert-data group)."""
    return plan.dims.data_shard if plan.dims.expert == 1 else 1


def gathered_param_bytes(stage_groups: list[list[ParamGroup]], outer: list[ParamGroup],
                         split: Split, param_bytes: int, policy: str, pipeline: int) -> int:
    """FSDP (`optim_grads_params`) gathers a unit's parameters around its use. At the start of
    backward the units that did not reshard after forward (mf_parallel.reshard_plan) are still
    gathered, one more resharded unit is gathered again, and the parameters outside the units
    (embedding, final norm, head) stay gathered: each costs its full minus its own slice
    (routed experts under expert parallelism are never sliced, so never gathered)."""
    from mf_parallel import reshard_plan

    if (split.dense_shard, split.expert_shard) == (1, 1) or not stage_groups:
        return 0

    def extra(groups: list[ParamGroup]) -> int:
        return split.full_bytes(groups, param_bytes) - split.sharded_bytes(groups, param_bytes)

    plan = reshard_plan(policy, len(stage_groups), pipeline)
    held = [extra(unit) for unit, reshards in zip(stage_groups, plan, strict=True)
            if not reshards]
    again = [extra(unit) for unit, reshards in zip(stage_groups, plan, strict=True) if reshards]
    return sum(held) + max(again, default=0) + extra(outer)


# ----------------------------------------------------------------------------- the result


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes one device of one pipeline stage holds at its fullest."""

    stage: int
    num_stages: int
    layers: tuple[int, ...]
    params: int
    grads: int
    optimizer: int
    gathered_params: int
    activations: int
    """Saved activations of the layers (times micro-batches in flight), embedding ids,
    recompute rebuild, swap prefetch and the backward working memory."""
    logits: int
    """Final norm, head input, logits and loss (last stage only), times micro-batches."""
    in_flight: int
    """Micro-batch inputs the stage holds at once (one per micro-batch and chunk under
    pipelining, whose B recomputes the chunk; 1 without it)."""
    transient: int
    """Recompute rebuild and swap prefetch (once, not per micro-batch)."""
    working: int
    """Gradients the largest backward op forms beside the saved tensors (once)."""
    layer_activations: tuple[LayerActivation, ...]
    parameter_count: int
    """Parameters of the whole model."""
    limit: int | None
    warnings: tuple[str, ...] = field(default=())
    parameter_parts: tuple[tuple[str, int], ...] = ()
    """`params` by part of the model (routed experts, shared experts, router, attention, ...)."""
    activation_parts: tuple[tuple[str, int], ...] = ()
    """The stage's layers' saved activations by part (MLA, router, dispatch, routed experts,
    ...), one micro-batch, before recompute and swap."""
    defaulted: tuple[tuple[str, object], ...] = ()
    """MoE/MLA model keys the config does not write, with the default value estimated."""
    routed_experts: tuple[int, int, int] | None = None
    """(experts per MoE layer, experts on this device, ranks FSDP/ZeRO slices them over) for a
    mixture-of-experts model."""

    @property
    def total(self) -> int:
        return (self.params + self.grads + self.optimizer + self.gathered_params
                + self.activations + self.logits)

    @property
    def fits(self) -> bool | None:
        """Whether the total fits `context.max_device_memory` (None without a limit)."""
        return None if self.limit is None else self.total <= self.limit

    @property
    def headroom(self) -> int | None:
        """limit - total: negative when it does not fit."""
        return None if self.limit is None else self.limit - self.total

    def as_dict(self) -> dict[str, Any]:
        """Plain data in bytes (what `mf-memory estimate --json` prints)."""
        return {
            "stage": self.stage, "num_stages": self.num_stages,
            "layers": list(self.layers), "parameter_count": self.parameter_count,
            "params": self.params, "grads": self.grads, "optimizer": self.optimizer,
            "gathered_params": self.gathered_params, "activations": self.activations,
            "logits": self.logits, "total": self.total, "in_flight": self.in_flight,
            "transient": self.transient, "working": self.working,
            "layer_activations": [
                {"layer": la.layer, "full": la.full, "kept": la.kept,
                 "treatment": la.treatment, "rebuilt": la.rebuilt, "swapped": la.swapped}
                for la in self.layer_activations],
            "max_device_memory": self.limit, "fits": self.fits, "headroom": self.headroom,
            "warnings": list(self.warnings),
            "parameter_parts": dict(self.parameter_parts),
            "activation_parts": dict(self.activation_parts),
            "defaulted": dict(self.defaulted),
            "routed_experts": None if self.routed_experts is None else dict(zip(
                ("per_layer", "per_device", "sliced_over"), self.routed_experts,
                strict=True)),
        }


_MEMORY = re.compile(r"\s*(\d+(?:\.\d+)?)\s*(GB|GIB|MB|MIB|KB|KIB|B)?\s*", re.IGNORECASE)
_UNITS = {"gb": GIB, "gib": GIB, "mb": MIB, "mib": MIB, "kb": 1024, "kib": 1024, "b": 1}


def parse_memory(text: str | None) -> int | None:
    """Read `context.max_device_memory` as MindSpore does (its GB are binary).

    Args:
        text: `"58GB"`, `"1024MB"`, ... or None.

    Returns:
        Bytes (`"58GB"` -> 58·2^30, `"1024MB"` -> 2^30), or None for None.

    Raises:
        EstimateError: not a size; names context.max_device_memory.
    """
    if text is None:
        return None
    match = _MEMORY.fullmatch(str(text))
    if match is None:
        raise EstimateError(f"context.max_device_memory: {text!r} is not a size; write it "
                            "as \"58GB\" or \"1024MB\"")
    unit = (match.group(2) or "B").lower()
    return int(float(match.group(1)) * _UNITS[unit])


def sequence_length(config: TrainConfig) -> int:
    """`model.seq_length`, else the data loader's `config.seq_length`."""
    value = planned_sequence_length(config)
    if value is None:
        raise EstimateError("model.seq_length: required (or train_dataset.dataloader.config."
                            "seq_length), a positive integer")
    return value


def in_flight(plan: Plan, stage: int) -> int:
    """Micro-batch inputs stage `stage` holds at its fullest: 1 without pipeline parallelism;
    with it, the peak of forwards run minus backwards run in the simulated schedule
    (mf_parallel.simulate), one per (micro-batch, chunk): p - stage for 1F1B (the first stage
    holds the most), every accumulation micro-batch for GPipe."""
    if plan.simulation is None:
        return 1
    return plan.simulation.peak_in_flight[stage]


def pipeline_activations(per_layer: list[LayerActivation], plan: Plan, stage: int,
                         geo: Geometry, hidden: int, first_stage: int) -> int:
    """Saved activations of a pipeline stage as mf-train runs it, bytes.

    A forward (F) keeps only its chunk's input; the backward (B) runs the chunk's forward
    again and takes its gradients at once (`mf_train.layouts.pipeline_executor`). So a stage
    holds `in_flight` inputs, T_sp·h·e each (the token ids, T·4, on the first stage without
    interleaving; with it the hidden size counts for every input, an upper bound), plus the
    saved activations of the one chunk whose B runs: the largest of its chunks (the first
    stage's chunk 0 with the embedding's). The messages in transit (a couple of T_sp·h·e
    tensors at most) are left out.
    """
    layout = plan.layout
    assert layout is not None
    kept = {la.layer: la.kept for la in per_layer}
    chunks = [sum(kept[layer] for layer in layout.layers(stage, chunk))
              + (first_stage if stage == 0 and chunk == 0 else 0)
              for chunk in range(plan.interleave)]
    ids_only = stage == 0 and plan.interleave == 1
    one_input = geo.tokens * 4 if ids_only else geo.sp_tokens * hidden * geo.act_bytes
    return in_flight(plan, stage) * one_input + max(chunks)


def estimate(config: TrainConfig, world_size: int, stage: int | None = None) -> MemoryEstimate:
    """Estimate one device's memory before launching, so that a job that cannot fit is caught
    on a laptop. Pure Python.

    Args:
        config: the whole training config.
        world_size: the number of ranks.
        stage: the pipeline stage to estimate (None: the stage with the largest total).

    Returns:
        The stage's bytes by component, per-layer activations and the verdict.

    Raises:
        EstimateError: what the config lacks, or a stage that does not exist.
        mf_parallel.PlanError: a layout that does not fit the world size, batch or sequence.
    """
    shape = shape_of(config.model)
    seq = sequence_length(config)
    plan = make_plan(config.parallelism, config.training, world_size,
                     num_layers=shape.num_layers, seq_length=seq)
    limit = parse_memory(config.context.max_device_memory)
    stages = range(plan.dims.pipeline) if stage is None else [stage]
    if stage is not None and not 0 <= stage < plan.dims.pipeline:
        raise EstimateError(f"stage {stage} does not exist: there are {plan.dims.pipeline} "
                            f"pipeline stages (0-{plan.dims.pipeline - 1})")
    results = [_stage_estimate(config, shape, seq, plan, s, limit) for s in stages]
    return max(results, key=lambda r: r.total)


def _stage_estimate(config: TrainConfig, shape: ModelShape, seq: int, plan: Plan, stage: int,
                    limit: int | None) -> MemoryEstimate:
    d = plan.dims
    tp, last = d.tensor, d.pipeline - 1
    _check_tp(shape, tp)
    pbytes, abytes = param_dtype(shape)
    geo = Geometry(micro_batch=config.training.local_batch_size, seq_length=seq, tp=tp,
                   cp=d.context, flash=shape.use_flash_attention, act_bytes=abytes,
                   tiled=config.context.device_target == "CPU", ep=d.expert)
    assert plan.layout is not None  # num_layers is always given
    layers = [layer for chunk in range(plan.interleave) for layer in
              plan.layout.layers(stage, chunk)]
    unit_groups = [layer_params(shape, layer) for layer in layers]
    outer = ((embedding_params(shape) if stage == 0 else [])
             + (output_params(shape, shares_embedding_stage=last == 0) if stage == last
                else []))
    groups = [g for unit in unit_groups for g in unit] + outer
    strategy = config.parallelism.data_parallel_shard_strategy
    split = Split(tp=tp, ep=d.expert, dense_shard=d.data_shard,
                  expert_shard=expert_shard_degree(plan))
    params = (split.sharded_bytes(groups, pbytes) if strategy == "optim_grads_params"
              else split.full_bytes(groups, pbytes))
    grads = (split.sharded_bytes(groups, pbytes, trainable_only=True) if strategy != "optim"
             else split.full_bytes(groups, pbytes, trainable_only=True))
    optimizer = sum(
        shard(optimizer_bytes([g for g in groups if g.expert == expert], tp,
                              config.optimizer.type, pbytes, d.expert),
              split.expert_shard if expert else split.dense_shard)
        for expert in (False, True))
    gathered = (gathered_param_bytes(unit_groups, outer, split, pbytes,
                                     config.parallelism.reshard_after_forward_policy,
                                     d.pipeline)
                if strategy == "optim_grads_params" else 0)
    per_layer, warnings = stage_layer_activations(config, shape, geo, layers)
    held = in_flight(plan, stage)
    transient = transient_bytes(per_layer, config.swap.default_prefetch
                                if config.swap.enable else 0)
    first_stage = sum(s.bytes for s in embedding_tensors(geo)) if stage == 0 else 0
    working = backward_working_bytes(shape, geo, last_stage=stage == last)
    saved = (sum(la.kept for la in per_layer) + first_stage if d.pipeline == 1 else
             pipeline_activations(per_layer, plan, stage, geo, shape.hidden_size, first_stage))
    activations = saved + transient + working
    logits = sum(s.bytes for s in output_tensors(shape, geo)) if stage == last else 0
    held_params = (split.sharded_bytes if strategy == "optim_grads_params" else split.full_bytes)
    moe = shape.experts
    return MemoryEstimate(
        stage=stage, num_stages=d.pipeline, layers=tuple(layers), params=params, grads=grads,
        optimizer=optimizer, gathered_params=gathered, activations=activations, logits=logits,
        in_flight=held, transient=transient, working=working, layer_activations=tuple(per_layer),
        parameter_count=parameter_count(shape), limit=limit,
        warnings=(*warnings, *plan.warnings, *_model_notes(config, shape, d.expert)),
        parameter_parts=parameter_parts(groups, lambda g: held_params(g, pbytes)),
        activation_parts=activation_parts(
            t for layer in layers for t in layer_tensors(shape, geo, layer=layer)),
        defaulted=defaulted_fields(config.model, shape),
        routed_experts=None if moe is None else (
            moe.routed_experts, moe.routed_experts // d.expert, split.expert_shard))


def _model_notes(config: TrainConfig, shape: ModelShape, ep: int) -> list[str]:
    """Warnings about what a mixture-of-experts estimate assumed: a dense width taken from the
    defaults, the deredundant dispatcher estimated as the all-to-all one."""
    notes = [note for note in (dense_width_warning(config.model, shape),) if note]
    if (shape.experts is not None and ep > 1
            and config.parallelism.moe_token_dispatcher_type == "alltoall_deredundancy"):
        notes.append("parallelism.moe_token_dispatcher_type: the deredundant dispatcher's "
                     "buffers are estimated as the all-to-all dispatcher's, an upper bound (it "
                     "sends a token once per device, not once per expert; 0.95x measured on 2 "
                     "ranks)")
    return notes


def _check_tp(shape: ModelShape, tp: int) -> None:
    widths = [("num_attention_heads", shape.num_attention_heads),
              ("num_key_value_heads", shape.num_key_value_heads),
              ("vocab_size", shape.vocab_size)]
    moe = shape.experts
    if moe is None or moe.first_dense_layers > 0:
        widths.append(("intermediate_size", shape.intermediate_size))
    if moe is not None and moe.shared_experts:
        widths.append(("moe_intermediate_size x n_shared_experts",
                       moe.expert_intermediate_size * moe.shared_experts))
    for name, value in widths:
        if value % tp:
            raise EstimateError(f"model.{name} ({value}) must be divisible by "
                                f"parallelism.tensor_parallel ({tp})")


# ----------------------------------------------------------------------------- what to turn


def with_changes(config: TrainConfig, **sections: Any) -> TrainConfig:
    """A copy of `config` with whole sections replaced."""
    return attrs.evolve(config, **sections)


def suggestions(config: TrainConfig, world_size: int, current: MemoryEstimate
                ) -> list[tuple[str, int]]:
    """What to turn when an estimate does not fit: the usual memory knobs, each a full
    re-estimate with that one change (full recompute, select attention, flash attention,
    FSDP sharding of parameters too).

    Args:
        config: the config that was estimated.
        world_size: the number of ranks.
        current: its estimate (its stage is re-estimated).

    Returns:
        (change, bytes saved) for each change that saves anything, largest first.
    """
    shape = shape_of(config.model)
    all_layers = [LayerSpec(0, shape.num_layers - 1)]
    options: list[tuple[str, TrainConfig]] = [
        ("recompute: full (every layer)", with_changes(config, recompute=attrs.evolve(
            config.recompute, mode="full", full_recompute_layer=all_layers))),
        ("recompute: select attention (every layer)", with_changes(
            config, recompute=attrs.evolve(config.recompute, mode="select",
                                           select_module={"attention": all_layers}))),
    ]
    if not shape.use_flash_attention:
        model = attrs.evolve(config.model, extras={**config.model.extras,
                                                   "use_flash_attention": True})
        options.append(("model.use_flash_attention: true", with_changes(config, model=model)))
    if config.parallelism.data_parallel_shard_strategy != "optim_grads_params":
        options.append(("parallelism.data_parallel_shard_strategy: optim_grads_params",
                        with_changes(config, parallelism=attrs.evolve(
                            config.parallelism,
                            data_parallel_shard_strategy="optim_grads_params"))))
    result = []
    for label, changed in options:
        saved = current.total - estimate(changed, world_size, current.stage).total
        if saved > 0:
            result.append((label, saved))
    return sorted(result, key=lambda item: -item[1])


def gib(nbytes: int) -> float:
    """Bytes in GiB."""
    return nbytes / GIB


__all__ = ["EstimateError", "Geometry", "LayerActivation", "MemoryEstimate", "ModelShape",
           "ParamGroup", "Saved", "estimate", "parameter_count", "parse_memory", "suggestions"]
