"""`mf-train export-hf --checkpoint DIR --output DIR [--config FILE] [--dtype D]
[--max-shard-size SIZE] [--set KEY=VALUE ...] [--tokenizer DIR] [--force]`: an mf checkpoint
as a Hugging Face model directory (`hf_export`), with the tokenizer's files when given. Bad
input exits with status 2 and one line saying what is wrong."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from ..checkpoint.errors import CheckpointError
from ..checkpoint.hf_write import DTYPES

COMMAND = "export-hf"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=f"mf-train {COMMAND}", description="Write the model of an mf checkpoint as a "
        "Hugging Face directory (config.json and safetensors) that transformers loads.")
    parser.add_argument("--checkpoint", required=True, metavar="DIR",
                        help="a save root (its newest complete iteration) or one "
                             "iteration_XXXXXXXX directory")
    parser.add_argument("--config", default=None, metavar="FILE",
                        help="the train.yaml of the run that saved it (default: the "
                             "configuration saved with the checkpoint)")
    parser.add_argument("--set", dest="overrides", action="append", default=[],
                        metavar="KEY=VALUE", help="override a value of the configuration")
    parser.add_argument("--output", required=True, metavar="DIR", help="directory to write")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default=None,
                        help="dtype of the weights (default: the model's params_dtype)")
    parser.add_argument("--max-shard-size", default="5GB", metavar="SIZE",
                        help="split the weights into files of at most this size, with "
                             "model.safetensors.index.json (default 5GB)")
    parser.add_argument("--tokenizer", default=None, metavar="DIR",
                        help="a Hugging Face tokenizer directory (the one the data was "
                             "preprocessed with): its files are copied beside the weights")
    parser.add_argument("--force", action="store_true",
                        help="replace --output when it is not empty")
    return parser


def main(argv: Sequence[str]) -> int:
    """Entry point of `mf-train export-hf`."""
    args = _parser().parse_args(argv)
    from ..export.errors import ExportError
    from ..export.hf_export import export_hf  # MindSpore

    try:
        written = export_hf(args.checkpoint, args.config, args.output, dtype=args.dtype,
                            max_shard_size=args.max_shard_size, force=args.force,
                            overrides=args.overrides, tokenizer=args.tokenizer)
    except (ExportError, CheckpointError) as exc:
        print(f"mf-train {COMMAND}: {exc}", file=sys.stderr)
        return 2
    from ..checkpoint import layout

    source = layout.find_checkpoint(args.checkpoint)
    print(f"mf-train {COMMAND}: wrote {written} from {source}", file=sys.stderr)
    return 0
