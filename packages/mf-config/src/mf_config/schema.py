"""A JSON Schema of `TrainConfig`, built from the same field declarations the loader uses.

Editors (for example VS Code's YAML extension via `# yaml-language-server: $schema=...`) use it
to complete keys and flag wrong types while the file is being written.
"""

from __future__ import annotations

import types
import typing
from typing import Any, Literal, Union

import attrs

from .layer_spec import LayerSpec
from .section_base import OpenSection, declared_fields
from .sections import TrainConfig

_SCALARS = {int: {"type": "integer"}, float: {"type": "number"}, bool: {"type": "boolean"},
            str: {"type": "string"}, type(None): {"type": "null"}}
_LAYER_SPEC = {
    "description": "One layer ('5') or a closed range of layers ('0-3').",
    "oneOf": [{"type": "string", "pattern": r"^\s*\d+(-\d+)?\s*$"},
              {"type": "integer", "minimum": 0}],
}


def json_schema() -> dict[str, Any]:
    """The JSON Schema of a configuration file, for editors, from the same declarations.

    Returns:
        A draft 2020-12 schema: every section and field with its type, default, help text,
        bounds and enumeration.
    """
    definitions: dict[str, Any] = {"LayerSpec": _LAYER_SPEC}
    root = _class_schema(TrainConfig, definitions)
    root.pop("default", None)
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "mf training configuration (train.yaml)",
        **root,
        "required": ["model", "train_dataset", "training"],
        "$defs": definitions,
    }


def _class_schema(cls: type, definitions: dict[str, Any]) -> dict[str, Any]:
    properties = {}
    for a in attrs.fields(cls):
        if a.name not in declared_fields(cls):
            continue
        prop = _type_schema(a.type, definitions)
        prop.update(_bounds(a.metadata))
        if "help" in a.metadata:
            prop["description"] = a.metadata["help"]
        default = a.default.factory() if isinstance(a.default, attrs.Factory) else a.default
        if not attrs.has(type(default)):
            prop["default"] = _plain(default)
        properties[a.name] = prop
    return {
        "type": "object",
        "description": (cls.__doc__ or "").strip().splitlines()[0],
        "properties": properties,
        "additionalProperties": issubclass(cls, OpenSection),
    }


def _type_schema(t: Any, definitions: dict[str, Any]) -> dict[str, Any]:
    origin = typing.get_origin(t)
    if t in _SCALARS:
        return dict(_SCALARS[t])
    if t is LayerSpec:
        return {"$ref": "#/$defs/LayerSpec"}
    if attrs.has(t):
        if t.__name__ not in definitions:
            definitions[t.__name__] = {}
            definitions[t.__name__] = _class_schema(t, definitions)
        return {"$ref": f"#/$defs/{t.__name__}"}
    if origin is Literal:
        return {"enum": list(typing.get_args(t))}
    if origin is list:
        return {"type": "array", "items": _type_schema(typing.get_args(t)[0], definitions)}
    if origin is dict:
        return {"type": "object",
                "additionalProperties": _type_schema(typing.get_args(t)[1], definitions)}
    if origin in (Union, types.UnionType):
        return {"anyOf": [_type_schema(member, definitions) for member in typing.get_args(t)]}
    return {}


def _bounds(metadata: Any) -> dict[str, Any]:
    names = {"gt": "exclusiveMinimum", "ge": "minimum", "le": "maximum"}
    return {names[key]: value for key, value in metadata.items() if key in names}


def _plain(value: Any) -> Any:
    if isinstance(value, list):
        return [_plain(item) for item in value]
    if isinstance(value, LayerSpec):
        return str(value)
    return value
