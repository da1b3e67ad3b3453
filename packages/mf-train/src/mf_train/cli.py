"""`mf-train --config FILE [--set key.path=value ...] [--output-dir DIR]`.

The whole configuration is validated first (mf-config, then mf-parallel's plan for the world
size), and only then are devices, data and the model touched. A bad file exits with status 2
and every problem with its path and line; a failure while training exits with status 1.
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
    return parser


def run(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `mf-train` script."""
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    from mf_config import ConfigError
    from mf_config.validate import config_from_source, load_source
    from mf_config.yaml_source import UnreadableFile
    from mf_data.errors import DataError
    from mf_parallel import PlanError

    from .trainer import make_job_plan

    try:
        source = load_source(args.config, args.overrides)
        config = config_from_source(source)
        make_job_plan(config, world_size=1)
    except (ConfigError, UnreadableFile, PlanError) as exc:
        print(f"mf-train: {exc}", file=sys.stderr)
        return 2
    from .trainer import Trainer

    output_dir = Path(args.output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    try:
        trainer = Trainer(config, output_dir=output_dir, source=source)
        trainer.train()
    except ConfigError as exc:
        print(f"mf-train: {exc}", file=sys.stderr)
        return 2
    except (DataError, ValueError, OSError) as exc:  # bad input found while building: no traceback
        print(f"mf-train: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(run())
