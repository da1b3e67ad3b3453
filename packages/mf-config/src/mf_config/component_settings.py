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
    """`raw` as an instance of the settings class `cls`, or `ConfigError` listing every
    problem at `path` (a tuple such as `("model",)`), located in `source` when given.

    An unknown key is named with the nearest known one: `owner` says whose keys they are in
    the message (default: the class name) and `also_allowed` adds the open section's own
    fields to the suggestions (`optimizer.weight_decy` -> 'weight_decay'); a class may map
    keys users write from other tools to a hint (`key_hints`, a class attribute: `min_lr` ->
    "the floor is lr_end"). When the class defines `problems(self, path)`, its findings are
    problems too; it runs unless a key is unknown (a misspelt `hidden_size` would also be
    reported missing), even when a value is out of bounds, so it must not divide by one."""
    attrs.resolve_types(cls)  # a module with `from __future__ import annotations` has strings
    allowed = declared_fields(cls)
    hints = getattr(cls, "key_hints", {})
    found = [((*path, key), _with_hint(unknown_keys_message(owner or cls.__name__, key,
                                                            allowed + also_allowed),
                                       hints.get(key)))
             for key in raw if key not in allowed]
    known = {key: value for key, value in raw.items() if key in allowed}
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


def _with_hint(message: str, hint: str | None) -> str:
    return message if hint is None else f"{message}; {hint}"


def settings_error(found: list[tuple[Path, str]], source: Source | None = None) -> ConfigError:
    """A `ConfigError` of (path, message) pairs, with file and line when `source` has them."""
    if source is not None:
        return ConfigError([source.issue(where, message) for where, message in found])
    return ConfigError([ConfigIssue(format_path(where), message) for where, message in found])
