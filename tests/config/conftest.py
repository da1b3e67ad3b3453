"""Helpers for mf-config tests: the spec's YAML examples, and problems as (path, message) pairs."""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import pytest

from mf_config import ConfigError, TrainConfig
from mf_config.validate import check_source
from mf_config.yaml_source import Source, load_text

DATA = Path(__file__).resolve().parent / "data"
SPEC = DATA / "configuration.md"
"""A copy of the spec, so that the suite runs without ../shared (test_spec_copy_is_current)."""
ROOT_SHARED_SPEC = Path(__file__).resolve().parents[3] / "shared" / "spec" / "configuration.md"


@pytest.fixture(autouse=True)
def mf_config_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    """mf-config's own behaviour, as when no component package is installed: the settings that
    mf-train and mf-data declare through entry points are hidden (tests/integration checks a
    file against them)."""
    from mf_config import components

    monkeypatch.setattr(components, "_ENTRY_POINTS", {kind: () for kind in components.KINDS})


def spec_yaml_blocks() -> list[str]:
    """Every ```yaml block of the spec, in order."""
    return re.findall(r"```yaml\n(.*?)```", SPEC.read_text(encoding="utf-8"), re.S)


def skeleton() -> dict[str, Any]:
    """The spec's complete skeleton, parsed."""
    return load_text(spec_yaml_blocks()[0]).data


def with_sections(**sections: Any) -> dict[str, Any]:
    """The skeleton with whole sections replaced (None removes a section)."""
    data = copy.deepcopy(skeleton())
    for name, value in sections.items():
        if value is None:
            data.pop(name, None)
        else:
            data[name] = value
    return data


def patched(path: str, value: Any, data: dict[str, Any] | None = None) -> dict[str, Any]:
    """The skeleton (or `data`) with one dotted path set; intermediate mappings are created."""
    data = copy.deepcopy(skeleton() if data is None else data)
    node = data
    *parents, last = path.split(".")
    for key in parents:
        node = node.setdefault(key, {})
    node[last] = value
    return data


def problems(data: dict[str, Any], severity: str = "error") -> list[tuple[str, str]]:
    """(path, message) of every issue of the given severity."""
    _, issues = check_source(Source(copy.deepcopy(data)))
    return [(issue.path, issue.message) for issue in issues if issue.severity == severity]


def assert_only_problem(data: dict[str, Any], path: str, *fragments: str) -> str:
    """Exactly one error, at `path`, whose message contains every fragment; returns it."""
    found = problems(data)
    assert len(found) == 1, found
    assert found[0][0] == path, found
    for fragment in fragments:
        assert fragment in found[0][1], found
    return found[0][1]


def valid(data: dict[str, Any]) -> TrainConfig:
    """Validate or fail the test with every problem listed."""
    try:
        return TrainConfig.from_dict(copy.deepcopy(data))
    except ConfigError as exc:  # pragma: no cover - a failing test shows the problems
        pytest.fail(str(exc))
