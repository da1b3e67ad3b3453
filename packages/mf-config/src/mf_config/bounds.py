"""The numeric bounds fields declare (`gt`, `ge`, `le` metadata), checked generically.

Every section and every component's settings class declares its bounds on the fields
(`section_base.setting`), so one walk checks them all, with one wording: the configuration's
rules (`rules.run_rules`) and a component's settings (`component_settings.structure_settings`)
both report through here.
"""

from __future__ import annotations

from typing import Any

import attrs

from .errors import Path
from .layer_spec import LayerSpec


def bound_problems(value: Any, path: Path) -> list[tuple[Path, str]]:
    """Every number in a structured section that breaks its field's declared bounds.

    Args:
        value: a section, a list of sections, or anything else (which has no bounds).
        path: where `value` sits in the configuration, such as `("training",)`.

    Returns:
        (path, message) pairs, in field order.
    """
    if isinstance(value, list):
        return [found for index, item in enumerate(value)
                for found in bound_problems(item, (*path, index))]
    if not attrs.has(type(value)) or isinstance(value, LayerSpec):
        return []
    found = []
    for a in attrs.fields(type(value)):
        item = getattr(value, a.name)
        if type(item) in (int, float):
            message = _bound_problem(item, a.metadata)
            if message:
                found.append(((*path, a.name), message))
        else:
            found += bound_problems(item, (*path, a.name))
    return found


def raw_bound_problems(cls: Any, raw: Any, path: Path) -> list[tuple[Path, str]]:
    """Bounds of the well-typed numbers in the raw data of a section that failed to structure
    as a whole (so its out-of-bounds values are reported with its type errors).

    Args:
        cls: the section class `raw` was meant to structure into.
        raw: the section's plain data, as written.
        path: where the section sits in the configuration.

    Returns:
        (path, message) pairs, in field order.
    """
    if not attrs.has(cls) or not isinstance(raw, dict):
        return []
    found = []
    for a in attrs.fields(cls):
        item = raw.get(a.name)
        if type(item) is int or (type(item) is float and abs(item) < float("inf")):
            message = _bound_problem(item, a.metadata)
            if message:
                found.append(((*path, a.name), message))
        else:
            found += raw_bound_problems(a.type, item, (*path, a.name))
    return found


def _bound_problem(value: float, bounds: Any) -> str | None:
    if "gt" in bounds and not value > bounds["gt"]:
        return f"must be positive, got {value}" if bounds["gt"] == 0 else (
            f"must be > {bounds['gt']}, got {value}")
    if "ge" in bounds and not value >= bounds["ge"]:
        return f"must be >= {bounds['ge']}, got {value}"
    if "le" in bounds and not value <= bounds["le"]:
        return f"must be <= {bounds['le']}, got {value}"
    return None
