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

from mf_config import ConfigError, TrainConfig, UnreadableFile, load_config
from mf_config.components import decoder_layers, sequence_length

from .batch import BatchPlan, Rampup
from .errors import PlanError
from .plan import Plan, make_plan, plan_summary

EXIT_OK, EXIT_INVALID, EXIT_USAGE = 0, 1, 2


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the exit status."""
    args = _parser().parse_args(argv)
    if args.command != "plan":
        _parser().print_usage(sys.stderr)
        return EXIT_USAGE
    config = load_job_config(args)
    if isinstance(config, int):
        return config
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


def load_job_config(args: argparse.Namespace) -> TrainConfig | int:
    """The config of `--config` with the `--set` overrides, or, after printing its problems,
    the exit status: 1 for an invalid config, 2 for an unreadable file."""
    try:
        return load_config(args.config, args.overrides)
    except ConfigError as exc:
        for issue in exc.errors:
            print(issue, file=sys.stderr)
        return EXIT_USAGE if isinstance(exc, UnreadableFile) else EXIT_INVALID


def add_job_arguments(parser: argparse.ArgumentParser) -> None:
    """`--config`, `--world-size`, `--json` and `--set`: what every command about one training
    job on N ranks takes (`mf-parallel plan`, `mf-memory estimate`)."""
    parser.add_argument("--config", required=True, metavar="FILE", help="train.yaml")
    parser.add_argument("--world-size", required=True, type=int, metavar="N",
                        help="number of ranks")
    parser.add_argument("--json", action="store_true", help="print JSON instead of text")
    parser.add_argument("--set", dest="overrides", action="append", default=[],
                        metavar="KEY.PATH=VALUE", help="override a config value (repeatable)")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mf-parallel",
                                     description="Parallel layouts of mf training jobs.")
    parser.set_defaults(command=None)
    commands = parser.add_subparsers(title="commands", metavar="COMMAND")
    plan = commands.add_parser("plan", help="show the degrees, batches, stages and groups")
    add_job_arguments(plan)
    plan.add_argument("--rank", type=int, metavar="R", help="also show the groups of rank R")
    plan.set_defaults(command="plan")
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
    if plan.simulation is not None:
        text += (f", bubble {plan.simulation.bubble_fraction:.1%} "
                 "(simulated, backward = 2 x forward)")
    return text


def _rank_lines(plan: Plan, rank: int) -> list[str]:
    coords = ", ".join(f"{k} {v}" for k, v in plan.mesh.coordinates(rank).items())
    lines = [f"rank {rank}: {coords}"]
    for kind, group in plan.mesh.groups_of(rank).items():
        lines.append(f"  {kind + ' group':<18}{_ranks(group)}")
    return lines


def _ranks(group: list[Any]) -> str:
    return "[" + ", ".join(str(r) for r in group) + "]"


def run() -> None:
    """Console-script entry point."""
    sys.exit(main())
