"""`mf-train --config FILE [--set key.path=value ...] [--output-dir DIR] [--nproc N]`.

The whole configuration is validated first (mf-config, then mf-parallel's plan for the world
size), and only then are devices, data and the model touched. A bad file exits with status 2
and every problem with its path and line; a failure while training exits with status 1.

With `--nproc N` the launcher starts N ranks on this host through msrun (mf_parallel.launch:
127.0.0.1, a free port, the whole process group killed on failure or timeout); each rank runs
`rank_worker.py` and writes its log to `DIR/logs/worker_<rank>.log`. When a rank fails, the job
stops and the launcher prints that rank's error and the path of its log.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from pathlib import Path


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mf-train", description="Train the model a "
                                     "train.yaml describes, on MindSpore in PyNative mode.")
    parser.add_argument("--config", required=True, metavar="FILE", help="train.yaml")
    parser.add_argument("--set", dest="overrides", action="append", default=[],
                        metavar="KEY=VALUE", help="override a value, e.g. training.steps=10")
    parser.add_argument("--output-dir", default="./output", metavar="DIR",
                        help="logs, metrics.jsonl and TensorBoard events (default ./output)")
    parser.add_argument("--nproc", type=int, default=1, metavar="N",
                        help="ranks to start on this host through msrun (default 1: this "
                             "process trains)")
    parser.add_argument("--timeout", type=float, default=0, metavar="SECONDS",
                        help="with --nproc: stop the job after this long (default: no limit)")
    return parser


def run(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `mf-train` script."""
    args = _parser().parse_args(argv)
    if args.nproc < 1:
        print(f"mf-train: --nproc must be >= 1, got {args.nproc}", file=sys.stderr)
        return 2
    if args.nproc > 1:
        return launch(args, list(argv if argv is not None else sys.argv[1:]))
    return run_training(argv if argv is not None else sys.argv[1:], world_size=1)


def launch(args: argparse.Namespace, argv: list[str]) -> int:
    """Validate for `--nproc` ranks here, then run them through msrun."""
    from mf_parallel.launch import LaunchError, run_ranks

    if _validated(args, args.nproc, say_warnings=True) is None:
        return 2
    logs = Path(args.output_dir) / "logs"
    worker = Path(__file__).with_name("rank_worker.py")
    rank_args = _without_launcher_options(argv)
    timeout = args.timeout if args.timeout > 0 else 365 * 24 * 3600.0
    print(f"mf-train: starting {args.nproc} ranks; logs in {logs}/worker_<rank>.log",
          file=sys.stderr)
    try:
        run_ranks(worker, args.nproc, log_dir=logs, timeout=timeout, args=rank_args)
    except LaunchError as exc:
        print(f"mf-train: {exc}", file=sys.stderr)
        return 1
    return 0


def _without_launcher_options(argv: list[str]) -> list[str]:
    """`argv` without --nproc/--timeout (and their values), for the ranks."""
    out, skip = [], False
    for arg in argv:
        if skip:
            skip = False
            continue
        if arg in ("--nproc", "--timeout"):
            skip = True
            continue
        if arg.startswith(("--nproc=", "--timeout=")):
            continue
        out.append(arg)
    return out


def _validated(args: argparse.Namespace, world_size: int, *,
               say_warnings: bool = False) -> tuple[object, object] | None:
    """(config, source) when the file, overrides, plan and what the trainer supports
    (`support`) are valid; else print the problems and return None. With `say_warnings`,
    the settings that have no effect here are printed too (the launcher says them once for
    all ranks; a single process logs them when the trainer starts)."""
    from mf_config import ConfigError
    from mf_config.validate import config_from_source, load_source
    from mf_config.yaml_source import UnreadableFile
    from mf_parallel import PlanError

    from .trainer import check_support, make_job_plan, resolve_device

    try:
        source = load_source(args.config, args.overrides)
        config = config_from_source(source)
        plan = make_job_plan(config, world_size=world_size, source=source)
        device = resolve_device(config.context.device_target)
        warnings = check_support(config, plan, device, source)
    except (ConfigError, UnreadableFile, PlanError) as exc:
        print(f"mf-train: {exc}", file=sys.stderr)
        return None
    for warning in warnings if say_warnings else ():
        print(f"mf-train: {warning}", file=sys.stderr)
    return config, source


def _log_to_file(path: Path) -> logging.Handler:
    """Also write the log to `path` (the run's log under its output directory); the caller
    removes the returned handler when the run ends."""
    path.parent.mkdir(parents=True, exist_ok=True)
    handler = logging.FileHandler(path, encoding="utf-8")
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
    logging.getLogger().addHandler(handler)
    logging.getLogger("mf_train").setLevel(logging.INFO)  # even if logging was set up before
    return handler


def run_training(argv: Sequence[str], *, world_size: int) -> int:
    """Validate, build and train in this process (one rank of `world_size`)."""
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    from mf_config import ConfigError
    from mf_data.errors import DataError

    validated = _validated(args, world_size)
    if validated is None:
        return 2
    config, source = validated
    from .trainer import Trainer, TrainingStopped

    output_dir = Path(args.output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    # ranks started by msrun log to <output-dir>/logs/worker_<rank>.log already
    handler = _log_to_file(output_dir / "logs" / "train.log") if world_size == 1 else None
    try:
        trainer = Trainer(config, output_dir=output_dir, source=source,
                          world_size=world_size)
        trainer.train()
    except (ConfigError, DataError, ValueError, OSError, TrainingStopped) as exc:
        if world_size > 1:  # a rank: the traceback's last line is what the launcher reports
            raise
        print(f"mf-train: {exc}", file=sys.stderr)  # bad input found while building
        return 2 if isinstance(exc, ConfigError) else 1
    finally:
        if handler is not None:
            logging.getLogger().removeHandler(handler)
            handler.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(run())
