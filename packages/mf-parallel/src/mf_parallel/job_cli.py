"""The command line of one training job on N ranks: its arguments, its config, its exit statuses.

Public: every command about a job (`mf-parallel plan`, `mf-memory estimate`, a tool of your
own) takes the same `--config FILE [--world-size N] [--json] [--set key.path=value ...]` and
reports a bad config the same way. mf-parallel owns it because it owns the job's layout: the
config and the world size.

    def check(args: argparse.Namespace, config: TrainConfig) -> int:
        ...  # the command's work; returns EXIT_OK or EXIT_INVALID

    parser, command = job_parser("my-tool", "What my tool does.", "check", "check a job")
    sys.exit(run_job(parser, None, check))  # None: sys.argv[1:]
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

from mf_config import ConfigError, TrainConfig, UnreadableFile, load_config

from .errors import PlanError
from .plan import make_plan

#: Exit statuses: the command did its work; the config or layout is invalid; usage error or
#: unreadable file.
EXIT_OK, EXIT_INVALID, EXIT_USAGE = 0, 1, 2


def job_parser(prog: str, description: str, command: str,
               summary: str) -> tuple[argparse.ArgumentParser, argparse.ArgumentParser]:
    """A parser whose one command takes the job arguments (see `add_job_arguments`).

    Args:
        prog: the program's name, as usage lines show it.
        description: what the program is for.
        command: the command's name; `args.command` is set to it (None without a command).
        summary: the command's one-line help.

    Returns:
        The parser and the command's subparser, to add the command's own arguments to.
    """
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.set_defaults(command=None)
    commands = parser.add_subparsers(title="commands", metavar="COMMAND")
    subparser = commands.add_parser(command, help=summary)
    add_job_arguments(subparser)
    subparser.set_defaults(command=command)
    return parser, subparser


def add_job_arguments(parser: argparse.ArgumentParser) -> None:
    """Add `--config`, `--world-size`, `--json` and `--set`: what every command about one
    training job on N ranks takes.

    Args:
        parser: the (sub)parser of the command.
    """
    parser.add_argument("--config", required=True, metavar="FILE", help="train.yaml")
    parser.add_argument("--world-size", type=int, metavar="N",
                        help="number of ranks (default: the smallest the layout fits)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of text")
    parser.add_argument("--set", dest="overrides", action="append", default=[],
                        metavar="KEY.PATH=VALUE", help="override a config value (repeatable)")


def parse_job(parser: argparse.ArgumentParser,
              argv: Sequence[str] | None) -> tuple[argparse.Namespace, TrainConfig] | int:
    """Parse the command line and load the job's config, or say why not.

    Args:
        parser: a parser from `job_parser`.
        argv: the arguments (None: sys.argv[1:]).

    Returns:
        The parsed arguments and the config; or, after printing the problem to stderr, the
        exit status: `EXIT_USAGE` without a command, else as `load_job_config`.
    """
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_usage(sys.stderr)
        return EXIT_USAGE
    config = load_job_config(args)
    if isinstance(config, int):
        return config
    if args.world_size is None:
        args.world_size = smallest_world(config)
        if args.world_size is None:
            print(f"{args.config}: no world size up to {MAX_WORLD} fits the parallel layout; "
                  "give the job's with --world-size N", file=sys.stderr)
            return EXIT_INVALID
        print(f"world size {args.world_size}: the smallest the layout fits (--world-size N for "
              "another)", file=sys.stderr)
    return args, config


MAX_WORLD = 65536
"""The largest world size `smallest_world` tries."""


def smallest_world(config: TrainConfig) -> int | None:
    """The smallest number of ranks the configuration's parallel layout can be planned on
    (its parallel degrees, the batch over data-parallel ranks), None when none up to
    `MAX_WORLD` can."""
    for world in range(1, MAX_WORLD + 1):
        try:
            make_plan(config.parallelism, config.training, world)
        except PlanError:
            continue
        return world
    return None


def run_job(parser: argparse.ArgumentParser, argv: Sequence[str] | None,
            command: Callable[[argparse.Namespace, TrainConfig], int]) -> int:
    """Parse, load the job's config and run the command: the part every job CLI's `main`
    shares.

    Args:
        parser: a parser from `job_parser`.
        argv: the arguments (None: sys.argv[1:]).
        command: the command's work, given the parsed arguments and the config.

    Returns:
        The command's exit status, or `parse_job`'s when there is nothing to run.
    """
    parsed = parse_job(parser, argv)
    return parsed if isinstance(parsed, int) else command(*parsed)


def load_job_config(args: argparse.Namespace) -> TrainConfig | int:
    """Load the config of `--config` with the `--set` overrides applied.

    Args:
        args: parsed arguments with `config` and `overrides` (see `add_job_arguments`).

    Returns:
        The config; or, after printing its problems to stderr, the exit status:
        `EXIT_INVALID` for an invalid config, `EXIT_USAGE` for an unreadable file.
    """
    try:
        return load_config(args.config, args.overrides)
    except ConfigError as exc:
        for issue in exc.errors:
            print(issue, file=sys.stderr)
        return EXIT_USAGE if isinstance(exc, UnreadableFile) else EXIT_INVALID
