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

from .converter import converter, problems
from .errors import ConfigError, ConfigIssue, Path, format_path
from .rules import bound_problems
from .yaml_source import Source

T = TypeVar("T")


def structure_settings(cls: type[T], raw: Mapping[str, Any], path: Path,
                       source: Source | None = None) -> T:
    """`raw` as an instance of the settings class `cls`, or `ConfigError` listing every
    problem at `path` (a tuple such as `("model",)`), located in `source` when given."""
    attrs.resolve_types(cls)  # a module with `from __future__ import annotations` has strings
    try:
        settings = converter.structure(dict(raw), cls)
    except Exception as exc:  # cattrs' validation group: flattened into paths
        raise settings_error(problems(exc, path), source) from None
    found = bound_problems(settings, path)
    if found:
        raise settings_error(found, source)
    return settings


def settings_error(found: list[tuple[Path, str]], source: Source | None = None) -> ConfigError:
    """A `ConfigError` of (path, message) pairs, with file and line when `source` has them."""
    if source is not None:
        return ConfigError([source.issue(where, message) for where, message in found])
    return ConfigError([ConfigIssue(format_path(where), message) for where, message in found])
