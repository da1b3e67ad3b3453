"""Dotted `key.path=value` overrides: applied before validation, validated like the file."""

from __future__ import annotations

import pytest
from conftest import spec_yaml_blocks
from hypothesis import given, settings
from hypothesis import strategies as st

from mf_config import ConfigError, LayerSpec, load_config
from mf_config.cli import main
from mf_config.overrides import apply_overrides, parse_key_path
from mf_config.validate import check_source
from mf_config.yaml_source import load_text


@pytest.fixture()
def skeleton_file(tmp_path):
    path = tmp_path / "train.yaml"
    path.write_text(spec_yaml_blocks()[0], encoding="utf-8")
    return path


@pytest.mark.parametrize(("text", "path"), [
    ("training.steps", ("training", "steps")),
    ("callbacks[0].type", ("callbacks", 0, "type")),
    ('recompute.select_module["attention.qkv"][1]',
     ("recompute", "select_module", "attention.qkv", 1)),
    ("recompute.select_module['mlp']", ("recompute", "select_module", "mlp")),
    ("model.rope-theta", ("model", "rope-theta")),
])
def test_key_paths(text, path) -> None:
    assert parse_key_path(text) == path


@pytest.mark.parametrize("text", ["", ".a", "a..b", "a[x]", "a.[0]x", "a b"])
def test_bad_key_paths(text) -> None:
    with pytest.raises(ValueError):
        parse_key_path(text)


def test_values_are_parsed_as_yaml(skeleton_file) -> None:
    config = load_config(skeleton_file, [
        "training.steps=10", "training.max_norm=1e-2", "lr_scheduler.learning_rate=3e-4",
        "training.deterministic=true", "checkpoint.prefix=qwen3",
        "recompute.mode=full", "recompute.full_recompute_layer=['0-3', 5]",
        "model.rope_scaling={type: yarn, factor: 4}",
        "train_dataset.dataloader.config.seq_length=128",
    ])
    assert config.training.steps == 10 and config.training.max_norm == 0.01
    assert config.lr_scheduler.learning_rate == 3e-4
    assert config.training.deterministic is True
    assert config.checkpoint.prefix == "qwen3"
    assert config.recompute.full_recompute_layer == [LayerSpec(0, 3), LayerSpec(5, 5)]
    assert config.model.rope_scaling == {"type": "yarn", "factor": 4}
    assert config.train_dataset.dataloader.config["seq_length"] == 128


def test_overrides_create_sections_and_list_items(skeleton_file) -> None:
    config = load_config(skeleton_file, ["context.device_target=CPU",
                                         "callbacks=[{type: A}]", "callbacks[0].every=3"])
    assert config.context.device_target == "CPU"
    assert config.callbacks[0].type == "A" and config.callbacks[0].every == 3


def test_override_errors_name_the_override(skeleton_file) -> None:
    with pytest.raises(ConfigError) as exc:
        load_config(skeleton_file, ["training.global_batch_size=0", "training.stepz=3"])
    issues = {issue.path: issue for issue in exc.value.errors}
    assert set(issues) == {"training.global_batch_size", "training.stepz"}
    bad = issues["training.global_batch_size"]
    assert bad.line is None and bad.origin == "--set training.global_batch_size=0"
    assert str(bad) == (f"{skeleton_file} (--set training.global_batch_size=0): "
                        "training.global_batch_size: must be positive, got 0")
    assert "Unknown configuration keys for TrainingConfig: ['stepz']" in \
        issues["training.stepz"].message


TOP_LEVEL_KEYS = ("context, checkpoint, training, parallelism, optimizer, lr_scheduler, "
                  "train_dataset, model, monitor, profiler, recompute, recompute_comm, swap, "
                  "callbacks")


@pytest.mark.parametrize("override", ["bogus.key=1", "bogus=1", "bogus.a.b.c={d: 1}"])
def test_an_unknown_top_level_key_names_its_override_not_line_1(skeleton_file, capsys,
                                                                 override) -> None:
    assert main(["validate", str(skeleton_file), "--set", override]) == 1
    printed = capsys.readouterr().err.splitlines()
    # Notes name the open sections no installed package declares (none is, in tests/config).
    assert [line for line in printed if ": note: " not in line] == [
        f"{skeleton_file} (--set {override}): bogus: Unknown configuration keys for "
        f"TrainConfig: ['bogus']; allowed keys: {TOP_LEVEL_KEYS}"]


CLOSED_SECTIONS = ("context", "checkpoint", "training", "parallelism", "train_dataset",
                   "monitor", "monitor.train_state", "profiler", "recompute", "recompute_comm",
                   "swap")
"""Sections that reject unknown keys; context and recompute_comm are not in the skeleton."""


@settings(max_examples=60, deadline=None)
@given(section=st.sampled_from(CLOSED_SECTIONS),
       key=st.from_regex(r"zz_[a-z]{1,8}", fullmatch=True),
       below=st.lists(st.sampled_from(["a", "b"]), max_size=3))
def test_unknown_keys_inside_closed_sections_name_their_override(section: str, key: str,
                                                                 below: list[str]) -> None:
    override = ".".join([section, key, *below]) + "=1"
    source = load_text(spec_yaml_blocks()[0], "train.yaml")
    apply_overrides(source, [override])
    errors = [issue for issue in check_source(source)[1] if issue.severity == "error"]
    assert len(errors) == 1, errors
    (issue,) = errors
    assert (issue.path, issue.line, issue.origin) == (f"{section}.{key}", None,
                                                      f"--set {override}")
    assert str(issue).startswith(f"train.yaml (--set {override}): {section}.{key}: Unknown "
                                 "configuration keys for ")
    assert f"Config: ['{key}']; allowed keys: " in issue.message


def test_file_errors_keep_their_lines_next_to_overrides(skeleton_file) -> None:
    with pytest.raises(ConfigError) as exc:
        load_config(skeleton_file, ["profiler.start_step=5", "profiler.end_step=3"])
    (issue,) = exc.value.errors
    assert issue.path == "profiler.start_step" and issue.origin == "--set profiler.start_step=5"


def test_an_override_replacing_a_section_drops_its_old_lines(skeleton_file) -> None:
    with pytest.raises(ConfigError) as exc:
        load_config(skeleton_file, ["training={steps: -1}"])
    (issue,) = exc.value.errors
    assert issue.path == "training.steps" and issue.origin == "--set training={steps: -1}"


@pytest.mark.parametrize(("override", "fragment"), [
    ("training.steps", "expected key.path=value"),
    ("training.steps.x=1", "training.steps is not a mapping, so it has no key 'x'"),
    ("callbacks[3].type=A", "callbacks has 0 items, so [3] does not exist"),
    ("training[0]=1", "training is not a list"),
    ("a b=1", "cannot read the key path"),
    ("training.steps=[1", "not a YAML value"),
])
def test_malformed_overrides(skeleton_file, override, fragment) -> None:
    with pytest.raises(ConfigError) as exc:
        load_config(skeleton_file, [override])
    (issue,) = exc.value.errors
    assert issue.message.startswith(f"bad override {override!r}") and fragment in issue.message


@pytest.mark.parametrize(("value", "problem"), [
    ("[1,2", "did not find expected ',' or ']' at the end of the value"),
    ("{a: [1}", "did not find expected ',' or ']' at character 7"),
    ("a: b: c", "mapping values are not allowed in this context at character 5"),
])
def test_a_value_that_is_not_yaml_is_one_line(skeleton_file, value, problem) -> None:
    """PyYAML's five-line complaint becomes one line: its problem, where in the value, and
    how to write one."""
    with pytest.raises(ConfigError) as exc:
        load_config(skeleton_file, [f"training.steps={value}"])
    (issue,) = exc.value.errors
    assert issue.message == (f"bad override 'training.steps={value}': not a YAML value: "
                             f"{problem}; write a list as [a, b], a mapping as {{key: value}}, "
                             "and text with YAML's special characters in quotes")
    assert "\n" not in str(issue)


def test_override_values_obey_the_nesting_limit(skeleton_file) -> None:
    deep = "model" + ".a" * 8 + "={b: {c: 1}}"
    with pytest.raises(ConfigError) as exc:
        load_config(skeleton_file, [deep])
    (issue,) = exc.value.errors
    assert "nested deeper than 10" in issue.message
    load_config(skeleton_file, ["model" + ".a" * 8 + "={b: 1}"])


@pytest.mark.parametrize("length", [11, 600])
def test_override_key_paths_obey_the_mapping_limit(skeleton_file, length) -> None:
    load_config(skeleton_file, ["model" + ".a" * 9 + "=1"])  # the top level + 9 mappings
    override = "model" + ".a" * (length - 1) + "=1"
    with pytest.raises(ConfigError) as exc:
        load_config(skeleton_file, [override])
    shown = override if len(override) <= 100 else f"{override[:97]}... ({len(override)} characters)"
    assert str(exc.value.errors[0]) == (f"{skeleton_file}: bad override {shown!r}: the key path "
                                        "nests mappings deeper than 10 levels")
    assert len(exc.value.errors) == 1


def test_override_values_obey_the_nesting_limit_of_lists_and_mappings(skeleton_file) -> None:
    # model.x sits in 2 collections (the top level, model): 98 more make 100.
    load_config(skeleton_file, ["model.x=" + "[" * 98 + "]" * 98])
    with pytest.raises(ConfigError) as exc:
        load_config(skeleton_file, ["model.x=" + "[" * 99 + "]" * 99])
    (issue,) = exc.value.errors
    assert issue.message.endswith("': nesting deeper than 100 levels (lists and mappings); a "
                                  "configuration needs a handful")
