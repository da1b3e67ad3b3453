"""The one cattrs `Converter` that turns plain data into section classes and back.

cattrs' defaults are lenient where a configuration must be strict: `int("5")` and `int(True)`
succeed, a string structures as a list of characters, a union tries members blindly. The hooks
here accept a value only when its YAML type is the declared one (an int is fine where a float
is expected), and say what was expected. Sections, lists and mappings collect the failures of
all their members into cattrs' exception groups (with cattrs' attribute and item notes), and
`problems()` flattens that tree into (path, message) pairs.
"""

from __future__ import annotations

import copy
import types
import typing
from collections.abc import Callable
from typing import Any, Literal, Union

import attrs
import cattrs
from cattrs.errors import (
    AttributeValidationNote,
    ClassValidationError,
    ForbiddenExtraKeysError,
    IterableValidationError,
    IterableValidationNote,
)
from cattrs.gen import make_dict_unstructure_fn

from .errors import MappingKey, Path
from .layer_spec import LayerSpec
from .section_base import OpenSection, declared_fields


class ValueProblem(ValueError):
    """A value of the wrong type or form; the message is for the user."""


converter = cattrs.Converter(detailed_validation=True)


def describe(value: Any) -> str:
    """A short, user-facing description of a parsed YAML value."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"{value} (a boolean)"
    if isinstance(value, int):
        return f"{value} (an integer)"
    if isinstance(value, float):
        return f"{value!r} (a number)"
    if isinstance(value, str):
        return f"{value!r} (a string)"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "a mapping"
    return f"{value!r} ({type(value).__name__})"


def expected(t: Any) -> str:
    """How a declared type reads in a message: `an integer`, `a list of strings`, ..."""
    origin = typing.get_origin(t)
    if t is type(None):
        return "null"
    if t is LayerSpec:
        return "a layer spec such as '5' or '0-3'"
    if attrs.has(t):
        return "a mapping"
    if origin is list:
        inner = expected(typing.get_args(t)[0])
        return "a list" + ("" if inner in ("any value", "a mapping") else f" of {_plural(inner)}")
    if origin is dict:
        return "a mapping"
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(t))
    if _is_union(t):
        return " or ".join(expected(a) for a in typing.get_args(t))
    return _SCALAR_NAMES.get(t, "any value")


_SCALAR_NAMES = {int: "an integer", float: "a number", bool: "true or false", str: "a string"}


def _plural(noun: str) -> str:
    for article in ("an ", "a "):
        if noun.startswith(article):
            return noun[len(article):].replace("layer spec", "layer specs") + (
                "" if "layer spec" in noun else "s")
    return noun


def _is_union(t: Any) -> bool:
    return typing.get_origin(t) in (Union, types.UnionType)


def _mismatch(value: Any, t: Any) -> ValueProblem:
    return ValueProblem(f"expected {expected(t)}, got {describe(value)}")


INT64_MAX = 2**63 - 1


def _structure_int(value: Any, _: type) -> int:
    if type(value) is not int:
        raise _mismatch(value, int)
    if abs(value) > INT64_MAX:  # no setting means anything past 64 bits; say so at the key
        raise ValueProblem(f"{value} is too large: no setting takes an integer beyond "
                           f"+-{INT64_MAX} (2**63 - 1)")
    return value


def _structure_float(value: Any, _: type) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _mismatch(value, float)
    if value != value or value in (float("inf"), float("-inf")):
        raise ValueProblem(f"expected a finite number, got {value!r}")
    return float(value)


def _structure_bool(value: Any, _: type) -> bool:
    if not isinstance(value, bool):
        raise _mismatch(value, bool)
    return value


def _structure_str(value: Any, _: type) -> str:
    if not isinstance(value, str):
        raise _mismatch(value, str)
    return value


def _structure_layer_spec(value: Any, _: type) -> LayerSpec:
    try:
        return LayerSpec.parse(value)
    except ValueError as exc:
        raise ValueProblem(str(exc)) from None


def _literal_hook(t: Any) -> Callable[[Any, Any], Any]:
    choices = typing.get_args(t)

    def structure(value: Any, _: Any) -> Any:
        if any(type(value) is type(c) and value == c for c in choices):
            return value
        hint = ""
        if value is None and "None" in choices:
            hint = '; YAML null is not a mode: write the string "None" (in quotes) to disable it'
        allowed = ", ".join(repr(c) for c in choices)
        raise ValueProblem(f"must be one of {allowed}; got {describe(value)}{hint}")

    return structure


def _shape_matches(value: Any, t: Any) -> bool:
    """Whether `value` has the YAML shape of union member `t` (before looking inside it)."""
    origin = typing.get_origin(t) or t
    if t is type(None):
        return value is None
    if t is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if t is int:
        return type(value) is int
    if t is LayerSpec:
        return isinstance(value, (str, int)) and not isinstance(value, bool)
    if origin is Literal:
        return value in typing.get_args(t)
    if attrs.has(t) or origin is dict:
        return isinstance(value, dict)
    return isinstance(value, origin)


def _union_hook(t: Any) -> Callable[[Any, Any], Any]:
    members = typing.get_args(t)
    # An exact scalar type wins over float's acceptance of ints.
    ordered = sorted(members, key=lambda m: m is float)

    def structure(value: Any, _: Any) -> Any:
        for member in ordered:
            if _shape_matches(value, member):
                return None if member is type(None) else converter.structure(value, member)
        raise _mismatch(value, t)

    return structure


def _list_hook(t: Any) -> Callable[[Any, Any], list[Any]]:
    (item_type,) = typing.get_args(t) or (Any,)

    def structure(value: Any, _: Any) -> list[Any]:
        if not isinstance(value, list):
            raise _mismatch(value, t)
        items, errors = [], []
        for index, item in enumerate(value):
            try:
                items.append(converter.structure(item, item_type))
            except Exception as exc:
                _note(exc, index, item_type)
                errors.append(exc)
        if errors:
            raise IterableValidationError("While structuring a list", errors, list)
        return items

    return structure


def _dict_hook(t: Any) -> Callable[[Any, Any], dict[str, Any]]:
    _, value_type = typing.get_args(t) or (str, Any)

    def structure(value: Any, _: Any) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise _mismatch(value, t)
        result, errors = {}, []
        for key, item in value.items():
            try:
                if not isinstance(key, str):
                    raise ValueProblem(f"mapping keys must be strings, got {describe(key)}")
                result[key] = converter.structure(item, value_type)
            except Exception as exc:
                _note(exc, MappingKey(str(key)), value_type)
                errors.append(exc)
        if errors:
            raise IterableValidationError("While structuring a mapping", errors, dict)
        return result

    return structure


def _note(exc: Exception, index: int | str, t: Any) -> None:
    note = IterableValidationNote(f"Structuring item @ {index!r}", index, t)
    exc.__notes__ = [*getattr(exc, "__notes__", []), note]


def _class_hook(cls: type) -> Callable[[Any, Any], Any]:
    """Structure a section: each declared field through the converter, errors collected.

    Written as a loop rather than cattrs' generated code: a configuration is structured once
    per process, so compiling a function per class would cost more than it saves.
    """
    fields = [(a.name, a.type) for a in attrs.fields(cls) if not a.metadata.get("extras")]
    names = {name for name, _ in fields}
    is_open = issubclass(cls, OpenSection)

    def structure(value: Any, _: Any) -> Any:
        if not isinstance(value, dict):
            hint = " (omit the section to use its defaults)" if value is None else ""
            raise ValueProblem(f"expected a mapping of {cls.__name__} fields, "
                               f"got {describe(value)}{hint}")
        kwargs, errors = {}, []
        for name, field_type in fields:
            if name not in value:
                continue
            try:
                kwargs[name] = converter.structure(value[name], field_type)
            except Exception as exc:
                errors.append(_at(exc, name, field_type))
        unknown = [key for key in value if key not in names]
        if is_open:
            kwargs["extras"] = {key: copy.deepcopy(value[key]) for key in unknown}
            errors += [_at(ValueProblem(f"mapping keys must be strings, got {describe(key)}"),
                           key, Any) for key in unknown if not isinstance(key, str)]
        elif unknown:
            errors.append(ForbiddenExtraKeysError("", cls, set(unknown)))
        if errors:
            raise ClassValidationError(f"While structuring {cls.__name__}", errors, cls)
        return cls(**kwargs)

    return structure


def _at(exc: Exception, name: Any, field_type: Any) -> Exception:
    """Note on `exc` that it happened at attribute (or key) `name`."""
    note = AttributeValidationNote(f"@ attribute {name}", name, field_type)
    exc.__notes__ = [*getattr(exc, "__notes__", []), note]
    return exc


def _open_unstructure_hook(cls: type) -> Callable[[Any], dict[str, Any]]:
    generated = make_dict_unstructure_fn(cls, converter)

    def unstructure(section: Any) -> dict[str, Any]:
        data = generated(section)
        data.update(copy.deepcopy(data.pop("extras")))
        return data

    return unstructure


converter.register_structure_hook(int, _structure_int)
converter.register_structure_hook(float, _structure_float)
converter.register_structure_hook(bool, _structure_bool)
converter.register_structure_hook(str, _structure_str)
converter.register_structure_hook(LayerSpec, _structure_layer_spec)
converter.register_structure_hook_factory(lambda t: typing.get_origin(t) is Literal, _literal_hook)
converter.register_structure_hook_factory(_is_union, _union_hook)
converter.register_structure_hook_factory(lambda t: typing.get_origin(t) is list, _list_hook)
converter.register_structure_hook_factory(lambda t: typing.get_origin(t) is dict, _dict_hook)
converter.register_structure_hook_factory(
    lambda t: attrs.has(t) and t is not LayerSpec, _class_hook)
converter.register_unstructure_hook(LayerSpec, str)
converter.register_unstructure_hook_factory(
    lambda t: isinstance(t, type) and issubclass(t, OpenSection), _open_unstructure_hook)


def problems(exc: BaseException, path: Path) -> list[tuple[Path, str]]:
    """Flatten a structuring failure into (path, message) pairs, one per problem."""
    if isinstance(exc, (ClassValidationError, IterableValidationError)):
        with_notes, others = exc.group_exceptions()
        found = []
        for sub, note in with_notes:
            step = note.name if isinstance(note, AttributeValidationNote) else note.index
            found += problems(sub, (*path, step))
        for sub in others:
            found += problems(sub, path)
        return found
    if isinstance(exc, ForbiddenExtraKeysError):
        allowed = declared_fields(exc.cl)
        return [((*path, key), unknown_keys_message(exc.cl.__name__, key, allowed))
                for key in sorted(exc.extra_fields, key=str)]
    if isinstance(exc, ValueProblem):
        return [(path, str(exc))]
    return [(path, f"{type(exc).__name__}: {exc}")]


def unknown_keys_message(owner: str, key: Any, allowed: tuple[str, ...]) -> str:
    """The message for one unknown key in a closed mapping, with a suggestion when one is near."""
    import difflib

    message = f"Unknown configuration keys for {owner}: [{key!r}]"
    close = difflib.get_close_matches(str(key), allowed, n=1, cutoff=0.6)
    if close:
        return f"{message}; did you mean {close[0]!r}?"
    if not allowed:
        return f"{message}; it takes no keys"
    return f"{message}; allowed keys: {', '.join(allowed)}"
