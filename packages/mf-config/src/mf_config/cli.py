"""The `mf-config` command: validate, show and describe training configuration files.

    mf-config validate train.yaml [more.yaml ...] [--set training.steps=10 ...]
    mf-config show train.yaml [--set ...]
    mf-config schema

Exit status: 0 valid, 1 invalid (every problem printed as FILE:LINE: path: message),
2 usage error or unreadable file. Never a traceback.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from .errors import ConfigError, ConfigIssue
from .validate import check_source, load_source, pre_launch_issues
from .yaml_source import UnreadableFile, dump_text

EXIT_OK, EXIT_INVALID, EXIT_USAGE = 0, 1, 2


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the exit status (also used as the process exit code)."""
    parser = _parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_usage(sys.stderr)
        return EXIT_USAGE
    try:
        return args.run(args)
    except BrokenPipeError:  # `mf-config show x.yaml | head`
        return EXIT_OK


class _HelpFormatter(argparse.HelpFormatter):
    """argparse's formatter, told the terminal width so that it does not import `shutil` for it.

    That import is 8 ms, a tenth of what `mf-config validate` costs beyond Python itself.
    """

    def __init__(self, prog: str) -> None:
        try:
            columns = os.get_terminal_size(sys.__stdout__.fileno()).columns  # type: ignore[union-attr]
        except (AttributeError, ValueError, OSError):
            columns = int(os.environ.get("COLUMNS", "80") or 80)
        super().__init__(prog, width=max(columns, 40) - 2)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="mf-config", description="Validate and inspect mf training configuration files.",
        formatter_class=_HelpFormatter)
    parser.set_defaults(command=None)
    commands = parser.add_subparsers(title="commands", metavar="COMMAND")
    override = dict(action="append", default=[], metavar="KEY.PATH=VALUE",
                    help="override a value before validation (repeatable; VALUE is YAML)")

    validate = commands.add_parser("validate", help="check files; print OK or every problem",
                                   formatter_class=_HelpFormatter)
    validate.add_argument("files", nargs="+", metavar="FILE")
    validate.add_argument("--set", dest="overrides", **override)
    validate.add_argument("--nproc", type=int, default=None, metavar="N",
                          help="the ranks mf-train would run on, as its --nproc over its "
                               "nodes, for the trainer's pre-launch checks (default: the "
                               "fewest the parallelism section runs on)")
    validate.set_defaults(command="validate", run=_validate)

    show = commands.add_parser("show", help="print the effective configuration as YAML",
                               formatter_class=_HelpFormatter)
    show.add_argument("file", metavar="FILE")
    show.add_argument("--set", dest="overrides", **override)
    show.set_defaults(command="show", run=_show)

    schema = commands.add_parser("schema", help="print the JSON Schema of a configuration",
                                 formatter_class=_HelpFormatter)
    schema.set_defaults(command="schema", run=_schema)
    return parser


def _check(file: str, overrides: Sequence[str], nproc: int | None = None,
           pre_launch: bool = False) -> tuple[object, list[ConfigIssue], int]:
    """(config or None, issues, exit status) for one file; with `pre_launch`, a valid file is
    also put through the installed trainer's pre-launch checks on `nproc` ranks (None: the
    fewest its layout runs on)."""
    try:
        source = load_source(file, overrides)
    except UnreadableFile as exc:
        return None, exc.errors, EXIT_USAGE
    except ConfigError as exc:
        return None, exc.errors, EXIT_INVALID
    config, issues = check_source(source)
    if pre_launch and not any(issue.severity == "error" for issue in issues):
        issues += pre_launch_issues(config, source, nproc)
    invalid = any(issue.severity == "error" for issue in issues)
    return config, issues, EXIT_INVALID if invalid else EXIT_OK


def _validate(args: argparse.Namespace) -> int:
    if args.nproc is not None and args.nproc < 1:
        print(f"mf-config: --nproc must be >= 1, got {args.nproc}", file=sys.stderr)
        return EXIT_USAGE
    status = EXIT_OK
    for file in args.files:
        _, issues, file_status = _check(file, args.overrides, args.nproc, pre_launch=True)
        for issue in issues:
            print(issue, file=sys.stderr)
        if file_status == EXIT_OK:
            print(f"{file}: OK")
        status = max(status, file_status)
    return status


def _show(args: argparse.Namespace) -> int:
    config, issues, status = _check(args.file, args.overrides)
    for issue in issues:
        print(issue, file=sys.stderr)
    if status != EXIT_OK:
        return status
    sys.stdout.write(dump_text(config.to_dict()))  # type: ignore[attr-defined]
    return EXIT_OK


def _schema(args: argparse.Namespace) -> int:
    import json

    from .schema import json_schema

    print(json.dumps(json_schema(), indent=2))
    return EXIT_OK


def run() -> None:
    """Console-script entry point."""
    sys.exit(main())
