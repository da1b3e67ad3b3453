"""Typed settings for the component an open section selects.

An open section (`model`, `optimizer`, `lr_scheduler`, `train_dataset.dataloader`, each
callback) keeps the keys mf-config does not declare in `extras` and hands them to the
component its `type` selects. That component declares its own settings as a `Section` class
(fields made with `setting`, bounds included) and structures the extras here, through the same
converter and bound checks as the rest of the configuration; so an unknown or ill-typed key
reads like every other configuration error, with its path and, given the `Source`, its line:
`train.yaml:12: model.hidden_size: expected an integer, got '4k' (a string)`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar

import attrs

from .bounds import bound_problems
from .converter import converter, problems, unknown_keys_message
from .errors import ConfigError, ConfigIssue, Path, format_path
from .section_base import declared_fields
from .yaml_source import Source

T = TypeVar("T")


def structure_settings(cls: type[T], raw: Mapping[str, Any], path: Path,
                       source: Source | None = None, *, owner: str | None = None,
                       also_allowed: tuple[str, ...] = ()) -> T:
    """A component's keys as its typed settings, checked as the rest of the configuration is.

    A class may map keys from other tools to a hint (`key_hints`: `min_lr` -> "the floor is
    lr_end"). Its `problems(self, path)` hook, when defined, runs unless a key is unknown (a
    misspelt `hidden_size` would read as missing), even past a bound: it must not divide by one.

    Args:
        cls: the settings class, a `Section` whose fields are made with `setting`.
        raw: the keys as written (an open section's `extras`).
        path: where they sit, such as `("model",)`.
        source: locates each problem (file and line) when given.
        owner: whose keys they are, in the unknown-key message (default: the class name).
        also_allowed: the open section's own fields, suggested for a near miss too
            (`optimizer.weight_decy` -> 'weight_decay').

    Returns:
        An instance of `cls`.

    Raises:
        ConfigError: listing every problem (unknown keys, types, bounds, `problems`).
    """
    attrs.resolve_types(cls)  # a module with `from __future__ import annotations` has strings
    found = _unknown_keys(cls, raw, path, owner or cls.__name__, also_allowed)
    known = {key: value for key, value in raw.items() if key in declared_fields(cls)}
    try:
        settings = converter.structure(known, cls)
    except Exception as exc:  # cattrs' validation group: flattened into paths
        raise settings_error(found + problems(exc, path), source) from None
    found += bound_problems(settings, path)
    hook = getattr(settings, "problems", None)
    unknown = len(raw) - len(known)
    if hook is not None and not unknown:  # a misspelt key would read as a missing one
        found += hook(path)
    if found:
        raise settings_error(found, source)
    return settings


def _unknown_keys(cls: type, raw: Mapping[str, Any], path: Path, owner: str,
                  also_allowed: tuple[str, ...]) -> list[tuple[Path, str]]:
    """Each key `cls` does not declare, named with the nearest known one or the class's hint."""
    allowed = declared_fields(cls)
    hints = getattr(cls, "key_hints", {})
    return [((*path, key), _with_hint(unknown_keys_message(owner, key, allowed + also_allowed),
                                      hints.get(key)))
            for key in raw if key not in allowed]


def _with_hint(message: str, hint: str | None) -> str:
    return message if hint is None else f"{message}; {hint}"


def settings_error(found: list[tuple[Path, str]], source: Source | None = None) -> ConfigError:
    """A `ConfigError` from (path, message) pairs, for checks a component runs itself.

    Args:
        found: (path, message) pairs, as `structure_settings` and the `problems` hooks give.
        source: locates each problem (file and line) when given.

    Returns:
        The error (to raise), one `ConfigIssue` per pair.
    """
    return ConfigError([located_issue(where, message, source=source) for where, message in found])


def located_issue(path: Path, message: str, severity: str = "error",
                  source: Source | None = None) -> ConfigIssue:
    """One issue at `path`, with its file and line when `source` is given.

    Args:
        path: where in the configuration (`("training", "steps")`).
        message: what is wrong, and what is allowed.
        severity: "error", "warning" or "note".
        source: locates the value (its line, or the `--set` that wrote it).

    Returns:
        The issue.
    """
    if source is not None:
        return source.issue(path, message, severity)
    return ConfigIssue(format_path(path), message, severity=severity)
