"""Every field, type and default of the spec's tables (and the rules page's additions)."""

from __future__ import annotations

import re
import types
import typing
from typing import Any, Literal, Union

import attrs
import pytest
from conftest import SPEC

from mf_config import LayerSpec, TrainConfig
from mf_config.sections import declared_fields


def spec_rows() -> list[tuple[str, str, str, str]]:
    """(section, parameter, type text, default text) of every table row under a `## x—` heading."""
    rows = []
    section = None
    for line in SPEC.read_text(encoding="utf-8").splitlines():
        heading = re.match(r"## (\w+)—", line)
        if heading:
            section = heading.group(1)
        elif section and line.startswith("| `"):
            cells = [cell.strip() for cell in line.strip("|").split("|")]
            rows.append((section, cells[0].strip("`"), cells[1], cells[3]))
    return rows


ROWS = spec_rows()


def _default_of(path: str) -> Any:
    node: Any = TrainConfig()
    for part in path.split("."):
        node = getattr(node, part)
    return node


def _annotation_of(path: str) -> Any:
    cls: Any = TrainConfig
    annotation = None
    for part in path.split("."):
        annotation = attrs.fields_dict(cls)[part].type
        cls = annotation
    return annotation


def _parse_default(text: str) -> Any:
    text = text.strip().strip("`")
    if text in ("None",):
        return None
    if text in ("True", "False"):
        return text == "True"
    if text.startswith('"'):
        return text.strip('"')
    if text.startswith("["):
        return [_parse_default(item) for item in text.strip("[]").split(",")]
    if re.fullmatch(r"-?\d+", text):
        return int(text)
    return float(text)


def test_the_spec_tables_were_found() -> None:
    sections = {section for section, *_ in ROWS}
    assert sections == {
        "checkpoint", "training", "parallelism", "optimizer", "lr_scheduler", "train_dataset",
        "model", "monitor", "profiler", "recompute", "recompute_comm", "swap", "callbacks"}
    assert len(ROWS) == 86


@pytest.mark.parametrize(("section", "param", "type_text", "default_text"), ROWS,
                         ids=[f"{s}.{p}" for s, p, *_ in ROWS])
def test_default_matches_spec(section: str, param: str, type_text: str,
                              default_text: str) -> None:
    path = f"{section}.{param}" if section != "callbacks" else None
    if path is None:  # the item of the callbacks list
        from mf_config import CallbackConfig

        assert CallbackConfig().type is None
        return
    if default_text.strip() in ("—", "`DataloaderConfig()`"):
        assert attrs.has(type(_default_of(path))) or _default_of(path) is None
        return
    expected = _parse_default(default_text)
    actual = _default_of(path)
    assert actual == expected
    assert type(actual) is type(expected)


@pytest.mark.parametrize(("section", "param", "type_text"),
                         [(s, p, t) for s, p, t, _ in ROWS if s != "callbacks"],
                         ids=[f"{s}.{p}" for s, p, *_ in ROWS if s != "callbacks"])
def test_type_matches_spec(section: str, param: str, type_text: str) -> None:
    annotation = _annotation_of(f"{section}.{param}")
    for alternative in re.findall(r"`([^`]+)`", type_text):
        assert _admits(annotation, alternative), (annotation, alternative)


_SPEC_TYPES: dict[str, Any] = {"bool": bool, "int": int, "float": float, "str": str,
                               "None": type(None)}


def _members(annotation: Any) -> tuple[Any, ...]:
    if typing.get_origin(annotation) in (Union, types.UnionType):
        return typing.get_args(annotation)
    return (annotation,)


def _admits(annotation: Any, spec_type: str) -> bool:
    """Whether our annotation accepts what the spec's type text names."""
    members = _members(annotation)
    if spec_type in _SPEC_TYPES:
        wanted = _SPEC_TYPES[spec_type]
        return any(m is wanted or (typing.get_origin(m) is Literal
                   and all(type(a) is wanted for a in typing.get_args(m))) for m in members)
    if spec_type.startswith("list"):
        return any(typing.get_origin(m) is list for m in members)
    if spec_type == "dict":
        return any(typing.get_origin(m) is dict for m in members)
    if spec_type == "DataloaderConfig":
        return attrs.has(annotation)
    raise AssertionError(f"unknown spec type {spec_type!r}")


# The fourteenth section and the additions of reference/config-rules.md.
ADDITIONS = {
    "context.device_target": "auto",
    "context.mode": 1,
    "context.max_device_memory": None,
    "context.compile": False,
    "monitor.health_checkpoint.embedding_local_norm_threshold": 100.0,
    "monitor.health_checkpoint.global_norm_skip_threshold": 100.0,
    "monitor.health_checkpoint.global_norm_skip_time": 10,
    "monitor.tensorboard.output_dir": "",
    "monitor.tensorboard.log_interval": 1,
    "monitor.tensorboard.queue_size": 1000,
    "training.rampup_batch_size": None,
    "training.use_skip_step_on_nan": False,
    "training.max_consecutive_skipped_steps": 0,
    "training.max_nonfinite_steps": 3,
    "parallelism.param_dtype": "float32",
    "parallelism.reduce_dtype": "float32",
}


@pytest.mark.parametrize(("path", "expected"), ADDITIONS.items(), ids=list(ADDITIONS))
def test_addition_default(path: str, expected: Any) -> None:
    actual = _default_of(path)
    assert actual == expected and type(actual) is type(expected)


def test_no_undocumented_fields() -> None:
    """Every declared field is in the spec's tables or in the rules page's additions."""
    documented = {f"{s}.{p}" for s, p, *_ in ROWS} | set(ADDITIONS)
    documented |= {"callbacks.type", "swap.layer_swap.layers", "swap.op_swap.op_name",
                   "swap.op_swap.layers"}
    every, leaves = set(), set()

    def walk(cls: Any, prefix: str) -> None:
        for name in declared_fields(cls):
            path = f"{prefix}{name}"
            every.add(path)
            nested = [m for m in _members(attrs.fields_dict(cls)[name].type)
                      for m in (typing.get_args(m)[0] if typing.get_origin(m) is list else m,)
                      if attrs.has(m) and m is not LayerSpec]
            if nested:
                walk(nested[0], path + ".")
            else:
                leaves.add(path)

    walk(TrainConfig, "")
    assert leaves - documented == set()
    assert documented - every == set()


def test_sections_can_be_omitted() -> None:
    config = TrainConfig()
    assert config.recompute.mode == "None"
    assert config.swap.enable is False
    assert config.profiler.enable_profiling is False
    assert config.lr_scheduler.type is None
    assert config.callbacks == []
