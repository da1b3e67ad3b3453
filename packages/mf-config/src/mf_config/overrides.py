"""Dotted `key.path=value` overrides, applied to the data before it is validated.

An override writes into the parsed data exactly as if the file had said it, so it is validated
like the file: an unknown key in a closed section is reported (naming the override), and a
new key in an open section (`model`, `optimizer`, ...) is passed on like any extra key.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from .errors import ConfigError, ConfigIssue, Path
from .yaml_source import Source, load_value

# A name (after a dot, except at the start), or a bracketed index or quoted key.
_BRACKETS = r"""|\[(\d+)\]|\["([^"]*)"\]|\['([^']*)'\]"""
_FIRST = re.compile(r"([A-Za-z_][\w-]*)" + _BRACKETS)
_NEXT = re.compile(r"\.([A-Za-z_][\w-]*)" + _BRACKETS)


def parse_key_path(text: str) -> Path:
    """A written key path as a data path, the form overrides and messages share.

    Args:
        text: such as `callbacks[0].type`, or `a["b.c"]` to keep a dot inside one key.

    Returns:
        The path, such as `("callbacks", 0, "type")`.

    Raises:
        ValueError: saying where the text cannot be read.
    """
    path: list[str | int] = []
    position = 0
    while position < len(text):
        match = (_NEXT if path else _FIRST).match(text, position)
        if match is None:
            raise ValueError(f"cannot read the key path {text!r} at {text[position:]!r}; "
                             "write it as section.key, list[0].key or map[\"a.b\"]")
        name, index, double, single = match.groups()
        path.append(int(index) if index is not None else next(
            part for part in (name, double, single) if part is not None))
        position = match.end()
    if not path:
        raise ValueError("the key path is empty")
    return tuple(path)


def apply_overrides(source: Source, overrides: Iterable[str]) -> None:
    """Write each `key.path=value` into the data, and remember which override wrote it.

    The lines of what an override replaced are dropped, so a later problem there names the
    override (`--set training.steps=0`), not the file's line.

    Args:
        source: the data to change, in place.
        overrides: `key.path=value` strings, applied in order; the value is YAML.

    Raises:
        ConfigError: one, listing every malformed override.
    """
    problems = []
    for text in overrides:
        try:
            path, value = _parse(text)
            _write(source.data, path, value)
        except ValueError as exc:
            problems.append(ConfigIssue("", f"bad override {_shown(text)!r}: {exc}", None,
                                        None, source.file))
            continue
        for known in [p for p in source.lines if p[: len(path)] == path]:
            del source.lines[known]
        source.origins[path] = f"--set {_shown(text)}"
    if problems:
        raise ConfigError(problems)


def _shown(text: str, limit: int = 100) -> str:
    """The override as messages quote it: whole, or its start when it is too long to read."""
    if len(text) <= limit:
        return text
    return f"{text[: limit - 3]}... ({len(text)} characters)"


def _parse(text: str) -> tuple[Path, Any]:
    key, separator, value = text.partition("=")
    if not separator:
        raise ValueError("expected key.path=value")
    path = parse_key_path(key.strip())
    mappings = sum(isinstance(part, str) for part in path)
    return path, load_value(value, depth=mappings, level=len(path))


def _write(data: dict[str, Any], path: Path, value: Any) -> None:
    node: Any = data
    for depth, part in enumerate(path):
        last = depth == len(path) - 1
        where = ".".join(str(p) for p in path[:depth]) or "the top level"
        if isinstance(part, int):
            if not isinstance(node, list):
                raise ValueError(f"{where} is not a list, so [{part}] cannot index it")
            if part >= len(node):
                raise ValueError(f"{where} has {len(node)} items, so [{part}] does not exist")
        elif not isinstance(node, dict):
            raise ValueError(f"{where} is not a mapping, so it has no key {part!r}")
        if last:
            node[part] = value
        elif isinstance(node, dict) and part not in node:
            node[part] = [] if isinstance(path[depth + 1], int) else {}
            node = node[part]
        else:
            node = node[part]
