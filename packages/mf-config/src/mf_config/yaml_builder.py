"""Composed YAML nodes -> plain data, with the line of every value, within safety limits.

Nesting has two limits. Mappings nest at most `MAX_MAPPING_DEPTH` (10) deep, the anchor's rule,
which counts mappings only. Lists and mappings together nest at most `MAX_NESTING_DEPTH` (100)
deep: a real configuration needs five, and the bound keeps every recursive walk of the data
(this builder at two frames a level, the YAML dumper of `mf-config show` at about three) far
below Python's recursion limit of 1000 frames, where a list nested 500 deep used to end in a
RecursionError. The composer may stop a document before the builder sees it: libyaml refuses
1000 levels, and PyYAML's pure-Python composer (used when libyaml is missing) runs out of
frames near 490 levels; both are reported with the same message as the builder's limit (the
line is then where the composer stopped).

The builder also refuses what a configuration never needs: duplicate keys in one mapping,
keys that are not plain values, tags other than the plain ones, recursive aliases.
"""

from __future__ import annotations

from typing import Any

import yaml

from .errors import ConfigIssue, Path

MAX_MAPPING_DEPTH = 10
"""Mappings nested deeper than this are rejected (the anchor's limit; only mappings count)."""
MAX_NESTING_DEPTH = 100
"""Lists and mappings nested deeper than this, counted together, are rejected (see above)."""
MAX_VALUES = 100_000
"""Upper bound on the values that aliases add to one document, which stops an alias bomb (the
"billion laughs") early. Each use of an alias (or `<<` merge) of a list or mapping after the
first copies it, and the values of the copies count; values written out do not, so a large
file without aliases loads: 20 MB of plain keys and lists in about 40 s and 1.4 GB on a 2-core
machine, where libyaml composing the node tree takes 28 s and `yaml.load` with CSafeLoader
35 s (plain `yaml.safe_load`, without libyaml, 113 s)."""

_MERGE_TAG = "tag:yaml.org,2002:merge"
_MAP_TAG = "tag:yaml.org,2002:map"
_SEQ_TAG = "tag:yaml.org,2002:seq"
_SCALAR_TAGS = {f"tag:yaml.org,2002:{kind}" for kind in ("str", "int", "float", "bool", "null")}

TOO_DEEP = (f"nesting deeper than {MAX_NESTING_DEPTH} levels (lists and mappings); a "
            "configuration needs a handful")
"""The message of every nesting refusal, the builder's and the composer's."""


class _Abandon(Exception):
    """Stops the build: the document nests or expands too far to be a configuration."""

    def __init__(self, line: int | None, message: str):
        super().__init__(message)
        self.line = line
        self.message = message


class Builder:
    """Walks a composed node tree into dicts, lists and scalars, recording lines.

    An alias is the same node met again: the builder makes a fresh copy of it each time (an
    override may change one place), and counts the values of those copies against MAX_VALUES.
    """

    def __init__(self, loader: Any, file: str | None):
        self.loader = loader
        self.file = file
        self.lines: dict[Path, int] = {(): 1}
        self.problems: list[ConfigIssue] = []
        self.open_nodes: set[int] = set()
        """Collections being built, to catch an alias to an enclosing collection; with
        `outer`, their number is the nesting level that `MAX_NESTING_DEPTH` bounds."""
        self.outer = 0
        """Collections around the document (those of an override's key path)."""
        self.built: set[int] = set()
        """Collections built once already: meeting one again means an alias (or `<<`)."""
        self.copying = 0
        """How many aliased collections are being copied around the current value."""
        self.alias_line: int | None = None
        """Line of the entry using the alias that the outermost copy is for."""
        self.count = 0
        """Values built in copies of aliased collections: what aliases add to the document."""

    def build(self, node: yaml.Node, path: Path, depth: int, level: int = 0) -> Any:
        """`node` as plain data; `depth` mappings and `level` collections enclose it."""
        self.outer = level
        try:
            return self._value(node, path, depth)
        except _Abandon as stop:
            self.problems.append(ConfigIssue("", stop.message, stop.line, None, self.file))
            return None

    def _value(self, node: yaml.Node, path: Path, depth: int) -> Any:
        if self.copying:
            self.count += 1
            if self.count > MAX_VALUES:
                raise _Abandon(self.alias_line, f"YAML aliases add more than {MAX_VALUES} "
                               "values to the document (an alias bomb?); write the values "
                               "out or use fewer aliases")
        if isinstance(node, yaml.ScalarNode):
            return self._scalar(node)
        key = id(node)
        if key in self.open_nodes:
            self._problem(node, "an alias refers to a value that contains it (a recursive "
                          "alias); write the value out instead")
            return None
        alias = key in self.built
        if alias and not self.copying:
            self.alias_line = self._use_line(path)
        self.copying += alias
        self.open_nodes.add(key)
        try:
            if len(self.open_nodes) + self.outer > MAX_NESTING_DEPTH:
                line = self.alias_line if self.copying else node.start_mark.line + 1
                raise _Abandon(line, TOO_DEEP)
            if isinstance(node, yaml.MappingNode):
                return self._mapping(node, path, depth + 1)
            return self._sequence(node, path, depth)
        finally:
            self.open_nodes.discard(key)
            self.built.add(key)
            self.copying -= alias

    def _use_line(self, path: Path) -> int | None:
        """The line where the alias at `path` is used, as near as the node tree tells.

        A mapping entry's line is its key's; a list item's is its node's, which for an alias is
        the anchor's, so the list's own line stands in (an integer mapping key, which no
        configuration uses, gets its mapping's line too).
        """
        return self.lines.get(path[:-1] if path and type(path[-1]) is int else path)

    def _sequence(self, node: yaml.SequenceNode, path: Path, depth: int) -> list[Any]:
        self._check_tag(node, _SEQ_TAG)
        items = []
        for index, item in enumerate(node.value):
            self.lines[(*path, index)] = item.start_mark.line + 1
            items.append(self._value(item, (*path, index), depth))
        return items

    def _mapping(self, node: yaml.MappingNode, path: Path, depth: int) -> dict[Any, Any]:
        self._check_tag(node, _MAP_TAG)
        if depth > MAX_MAPPING_DEPTH:
            self._problem(node, f"mappings are nested deeper than {MAX_MAPPING_DEPTH} levels")
            return {}
        result: dict[Any, Any] = {}
        explicit = []
        for key_node, value_node in node.value:
            if key_node.tag == _MERGE_TAG:
                self._merge(result, value_node, path, depth)
            else:
                explicit.append((key_node, value_node))
        first_line: dict[Any, int] = {}
        for key_node, value_node in explicit:
            key = self._scalar(key_node) if isinstance(key_node, yaml.ScalarNode) else None
            if not isinstance(key_node, yaml.ScalarNode) or isinstance(key, (list, dict)):
                self._problem(key_node, "a mapping key must be a plain value, not a mapping "
                              "or a list")
                continue
            line = key_node.start_mark.line + 1
            if key in first_line:
                self._problem(key_node, f"duplicate key {key!r} in one mapping "
                              f"(first written on line {first_line[key]})")
                continue
            first_line[key] = line
            self.lines[(*path, key)] = line
            result[key] = self._value(value_node, (*path, key), depth)
        return result

    def _merge(self, result: dict[Any, Any], node: yaml.Node, path: Path, depth: int) -> None:
        """`<<: *anchor` (or a list of anchors): keys not already present are taken over."""
        sources = node.value if isinstance(node, yaml.SequenceNode) else [node]
        for source in sources:
            if not isinstance(source, yaml.MappingNode):
                self._problem(source, "a merge key (<<) needs a mapping or a list of mappings")
                continue
            merged = self._value(source, path, depth - 1) or {}
            for key, value in merged.items():
                result.setdefault(key, value)

    def _scalar(self, node: yaml.Node) -> Any:
        if node.tag not in _SCALAR_TAGS:
            self._problem(node, f"unsupported YAML tag {node.tag!r}; only plain YAML values "
                          "(strings, numbers, booleans, null) are allowed")
            return None
        try:
            return self.loader.construct_object(node)
        except Exception:  # PyYAML's constructors raise ValueError, IndexError, ... on odd text
            kind = node.tag.rsplit(":", 1)[-1]
            shown = node.value if len(node.value) <= 40 else node.value[:40] + "..."
            self._problem(node, f"cannot read {shown!r} as {kind}")
            return None

    def _check_tag(self, node: yaml.Node, expected: str) -> None:
        if node.tag != expected:
            self._problem(node, f"unsupported YAML tag {node.tag!r}; only plain mappings, "
                          "lists and scalars are allowed")

    def _problem(self, node: yaml.Node, message: str) -> None:
        self.problems.append(ConfigIssue("", message, node.start_mark.line + 1, None, self.file))
