"""Registries: a config's `type` string -> the class that builds that component.

One `Registry` per kind (models, optimizers, LR schedulers, callbacks, dataloaders). A `type`
is resolved, in order, as:
1. a name registered in code (`@MODELS.register("qwen3", "Qwen3ForCausalLM")`);
2. a name published by an installed distribution under the entry-point group
   `mf_train.<kind>` (for example `[project.entry-points."mf_train.models"]`
   `my_model = "my_pkg.model:MyModel"`), so users add components without touching mf;
3. a `module:Class` path, imported as written.
An unknown type is a `ConfigError` at the section's `type` path that lists what is registered.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any, Generic, TypeVar

from mf_config.component_settings import settings_error
from mf_config.errors import Path
from mf_config.yaml_source import Source

T = TypeVar("T")


class Registry(Generic[T]):
    """Named classes of one kind of component."""

    def __init__(self, kind: str):
        self.kind = kind
        self.noun = kind.removesuffix("s")
        """One of the kind, in messages: `unknown callback type 'X'`."""
        self.group = f"mf_train.{kind}"
        self._classes: dict[str, T] = {}

    def register(self, *names: str) -> Callable[[T], T]:
        """Class decorator: register the class under each of `names` (the first is its own)."""

        def add(cls: T) -> T:
            for name in names:
                if name in self._classes and self._classes[name] is not cls:
                    raise ValueError(f"{self.kind}: {name!r} is already registered to "
                                     f"{self._classes[name]!r}")
                self._classes[name] = cls
            return cls

        return add

    def names(self) -> list[str]:
        """Registered names, from code and from installed entry points, sorted."""
        return sorted(set(self._classes) | {ep.name for ep in self._entry_points()})

    def get(self, type_name: Any, path: Path, source: Source | None = None) -> T:
        """The class for `type_name`; `ConfigError` at `path` (the `type` key) otherwise."""
        if not isinstance(type_name, str) or not type_name:
            raise settings_error([(path, f"required: one of {', '.join(self.names())}, or a "
                                         "'module:Class' path")], source)
        if type_name in self._classes:
            return self._classes[type_name]
        for ep in self._entry_points():
            if ep.name == type_name:
                return self._load(ep.load, type_name, path, source)
        if ":" in type_name:
            return self._load(lambda: _import_path(type_name), type_name, path, source)
        raise settings_error([(path, f"unknown {self.noun} type {type_name!r}; registered: "
                                     f"{', '.join(self.names())}; or give a 'module:Class' "
                                     "path")], source)

    def _entry_points(self) -> list[Any]:
        from importlib.metadata import entry_points  # 25 ms of imports: only when asked

        return list(entry_points(group=self.group))

    def _load(self, load: Callable[[], Any], type_name: str, path: Path,
              source: Source | None) -> T:
        try:
            return load()
        except (ImportError, AttributeError) as exc:
            raise settings_error([(path, f"cannot load {self.noun} type {type_name!r}: "
                                         f"{exc}")], source) from None


def _import_path(text: str) -> Any:
    module_name, _, attribute = text.partition(":")
    target: Any = importlib.import_module(module_name)
    for part in attribute.split("."):
        target = getattr(target, part)
    return target


MODELS: Registry[Any] = Registry("models")
OPTIMIZERS: Registry[Any] = Registry("optimizers")
LR_SCHEDULERS: Registry[Any] = Registry("lr_schedulers")
CALLBACKS: Registry[Any] = Registry("callbacks")
DATALOADERS: Registry[Any] = Registry("dataloaders")
