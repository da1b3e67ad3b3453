"""The settings of the component each open section selects, checked when a file is validated.

An open section (`model`, `optimizer`, `lr_scheduler`, `train_dataset.dataloader`, each
callback) keeps the keys mf-config does not declare and hands them to the component its `type`
selects. So that `mf-config validate` can check those keys too (`model.hiden_size`, with its
line and "did you mean"), without importing the components (a model imports MindSpore, which
costs seconds), each package declares the settings class of every component type it provides
under an entry point of the kind's group:

    [project.entry-points."mf_config.models"]
    qwen3 = "mf_train.settings.qwen3:Qwen3Settings"

Groups: `mf_config.models`, `mf_config.optimizers`, `mf_config.lr_schedulers`,
`mf_config.dataloaders`, `mf_config.callbacks`; the entry point's name is the `type` as written
(every alias gets its own entry point). The class is a `Section` (fields made with `setting`)
in a module that imports neither MindSpore nor numpy. It may define two hooks:
`problems(self, path)` for checks within its keys (run whenever they are structured, see
`component_settings.structure_settings`) and `config_problems(self, config, path)` for checks
against other sections (run here; each problem a `(path, message)` error or a `(path,
message, "warning")`). Models subclass `model_shape.ModelSettings`.

A type no installed package declares settings for may still be a component: registered in
code, published under the package's own registry, or a `module:Class` path. A package may
declare, under the group `mf_config.component_classes`, a resolver for a kind (the entry
point's name is the kind, such as `callbacks`): a function `(type_name, type_path, source)`
that returns the settings class of the component the type names (None when it declares
none) and raises `ConfigError` when the type names no component of that kind. Validation
then refuses such a type and checks the keys its class declares. Without a resolver, or when
the class declares no settings, validation says, as a note, that the keys were not checked;
the component checks them when it is built.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, NamedTuple, TypeVar

from .component_settings import structure_settings
from .entry_points import EntryPoint, entry_points
from .errors import ConfigError, ConfigIssue, Path
from .section_base import OpenSection, declared_fields
from .sections import ModelConfig, TrainConfig
from .yaml_source import Source

if TYPE_CHECKING:  # imported by the models' settings modules, when a model has them
    from .model_shape import ModelSettings, ModelShape

M = TypeVar("M", bound="ModelSettings")
GROUP_PREFIX = "mf_config."
KINDS = {"models": "model type", "optimizers": "optimizer type",
         "lr_schedulers": "learning-rate scheduler type", "dataloaders": "data loader type",
         "callbacks": "callback type"}
"""Entry-point group suffix -> how a type of that kind is named in messages."""
RESOLVERS = "component_classes"
"""Entry-point group suffix of the resolvers: kind -> `(type_name, type_path, source)` ->
the settings class of the component that type names (see the module's docstring)."""
PRE_LAUNCH = "pre_launch"
"""Entry-point group suffix of a trainer's pre-launch checks: `(config, source, world_size)`
-> the issues it would report before starting a rank (`validate.pre_launch_issues`)."""


class Selection(NamedTuple):
    """One open section and the component type it selects."""

    kind: str
    section: OpenSection
    path: Path
    """Where the section is: `("model",)`, `("callbacks", 2)`."""
    type_path: Path
    """Where the type is written: `("model", "architectures")`."""
    type_name: str | None


class ComponentCheck(NamedTuple):
    """What checking the open sections found, and the model's shape and settings when they
    are known."""

    issues: list[ConfigIssue]
    model_shape: ModelShape | None = None
    model_settings: ModelSettings | None = None


def selections(config: TrainConfig, failed: set[str] = frozenset()) -> Iterator[Selection]:
    """The open sections of `config` that structured, each with the type it selects."""
    if "model" not in failed:
        model = config.model
        key = "architectures" if model.architectures else "model_type"
        yield Selection("models", model, ("model",), ("model", key), model_type_name(model))
    if "optimizer" not in failed:
        yield Selection("optimizers", config.optimizer, ("optimizer",), ("optimizer", "type"),
                        config.optimizer.type)
    if "lr_scheduler" not in failed:
        yield Selection("lr_schedulers", config.lr_scheduler, ("lr_scheduler",),
                        ("lr_scheduler", "type"), config.lr_scheduler.type)
    if "train_dataset" not in failed:
        loader = config.train_dataset.dataloader
        path = ("train_dataset", "dataloader")
        yield Selection("dataloaders", loader, path, (*path, "type"), loader.type)
    if "callbacks" not in failed:
        for index, callback in enumerate(config.callbacks):
            yield Selection("callbacks", callback, ("callbacks", index),
                            ("callbacks", index, "type"), callback.type)


def model_type_name(model: ModelConfig) -> str | None:
    """The type a model section selects: `architectures` (its class), else `model_type`."""
    return model.architecture() if model.architectures else model.model_type


def check_components(config: TrainConfig, source: Source,
                     failed: set[str] = frozenset()) -> ComponentCheck:
    """The open sections' keys checked against the settings their components declare.

    Args:
        config: the structured configuration.
        source: locates each issue.
        failed: sections that failed to structure (they are skipped).

    Returns:
        Every problem in those keys (errors), a note per section whose type no installed
        package declares settings for, and the model's shape and settings when its settings
        are declared.
    """
    issues: list[ConfigIssue] = []
    shape = model = None
    for selection in selections(config, failed):
        settings, found = _check(selection, config, source)
        issues += found
        give_shape = getattr(settings, "shape", None)  # a model's ModelSettings
        if selection.kind == "models" and give_shape is not None and not found:
            shape, model = give_shape(), settings
    return ComponentCheck(issues, shape, model)


def _check(selection: Selection, config: TrainConfig,
           source: Source) -> tuple[Any, list[ConfigIssue]]:
    extras = selection.section.extras
    if selection.type_name is None:
        return None, _keys_without_type(selection, source)
    try:
        cls = settings_class(selection.kind, selection.type_name)
        if cls is None:
            cls = _resolved_settings(selection, source)
    except (ImportError, AttributeError) as exc:  # a broken installation: say which
        return None, [source.issue(selection.type_path, f"cannot load the settings of "
                                   f"{KINDS[selection.kind]} {selection.type_name!r}: {exc}")]
    except ConfigError as exc:  # the type names no component of its kind
        return None, exc.errors
    if cls is None and not extras:
        return None, []  # nothing to check
    if cls is None:
        return None, [source.issue(selection.type_path, f"not checked: no installed package "
                                   f"declares the settings of {KINDS[selection.kind]} "
                                   f"{selection.type_name!r}; its keys are checked when it is "
                                   "built", "note")]
    try:
        settings = structure_settings(cls, extras, selection.path, source,
                                      owner=f"{KINDS[selection.kind]} {selection.type_name!r}",
                                      also_allowed=declared_fields(type(selection.section)))
    except ConfigError as exc:
        return None, exc.errors
    hook = getattr(settings, "config_problems", None)
    found = hook(config, selection.path) if hook is not None else []
    return settings, [source.issue(*problem) for problem in found]


def _resolved_settings(selection: Selection, source: Source) -> type | None:
    """The settings class of the component a type names, through the kind's resolver; None
    when no installed package declares a resolver for the kind or the class declares none."""
    for entry in installed_entry_points(RESOLVERS):
        if entry.name == selection.kind:
            return entry.load()(selection.type_name, selection.type_path, source)
    return None


def _keys_without_type(selection: Selection, source: Source) -> list[ConfigIssue]:
    """Keys for a component while its type is null would be ignored silently: refuse them.
    (`lr_scheduler.type: null` is a constant learning rate; the other kinds need a type.)"""
    if selection.kind != "lr_schedulers":
        return []
    schedulers = installed_entry_points("lr_schedulers")
    names = ", ".join(entry.name for entry in schedulers) or "a scheduler type"
    return [source.issue((*selection.path, key),
                         f"is a scheduler key, but lr_scheduler.type is null (a constant "
                         f"learning_rate); set type ({names}), or remove the key")
            for key in selection.section.extras]


def settings_class(kind: str, type_name: str) -> type | None:
    """The settings class an installed package declares for a component type.

    The entry point's module is imported now, on first use: only this type's.

    Args:
        kind: a key of `KINDS`, such as "models".
        type_name: the type as written, such as "qwen3".

    Returns:
        The class, or None when no installed package declares one.
    """
    for entry in installed_entry_points(kind):
        if entry.name == type_name:
            return entry.load()
    return None


def declared_types(kind: str) -> list[str]:
    """The type names installed packages declare settings for, for messages and tests."""
    return sorted({entry.name for entry in installed_entry_points(kind)})


def model_settings(model: ModelConfig, source: Source | None = None) -> ModelSettings | None:
    """The typed settings of a model section, or None when no installed package declares
    them for its type; `ConfigError` (located in `source`) when its keys are wrong."""
    name = model_type_name(model)
    cls = settings_class("models", name) if name else None
    return None if cls is None else structure_model_settings(cls, model, source)


def structure_model_settings(cls: type[M], model: ModelConfig,
                             source: Source | None = None) -> M:
    """The keys of a model section as its typed settings: one parse for validation (through
    the entry point) and for the model class (in its `from_config`).

    Args:
        cls: the model's settings class (a `ModelSettings`).
        model: the model section.
        source: locates each problem when given.

    Returns:
        An instance of `cls`.

    Raises:
        ConfigError: listing every problem in the model's keys.
    """
    return structure_settings(cls, model.extras, ("model",), source,
                              owner=f"model type {model_type_name(model)!r}",
                              also_allowed=declared_fields(ModelConfig))


def model_shape(model: ModelConfig, source: Source | None = None) -> ModelShape | None:
    """The model's structure numbers (layers, widths, experts), for the other packages' plans.

    Args:
        model: the model section.
        source: locates a problem in the model's keys when given.

    Returns:
        `model_settings(model).shape()`, or None when no settings are declared for its type.

    Raises:
        ConfigError: the model's keys are wrong.
    """
    settings = model_settings(model, source)
    return None if settings is None else settings.shape()


_ENTRY_POINTS: dict[str, tuple[EntryPoint, ...]] = {}


def installed_entry_points(kind: str) -> tuple[EntryPoint, ...]:
    """The entry points installed packages declare in one kind's group (`mf_config.models`...).

    The groups of all kinds are read once per process, on first use.

    Args:
        kind: a key of `KINDS`, such as "models", `RESOLVERS` or `PRE_LAUNCH`.

    Returns:
        The group's entry points; each names a type and the settings class declared for it
        (for `RESOLVERS`, a kind and its resolver).
    """
    if not _ENTRY_POINTS:
        found = entry_points(GROUP_PREFIX + name for name in (*KINDS, RESOLVERS, PRE_LAUNCH))
        for name in (*KINDS, RESOLVERS, PRE_LAUNCH):
            _ENTRY_POINTS[name] = tuple(found[GROUP_PREFIX + name])
    return _ENTRY_POINTS.get(kind, ())




def decoder_layers(config: TrainConfig) -> int | None:
    """The decoder layers pipeline stages hold: the model's shape, or for a model whose
    settings no installed package declares, `num_hidden_layers` (`num_layers`) as written."""
    shape = model_shape(config.model)
    return shape.num_layers if shape is not None else config.model.decoder_layer_count()


def sequence_length(config: TrainConfig) -> int | None:
    """The training sequence length: the model's `seq_length` (from its shape, or as written
    for an undeclared model), else the data loader's `config.seq_length`."""
    shape = model_shape(config.model)
    value = shape.seq_length if shape is not None else config.model.get("seq_length")
    if value is None:
        loader_config = config.train_dataset.dataloader.get("config")
        value = loader_config.get("seq_length") if isinstance(loader_config, dict) else None
    return value if type(value) is int else None
