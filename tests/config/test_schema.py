"""The JSON Schema of a configuration file: `mf-config schema` and `json_schema()`."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
import typing
from typing import Any

import attrs
import jsonschema
import pytest
from conftest import patched, skeleton, spec_yaml_blocks, valid, with_sections

from mf_config import OpenSection, TrainConfig
from mf_config.converter import converter
from mf_config.schema import json_schema
from mf_config.sections import (
    DataloaderConfig,
    OptimizerConfig,
    ParallelismConfig,
    ProfilerConfig,
    RecomputeConfig,
    TrainingConfig,
    TrainStateConfig,
    declared_fields,
)
from mf_config.yaml_source import load_text

SCHEMA = json_schema()
VALIDATOR = jsonschema.Draft202012Validator(SCHEMA)


def errors(data: Any) -> list[jsonschema.ValidationError]:
    return sorted(VALIDATOR.iter_errors(data), key=lambda e: list(e.absolute_path))


def error_at(data: Any, path: list[Any], keyword: str) -> jsonschema.ValidationError:
    """The one schema error of `data`: at `path`, by `keyword` (e.g. `type`, `enum`)."""
    found = errors(data)
    assert len(found) == 1, [(list(e.absolute_path), e.validator, e.message) for e in found]
    assert list(found[0].absolute_path) == path
    assert found[0].validator == keyword
    return found[0]


def section_classes() -> list[type]:
    """Every attrs class reachable from TrainConfig through its field types (TrainConfig too)."""
    seen: list[type] = []

    def visit(t: Any) -> None:
        if attrs.has(t):
            if t in seen or t.__name__ == "LayerSpec":
                return
            seen.append(t)
            for a in attrs.fields(t):
                visit(a.type)
        for arg in typing.get_args(t):
            visit(arg)

    visit(TrainConfig)
    return seen


def definition(cls: type) -> dict[str, Any]:
    return SCHEMA if cls is TrainConfig else SCHEMA["$defs"][cls.__name__]


def test_is_a_valid_draft_2020_12_schema() -> None:
    jsonschema.Draft202012Validator.check_schema(SCHEMA)
    assert SCHEMA["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert SCHEMA["type"] == "object"
    assert sorted(SCHEMA["required"]) == ["model", "train_dataset", "training"]
    assert sorted(SCHEMA["properties"]) == sorted(declared_fields(TrainConfig))


def test_the_spec_skeleton_validates() -> None:
    assert errors(skeleton()) == []


SECTION_EXAMPLES = [load_text(block).data for block in spec_yaml_blocks()[1:]]


@pytest.mark.parametrize("example", SECTION_EXAMPLES,
                         ids=[f"{i}-{next(iter(e))}" for i, e in enumerate(SECTION_EXAMPLES)])
def test_each_spec_section_example_in_the_skeleton_validates(example: dict[str, Any]) -> None:
    data = with_sections(**example)
    assert errors(data) == []
    valid(data)  # the loader agrees


def test_there_is_an_example_for_most_sections() -> None:
    covered = {name for example in SECTION_EXAMPLES for name in example}
    assert covered == set(declared_fields(TrainConfig)) - {"context"}


def test_unknown_key_in_a_closed_section_is_rejected() -> None:
    error = error_at(patched("training.stepz", 10), ["training"], "additionalProperties")
    assert "'stepz'" in error.message
    error_at(patched("monitor.tensorboard.colour", 1), ["monitor", "tensorboard"],
             "additionalProperties")
    error_at(patched("stepz", {}), [], "additionalProperties")


def test_wrong_type_is_rejected() -> None:
    error = error_at(patched("training.steps", "10"), ["training", "steps"], "type")
    assert "'integer'" in error.message
    error_at(patched("training.deterministic", 1), ["training", "deterministic"], "type")
    error_at(patched("optimizer.betas", "0.9"), ["optimizer", "betas"], "type")
    error_at(patched("training.max_norm", True), ["training", "max_norm"], "type")


def test_bad_enum_is_rejected() -> None:
    error = error_at(patched("recompute.mode", "full2"), ["recompute", "mode"], "enum")
    assert "'full2'" in error.message
    error_at(patched("parallelism.reshard_after_forward_policy", "sometimes"),
             ["parallelism", "reshard_after_forward_policy"], "enum")
    error_at(patched("profiler.profiler_level", True), ["profiler", "profiler_level"], "enum")
    assert errors(patched("recompute.mode", None)), "YAML null is not the mode \"None\""


def test_bounds_are_enforced() -> None:
    error_at(patched("training.global_batch_size", 0), ["training", "global_batch_size"],
             "exclusiveMinimum")
    error_at(patched("checkpoint.save_max", 0), ["checkpoint", "save_max"], "minimum")
    assert errors(patched("checkpoint.save_max", 1)) == []


def test_missing_required_section_is_rejected() -> None:
    found = errors(with_sections(training=None))
    assert [(list(e.absolute_path), e.validator) for e in found] == [([], "required")]
    assert "'training'" in found[0].message


def test_layer_specs() -> None:
    assert errors(patched("recompute", {"mode": "full",
                                        "full_recompute_layer": ["0-3", " 5 ", 7]})) == []
    error = errors(patched("recompute", {"mode": "full", "full_recompute_layer": ["0:3"]}))
    assert [list(e.absolute_path) for e in error] == [["recompute", "full_recompute_layer"]]


def test_extra_keys_in_open_sections_are_accepted() -> None:
    data = patched("model.hidden_size", 4096)
    data = patched("model.rope_scaling", {"type": "yarn", "factor": 4.0}, data)
    data = patched("optimizer.nesterov", True, data)
    data = patched("lr_scheduler.warmup_steps", 100, data)
    data = patched("train_dataset.dataloader.seed", 7, data)
    data["callbacks"] = [{"type": "MyCallback", "log_interval": 10}]
    assert errors(data) == []
    valid(data)


def test_open_and_closed_sections() -> None:
    for cls in section_classes():
        assert definition(cls)["additionalProperties"] is issubclass(cls, OpenSection), cls
    assert {c.__name__ for c in section_classes() if issubclass(c, OpenSection)} == {
        "OptimizerConfig", "LrSchedulerConfig", "DataloaderConfig", "ModelConfig",
        "CallbackConfig"}


@pytest.mark.parametrize(("cls", "field", "expected"), [
    (TrainingConfig, "steps", 1000),
    (TrainingConfig, "global_batch_size", 1),
    (TrainingConfig, "max_norm", 1.0),
    (ParallelismConfig, "data_parallel_shard", -1),
    (ParallelismConfig, "data_parallel_shard_strategy", "optim_grads_params"),
    (ParallelismConfig, "ulysses_degree_in_cp", None),
    (OptimizerConfig, "betas", [0.9, 0.95]),
    (OptimizerConfig, "eps", 1.0e-8),
    (DataloaderConfig, "column_names", ["input_ids", "labels"]),
    (ProfilerConfig, "with_stack", True),
    (RecomputeConfig, "mode", "None"),
    (TrainStateConfig, "local_norm", ""),
])
def test_defaults_are_the_spec_defaults(cls: type, field: str, expected: Any) -> None:
    prop = definition(cls)["properties"][field]
    assert prop["default"] == expected
    assert type(prop["default"]) is type(expected)
    assert getattr(cls(), field) == expected


def test_every_default_equals_the_section_default() -> None:
    checked = 0
    for cls in section_classes():
        instance = cls()
        for name in declared_fields(cls):
            prop = definition(cls)["properties"][name]
            value = getattr(instance, name)
            if attrs.has(type(value)):
                assert "default" not in prop, (cls, name)  # a sub-section: its own defaults
                assert prop["$ref"] == f"#/$defs/{type(value).__name__}"
            else:
                assert prop["default"] == converter.unstructure(value), (cls, name)
                checked += 1
    assert checked > 100


def test_every_declared_field_is_described() -> None:
    for cls in section_classes():
        schema = definition(cls)
        assert sorted(schema["properties"]) == sorted(declared_fields(cls)), cls
        assert schema["description"].strip(), cls
        for name, prop in schema["properties"].items():
            help_text = attrs.fields_dict(cls)[name].metadata["help"]
            assert prop["description"] == help_text, (cls, name)
            assert help_text.strip(), (cls, name)


def test_schema_does_not_change_between_calls() -> None:
    first = json_schema()
    first["$defs"]["TrainingConfig"]["properties"]["steps"]["default"] = -1
    assert json_schema() == SCHEMA
    assert copy.deepcopy(SCHEMA) == json_schema()


def test_cli_prints_the_same_schema() -> None:
    result = subprocess.run([sys.executable, "-m", "mf_config", "schema"], capture_output=True,
                            text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    assert json.loads(result.stdout) == SCHEMA
    assert result.stdout == json.dumps(SCHEMA, indent=2) + "\n"
