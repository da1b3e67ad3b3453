"""Plain data (with its source positions) -> a validated `TrainConfig`, or every problem."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path as FilePath

import attrs

from .components import PRE_LAUNCH, check_components, installed_entry_points
from .converter import converter, problems, unknown_keys_message
from .errors import ConfigError, ConfigIssue, emit_warnings
from .overrides import apply_overrides
from .rules import run_rules
from .sections import TrainConfig
from .yaml_source import Source, load_file

_SECTIONS = {a.name: a.type for a in attrs.fields(TrainConfig)}


def check_source(source: Source) -> tuple[TrainConfig, list[ConfigIssue]]:
    """Every issue of a configuration, found in one pass, so the user gets the whole list.

    Sections are structured one by one, so a type error in one section does not hide the
    value-rule problems of the others; then the open sections' keys are checked against the
    settings their components declare (`components`), and every rule runs.

    Args:
        source: the configuration data and where each value came from.

    Returns:
        (config, issues): the config, where a section that failed is left at its defaults (and
        the rules that read it are skipped), and every error, warning and note, in line order.
    """
    if not isinstance(source.data, dict):
        kind = "a list" if isinstance(source.data, list) else type(source.data).__name__
        return TrainConfig(), [source.issue((), f"the configuration must be a mapping of "
                                                 f"sections, got {kind}")]
    issues = _unknown_sections(source)
    sections, failed = {}, set()
    for name, section_type in _SECTIONS.items():
        if name not in source.data:
            continue
        try:
            sections[name] = converter.structure(source.data[name], section_type)
        except Exception as exc:  # every structuring failure becomes issues, never a traceback
            failed.add(name)
            issues += [source.issue(path, message) for path, message in problems(exc, (name,))]
    config = TrainConfig(**sections)
    components = check_components(config, source, failed)
    issues += components.issues
    issues += run_rules(config, source, failed, components.model_shape,
                        components.model_settings)
    issues.sort(key=lambda issue: issue.line if issue.line is not None else float("inf"))
    return config, issues


def pre_launch_issues(config: TrainConfig, source: Source,
                      world_size: int | None = None) -> list[ConfigIssue]:
    """What the installed trainer would refuse or say has no effect before it starts a rank,
    through the entry points of the group `mf_config.pre_launch` (mf-train declares one), so
    that `mf-config validate` shows the same lines as the launcher; mf-config imports no
    trainer.

    Args:
        config: a configuration that validated without errors.
        source: where its values came from.
        world_size: the ranks the job would run on; None: the fewest its parallelism
            section runs on (the trainer decides, and says so when it is more than one).

    Returns:
        The trainer's errors and warnings, or, when no trainer is installed, one note saying
        what could not be checked.
    """
    checks = installed_entry_points(PRE_LAUNCH)
    if not checks:
        return [ConfigIssue("", NOT_CHECKED, file=source.file, severity="note")]
    return [issue for entry in checks for issue in entry.load()(config, source, world_size)]


NOT_CHECKED = ("not checked: what the trainer refuses or says has no effect before it starts "
               "(no installed package declares pre-launch checks; mf-train does)")


def _unknown_sections(source: Source) -> list[ConfigIssue]:
    return [source.issue((key,), unknown_keys_message("TrainConfig", key, tuple(_SECTIONS)))
            for key in source.data if key not in _SECTIONS]


def config_from_source(source: Source) -> TrainConfig:
    """The validated config of data already read (a file, overrides applied; or a dict).

    Warnings are emitted through the `warnings` module (`ConfigWarning`).

    Args:
        source: the configuration data and where each value came from.

    Returns:
        The typed, validated configuration.

    Raises:
        ConfigError: listing every error, each with its path and line.
    """
    config, issues = check_source(source)
    errors = [issue for issue in issues if issue.severity == "error"]
    if errors:
        raise ConfigError(errors)
    emit_warnings(issues)
    return config


def load_source(path: str | FilePath, overrides: Iterable[str] = ()) -> Source:
    """Read a file and apply overrides to it, keeping where each value came from.

    Args:
        path: the YAML configuration file.
        overrides: `key.path=value` strings, applied in order.

    Returns:
        The data with the line of every value and the override that wrote each path.

    Raises:
        ConfigError: the file cannot be read or parsed (`UnreadableFile` when it cannot be
            read at all), or an override is malformed.
    """
    source = load_file(path)
    apply_overrides(source, overrides)
    return source


def load_config(path: str | FilePath, overrides: Iterable[str] = ()) -> TrainConfig:
    """Load, override and validate a YAML configuration file: mf-config's entry point.

    Args:
        path: the YAML configuration file.
        overrides: `key.path=value` strings (as `--set` takes them), applied in order.

    Returns:
        The typed, validated configuration.

    Raises:
        ConfigError: a `ValueError` whose `.errors` lists every problem, each with its dotted
            path and source line (`UnreadableFile` when the file cannot be read at all).
    """
    return config_from_source(load_source(path, overrides))
