"""`mf-memory estimate`: how much memory one device of a training job needs, before launching it.

    mf-memory estimate --config train.yaml --world-size 8 [--rank R | --stage S] [--json]
                       [--set key.path=value ...]

Exit status: 0 the estimate was made (whether it fits or not is in the output), 1 invalid
configuration or layout, 2 usage error or unreadable file. Never imports MindSpore.
"""

from __future__ import annotations

import argparse
import json
import sys
import textwrap
from collections.abc import Sequence

from mf_config import TrainConfig
from mf_parallel import PlanError, make_plan
from mf_parallel.job_cli import EXIT_INVALID, EXIT_OK, job_parser, run_job

from .estimate import (
    EstimateError,
    LayerActivation,
    MemoryEstimate,
    estimate,
    size,
    suggestions,
)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the exit status."""
    return run_job(_parser(), argv, _estimate)


def _estimate(args: argparse.Namespace, config: TrainConfig) -> int:
    """`mf-memory estimate` once the config is loaded."""
    try:
        stage = args.stage
        if args.rank is not None:
            plan = make_plan(config.parallelism, config.training, args.world_size)
            stage = plan.mesh.coordinates(args.rank)["pipeline"]
        result = estimate(config, args.world_size, stage)
        tips = suggestions(config, args.world_size, result) if result.fits is False else []
    except (PlanError, EstimateError) as exc:
        print(f"{args.config}: {exc}", file=sys.stderr)
        return EXIT_INVALID
    if args.json:
        data = result.as_dict()
        data["suggestions"] = [{"change": label, "saves": saved} for label, saved in tips]
        print(json.dumps(data, indent=2))
    else:
        print(describe(result, tips))
    return EXIT_OK


def _parser() -> argparse.ArgumentParser:
    parser, est = job_parser("mf-memory", "Memory estimates of mf training jobs.", "estimate",
                             "per-device memory of a configuration")
    where = est.add_mutually_exclusive_group()
    where.add_argument("--rank", type=int, metavar="R", help="estimate the stage of rank R")
    where.add_argument("--stage", type=int, metavar="S",
                       help="estimate pipeline stage S (default: the largest stage)")
    return parser


def describe(result: MemoryEstimate, tips: Sequence[tuple[str, int]] = ()) -> str:
    """The estimate as a table, the verdict, and what to turn when it does not fit."""
    span = f"layers {result.layers[0]}-{result.layers[-1]}" if result.layers else "no layers"
    lines = [f"stage {result.stage} of {result.num_stages} ({span}); model "
             f"{result.parameter_count:,} parameters, {result.held_params:,} held per device"
             + (f"; {result.in_flight} micro-batch input(s) in flight, one chunk's "
                "activations at a time (the backward recomputes its chunk)"
                if result.num_stages > 1 else "")]
    rows = [*([("MindSpore's own (CPU)", result.runtime)] if result.runtime else []),
            ("parameters", result.params), ("gradients", result.grads),
            ("optimizer state", result.optimizer),
            ("FSDP gathered parameters", result.gathered_params),
            ("activations", result.activations), ("logits and loss", result.logits)]
    for name, value in rows:
        lines.append(f"  {name:<26}{size(value):>16}")
        if name == "parameters" and result.routed_experts is not None:
            lines += [f"    {part:<24}{size(nbytes):>16}"
                      for part, nbytes in result.parameter_parts]
            lines.append(f"      routed experts: {_experts_note(result)}")
    if result.step:
        lines += [f"  {'peak in backward pass':<26}{size(result.backward_peak):>16}",
                  f"  {'peak in optimizer step':<26}{size(result.step_peak):>16}  (parameters, "
                  f"optimizer state and {size(result.step)} of gradients and the step's "
                  "buffers)"]
    lines.append(f"  {'total':<26}{size(result.total):>16}")
    lines.append(f"  {'once built (before step 1)':<26}{size(result.build_peak):>16}")
    lines.append("activations per layer (one micro-batch):")
    for first, last, la in _runs(result.layer_activations):
        span = f"layer {first}" if first == last else f"layers {first}-{last}"
        lines.append(f"  {span:<14} kept {size(la.kept):>12} of {size(la.full):>12}"
                     f"  {la.treatment}")
    if result.transient:
        lines.append(f"  recompute rebuild / swap prefetch (once): {size(result.transient)}")
    if result.working:
        lines.append(f"  backward working memory (once): {size(result.working)}")
    if result.routed_experts is not None:
        lines.append("activations by part (these layers, one micro-batch, before recompute "
                     "and swap):")
        lines += [f"  {part:<46}{size(nbytes):>14}" for part, nbytes in result.activation_parts]
    if result.defaulted:
        lines += textwrap.wrap("model defaults used (not in the config): " + ", ".join(
            f"{key} {_setting(value)}" for key, value in result.defaulted), 96,
            subsequent_indent="  ")
    lines += [f"warning: {w}" for w in result.warnings]
    if result.limit is None:
        lines.append("no context.max_device_memory set: no verdict")
    elif result.fits:
        lines.append(f"fits in {size(result.limit)} (headroom {size(result.headroom or 0)})")
    else:
        lines.append(f"does NOT fit in {size(result.limit)}: {size(-(result.headroom or 0))} "
                     "over")
        lines += [f"  {label} saves {size(saved)}" for label, saved in tips]
    return "\n".join(lines)


def _experts_note(result: MemoryEstimate) -> str:
    """`256 per MoE layer, 32 here (expert_parallel 8, whole experts), not sliced` (or
    `sliced over 8 ranks` by FSDP/ZeRO without expert parallelism, or with it `optimizer
    state sliced over 2 expert-data ranks`)."""
    assert result.routed_experts is not None
    total, here, ranks = result.routed_experts
    parallel = total // here
    sliced = "not sliced" if ranks == 1 else (
        f"sliced over {ranks} ranks" if parallel == 1
        else f"optimizer state sliced over {ranks} expert-data ranks")
    return (f"{total} per MoE layer, {here} here (expert_parallel {parallel}, whole experts), "
            f"{sliced}")


def _setting(value: object) -> str:
    """A default as the YAML would write it (null for None)."""
    return "null" if value is None else str(value)


def _runs(layers: Sequence[LayerActivation]) -> list[tuple[int, int, LayerActivation]]:
    """Consecutive layers with equal figures, as (first, last, one of them)."""
    runs: list[tuple[int, int, LayerActivation]] = []
    for la in layers:
        if runs and runs[-1][1] == la.layer - 1 and _same(runs[-1][2], la):
            runs[-1] = (runs[-1][0], la.layer, la)
        else:
            runs.append((la.layer, la.layer, la))
    return runs


def _same(a: LayerActivation, b: LayerActivation) -> bool:
    return (a.full, a.kept, a.treatment) == (b.full, b.kept, b.treatment)


def run() -> None:
    """Console-script entry point."""
    sys.exit(main())
