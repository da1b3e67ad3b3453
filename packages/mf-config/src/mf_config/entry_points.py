"""The entry points installed distributions declare in mf-config's groups, read directly.

`importlib.metadata` would do this, but importing it (email, zipfile, csv, ...) and scanning
every distribution costs about 25 ms in a fresh process, measured here, which alone would
take `mf-config validate` past three times the cost of parsing the YAML. The format is small:
each installed distribution is a `*.dist-info` (or `*.egg-info`) directory on `sys.path` whose
`entry_points.txt` is an INI file of `[group]` sections and `name = module:attribute` lines.
As in `importlib.metadata`, the first distribution of a name on `sys.path` wins; zipped
distributions are not read (mf's packages install as directories).
"""

from __future__ import annotations

import importlib
import os
import re
import sys
from collections.abc import Iterable
from typing import Any, NamedTuple


class EntryPoint(NamedTuple):
    """One `name = module:attribute` line of a group."""

    name: str
    value: str
    group: str

    def load(self) -> Any:
        """The object the entry point names (its module is imported now)."""
        module, _, attribute = self.value.partition(":")
        target: Any = importlib.import_module(module.strip())
        for part in attribute.split("[")[0].strip().split(".") if attribute else ():
            target = getattr(target, part)
        return target


def entry_points(groups: Iterable[str]) -> dict[str, list[EntryPoint]]:
    """The entry points of each of `groups`, from every installed distribution."""
    wanted = set(groups)
    found: dict[str, list[EntryPoint]] = {group: [] for group in wanted}
    seen: set[str] = set()
    for directory in _metadata_dirs():
        name = _distribution_name(os.path.basename(directory))
        if name in seen:
            continue
        seen.add(name)
        for entry in _read(os.path.join(directory, "entry_points.txt"), wanted):
            found[entry.group].append(entry)
    return found


def _metadata_dirs() -> Iterable[str]:
    for base in sys.path:
        try:
            names = sorted(os.listdir(base or "."))
        except OSError:  # a missing directory or a zip file on sys.path
            continue
        yield from (os.path.join(base, name) for name in names
                    if name.endswith((".dist-info", ".egg-info")))


def _distribution_name(directory: str) -> str:
    """`mf_train-0.1.0.dist-info` -> `mf_train` (normalised as PEP 503 says)."""
    stem = directory.rsplit(".", 1)[0].split("-", 1)[0]
    return re.sub(r"[-_.]+", "_", stem).lower()


def _read(path: str, groups: set[str]) -> list[EntryPoint]:
    try:
        with open(path, encoding="utf-8") as file:
            lines = file.read().splitlines()
    except OSError:
        return []
    entries, group = [], None
    for line in lines:
        line = line.strip()
        if line.startswith("[") and line.endswith("]"):
            group = line[1:-1].strip()
        elif group in groups and "=" in line and not line.startswith(("#", ";")):
            name, _, value = line.partition("=")
            entries.append(EntryPoint(name.strip(), value.strip(), group))
    return entries
