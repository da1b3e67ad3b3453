"""`mf-config validate` with the component packages installed: the keys of the open sections
are checked against the settings mf-train and mf-data declare through entry points, with
lines and "did you mean"; without them, mf-config says which sections it could not check."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from mf_config import ConfigError, TrainConfig, components, load_config
from mf_config.components import check_components, declared_types, model_shape
from mf_config.validate import check_source, load_source

pytest.importorskip("mf_train")
pytest.importorskip("mf_data")

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))
SCRIPT = Path(sys.executable).parent / "mf-config"
TYPOS = """\
model:
  model_type: qwen3
  vocab_size: 512
  hiden_size: 64
  intermediate_size: 128
  num_hidden_layers: 2
  num_attention_heads: 4
training:
  steps: 10
lr_scheduler:
  type: CosineWithWarmUpLR
  learning_rate: 1.e-3
  lr_endd: 1.e-5
train_dataset:
  dataloader:
    type: BlendedMegatronDatasetDataLoader
    sizes: [100, 0, 0]
    config:
      seq_lenght: 128
      data_path: ["/data/corpus_text_document"]
"""


def validate(path: Path, *overrides: str) -> subprocess.CompletedProcess[str]:
    sets = [arg for value in overrides for arg in ("--set", value)]
    return subprocess.run([str(SCRIPT), "validate", str(path), *sets], capture_output=True,
                          text=True, timeout=60)


def test_the_components_declare_their_settings() -> None:
    assert declared_types("models") == ["DeepseekV3ForCausalLM", "Qwen3ForCausalLM",
                                        "deepseek_v3", "qwen3"]
    assert declared_types("optimizers") == ["AdamW", "Muon", "adamw", "muon"]
    assert "CosineWithWarmUpLR" in declared_types("lr_schedulers")
    assert declared_types("dataloaders") == ["BlendedMegatronDatasetDataLoader"]


def test_three_typos_in_three_open_sections_are_all_named(tmp_path: Path) -> None:
    path = tmp_path / "train.yaml"
    path.write_text(TYPOS, encoding="utf-8")
    result = validate(path)
    assert result.returncode == 1
    assert result.stderr.splitlines() == [
        f"{path}:4: model.hiden_size: Unknown configuration keys for model type 'qwen3': "
        "['hiden_size']; did you mean 'hidden_size'?",
        f"{path}:13: lr_scheduler.lr_endd: Unknown configuration keys for learning-rate "
        "scheduler type 'CosineWithWarmUpLR': ['lr_endd']; did you mean 'lr_end'?",
        f"{path}:19: train_dataset.dataloader.config.seq_lenght: Unknown configuration keys for "
        "MegatronDatasetSettings: ['seq_lenght']; did you mean 'seq_length'?"]


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda path: path.name)
def test_the_examples_validate_with_every_key_checked(example: Path) -> None:
    result = validate(example)
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""  # no note: every open section was checked


def test_how_components_fit_the_rest_is_checked_too(tmp_path: Path) -> None:
    path = tmp_path / "train.yaml"
    path.write_text(TYPOS.replace("hiden_size", "hidden_size").replace("lr_endd", "lr_end")
                    .replace("seq_lenght", "seq_length"), encoding="utf-8")
    assert validate(path).returncode == 0
    tensor = validate(path, "parallelism.tensor_parallel=8")
    assert tensor.returncode == 1
    assert "model.num_attention_heads: 4 is not divisible by parallelism.tensor_parallel (8)" \
        in tensor.stderr
    schedule = validate(path, "lr_scheduler.type=WarmUpStableDecayLR")
    assert schedule.stderr.splitlines() == [
        f"{path}:10: lr_scheduler.warmup_steps: required by WarmUpStableDecayLR: give "
        "warmup_steps (an integer >= 0) or warmup_ratio (a fraction of total_steps, in [0, 1])",
        f"{path}:10: lr_scheduler.decay_start_steps: required by WarmUpStableDecayLR: give "
        "decay_start_steps (an integer >= 0) or decay_start_ratio (a fraction of total_steps, "
        "in [0, 1])"]
    constant = validate(path, "lr_scheduler.type=null")
    assert f"{path}:13: lr_scheduler.lr_end: is a scheduler key, but lr_scheduler.type is " \
        "null" in constant.stderr


@pytest.mark.parametrize(("override", "message"), [
    ("model.hidden_size=1000000000000000000000000000000",
     "model.hidden_size: 1000000000000000000000000000000 is too large: no setting takes an "
     "integer beyond"),
    ("model.hidden_size=4294967296", "model.hidden_size: must be <= 2147483647, got 4294967296"),
    ("training.seed=4294967296", "training.seed: must be <= 4294967295, got 4294967296"),
    ("train_dataset.dataloader.config.seed=-1",
     "train_dataset.dataloader.config.seed: must be >= 0, got -1"),
])
def test_values_too_large_to_mean_anything_are_refused(tmp_path: Path, override: str,
                                                       message: str) -> None:
    path = tmp_path / "train.yaml"
    path.write_text(TYPOS.replace("hiden_size", "hidden_size").replace("lr_endd", "lr_end")
                    .replace("seq_lenght", "seq_length"), encoding="utf-8")
    result = validate(path, override)
    assert result.returncode == 1
    assert message in result.stderr, result.stderr


def test_a_callback_type_that_names_no_callback_is_refused(tmp_path: Path) -> None:
    """A registered name, an installed one or a `module:Class` path to a Callback subclass
    passes; anything else is refused where it is written, and a class's keys are checked."""
    path = tmp_path / "train.yaml"
    path.write_text(TYPOS.replace("hiden_size", "hidden_size").replace("lr_endd", "lr_end")
                    .replace("seq_lenght", "seq_length") + (
                        "callbacks:\n"
                        "  - type: collections:OrderedDict\n"
                        "  - type: NoSuchCallback\n"
                        "  - type: no_such_module:Thing\n"
                        "  - type: mf_train.monitor.wandb:WandbWriter\n"
                        "    projct: x\n"
                        "  - type: wandb\n"
                        "  - type: mf_train.observe.callbacks:LossLogger\n"), encoding="utf-8")
    result = validate(path)
    assert result.returncode == 1
    assert result.stderr.splitlines() == [
        f"{path}:22: callbacks[0].type: 'collections:OrderedDict' is not a callback: a "
        "subclass of mf_train.observe.callbacks.Callback is required",
        f"{path}:23: callbacks[1].type: unknown callback type 'NoSuchCallback'; registered: "
        "Evaluate, wandb; or give a 'module:Class' path",
        f"{path}:24: callbacks[2].type: cannot load callback type 'no_such_module:Thing': No "
        "module named 'no_such_module'",
        f"{path}:26: callbacks[3].projct: Unknown configuration keys for callback type "
        "'mf_train.monitor.wandb:WandbWriter': "
        "['projct']; did you mean 'project'?"]


def test_without_the_components_their_sections_are_noted(monkeypatch: pytest.MonkeyPatch,
                                                         tmp_path: Path) -> None:
    monkeypatch.setattr(components, "_ENTRY_POINTS", {kind: () for kind in components.KINDS})
    path = tmp_path / "train.yaml"
    path.write_text(TYPOS, encoding="utf-8")
    _, issues = check_source(load_source(path))
    assert [(issue.severity, issue.path) for issue in issues] == [
        ("note", "model.model_type"), ("note", "lr_scheduler.type"),
        ("note", "train_dataset.dataloader.type")]  # the optimizer section has no keys
    assert str(issues[0]) == (f"{path}:2: model.model_type: note: not checked: no installed "
                              "package declares the settings of model type 'qwen3'; its keys "
                              "are checked when it is built")
    load_config(path)  # valid for mf-config alone: notes are not errors


def test_the_model_is_read_through_its_own_settings() -> None:
    """One parse: the plan, the rules and the estimate read the numbers the model class is
    built from, defaults included (head_dim from hidden_size / heads)."""
    config = load_config(ROOT / "examples" / "qwen3_tiny.yaml")
    shape = model_shape(config.model)
    assert (shape.num_layers, shape.head_dim, shape.num_key_value_heads, shape.seq_length) == (
        4, 16, 2, None)
    skeleton = load_config(ROOT / "examples" / "spec_skeleton.yaml")
    deepseek = model_shape(skeleton.model)
    assert (deepseek.num_layers, deepseek.routed_experts, deepseek.head_dim) == (12, 256, 192)
    assert check_components(skeleton, load_source(ROOT / "examples" / "spec_skeleton.yaml")
                            ).model_shape == deepseek


def test_a_layer_spec_past_the_models_layers_is_refused() -> None:
    data = load_source(ROOT / "examples" / "qwen3_tiny.yaml",
                       ["recompute.select_module={attention: ['0-4']}"]).data
    with pytest.raises(ConfigError, match=r"recompute\.select_module\[\"attention\"\]\[0\]"):
        TrainConfig.from_dict(data)


def test_entry_points_are_read_as_importlib_metadata_reads_them() -> None:
    """mf-config reads entry_points.txt itself (importlib.metadata costs 25 ms to import);
    every installed distribution's console scripts and mf-config's groups must agree."""
    from importlib.metadata import entry_points as reference

    from mf_config.entry_points import entry_points

    groups = [components.GROUP_PREFIX + kind for kind in components.KINDS]
    groups.append("console_scripts")
    mine = entry_points(groups)
    for group in groups:
        expected = sorted((entry.name, entry.value) for entry in reference(group=group))
        assert sorted((entry.name, entry.value) for entry in mine[group]) == expected, group
    assert len(mine["console_scripts"]) > 5
    (qwen3,) = [entry for entry in mine["mf_config.models"] if entry.name == "qwen3"]
    assert qwen3.load().__name__ == "Qwen3Settings"
