"""The files a run reads are checked before anything is built (`mf_train.preflight.input_checks`):
each missing one is a line naming the YAML value (file and line) and what is accepted, and
`mf-train` stops with them before it builds a model or starts a rank."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

from mf_config import ConfigError
from mf_config.errors import ConfigIssue
from mf_config.validate import config_from_source, load_source
from mf_data import write_indexed
from mf_train.preflight.input_checks import check_inputs

ROOT = Path(__file__).resolve().parents[2]
QWEN3 = ROOT / "examples" / "qwen3_tiny.yaml"
SPEC = ROOT / "examples" / "spec_skeleton.yaml"
DATA_LINE = '      data_path: ["1", "./output/data/python_docs_text_document"]'
PREFIX_LINE = '  prefix: "qwen3_tiny"'
DATA = "train_dataset.dataloader.config."


def config_file(tmp_path: Path, data: str, load_path: str | None = None) -> Path:
    """The tiny Qwen3 example as `tmp_path/train.yaml`, its `data_path` line replaced by
    `data` (YAML lines under `config:`) and `checkpoint.load_path` set when given."""
    text = QWEN3.read_text(encoding="utf-8")
    assert DATA_LINE in text and PREFIX_LINE in text
    text = text.replace(DATA_LINE, data)
    if load_path is not None:
        text = text.replace(PREFIX_LINE, f'{PREFIX_LINE}\n  load_path: "{load_path}"')
    path = tmp_path / "train.yaml"
    path.write_text(text, encoding="utf-8")
    return path


def line_of(path: Path, text: str) -> int:
    """The 1-based line of `path` holding `text`."""
    return next(number for number, line in enumerate(path.read_text().splitlines(), 1)
                if text in line)


def check(path: Path) -> None:
    source = load_source(path)
    check_inputs(config_from_source(source), source)


def problems(path: Path) -> list[ConfigIssue]:
    """Every problem `check_inputs` finds in the file at `path` (one ConfigError)."""
    with pytest.raises(ConfigError) as raised:
        check(path)
    return raised.value.errors


def dataset(prefix: Path) -> Path:
    """A real Megatron .bin/.idx pair of two documents at `prefix`."""
    prefix.parent.mkdir(parents=True, exist_ok=True)
    write_indexed(prefix, [[1, 2, 3], [4, 5]])
    return prefix


def test_a_complete_configuration_passes(tmp_path: Path) -> None:
    a, b = dataset(tmp_path / "a"), dataset(tmp_path / "b")
    weights = tmp_path / "hf" / "model.safetensors"
    weights.parent.mkdir()
    save_file({"w": np.zeros(2, np.float32)}, str(weights))
    check(config_file(tmp_path, f'      data_path: ["0.3", "{a}", "0.7", "{b}"]',
                      load_path=str(weights.parent)))


def test_a_missing_dataset_names_its_line_and_the_fix(tmp_path: Path) -> None:
    path = config_file(tmp_path, f'      data_path: ["1", "{tmp_path}/none"]')
    [issue] = problems(path)
    assert (issue.file, issue.line, issue.path) == (
        str(path), line_of(path, "data_path:"), f"{DATA}data_path[1]")
    assert issue.message == (
        f"no dataset at {tmp_path}/none: neither its .idx nor its .bin exists; give the prefix "
        "of a Megatron .bin/.idx pair, as `mf-data preprocess --output-prefix PREFIX` writes it")


def test_every_problem_is_listed_at_once(tmp_path: Path) -> None:
    """A weighted blend, one of its prefixes missing, and a missing checkpoint: one error,
    each problem at its own line."""
    present = dataset(tmp_path / "present")
    data = "\n".join(["      data_path:", '        - "0.3"', f'        - "{present}"',
                      '        - "0.7"', f'        - "{tmp_path}/absent"'])
    path = config_file(tmp_path, data, load_path=str(tmp_path / "ckpt"))
    assert [(issue.line, issue.path) for issue in problems(path)] == [
        (line_of(path, f"{tmp_path}/absent"), f"{DATA}data_path[3]"),
        (line_of(path, "load_path:"), "checkpoint.load_path")]


def test_both_files_of_a_dataset_are_needed(tmp_path: Path) -> None:
    prefix = dataset(tmp_path / "corpus")
    Path(f"{prefix}.bin").unlink()
    [issue] = problems(config_file(tmp_path, f'      data_path: ["{prefix}"]'))
    assert issue.path == f"{DATA}data_path[0]"
    assert issue.message == (f"{prefix}.bin is missing ({prefix}.idx is there); a dataset "
                             f"needs both {prefix}.idx and {prefix}.bin")


def test_an_index_that_is_not_megatron_s(tmp_path: Path) -> None:
    prefix = dataset(tmp_path / "corpus")
    Path(f"{prefix}.idx").write_bytes(b"not an index at all")
    [issue] = problems(config_file(tmp_path, f'      train_data_path: ["{prefix}"]'))
    assert issue.path == f"{DATA}train_data_path[0]"
    assert issue.message.startswith(f"{prefix}.idx is not a Megatron index")


def test_an_index_that_does_not_describe_its_data(tmp_path: Path) -> None:
    """uint16 tokens whose index says uint8 would be read as other tokens (and train with
    exit status 0): refused before launch, at the prefix's line, naming both files."""
    prefix = tmp_path / "corpus"
    write_indexed(prefix, [[1, 2, 3], [4, 5]], dtype=np.uint16)
    index = bytearray(Path(f"{prefix}.idx").read_bytes())
    index[17] = 1  # the dtype code: uint16 (8) -> uint8 (1)
    Path(f"{prefix}.idx").write_bytes(bytes(index))
    path = config_file(tmp_path, f'      data_path: ["{prefix}"]')
    [issue] = problems(path)
    assert (issue.line, issue.path) == (line_of(path, "data_path:"), f"{DATA}data_path[0]")
    assert issue.message.startswith(
        f"{prefix}.bin: sizes disagree: the data file has 10 bytes but {prefix}.idx describes "
        "5 tokens of uint8 (1 byte each) = 5 bytes")


def test_a_prefix_given_with_its_extension(tmp_path: Path) -> None:
    prefix = dataset(tmp_path / "corpus")
    [issue] = problems(config_file(tmp_path, f'      data_path: ["{prefix}.bin"]'))
    assert issue.message == f"{prefix}.bin: give the prefix without its extension: {prefix}"


def test_a_list_the_builder_cannot_read(tmp_path: Path) -> None:
    prefix = dataset(tmp_path / "corpus")
    [issue] = problems(config_file(tmp_path, f'      data_path: ["0.5", "{prefix}", "0.5"]'))
    assert issue.path == f"{DATA}data_path"
    assert "weights come in weight/prefix pairs" in issue.message


def test_relative_prefixes_are_read_from_the_working_directory(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """As mf-data's builder reads them (not from the YAML file's directory)."""
    dataset(tmp_path / "data" / "corpus")
    path = config_file(tmp_path, '      data_path: ["data/corpus"]')
    monkeypatch.chdir(tmp_path)
    check(path)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    [issue] = problems(path)
    assert issue.message.startswith(
        f"no dataset at data/corpus (in the working directory: {elsewhere}/data/corpus): ")


def mf_save_path(tmp_path: Path) -> Path:
    """A save path that holds no checkpoint yet: loading it starts from scratch."""
    return tmp_path / "ckpt"


def mf_iteration(tmp_path: Path) -> Path:
    return tmp_path / "ckpt" / "iteration_00000002"


def hf_file(tmp_path: Path) -> Path:
    path = tmp_path / "model.safetensors"
    save_file({"w": np.zeros(2, np.float32)}, str(path))
    return path


@pytest.mark.parametrize("make", [mf_save_path, mf_iteration, hf_file])
def test_every_checkpoint_form_loaded_today_passes(make, tmp_path: Path) -> None:
    """What each holds is checked when it is loaded; here only that it is there."""
    (tmp_path / "ckpt" / "iteration_00000002").mkdir(parents=True)
    prefix = dataset(tmp_path / "corpus")
    check(config_file(tmp_path, f'      data_path: ["{prefix}"]', load_path=str(make(tmp_path))))


@pytest.mark.parametrize(("name", "what"), [
    ("absent", "does not exist"),
    ("weights.ckpt", "is neither a directory nor a .safetensors file")])
def test_a_checkpoint_that_cannot_be_loaded(name: str, what: str, tmp_path: Path) -> None:
    (tmp_path / "weights.ckpt").write_bytes(b"\0" * 8)
    prefix = dataset(tmp_path / "corpus")
    path = config_file(tmp_path, f'      data_path: ["{prefix}"]', load_path=str(tmp_path / name))
    [issue] = problems(path)
    assert (issue.line, issue.path) == (line_of(path, "load_path:"), "checkpoint.load_path")
    assert issue.message == (
        f"{tmp_path / name} {what}; give an mf checkpoint (a save_path directory or one of "
        "its iteration_XXXXXXXX directories) or Hugging Face weights (a .safetensors file or "
        "a directory of them), or leave it empty to start from scratch")


def test_an_empty_load_path_is_a_fresh_start(tmp_path: Path) -> None:
    prefix = dataset(tmp_path / "corpus")
    check(config_file(tmp_path, f'      data_path: ["{prefix}"]', load_path=""))


@pytest.mark.parametrize("module", ["mf_train.preflight.input_checks", "mf_train.launch.cli"])
def test_the_checks_and_the_command_line_do_not_import_mindspore(module: str) -> None:
    """`mf-train --help` and usage errors answer without MindSpore's 2-3 s import (the
    command line once imported it through the checkpoint readers and the monitors)."""
    code = (f"import sys, {module}; "
            f"assert 'mindspore' not in sys.modules, '{module} imports mindspore'")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_mf_train_stops_before_building_the_model(tmp_path: Path) -> None:
    """The spec's skeleton (a DeepSeek-V3 of 12 layers) names data that is not here:
    `mf-train` exits with its line before building anything (it used to build the whole
    model first) and leaves the output directory untouched."""
    pytest.importorskip("mindspore")
    output = tmp_path / "out"
    result = subprocess.run([sys.executable, "-m", "mf_train.launch.cli", "--config", str(SPEC),
                             "--output-dir", str(output)], capture_output=True, text=True,
                            cwd=tmp_path, timeout=120)
    assert result.returncode == 2
    line = line_of(SPEC, "/path/megatron_data_text_document")
    assert result.stderr.strip().splitlines()[-2:] == [
        "mf-train: 1 problem in the configuration:",
        f"  {SPEC}:{line}: {DATA}data_path[1]: no dataset at /path/megatron_data_text_document: "
        "neither its .idx nor its .bin exists; give the prefix of a Megatron .bin/.idx pair, "
        "as `mf-data preprocess --output-prefix PREFIX` writes it"]
    assert "Traceback" not in result.stderr
    assert not output.exists()


def test_the_launcher_stops_before_any_rank_starts(tmp_path: Path, capsys) -> None:
    pytest.importorskip("mindspore")
    from mf_train.launch.cli import run

    status = run(["--config", str(QWEN3), "--output-dir", str(tmp_path / "out"), "--nproc", "2",
                  "--set", f"{DATA}data_path=['1','{tmp_path}/none']",
                  "--set", f"checkpoint.load_path={tmp_path}/ckpt"])
    err = capsys.readouterr().err
    assert status == 2
    assert "mf-train: 2 problems in the configuration:" in err
    assert f"{DATA}data_path[1]: no dataset at {tmp_path}/none: " in err
    assert f"checkpoint.load_path: {tmp_path}/ckpt does not exist; " in err
    assert "starting 2 ranks" not in err
    assert not (tmp_path / "out").exists()


def test_the_trainer_checks_before_it_builds(tmp_path: Path) -> None:
    """A program that makes a `Trainer` itself (no launcher) gets the same problem before any
    parameter exists: ConfigError from the constructor, with the YAML line."""
    pytest.importorskip("mindspore")
    from mf_train.trainer import Trainer

    path = config_file(tmp_path, f'      data_path: ["1", "{tmp_path}/none"]')
    source = load_source(path)
    with pytest.raises(ConfigError) as raised:
        Trainer(config_from_source(source), output_dir=tmp_path / "out", source=source)
    [issue] = raised.value.errors
    assert (issue.line, issue.path) == (line_of(path, "data_path:"), f"{DATA}data_path[1]")
