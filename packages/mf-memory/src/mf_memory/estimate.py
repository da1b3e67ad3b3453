"""Per-device memory of a training job, worked out from its configuration alone.

`estimate(config, world_size)` returns the bytes one device holds at its fullest: parameters,
gradients, optimizer state, parameters gathered by FSDP, saved activations of every decoder
layer, and the logits and loss of the last pipeline stage; under pipeline parallelism, the
inputs of the micro-batches in flight and one chunk's activations, as mf-train's stages run.
Parameters, gradients and optimizer state follow the data-parallel layout (`data_parallel`:
replicated, or ZeRO-1, ZeRO-2 and FSDP over flat per-layer buffers as mf-train runs them), and
under a sharded strategy the optimizer step after the backward pass is a second candidate for
the peak. `rank_summary(config, world_size, rank)` gives a trainer's start line its numbers.
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
the rest: `data_parallel`), its saved tensors in
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
from typing import Any, NamedTuple

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
from .data_parallel import data_parallel_rank, expert_shard_degree
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
from .runtime import runtime_bytes

DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "fp32": 4, "fp16": 2, "bf16": 2}
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


# ----------------------------------------------------------------------------- the result


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes one device of one pipeline stage holds at its fullest: during the backward pass
    (parameters, gradients, optimizer state, gathered parameters, activations, logits) or,
    under the sharded strategies, in the optimizer step after it (parameters, optimizer state
    and `step`), whichever holds more (`total`)."""

    stage: int
    num_stages: int
    layers: tuple[int, ...]
    params: int
    """Parameters held between steps (`data_parallel.DataParallelRank.params`)."""
    grads: int
    """Gradients at the backward pass's peak (`DataParallelRank.grads`)."""
    optimizer: int
    """Optimizer state, with master copies and ZeRO's slices (`DataParallelRank.optimizer`)."""
    gathered_params: int
    """Parameters FSDP gathers beside the slices (`DataParallelRank.gathered`)."""
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
    step: int = 0
    """Under a sharded strategy, what the optimizer step holds beside the parameters and the
    optimizer state once the backward pass is over: gradient slices, the reduction's, update's
    and all-gather's buffers (`DataParallelRank.step`); 0 replicated."""
    held_params: int = 0
    """Parameter elements this device holds between steps (its tensor-parallel shards, its
    stage, its experts; under FSDP its slices): `DataParallelRank.held_params`."""
    runtime: int = 0
    """The framework's own memory through the steps, where it shares the device's budget
    (the CPU backend: `runtime.runtime_bytes`); 0 elsewhere."""
    runtime_built: int = 0
    """The same once the model and optimizer are built, before the first step."""
    build_transient: int = 0
    """Whole tensors the build holds beside the rank's share before cutting them
    (`DataParallelRank.build_transient`)."""

    @property
    def backward_peak(self) -> int:
        """Bytes held during the backward pass: the sum of the components."""
        return (self.runtime + self.params + self.grads + self.optimizer
                + self.gathered_params + self.activations + self.logits)

    @property
    def step_peak(self) -> int:
        """Bytes held in the optimizer step (0 when it holds nothing beside the parameters
        and the optimizer state)."""
        return self.runtime + self.params + self.optimizer + self.step if self.step else 0

    @property
    def build_peak(self) -> int:
        """Bytes held once the model and the optimizer are built, before the first step: the
        framework, the rank's parameters and optimizer state, or while building, its
        parameters with the whole tensors not cut yet, whichever is more."""
        return self.runtime_built + max(self.params + self.optimizer,
                                        self.params + self.build_transient)

    @property
    def total(self) -> int:
        """The device's peak: the larger of `backward_peak` and `step_peak`."""
        return max(self.backward_peak, self.step_peak)

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
            "logits": self.logits, "step": self.step, "backward_peak": self.backward_peak,
            "step_peak": self.step_peak, "total": self.total, "held_params": self.held_params,
            "runtime": self.runtime, "build_peak": self.build_peak,
            "in_flight": self.in_flight,
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
    holds the most), every accumulation micro-batch for GPipe; with the backward split, until
    each W (p on every stage for ZB-H1; the received gradient a W also keeps is left out, as
    the messages are)."""
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


class RankSummary(NamedTuple):
    """What a rank's start line says of its memory (`rank_summary`)."""

    model_params: int
    """Parameters of the whole model (one copy)."""
    rank_params: int
    """Parameter elements the rank holds between steps under its layout: its tensor-parallel
    shards of its stage's parameters and its experts, and under FSDP only its slices of them
    (`MemoryEstimate.held_params`)."""
    peak_bytes: int
    """The estimated peak of a device of the rank's stage (`MemoryEstimate.total`)."""


def rank_summary(config: TrainConfig, world_size: int, rank: int | None = None) -> RankSummary:
    """The model's parameters, the rank's, and its estimated peak memory, for a trainer's
    start line. Pure Python.

    Args:
        config: the whole training config.
        world_size: the number of ranks.
        rank: the rank (its pipeline stage is estimated); None: the stage with the largest
            total.

    Returns:
        (model_params, rank_params, peak_bytes).

    Raises:
        EstimateError, mf_parallel.PlanError: as `estimate`, and for a rank outside the world.
    """
    stage = None
    if rank is not None:
        if not 0 <= rank < world_size:
            raise EstimateError(f"rank {rank} does not exist: the world has {world_size} "
                                f"ranks (0-{world_size - 1})")
        plan = make_plan(config.parallelism, config.training, world_size)
        stage = plan.mesh.coordinates(rank)["pipeline"]
    result = estimate(config, world_size, stage)
    return RankSummary(result.parameter_count, result.held_params, result.total)


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
    rank = data_parallel_rank(config, plan, unit_groups, outer, tied=shape.tie_word_embeddings,
                              param_bytes=pbytes, vocab_size=shape.vocab_size)
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
    moe = shape.experts
    runtime = runtime_bytes(config.context.device_target)
    return MemoryEstimate(
        stage=stage, num_stages=d.pipeline, layers=tuple(layers), params=rank.params(),
        grads=rank.grads(), optimizer=rank.optimizer(config.optimizer.type),
        gathered_params=rank.gathered(config.parallelism.reshard_after_forward_policy,
                                      d.pipeline),
        activations=activations, logits=logits, in_flight=held, transient=transient,
        working=working, layer_activations=tuple(per_layer),
        parameter_count=parameter_count(shape), limit=limit,
        warnings=(*warnings, *plan.warnings, *_model_notes(config, shape, d.expert),
                  *rank.notes(config.optimizer.type)),
        parameter_parts=parameter_parts(groups, rank.part_bytes),
        activation_parts=activation_parts(
            t for layer in layers for t in layer_tensors(shape, geo, layer=layer)),
        defaulted=defaulted_fields(config.model, shape),
        routed_experts=None if moe is None else (
            moe.routed_experts, moe.routed_experts // d.expert, expert_shard_degree(plan)),
        step=rank.step(), held_params=rank.held_params(),
        runtime=runtime.training, runtime_built=runtime.built,
        build_transient=rank.build_transient())


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
           "ParamGroup", "RankSummary", "Saved", "estimate", "parameter_count", "parse_memory",
           "rank_summary", "suggestions"]
