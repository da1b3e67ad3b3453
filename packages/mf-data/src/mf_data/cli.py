"""The ``mf-data`` command: ``preprocess`` JSON Lines into a Megatron corpus, ``inspect`` one,
``sample`` a training config's data as the trainer sees it.

Each subcommand is one ``add_<name>`` function that registers its parser and handler; adding a
subcommand means writing that function and listing it in ``SUBCOMMANDS``. Exit status: 0 on
success, 1 on bad data (message on stderr, no traceback), 2 on bad usage (argparse).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

from mf_data.errors import DataError

PROGRAM = "mf-data"
DTYPE_NAMES = ("uint8", "int8", "int16", "uint16", "int32", "int64", "float32", "float64")


def _non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def _positive_int(text: str) -> int:
    value = _non_negative_int(text)
    if value == 0:
        raise argparse.ArgumentTypeError("must be >= 1, got 0")
    return value


def _preprocess_tokenizer(args: argparse.Namespace) -> Any:
    """The tokenizer of the legacy ``--tokenizer FILE`` or of Megatron's ``--tokenizer-type``
    and ``--tokenizer-model``; usage errors exit 2."""
    from mf_data.text_tokenizer import (
        TOKENIZER_TYPES,
        load_tokenizer,
        tokenizer_of_type,
        unknown_type_message,
    )

    if args.tokenizer is not None and (args.tokenizer_type or args.tokenizer_model):
        args.parser.error("--tokenizer FILE is short for --tokenizer-type HuggingFaceTokenizer "
                          "--tokenizer-model FILE; give one form, not both")
    if args.tokenizer_type is None:
        if args.tokenizer_model is not None:
            args.parser.error("--tokenizer-model needs --tokenizer-type (allowed: "
                              f"{', '.join(TOKENIZER_TYPES)})")
        return load_tokenizer(args.tokenizer, args.eod)
    if args.tokenizer_type not in TOKENIZER_TYPES:
        args.parser.error(unknown_type_message(args.tokenizer_type))
    return tokenizer_of_type(args.tokenizer_type, args.tokenizer_model, args.eod)


def _preprocess(args: argparse.Namespace) -> int:
    from mf_data.megatron_flags import check_megatron_flags
    from mf_data.preprocess import megatron_prefixes, preprocess

    refusal = check_megatron_flags(
        args, lambda message: print(f"{PROGRAM} preprocess: warning: {message}",
                                    file=sys.stderr))
    if refusal is not None:
        args.parser.error(refusal)
    if args.json_keys is not None and len(set(args.json_keys)) != len(args.json_keys):
        args.parser.error(f"--json-keys {' '.join(args.json_keys)}: a key is repeated")
    tokenizer = _preprocess_tokenizer(args)
    outputs = (megatron_prefixes(args.output_prefix, args.json_keys) if args.json_keys
               else {args.json_key: args.output_prefix})
    summaries = preprocess(args.input, outputs, tokenizer, dtype=args.dtype,
                           progress=None if args.quiet else sys.stderr,
                           append_eod=args.append_eod, workers=args.workers,
                           vocab_size=args.model_vocab_size)
    eod = f"EOD {tokenizer.eod}" if args.append_eod else "no EOD"
    for summary in summaries:
        print(f"wrote {summary.prefix}.bin and {summary.prefix}.idx: {summary.documents:,} "
              f"documents, {summary.sequences:,} sequences, {summary.tokens:,} tokens "
              f"({summary.dtype.name}; tokenizer {tokenizer.name}, {eod}) in "
              f"{summary.seconds:.2f} s")
        if summary.empty_documents:
            print(f"note: {summary.empty_documents:,} of the documents produced no tokens "
                  f"under {summary.json_key!r}; they are kept as documents without sequences, "
                  "as Megatron does")
    return 0


def add_preprocess(subparsers: argparse._SubParsersAction) -> None:
    from mf_data.megatron_flags import add_megatron_flags

    parser = subparsers.add_parser(
        "preprocess", help="tokenize JSON Lines into Megatron .bin/.idx datasets",
        description="Tokenize one JSON object per line into Megatron indexed datasets, taking "
                    "Megatron-LM's tools/preprocess_data.py flags. Unlike Megatron, each "
                    "document ends with the EOD token unless --no-append-eod.")
    parser.add_argument("--input", required=True, metavar="FILE.jsonl",
                        help="JSON Lines input, one document per line; .jsonl.gz is read as "
                             "gzip")
    parser.add_argument("--output-prefix", required=True, metavar="PREFIX",
                        help="with --json-keys: writes PREFIX_{KEY}_document.bin/.idx per key, "
                             "as Megatron; else PREFIX.bin and PREFIX.idx")
    keys = parser.add_mutually_exclusive_group()
    keys.add_argument("--json-keys", nargs="+", metavar="KEY",
                      help="keys to tokenize, one dataset each, named as Megatron names them")
    keys.add_argument("--json-key", default="text", metavar="KEY",
                      help="one key, written to PREFIX.bin/.idx exactly (default: text)")
    parser.add_argument("--append-eod", action=argparse.BooleanOptionalAction, default=True,
                        help="end each document with the EOD token (default: on; Megatron's "
                             "default is off, --no-append-eod gives it)")
    parser.add_argument("--workers", type=_positive_int, default=1, metavar="N",
                        help="tokenizing processes (default 1); the output is the same bytes "
                             "for any N")
    parser.add_argument("--tokenizer-type", metavar="TYPE",
                        help="ByteTokenizer (the default: UTF-8 bytes, ids 0-255, EOD 256) or "
                             "HuggingFaceTokenizer (needs mf-data[hf] and --tokenizer-model)")
    parser.add_argument("--tokenizer-model", metavar="DIR",
                        help="a Hugging Face model directory with tokenizer.json, or the file")
    parser.add_argument("--tokenizer", metavar="tokenizer.json",
                        help="short for --tokenizer-type HuggingFaceTokenizer --tokenizer-model "
                             "tokenizer.json")
    parser.add_argument("--eod", type=_non_negative_int, metavar="ID",
                        help="end-of-document token id (default: 256 for bytes, else the "
                             "tokenizer's eos token)")
    parser.add_argument("--dtype", choices=DTYPE_NAMES,
                        help="token dtype in .bin (default: uint16 if the vocabulary is below "
                             "65500, else int32)")
    parser.add_argument("--model-vocab-size", type=_positive_int, metavar="N",
                        help="the model's vocabulary (model.vocab_size): a token id at or "
                             "beyond it is an error naming the document, and nothing is "
                             "written (default: not checked here)")
    parser.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    add_megatron_flags(parser)
    parser.set_defaults(handler=_preprocess, parser=parser)


def _inspect(args: argparse.Namespace) -> int:
    from mf_data.corpus_stats import corpus_stats, format_stats
    from mf_data.indexed import IndexedDataset

    stats = corpus_stats(IndexedDataset(args.prefix))
    print(json.dumps(stats.to_dict(), indent=2) if args.json else format_stats(stats))
    return 0


def add_inspect(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "inspect", help="summarise PREFIX.bin/PREFIX.idx",
        description="Print counts, dtype and sequence-length statistics of an indexed dataset.")
    parser.add_argument("prefix", metavar="PREFIX", help="dataset path without .bin/.idx")
    parser.add_argument("--json", action="store_true", help="print JSON instead of text")
    parser.set_defaults(handler=_inspect)


def _sample(args: argparse.Namespace) -> int:
    from mf_config import ConfigError, load_config
    from mf_data.builder import build_datasets
    from mf_data.loader import named_columns
    from mf_data.sample_report import format_sample

    try:
        config = load_config(args.config, overrides=args.overrides)
    except ConfigError as error:
        raise DataError(str(error)) from None
    split = ("train", "valid", "test").index(args.split)
    dataset = build_datasets(config.train_dataset.dataloader)[split]
    if dataset is None:
        raise DataError(f"{args.config}: the {args.split} split has no data (see "
                        "train_dataset.dataloader.config.split and sizes)")
    if not 0 <= args.index < len(dataset):
        raise DataError(f"sample {args.index} is outside the {args.split} split's "
                        f"{len(dataset):,} samples")
    tokenizer = None
    if args.tokenizer is not None:
        from mf_data.text_tokenizer import load_tokenizer

        tokenizer = load_tokenizer(None if args.tokenizer == "bytes" else args.tokenizer,
                                   config.train_dataset.dataloader.config.get("eod"))
    columns = named_columns(dataset[args.index], config.train_dataset.dataloader.column_names)
    print(format_sample(args.index, args.split, columns, tokenizer))
    return 0


def add_sample(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "sample", help="print sample N of a training config's data",
        description="Build the datasets of CONFIG's train_dataset and print sample N as the "
                    "trainer sees it: int32 columns named by column_names (a dense "
                    "attention mask bool), and the text when a tokenizer is given.")
    parser.add_argument("config", metavar="CONFIG", help="the training YAML")
    parser.add_argument("index", metavar="N", type=_non_negative_int, help="sample index")
    parser.add_argument("--split", choices=("train", "valid", "test"), default="train")
    parser.add_argument("--tokenizer", metavar="FILE",
                        help="tokenizer.json to decode with, or 'bytes' for the byte tokenizer")
    parser.add_argument("--set", dest="overrides", action="append", default=[],
                        metavar="KEY=VALUE", help="override a config value (repeatable)")
    parser.set_defaults(handler=_sample)


SUBCOMMANDS: tuple[Callable[[argparse._SubParsersAction], None], ...] = (
    add_preprocess,
    add_inspect,
    add_sample,
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROGRAM,
                                     description="Megatron indexed datasets for mf.")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add_subcommand in SUBCOMMANDS:
        add_subcommand(subparsers)
    return parser


def run(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``mf-data`` console script; returns the exit status."""
    args = build_parser().parse_args(argv)
    try:
        return args.handler(args)
    except BrokenPipeError:
        # The reader went away (e.g. `mf-data inspect PREFIX | head`): stop quietly, and keep
        # the interpreter from complaining while it flushes stdout at exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except (DataError, OSError) as error:
        print(f"{PROGRAM}: error: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        # outputs are written under temporary names, removed on the way out (`indexed`)
        print(f"{PROGRAM}: interrupted (SIGINT); nothing was written", file=sys.stderr)
        return 130
