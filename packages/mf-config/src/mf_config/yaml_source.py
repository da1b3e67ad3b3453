"""YAML text -> plain data, with the source line of every value.

Plain `yaml.safe_load` is not strict enough for a training configuration: it silently keeps the
last of two equal keys, reads `1e-5` as a string (YAML 1.1), expands a "billion laughs" alias
tree until memory runs out, and forgets where each value came from. This module composes the
YAML node tree with a safe loader and builds the data itself, so that it can:

- reject a key repeated in one mapping (and say where the first one was),
- read `1e-5` as a float (and keep dates as strings),
- bound alias expansion and nesting depth,
- record the line of every mapping entry and list item, for error messages.

Nesting has two limits. Mappings nest at most `MAX_MAPPING_DEPTH` (10) deep, the anchor's rule,
which counts mappings only. Lists and mappings together nest at most `MAX_NESTING_DEPTH` (100)
deep: a real configuration needs five, and the bound keeps every recursive walk of the data
(this builder at two frames a level, the YAML dumper of `mf-config show` at about three) far
below Python's recursion limit of 1000 frames, where a list nested 500 deep used to end in a
RecursionError. The composer may stop a document before the builder sees it: libyaml refuses
1000 levels, and PyYAML's pure-Python composer (used when libyaml is missing) runs out of
frames near 490 levels; both are reported with the same message as the builder's limit (the
line is then where the composer stopped).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path as FilePath
from typing import Any

import yaml

from .errors import ConfigError, ConfigIssue, Path, format_path

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

_FLOAT_TAG = "tag:yaml.org,2002:float"
_TIMESTAMP_TAG = "tag:yaml.org,2002:timestamp"
_MERGE_TAG = "tag:yaml.org,2002:merge"
_MAP_TAG = "tag:yaml.org,2002:map"
_SEQ_TAG = "tag:yaml.org,2002:seq"
_SCALAR_TAGS = {f"tag:yaml.org,2002:{kind}" for kind in ("str", "int", "float", "bool", "null")}
# YAML 1.1's float forms plus the exponent without a dot (`1e-5`), as YAML 1.2 reads it.
_FLOAT_PATTERN = re.compile(
    r"""^(?:[-+]?[0-9][0-9_]*\.[0-9_]*(?:[eE][-+]?[0-9]+)?
    |[-+]?[0-9][0-9_]*[eE][-+]?[0-9]+
    |[-+]?\.[0-9][0-9_]*(?:[eE][-+]?[0-9]+)?
    |[-+]?\.(?:inf|Inf|INF)
    |\.(?:nan|NaN|NAN))$""",
    re.X,
)

_BaseLoader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_TOO_DEEP = (f"nesting deeper than {MAX_NESTING_DEPTH} levels (lists and mappings); a "
             "configuration needs a handful")


class UnreadableFile(ConfigError):
    """The file could not be read at all (missing, a directory, no permission)."""


class _ConfigLoader(_BaseLoader):  # type: ignore[misc, valid-type]
    """A safe loader whose float resolver accepts `1e-5` and which leaves dates as strings."""


class _ConfigDumper(yaml.SafeDumper):
    """A dumper that quotes every string `_ConfigLoader` would read as something else."""


for _cls in (_ConfigLoader, _ConfigDumper):
    _cls.yaml_implicit_resolvers = {
        first: [(tag, rx) for tag, rx in resolvers if tag not in (_FLOAT_TAG, _TIMESTAMP_TAG)]
        for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
    }
    _cls.add_implicit_resolver(_FLOAT_TAG, _FLOAT_PATTERN, list("-+0123456789."))


@dataclass
class Source:
    """Configuration data and where each part of it came from."""

    data: dict[str, Any]
    file: str | None = None
    lines: dict[Path, int] = field(default_factory=dict)
    """Source line of each mapping entry and list item, keyed by its path."""
    origins: dict[Path, str] = field(default_factory=dict)
    """The `--set` override that wrote a path, keyed by that path."""

    def written(self, path: Path) -> bool:
        """Whether the user wrote `path` (in the file or an override)."""
        node: Any = self.data
        for key in path:
            if not isinstance(node, dict) or key not in node:
                return False
            node = node[key]
        return True

    def issue(self, path: Path, message: str, severity: str = "error") -> ConfigIssue:
        """A `ConfigIssue` at `path`, located by the nearest enclosing value that has a source."""
        line, origin = self._locate(path)
        return ConfigIssue(format_path(path), message, line, origin, self.file, severity)

    def _locate(self, path: Path) -> tuple[int | None, str | None]:
        """(line, override) of `path` or of the nearest enclosing value that has a source.

        A key that the file does not have but an override wrote below was made by that
        override (`--set bogus.key=1` makes `bogus`): the override is named, not the line of
        the mapping around it.
        """
        for end in range(len(path), -1, -1):
            prefix = tuple(path[:end])
            if prefix in self.origins:
                return None, self.origins[prefix]
            if prefix in self.lines:
                return self.lines[prefix], None
            maker = self._override_below(prefix)
            if maker is not None:
                return None, maker
        return None, None

    def _override_below(self, prefix: Path) -> str | None:
        """The first override that wrote inside `prefix`, when the data came from a file (else
        there are no lines to tell what the file had)."""
        if not self.lines:
            return None
        return next((origin for written, origin in self.origins.items()
                     if written[: len(prefix)] == prefix), None)


def load_file(path: str | FilePath) -> Source:
    """Read and parse a configuration file; every failure is a `ConfigError` naming the file."""
    name = str(path)
    try:
        raw = FilePath(path).read_bytes()
    except FileNotFoundError:
        raise _unreadable(name, "file not found") from None
    except IsADirectoryError:
        raise _unreadable(name, "is a directory, not a configuration file") from None
    except OSError as exc:
        raise _unreadable(name, f"cannot be read: {exc.strerror or exc}") from None
    return load_text(_decode(raw, name), name)


def load_text(text: str, file: str | None = None) -> Source:
    """Parse configuration YAML from a string (`file` only names it in messages)."""
    loader = _ConfigLoader(text)
    root = _compose(loader, file)
    if root is None:
        raise _fatal(file, None, "the file is empty; a configuration needs at least the "
                     "model, train_dataset and training sections")
    builder = _Builder(loader, file)
    try:
        data = builder.build(root, (), 0)
    finally:
        loader.dispose()
    if builder.problems:
        raise ConfigError(builder.problems)
    if not isinstance(data, dict):
        raise _fatal(file, root.start_mark.line + 1,
                     f"the top level must be a mapping of sections, got {_kind(data)}")
    return Source(data, file, builder.lines)


def _compose(loader: Any, file: str | None) -> yaml.Node | None:
    """The document's node tree; YAML errors, and nesting too deep to compose, as `ConfigError`.

    libyaml stops at 1000 levels with its own error, PyYAML's Python composer recurses until
    Python's limit: both become the nesting message of `MAX_NESTING_DEPTH`.
    """
    try:
        return loader.get_single_node()
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark is not None else None
        if "maximum nesting depth" in (exc.problem or ""):
            raise _fatal(file, line, _TOO_DEEP) from None
        column = f" (column {mark.column + 1})" if mark is not None else ""
        problem = " ".join(p for p in (exc.context, exc.problem) if p)
        raise _fatal(file, line, f"YAML syntax error: {problem}{column}") from None
    except yaml.YAMLError as exc:
        raise _fatal(file, None, f"YAML syntax error: {exc}") from None
    except RecursionError:
        line = getattr(loader, "line", None)  # where the pure-Python reader had got to
        raise _fatal(file, None if line is None else line + 1, _TOO_DEEP) from None


def _decode(raw: bytes, name: str) -> str:
    if raw.startswith(b"\xef\xbb\xbf"):
        raw = raw[3:]
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        bad = raw[exc.start : exc.start + 1].hex()
        raise _fatal(name, line, f"not UTF-8 text: byte 0x{bad} at offset {exc.start} "
                     "cannot be decoded; save the file as UTF-8") from None


def _fatal(file: str | None, line: int | None, message: str) -> ConfigError:
    return ConfigError([ConfigIssue("", message, line, None, file)])


def _unreadable(file: str, message: str) -> UnreadableFile:
    return UnreadableFile([ConfigIssue("", message, None, None, file)])


def _kind(value: Any) -> str:
    if isinstance(value, list):
        return "a list"
    if value is None:
        return "null"
    return f"{type(value).__name__} {value!r}"


def dump_text(data: Any) -> str:
    """YAML for plain data that `load_text` reads back to the same data."""
    return yaml.dump(data, Dumper=_ConfigDumper, sort_keys=False, default_flow_style=False)


class _Abandon(Exception):
    """Stops the build: the document nests or expands too far to be a configuration."""

    def __init__(self, line: int | None, message: str):
        super().__init__(message)
        self.line = line
        self.message = message


class _Builder:
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
                raise _Abandon(line, _TOO_DEEP)
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


def load_value(text: str, depth: int = 0, level: int = 0) -> Any:
    """Parse one YAML value (as written after `=` in an override) with the same rules.

    `depth` is the number of mappings the value will sit in and `level` the number of lists and
    mappings, for the nesting limits. A key path can only add mappings, so one already past the
    mapping limit is refused here too.
    """
    if depth > MAX_MAPPING_DEPTH:
        raise ValueError(f"the key path nests mappings deeper than {MAX_MAPPING_DEPTH} levels")
    loader = _ConfigLoader(text)
    try:
        node = loader.get_single_node()
    except yaml.YAMLError as exc:
        if "maximum nesting depth" in str(getattr(exc, "problem", "")):
            raise ValueError(_TOO_DEEP) from None
        raise ValueError(f"not a YAML value: {exc}") from None
    except RecursionError:
        raise ValueError(_TOO_DEEP) from None
    if node is None:
        return None
    builder = _Builder(loader, None)
    try:
        value = builder.build(node, (), depth, level)
    finally:
        loader.dispose()
    if builder.problems:
        raise ValueError(builder.problems[0].message)
    return value
