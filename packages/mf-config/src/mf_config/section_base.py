"""How a configuration section is declared: `setting` fields, `Section`, `OpenSection`.

Each field carries its default, a one-line help text, and its numeric bounds (`gt`, `ge`, `le`)
as attrs metadata; enumerations are `Literal` types. The converter, the bound rules and the
JSON Schema all read these declarations, so a field is described in exactly one place. The
settings classes of components (a model's, a data loader's) are declared the same way.

Closed sections reject unknown keys. Open sections (`OpenSection`) keep undeclared keys in
`extras`, readable as attributes and by key, and hand them on to the component their `type`
selects.
"""

from typing import Any

import attrs

MAX_DIMENSION = 2**31 - 1
"""The largest width, count or token id a model or dataset setting may have: tensor shapes
and token ids are 32-bit integers in MindSpore and in the data."""
MAX_SEED = 2**32 - 1
"""The largest random seed: numpy's and MindSpore's seeds are unsigned 32-bit integers."""


def setting(default: Any, help: str, *, no_effect: str | None = None, **bounds: float) -> Any:
    """A section field: the one place its default, help text and bounds are declared.

    Args:
        default: the value when the key is not written; a list, dict or section is copied
            for each instance.
        help: one line, for `mf-config show` and the JSON Schema.
        no_effect: for a component's setting that is accepted (a Hugging Face config.json
            key, say) but changes nothing, the reason; the trainer says so once when the key
            is written.
        **bounds: `gt`, `ge`, `le`, checked on the structured value (`bounds`).

    Returns:
        An attrs field, for a class made with `section`.
    """
    metadata = {"help": help, **bounds}
    if no_effect is not None:
        metadata["no_effect"] = no_effect
    if isinstance(default, (list, dict)):
        return attrs.field(factory=lambda: type(default)(default), metadata=metadata)
    if attrs.has(type(default)):
        return attrs.field(factory=type(default), metadata=metadata)
    return attrs.field(default=default, metadata=metadata)


class Section:
    """Base of every section: `==` and `repr` written once, for all of them.

    attrs would generate and compile both per class; for two dozen classes that is 11 ms of
    every `mf-config validate` (measured), so the sections share these loops instead.
    Sections are unhashable: they hold lists and mappings.
    """

    __slots__ = ()
    __hash__ = None  # type: ignore[assignment]

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        return all(getattr(self, a.name) == getattr(other, a.name)
                   for a in attrs.fields(type(self)))

    def __repr__(self) -> str:
        values = ", ".join(f"{a.name}={getattr(self, a.name)!r}" for a in attrs.fields(type(self)))
        return f"{type(self).__name__}({values})"


def section(cls: type) -> Any:
    """Make a `Section` subclass a frozen attrs class with keyword-only fields."""
    return attrs.frozen(cls, kw_only=True, repr=False, eq=False)


@section
class OpenSection(Section):
    """A section that keeps undeclared keys (`allow_extra`) for the component it selects."""

    extras: dict[str, Any] = attrs.field(factory=dict, metadata={"extras": True})

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name == "extras":
            raise AttributeError(name)
        try:
            return object.__getattribute__(self, "extras")[name]
        except KeyError:
            raise AttributeError(
                f"{type(self).__name__} has no field or extra key {name!r}"
            ) from None

    def __getitem__(self, key: str) -> Any:
        if key in declared_fields(type(self)):
            return getattr(self, key)
        return self.extras[key]

    def __contains__(self, key: object) -> bool:
        return key in declared_fields(type(self)) or key in self.extras

    def get(self, key: str, default: Any = None) -> Any:
        """The value of a declared field or extra key, or `default`."""
        try:
            return self[key]
        except KeyError:
            return default


def declared_fields(cls: type) -> tuple[str, ...]:
    """The keys a section (or a component's settings class) accepts as its own.

    Args:
        cls: a section class.

    Returns:
        The names of its fields, without an open section's `extras` store.
    """
    return tuple(a.name for a in attrs.fields(cls) if not a.metadata.get("extras"))
