"""Plain data (with its source positions) -> a validated `TrainConfig`, or every problem."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path as FilePath

import attrs

from .components import check_components
from .converter import converter, problems, unknown_keys_message
from .errors import ConfigError, ConfigIssue, emit_warnings
from .overrides import apply_overrides
from .rules import run_rules
from .sections import TrainConfig
from .yaml_source import Source, load_file

_SECTIONS = {a.name: a.type for a in attrs.fields(TrainConfig)}


def check_source(source: Source) -> tuple[TrainConfig, list[ConfigIssue]]:
    """Structure every section, check the keys of the open sections against the settings
    their components declare (`components`), and run every rule; return the config and all
    issues found (errors, warnings, and notes on what could not be checked).

    Sections are structured one by one, so a type error in one section does not hide the
    value-rule problems of the others. A section that failed is left at its defaults in the
    returned config, and rules that read it are skipped.
    """
    if not isinstance(source.data, dict):
        kind = "a list" if isinstance(source.data, list) else type(source.data).__name__
        return TrainConfig(), [source.issue((), f"the configuration must be a mapping of "
                                                 f"sections, got {kind}")]
    issues: list[ConfigIssue] = []
    sections, failed = {}, set()
    for key in source.data:
        if key not in _SECTIONS:
            message = unknown_keys_message("TrainConfig", key, tuple(_SECTIONS))
            issues.append(source.issue((key,), message))
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
    issues += run_rules(config, source, failed, components.model_shape)
    issues.sort(key=lambda issue: issue.line if issue.line is not None else float("inf"))
    return config, issues


def config_from_source(source: Source) -> TrainConfig:
    """The validated config; `ConfigError` listing every error otherwise. Warnings are emitted."""
    config, issues = check_source(source)
    errors = [issue for issue in issues if issue.severity == "error"]
    if errors:
        raise ConfigError(errors)
    emit_warnings(issues)
    return config


def load_source(path: str | FilePath, overrides: Iterable[str] = ()) -> Source:
    """Read a file and apply `key.path=value` overrides to it."""
    source = load_file(path)
    apply_overrides(source, overrides)
    return source


def load_config(path: str | FilePath, overrides: Iterable[str] = ()) -> TrainConfig:
    """Load, override and validate a YAML configuration file.

    Raises `ConfigError` (a `ValueError`) whose `.errors` lists every problem, each with its
    dotted path and source line.
    """
    return config_from_source(load_source(path, overrides))
