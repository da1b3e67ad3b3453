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
        "<config>: optimizer.type: unknown thing type 'Beta'; registered: Alpha; "
        "or give a 'module:Class' path")


def test_module_class_path() -> None:
    things = Registry("things")
    assert things.get("collections:OrderedDict", ("t",)).__name__ == "OrderedDict"
    with pytest.raises(ConfigError, match="cannot load thing type 'collections:Nope'"):
        things.get("collections:Nope", ("t",))
    with pytest.raises(ConfigError, match="cannot load thing type 'no_such_mod:X'"):
        things.get("no_such_mod:X", ("t",))


def test_missing_type() -> None:
    things = Registry("things")
    things.register("Alpha")(int)
    with pytest.raises(ConfigError, match=r"callbacks\[0\].type: required: one of Alpha"):
        things.get(None, ("callbacks", 0, "type"))


def test_entry_point_of_an_installed_distribution(tmp_path, monkeypatch) -> None:
    """A distribution publishing `mf_train.things` entry points (a real .dist-info directory on
    sys.path, as pip installs it) adds its classes by name."""
    (tmp_path / "my_plugin.py").write_text("class Widget:\n    pass\n")
    info = tmp_path / "my_plugin-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: my-plugin\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[mf_train.things]\nwidget = my_plugin:Widget\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    things = Registry("things")
    assert "widget" in things.names()
    assert things.get("widget", ("t",)).__name__ == "Widget"
