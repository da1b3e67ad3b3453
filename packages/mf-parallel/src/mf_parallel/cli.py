"""`mf-parallel plan`: show what a parallel layout does before anything is launched.

    mf-parallel plan --config train.yaml --world-size 8 [--rank 3] [--json] [--set k=v ...]

Exit status: 0 the layout works, 1 it does not (the reason is printed) or the configuration is
invalid, 2 usage error or unreadable file.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any

from mf_config import TrainConfig
from mf_config.components import decoder_layers, sequence_length

from .batch import BatchPlan, Rampup
from .errors import PlanError
from .job_cli import EXIT_INVALID, EXIT_OK, job_parser, run_job
from .plan import Plan, make_plan, plan_summary


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the exit status."""
    return run_job(_parser(), argv, _plan)


def _plan(args: argparse.Namespace, config: TrainConfig) -> int:
    """`mf-parallel plan` once the config is loaded."""
    try:
        plan = make_plan(config.parallelism, config.training, args.world_size,
                         num_layers=decoder_layers(config), seq_length=sequence_length(config))
        if args.rank is not None:
            plan.mesh.coordinates(args.rank)  # checks the rank is in the world
    except PlanError as exc:
        print(f"{args.config}: invalid parallel layout: {exc}", file=sys.stderr)
        return EXIT_INVALID
    if args.json:
        print(json.dumps(plan_summary(plan, args.rank), indent=2))
    else:
        print(describe(plan, args.rank))
    return EXIT_OK


def _parser() -> argparse.ArgumentParser:
    parser, plan = job_parser("mf-parallel", "Parallel layouts of mf training jobs.", "plan",
                              "show the degrees, batches, stages and groups")
    plan.add_argument("--rank", type=int, metavar="R", help="also show the groups of rank R")
    return parser


def describe(plan: Plan, rank: int | None = None) -> str:
    """The plan as readable text."""
    d, batch = plan.dims, plan.batch
    lines = [
        d.describe(),
        "dimension order (outer -> inner): pipeline, replicate, shard, context, tensor",
        f"batch: micro-batch {batch.micro_batch_size} x data parallel {d.data} x "
        f"{batch.accumulation_steps()} accumulation steps = global batch "
        f"{batch.effective_global_batch_size()}",
    ]
    if batch.rampup is not None:
        lines.append(_rampup_line(batch, batch.rampup))
    if d.pipeline > 1 or plan.layout is not None:
        lines.append(_pipeline_line(plan))
    if plan.layout is not None:
        lines += [f"  {line}" for line in plan.layout.describe().splitlines()]
    lines += [f"warning: {warning}" for warning in plan.warnings]
    if rank is not None:
        lines += _rank_lines(plan, rank)
    return "\n".join(lines)


def _rampup_line(batch: BatchPlan, rampup: Rampup) -> str:
    """The ramp-up from step 0 to the final batch: the batch line above shows only the final."""
    start, final = batch.effective_global_batch_size(0), batch.effective_global_batch_size()
    if not rampup.active:
        config = [rampup.start, rampup.increment, rampup.samples]
        return (f"batch ramp-up: rampup_batch_size {config} has no effect; every step uses "
                f"global batch {final}")
    return (f"batch ramp-up: global batch {start} -> {final}, +{rampup.increment} every "
            f"{_samples(rampup.samples_per_increment)} samples ({rampup.samples} samples, "
            f"{batch.rampup_steps()} steps); accumulation steps {batch.accumulation_steps(0)} "
            f"-> {batch.accumulation_steps()}")


def _samples(count: float) -> str:
    """Whole when it is (1000), else to one decimal (333.3): Megatron-LM's spacing is a float."""
    return str(int(count)) if count == int(count) else f"{count:.1f}"


def _pipeline_line(plan: Plan) -> str:
    text = f"pipeline: {plan.dims.pipeline} stages"
    if plan.interleave > 1:
        text += f" x {plan.interleave} chunks"
    if plan.dims.pipeline > 1:
        text += f", schedule {plan.schedule}"
        if plan.split_backward:
            text += " with the backward split (ZB-H1)"
    if plan.simulation is not None:
        times = ("input and weight gradients = forward each" if plan.split_backward
                 else "backward = 2 x forward")
        text += f", bubble {plan.simulation.bubble_fraction:.1%} (simulated, {times})"
    return text


def _rank_lines(plan: Plan, rank: int) -> list[str]:
    coords = ", ".join(f"{k} {v}" for k, v in plan.mesh.coordinates(rank).items())
    lines = [f"rank {rank}: {coords}"]
    for kind, group in plan.mesh.groups_of(rank).items():
        lines.append(f"  {kind + ' group':<22}{_ranks(group)}")
    return lines


def _ranks(group: list[Any]) -> str:
    return "[" + ", ".join(str(r) for r in group) + "]"


def run() -> None:
    """Console-script entry point."""
    sys.exit(main())
