"""Registries resolve a config's `type` by name, entry point or `module:Class` path."""

from __future__ import annotations

import pytest

from mf_config import ConfigError
from mf_train.registry import Registry


def test_register_and_get() -> None:
    things = Registry("things")

    @things.register("Alpha", "alpha")
    class Alpha:
        pass

    assert things.get("Alpha", ("x", "type")) is Alpha
    assert things.get("alpha", ("x", "type")) is Alpha
    assert things.names() == ["Alpha", "alpha"]


def test_a_name_cannot_be_taken_twice() -> None:
    things = Registry("things")
    things.register("A")(int)
    with pytest.raises(ValueError, match="'A' is already registered"):
        things.register("A")(str)


def test_unknown_type_lists_the_registered_ones() -> None:
    things = Registry("things")
    things.register("Alpha")(int)
    with pytest.raises(ConfigError) as info:
        things.get("Beta", ("optimizer", "type"))
    assert str(info.value.errors[0]) == (
        "<config>: optimizer.type: unknown things type 'Beta'; registered: Alpha; "
        "or give a 'module:Class' path")


def test_module_class_path() -> None:
    things = Registry("things")
    assert things.get("collections:OrderedDict", ("t",)).__name__ == "OrderedDict"
    with pytest.raises(ConfigError, match="cannot load things type 'collections:Nope'"):
        things.get("collections:Nope", ("t",))
    with pytest.raises(ConfigError, match="cannot load things type 'no_such_mod:X'"):
        things.get("no_such_mod:X", ("t",))


def test_missing_type() -> None:
    things = Registry("things")
    things.register("Alpha")(int)
    with pytest.raises(ConfigError, match=r"callbacks\[0\].type: required: one of Alpha"):
        things.get(None, ("callbacks", 0, "type"))
