"""What goes wrong in a configuration, said so that the user can find and fix it.

Every problem is one `ConfigIssue`: where it is (the file, the dotted path, the source line or
the `--set` override it came from), what is wrong, and what is allowed. `ConfigError` carries
all of them at once, because a user fixing a file wants the whole list, not one per run.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass

Path = tuple["str | int", ...]
"""A position inside the configuration data: mapping keys and list indices, outermost first."""


class MappingKey(str):
    """A key of a free-form mapping (such as `select_module`), shown as `["key"]` in paths."""

    __slots__ = ()


def format_path(path: Path) -> str:
    """A path as messages show it, so every package names a value the same way.

    Args:
        path: mapping keys and list indices, outermost first.

    Returns:
        The dotted form, such as `recompute.select_module["mlp"][1]` or `callbacks[2].type`.
    """
    text = ""
    for part in path:
        if isinstance(part, int) and not isinstance(part, bool):
            text += f"[{part}]"
        elif not isinstance(part, str):  # a YAML key that is not a string: null, true, 1.5
            text += f"[{part!r}]"
        elif isinstance(part, MappingKey) or not part.isidentifier():
            text += f'["{part}"]'
        else:
            text += f".{part}" if text else part
    return text or "<top level>"


@dataclass(frozen=True)
class ConfigIssue:
    """One problem (or warning) in a configuration."""

    path: str
    """Dotted path of the offending value, e.g. `training.global_batch_size`."""
    message: str
    line: int | None = None
    """1-based source line when the value came from a file."""
    origin: str | None = None
    """The `--set key=value` override the value came from, when it did."""
    file: str | None = None
    severity: str = "error"
    """`error`, `warning` (valid, but probably not meant) or `note` (something that could not
    be checked here, such as an open section whose component is not installed)."""

    def location(self) -> str:
        """`FILE:LINE`, `FILE (--set a.b=1)`, `FILE`, or `<config>` when nothing is known."""
        where = self.file or "<config>"
        if self.line is not None:
            return f"{where}:{self.line}"
        if self.origin is not None:
            return f"{where} ({self.origin})"
        return where

    def __str__(self) -> str:
        kind = f"{self.severity}: " if self.severity in ("warning", "note") else ""
        path = f" {self.path}:" if self.path else ""
        return f"{self.location()}:{path} {kind}{self.message}"


class ConfigError(ValueError):
    """The configuration is not valid; `.errors` lists every problem found."""

    def __init__(self, errors: Sequence[ConfigIssue]):
        """One error for all the problems: the message lists them, one per line.

        Args:
            errors: every problem found.
        """
        self.errors: list[ConfigIssue] = list(errors)
        count = len(self.errors)
        head = f"{count} problem{'s' if count != 1 else ''} in the configuration"
        super().__init__("\n".join([head + ":", *(f"  {issue}" for issue in self.errors)]))


class ConfigWarning(UserWarning):
    """A configuration that is valid but probably not what its author meant."""


def emit_warnings(issues: Sequence[ConfigIssue]) -> None:
    """Send each warning-severity issue through the `warnings` module."""
    for issue in issues:
        if issue.severity == "warning":
            warnings.warn(str(issue), ConfigWarning, stacklevel=4)
