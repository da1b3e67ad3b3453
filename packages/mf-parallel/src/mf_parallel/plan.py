"""The plan: everything a parallel layout decides, worked out before any rank is started.

`make_plan` takes the typed `parallelism` and `training` sections and a world size, and returns
a `Plan`: the degrees, every rank's coordinates and groups, the batch math, and the pipeline's
stage layout and schedule (checked by simulation). It is pure Python; it never imports
MindSpore, so a laptop can answer "what does this layout do?" in milliseconds.
"""

from __future__ import annotations

from typing import Any

import attrs

from mf_config import ParallelismConfig, TrainingConfig

from .batch import BatchPlan, Rampup
from .dims import ParallelDims
from .errors import PlanError
from .mesh import DIMENSIONS, RankMesh
from .pipeline_layout import StageLayout, stage_layout
from .pipeline_schedules import build_schedule
from .pipeline_simulator import SimulationResult, simulate, unit_times
from .sequence import check_sequence_length


@attrs.frozen(kw_only=True)
class Plan:
    """The parallel layout of one training job."""

    dims: ParallelDims
    mesh: RankMesh
    batch: BatchPlan
    schedule: str
    """Pipeline schedule name, as in the config."""
    interleave: int
    """Model chunks per pipeline stage."""
    split_backward: bool = False
    """Each backward split into the input gradient (B) and the weight gradient (W)
    (`pipeline_parallel_enable_dxdw_split`: ZB-H1 for 1F1B)."""
    layout: StageLayout | None
    """Decoder layers of each stage and chunk; None when the layer count is not known."""
    simulation: SimulationResult | None
    """The schedule run on a unit-time model (t_b = 2 t_f; split, t_b = t_w = t_f); None
    without pipeline parallelism."""
    warnings: tuple[str, ...] = ()


def make_plan(parallelism: ParallelismConfig, training: TrainingConfig, world_size: int, *,
              num_layers: int | None = None, seq_length: int | None = None) -> Plan:
    """Work out the whole layout before any rank starts, so that a bad one fails early.

    Args:
        parallelism: the config's `parallelism` section.
        training: the config's `training` section (the batch sizes).
        world_size: the number of ranks.
        num_layers: decoder layers, to lay out the pipeline stages (None: no layout).
        seq_length: the sequence length, to check it splits over context and tensor ranks.

    Returns:
        The plan: degrees, rank mesh, batch math, stage layout and simulated schedule.

    Raises:
        PlanError: what does not fit and why.
    """
    dims = ParallelDims.from_config(parallelism, world_size)
    batch = BatchPlan.from_config(training, dims.data)
    if seq_length is not None:
        causal = parallelism.context_parallel_mask_type == "causal"
        check_sequence_length(seq_length, dims.tensor, dims.context, causal)
    interleave = parallelism.pipeline_parallel_interleave_num
    split = parallelism.pipeline_parallel_enable_dxdw_split and dims.pipeline > 1
    try:
        layout = None if num_layers is None else stage_layout(
            num_layers, dims.pipeline, interleave, parallelism.layers_per_stage())
        simulation = None
        if dims.pipeline > 1:
            for count in ramp_accumulation_steps(batch):  # each step's schedule must build
                build_schedule(parallelism.pipeline_parallel_schedule, dims.pipeline, count,
                               interleave, split)
            actions = build_schedule(parallelism.pipeline_parallel_schedule, dims.pipeline,
                                     batch.accumulation_steps(), interleave, split)
            simulation = simulate(actions, num_chunks=interleave, **unit_times(split))
    except ValueError as exc:  # PipelineError, ScheduleError and the schedules' own checks
        raise PlanError(str(exc)) from None
    return Plan(dims=dims, mesh=RankMesh(dims), batch=batch,
                schedule=parallelism.pipeline_parallel_schedule, interleave=interleave,
                split_backward=split, layout=layout, simulation=simulation,
                warnings=tuple(batch.warnings()))


def ramp_accumulation_steps(batch: BatchPlan) -> list[int]:
    """The micro-batch counts of the steps of a batch ramp-up, before the final one (none
    without a ramp): the pipeline runs a schedule of each."""
    rampup = batch.rampup
    if rampup is None or not rampup.active:
        return []
    sizes = range(rampup.global_batch_size(0), batch.global_batch_size, rampup.increment)
    return sorted({max(size // batch.samples_per_micro_step, 1) for size in sizes})


def plan_summary(plan: Plan, rank: int | None = None) -> dict[str, Any]:
    """The plan as plain data (what `mf-parallel plan --json` prints).

    Args:
        plan: a plan from `make_plan`.
        rank: also give this rank's coordinates and groups (under `rank`).

    Returns:
        A JSON-ready dict. The batch keys are at step 0, as MindFormers reports them; the
        `final_` keys once any ramp-up is over; `rampup` only with `rampup_batch_size`.
    """
    d = plan.dims
    summary: dict[str, Any] = {
        "world_size": d.world_size,
        "data_parallel": d.data,
        "data_parallel_shard": d.data_shard,
        "data_parallel_replicate": d.data_replicate,
        "tensor_parallel": d.tensor,
        "context_parallel": d.context,
        "context_ulysses": d.context_ulysses,
        "context_load_balanced": d.context > 1 and d.context_causal,
        "context_overlap": d.context_overlap,
        "pipeline_parallel": d.pipeline,
        "expert_parallel": d.expert,
        "expert_span": list(d.expert_span.split("_")),
        "expert_ranks_per_device": d.expert_node,
        "dimension_order": list(DIMENSIONS),
        "micro_batch_size": plan.batch.micro_batch_size,
        **_batch_summary(plan.batch),
        "pipeline_schedule": plan.schedule,
        "pipeline_interleave_num": plan.interleave,
        "pipeline_dxdw_split": plan.split_backward,
        "warnings": list(plan.warnings),
    }
    if plan.batch.rampup is not None:
        summary["rampup"] = _rampup_summary(plan.batch.rampup, plan.batch.rampup_steps())
    if plan.layout is not None:
        summary["stage_layers"] = plan.layout.as_lists()
    if plan.simulation is not None:
        summary["pipeline_bubble_fraction"] = round(plan.simulation.bubble_fraction, 4)
    if rank is not None:
        summary["rank"] = {"rank": rank, "coordinates": plan.mesh.coordinates(rank),
                           "groups": plan.mesh.groups_of(rank)}
    return summary


def _batch_summary(batch: BatchPlan) -> dict[str, int]:
    """The batch sizes at step 0 (0 samples consumed) and at the end of any ramp-up."""
    return {
        "num_accumulation_steps": batch.accumulation_steps(0),
        "global_batch_size": batch.global_batch_size_at(0),
        "effective_global_batch_size": batch.effective_global_batch_size(0),
        "final_num_accumulation_steps": batch.accumulation_steps(),
        "final_global_batch_size": batch.global_batch_size,
        "final_effective_global_batch_size": batch.effective_global_batch_size(),
    }


def _rampup_summary(rampup: Rampup, steps: int) -> dict[str, int]:
    """`rampup_batch_size` as configured, and the optimizer `steps` the ramp takes."""
    return {"start": rampup.start, "increment": rampup.increment, "samples": rampup.samples,
            "steps": steps}
