"""YAML text -> plain data, with the source line of every value.

Plain `yaml.safe_load` is not strict enough for a training configuration: it silently keeps the
last of two equal keys, reads `1e-5` as a string (YAML 1.1), expands a "billion laughs" alias
tree until memory runs out, and forgets where each value came from. This module composes the
YAML node tree with a safe loader and builds the data itself (`yaml_builder`), so that it can:

- reject a key repeated in one mapping (and say where the first one was),
- read `1e-5` as a float (and keep dates as strings),
- bound alias expansion and nesting depth,
- record the line of every mapping entry and list item, for error messages.

The limits on nesting depth and on the values aliases add are the builder's (`yaml_builder`);
a file is read only if it is a regular one of at most `MAX_FILE_BYTES`.
"""

from __future__ import annotations

import os
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path as FilePath
from typing import Any

import yaml

from .errors import ConfigError, ConfigIssue, Path, format_path
from .yaml_builder import MAX_MAPPING_DEPTH, MAX_NESTING_DEPTH, MAX_VALUES, TOO_DEEP, Builder

__all__ = [  # the limits too: they are part of what this module promises its callers
    "MAX_MAPPING_DEPTH", "MAX_NESTING_DEPTH", "MAX_VALUES", "Source", "UnreadableFile",
    "dump_text", "load_file", "load_text", "load_value",
]

_FLOAT_TAG = "tag:yaml.org,2002:float"
_TIMESTAMP_TAG = "tag:yaml.org,2002:timestamp"
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


MAX_FILE_BYTES = 64 * 2**20
"""The largest configuration file read (a train.yaml is a few KiB; a 20 MB table of model
settings still loads): a mistaken data file is refused, not read until memory runs out."""


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
    """Read and parse a configuration file, keeping the line of every value.

    Args:
        path: the YAML file.

    Returns:
        The data, with `file` and `lines` set.

    Raises:
        ConfigError: naming the file, for every failure: not UTF-8, YAML syntax, a duplicate
            key, a limit passed (`UnreadableFile` when it cannot be read at all).
    """
    name = str(path)
    try:
        # O_NONBLOCK: a named pipe opens at once (a plain open waits for a writer) and is
        # then refused below; it changes nothing for a regular file
        with os.fdopen(os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC), "rb") as handle:
            mode = os.fstat(handle.fileno()).st_mode
            if stat.S_ISDIR(mode):
                raise IsADirectoryError
            if not stat.S_ISREG(mode):
                raise _unreadable(name, "is not a regular file (a device, a pipe or a socket); "
                                        "give a YAML file")
            raw = handle.read(MAX_FILE_BYTES + 1)
    except FileNotFoundError:
        raise _unreadable(name, "file not found") from None
    except IsADirectoryError:
        raise _unreadable(name, "is a directory, not a configuration file") from None
    except OSError as exc:
        raise _unreadable(name, f"cannot be read: {exc.strerror or exc}") from None
    if len(raw) > MAX_FILE_BYTES:
        raise _unreadable(name, f"is larger than {MAX_FILE_BYTES // 2**20} MiB, far more than "
                                "a configuration file; give the train.yaml")
    return load_text(_decode(raw, name), name)



def _one_line(exc: yaml.YAMLError, text: str) -> str:
    """PyYAML's multi-line complaint about an override's value as one line: its problem and
    where in the value (`did not find expected ',' or ']' at the end of the value`)."""
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    mark = getattr(exc, "problem_mark", None)
    where = ""
    if mark is not None:
        offset = sum(len(line) + 1 for line in text.split("\n")[:mark.line]) + mark.column
        where = (" at the end of the value" if offset >= len(text.rstrip())
                 else f" at character {offset + 1}")
    return (f"not a YAML value: {problem}{where}; write a list as [a, b], a mapping as "
            "{key: value}, and text with YAML's special characters in quotes")


def load_text(text: str, file: str | None = None) -> Source:
    """Parse configuration YAML from a string, by the same strict rules as a file.

    Args:
        text: the YAML document.
        file: names the text in messages only.

    Returns:
        The data and the line of every value.

    Raises:
        ConfigError: listing what is wrong with the text.
    """
    loader = _ConfigLoader(text)
    root = _compose(loader, file)
    if root is None:
        raise _fatal(file, None, "the file is empty; a configuration needs at least the "
                     "model, train_dataset and training sections")
    builder = Builder(loader, file)
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
            raise _fatal(file, line, TOO_DEEP) from None
        column = f" (column {mark.column + 1})" if mark is not None else ""
        problem = " ".join(p for p in (exc.context, exc.problem) if p)
        raise _fatal(file, line, f"YAML syntax error: {problem}{column}") from None
    except yaml.YAMLError as exc:
        raise _fatal(file, None, f"YAML syntax error: {exc}") from None
    except RecursionError:
        line = getattr(loader, "line", None)  # where the pure-Python reader had got to
        raise _fatal(file, None if line is None else line + 1, TOO_DEEP) from None


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
            raise ValueError(TOO_DEEP) from None
        raise ValueError(_one_line(exc, text)) from None
    except RecursionError:
        raise ValueError(TOO_DEEP) from None
    if node is None:
        return None
    builder = Builder(loader, None)
    try:
        value = builder.build(node, (), depth, level)
    finally:
        loader.dispose()
    if builder.problems:
        raise ValueError(builder.problems[0].message)
    return value
