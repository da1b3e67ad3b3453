"""The `mf-config` command: exit codes, output format, `show` round trip, never a traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import spec_yaml_blocks

from mf_config import load_config
from mf_config.cli import main
from mf_config.validate import NOT_CHECKED

SCRIPT = Path(sys.executable).parent / "mf-config"
SPEC_SKELETON = spec_yaml_blocks()[0]
SKELETON = SPEC_SKELETON.replace("target_layers: [0, 1, 2]", "target_layers: [3, 4, 5]")
"""The spec's skeleton with its MoE monitor on MoE layers: as written it watches the first
three, which DeepSeek-V3 keeps dense (test_the_spec_skeleton_monitors_dense_layers)."""


def run(*args: str) -> subprocess.CompletedProcess[str]:
    """The installed console script, as a user runs it."""
    return subprocess.run([str(SCRIPT), *args], capture_output=True, text=True, timeout=60)


@pytest.fixture()
def good(tmp_path) -> Path:
    path = tmp_path / "train.yaml"
    path.write_text(SKELETON, encoding="utf-8")
    return path


@pytest.fixture()
def broken(tmp_path) -> Path:
    text = SKELETON.replace("global_batch_size: 8", "global_batch_size: 0").replace(
        "  seed: 42", "  seed: 42\n  stepz: 3").replace('mode: "None"', "mode: full2")
    path = tmp_path / "broken.yaml"
    path.write_text(text, encoding="utf-8")
    return path


def line_of(path: Path, fragment: str) -> int:
    lines = path.read_text(encoding="utf-8").splitlines()
    return next(number for number, line in enumerate(lines, 1) if fragment in line)


def test_validate_ok(good) -> None:
    result = run("validate", str(good))
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"{good}: OK\n"
    assert result.stderr == ""


def test_validate_reports_every_problem_with_file_and_line(broken) -> None:
    result = run("validate", str(broken))
    assert result.returncode == 1
    assert result.stdout == ""
    assert result.stderr.splitlines() == [
        f"{broken}:{line_of(broken, 'global_batch_size')}: training.global_batch_size: "
        "must be positive, got 0",
        f"{broken}:{line_of(broken, 'stepz')}: training.stepz: Unknown configuration keys for "
        "TrainingConfig: ['stepz']; did you mean 'steps'?",
        f"{broken}:{line_of(broken, 'full2')}: recompute.mode: must be one of 'None', 'full', "
        "'select'; got 'full2' (a string)",
    ]


def test_validate_several_files(good, broken) -> None:
    result = run("validate", str(good), str(broken))
    assert result.returncode == 1
    assert result.stdout == f"{good}: OK\n"
    assert len(result.stderr.splitlines()) == 3


def test_validate_with_overrides(good) -> None:
    result = run("validate", str(good), "--set", "training.steps=0", "--set", "training.seed=3")
    assert result.returncode == 1
    assert result.stderr == (f"{good} (--set training.steps=0): training.steps: "
                             "must be positive, got 0\n")
    assert run("validate", str(good), "--set", "training.steps=7").returncode == 0


def test_warnings_are_printed_but_the_file_is_valid(good) -> None:
    result = run("validate", str(good), "--set", "recompute.full_recompute_layer=['0-1']")
    assert result.returncode == 0
    assert "recompute.full_recompute_layer: warning: ignored because mode is 'None'" in \
        result.stderr
    assert result.stdout == f"{good}: OK\n"


def test_a_global_batch_that_local_batches_do_not_divide_is_said(good, capsys) -> None:
    good.write_text(SKELETON.replace("local_batch_size: 1", "local_batch_size: 3"))
    assert main(["validate", str(good)]) == 0
    captured = capsys.readouterr()
    assert captured.out == f"{good}: OK\n"
    assert captured.err.startswith(
        f"{good}:{line_of(good, 'global_batch_size')}: training.global_batch_size: warning: 8 "
        "is not a multiple of local_batch_size (3), so not of data_parallel x local_batch_size "
        "either: each step rounds it down to a multiple of that, 6 samples on one "
        "data-parallel rank")


@pytest.mark.parametrize("args", [[], ["validate"], ["frobnicate"], ["show"],
                                  ["validate", "x.yaml", "--set"]])
def test_usage_errors_exit_2(args) -> None:
    result = run(*args)
    assert result.returncode == 2
    assert "usage: mf-config" in result.stderr and "Traceback" not in result.stderr


def test_unreadable_file_exits_2(tmp_path, good) -> None:
    result = run("validate", str(good), str(tmp_path / "missing.yaml"))
    assert result.returncode == 2
    assert result.stderr == f"{tmp_path / 'missing.yaml'}: file not found\n"
    assert result.stdout == f"{good}: OK\n"


@pytest.mark.parametrize("content", [b"\xff\xfe", b"a: [1\n", b"- 1\n", b"", b"a: !!python/none x"])
def test_bad_content_exits_1_without_traceback(tmp_path, content) -> None:
    path = tmp_path / "bad.yaml"
    path.write_bytes(content)
    result = run("validate", str(path))
    assert result.returncode == 1
    assert result.stderr.startswith(str(path)) and "Traceback" not in result.stderr


def test_show_prints_effective_config_that_validates(good, tmp_path) -> None:
    result = run("show", str(good), "--set", "training.steps=5")
    assert result.returncode == 0, result.stderr
    shown = yaml.safe_load(result.stdout)
    assert shown["training"]["steps"] == 5
    assert shown["checkpoint"]["save_max"] == 5  # a default the file did not write
    assert shown["context"] == {"device_target": "auto", "mode": 1, "max_device_memory": None,
                                "compile": False}
    assert list(shown) == ["context", "checkpoint", "training", "parallelism", "optimizer",
                           "lr_scheduler", "train_dataset", "model", "monitor", "profiler",
                           "recompute", "recompute_comm", "swap", "callbacks"]
    again = tmp_path / "shown.yaml"
    again.write_text(result.stdout, encoding="utf-8")
    assert run("validate", str(again)).returncode == 0
    assert load_config(again) == load_config(good, ["training.steps=5"])


def test_show_of_an_invalid_file_exits_1(broken) -> None:
    result = run("show", str(broken))
    assert result.returncode == 1 and result.stdout == ""


def test_main_can_be_called_in_process(good, capsys) -> None:
    assert main(["validate", str(good)]) == 0
    assert capsys.readouterr().out == f"{good}: OK\n"


TOO_DEEP = ("nesting deeper than 100 levels (lists and mappings); a configuration needs a "
            "handful")
WITHOUT_LIBYAML = ("import yaml; yaml.__dict__.pop('CSafeLoader', None); "
                   "from mf_config.cli import run; run()")
"""`mf-config` as it runs where PyYAML has no libyaml: its pure-Python composer recurses."""


def deep_list(depth: int) -> str:
    return "[" * depth + "1" + "]" * depth


@pytest.mark.parametrize("libyaml", [True, False], ids=["libyaml", "pure-python"])
@pytest.mark.parametrize("command", ["validate", "show"])
@pytest.mark.parametrize("depth", [500, 999, 5000])
def test_deep_nesting_is_one_line_and_exit_1(tmp_path, depth, command, libyaml) -> None:
    path = tmp_path / "train.yaml"
    path.write_text(SKELETON + f"deep: {deep_list(depth)}\n", encoding="utf-8")
    line = len(SKELETON.splitlines()) + 1
    if libyaml:
        result = run(command, str(path))
    else:
        result = subprocess.run([sys.executable, "-c", WITHOUT_LIBYAML, command, str(path)],
                                capture_output=True, text=True, timeout=60)
    assert (result.returncode, result.stdout) == (1, "")
    assert result.stderr == f"{path}:{line}: {TOO_DEEP}\n"


def test_show_prints_values_nested_to_the_limit(good, capsys) -> None:
    # The top level (1) > callbacks (2) > its item (3) > 97 lists (4 to 100).
    overrides = ["callbacks=[{type: A}]", f"callbacks[0].deep={deep_list(97)}"]
    assert main(["show", str(good), *[f"--set={o}" for o in overrides]]) == 0
    shown = yaml.safe_load(capsys.readouterr().out)
    assert shown["callbacks"][0]["deep"] == yaml.safe_load(deep_list(97))
    too_deep = f"callbacks[0].deep={deep_list(98)}"
    assert main(["validate", str(good), "--set", "callbacks=[{type: A}]", "--set", too_deep]) == 1
    assert capsys.readouterr().err == (
        f"{good}: bad override '{too_deep[:97]}... ({len(too_deep)} characters)': {TOO_DEEP}\n")


@pytest.mark.parametrize("depth", [500, 999, 5000])
def test_deep_override_values_are_one_line_and_exit_1(good, depth) -> None:
    override = f"model.x={deep_list(depth)}"
    result = run("validate", str(good), "--set", override)
    assert (result.returncode, result.stdout) == (1, "")
    assert result.stderr == (f"{good}: bad override '{override[:97]}... ({len(override)} "
                             f"characters)': {TOO_DEEP}\n")


@pytest.mark.slow  # about 40 s and 1.4 GB: libyaml composes 2 million nodes
def test_a_20_mb_file_without_aliases_is_valid(tmp_path) -> None:
    # A model type no installed package declares, so the table is not checked as model keys.
    head, tail = SKELETON.replace("DeepseekV3ForCausalLM", "MyOwnModel").split("\nmodel:\n", 1)
    rows = [f"    key_{i:07d}: [{i}, {i + 1}, {i + 2}, value_{i}, {i * 0.5}]\n"
            for i in range(313_100)]
    path = tmp_path / "big.yaml"
    path.write_text(f"{head}\nmodel:\n  big_table:\n{''.join(rows)}{tail}", encoding="utf-8")
    assert path.stat().st_size > 20_000_000
    result = subprocess.run([str(SCRIPT), "validate", str(path)], capture_output=True,
                            text=True, timeout=600)
    assert (result.returncode, result.stdout) == (0, f"{path}: OK\n")
    assert "error" not in result.stderr and "Traceback" not in result.stderr


def test_the_spec_skeleton_monitors_dense_layers(tmp_path) -> None:
    """With mf-train installed the model's shape is known: its first_k_dense_replace 3 layers
    have no router, so the skeleton's target_layers [0, 1, 2] get a warning, not silence."""
    pytest.importorskip("mf_train")
    path = tmp_path / "train.yaml"
    path.write_text(SPEC_SKELETON, encoding="utf-8")
    result = run("validate", str(path))
    assert result.returncode == 0
    assert result.stderr == (
        f"{path}:{line_of(path, 'target_layers')}: monitor.moe_monitor.target_layers: warning: "
        "layers 0, 1, 2 are dense (the first 3 layers, first_k_dense_replace): no router, so "
        "no tokens per expert; the MoE layers are 3 to 11\n")
    assert run("validate", str(path), "--set", "monitor.moe_monitor.target_layers=2").stderr \
        .count("layers 0, 1 are dense") == 1


def test_without_a_trainer_validate_says_in_one_line_what_it_could_not_check(
        good, capsys, monkeypatch: pytest.MonkeyPatch) -> None:
    """mf-config imports no trainer: its pre-launch checks come through the entry-point group
    `mf_config.pre_launch`; with none installed (mf-config alone), one note says so."""
    from mf_config import components

    installed = {kind: components.installed_entry_points(kind)
                 for kind in (*components.KINDS, components.RESOLVERS)}
    monkeypatch.setattr(components, "_ENTRY_POINTS", {**installed, components.PRE_LAUNCH: ()})
    assert main(["validate", str(good)]) == 0
    notes = [line for line in capsys.readouterr().err.splitlines() if "pre-launch" in line
             or "before it starts" in line]
    assert notes == [f"{good}: note: {NOT_CHECKED}"]
