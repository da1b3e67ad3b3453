"""The vocabulary of `support.FIELDS`: what a decision depends on (`Target`), who reads a field
and when a value is refused or has no effect (`Field`, `Rule`), and the common conditions."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import attrs

from mf_config import TrainConfig
from mf_config.sections import declared_fields
from mf_config.yaml_source import Source


@attrs.frozen
class Target:
    """What a decision depends on: the configuration, the ranks, the backend."""

    config: TrainConfig
    world_size: int = 1
    device: str = "CPU"
    source: Source | None = None
    data_shard: int = 1
    """The plan's data-parallel shard degree (a sharded strategy runs when above 1)."""

    def written(self, path: tuple[str, ...]) -> bool:
        """Whether the user wrote `path` (in the file or a `--set`); without a source,
        whether the value differs from its default."""
        if self.source is not None:
            return self.source.written(path)
        try:
            default = value_at(TrainConfig(), path)
        except KeyError:  # an open section's key: written when the config has it
            default = _ABSENT
        try:
            return value_at(self.config, path) != default
        except KeyError:
            return False


_ABSENT = object()


@attrs.frozen
class Rule:
    """A value that is refused, or that has no effect here."""

    refuse: bool
    applies: Callable[[Any, Target], bool]
    """(the field's value, the target) -> whether the rule applies."""
    message: str
    """Said after the path; `{value}` is replaced by the field's value."""
    example: dict[str, Any]
    """`--set` overrides of an example configuration that make the rule apply (for the
    tests)."""
    world_size: int = 1
    config: str = "qwen3_tiny.yaml"
    """The example configuration (in examples/) the overrides apply to."""
    device: str = "CPU"
    """The backend the example runs on."""


@attrs.frozen
class Field:
    """Who reads a field, and when it is refused or has no effect."""

    reads: tuple[str, ...] = ()
    """Modules that read it (`mf_train.trainer`); the tests check the name appears there."""
    rules: tuple[Rule, ...] = ()


def reads(*modules: str, rules: tuple[Rule, ...] = ()) -> Field:
    return Field(reads=modules, rules=rules)


def no_effect(when: Callable[[Any, Target], bool], message: str, example: dict[str, Any],
              world_size: int = 1, config: str = "qwen3_tiny.yaml", device: str = "CPU") -> Rule:
    return Rule(False, when, message, example, world_size, config, device)


def refused(when: Callable[[Any, Target], bool], message: str, example: dict[str, Any],
            world_size: int = 1, config: str = "qwen3_tiny.yaml", device: str = "CPU") -> Rule:
    return Rule(True, when, message, example, world_size, config, device)


def written(path: str) -> Callable[[Any, Target], bool]:
    """The rule applies when the user wrote `path`."""
    keys = tuple(path.split("."))
    return lambda _value, target: target.written(keys)


def written_while_off(path: str, switch: str) -> Callable[[Any, Target], bool]:
    """The rule applies when the user wrote `path` while the field `switch`, which `path`
    depends on, is off (false, 0 or empty)."""
    keys, switch_keys = tuple(path.split(".")), tuple(switch.split("."))
    return lambda _value, target: (target.written(keys)
                                   and not value_at(target.config, switch_keys))


def needs(switch: str, path: str, example: Any, off: Any = False, why: str = "") -> Rule:
    """`path` has no effect while the field `switch` it depends on is off: said when the user
    wrote it.

    Args:
        switch: the field `path` depends on, such as `swap.enable`.
        path: the dependent field.
        example: a value of `path` for the rule's example (which also sets `switch` to `off`).
        off: the switch's off value, as the message names it (false, 0, null).
        why: what the message adds after the switch, such as `(nothing is saved)`.
    """
    return no_effect(written_while_off(path, switch),
                     f"has no effect: {switch} is {json.dumps(off)}{why}",
                     {switch: off, path: example})


def differs(default: Any) -> Callable[[Any, Target], bool]:
    return lambda value, _target: value != default


def on_cpu(value: Any, target: Target) -> bool:
    return value is not None and target.device == "CPU"


def value_at(config: Any, path: tuple[str, ...]) -> Any:
    """The value at a dotted path of a config: declared fields, then open sections' keys and
    mappings inside them; `KeyError` when an open key is not there."""
    node = config
    for key in path:
        if attrs.has(type(node)) and key in declared_fields(type(node)):
            node = getattr(node, key)
        elif attrs.has(type(node)) and hasattr(node, "extras"):
            node = node.extras[key]
        elif isinstance(node, dict):
            node = node[key]
        else:
            raise KeyError(key)
    return node
