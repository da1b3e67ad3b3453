"""Open sections' extras structured into a component's own typed settings."""

from __future__ import annotations

import pytest

from mf_config import ConfigError, load_config
from mf_config.component_settings import structure_settings
from mf_config.sections import Section, section, setting
from mf_config.validate import load_source


@section
class WarmupSettings(Section):
    warmup_steps: int = setting(0, "Warm-up steps.", ge=0)
    lr_end: float = setting(0.0, "Final rate.", ge=0)
    names: list[str] = setting([], "Some names.")


def test_defaults_and_values() -> None:
    settings = structure_settings(WarmupSettings, {"warmup_steps": 5}, ("lr_scheduler",))
    assert settings.warmup_steps == 5
    assert settings.lr_end == 0.0
    assert settings.names == []


def test_every_problem_is_listed_with_its_path() -> None:
    with pytest.raises(ConfigError) as info:
        structure_settings(WarmupSettings, {"warmup_step": 5, "lr_end": "x"}, ("lr_scheduler",))
    paths = sorted(issue.path for issue in info.value.errors)
    assert paths == ["lr_scheduler.lr_end", "lr_scheduler.warmup_step"]
    text = str(info.value)
    assert "did you mean 'warmup_steps'?" in text
    assert "expected a number" in text or "expected a float" in text


def test_bounds_are_checked() -> None:
    with pytest.raises(ConfigError, match=r"lr_scheduler.warmup_steps: must be >= 0, got -1"):
        structure_settings(WarmupSettings, {"warmup_steps": -1}, ("lr_scheduler",))


def test_source_gives_the_line(tmp_path) -> None:
    path = tmp_path / "train.yaml"
    path.write_text("model:\n  model_type: qwen3\ntrain_dataset:\n  dataloader:\n    type: Mock\n"
                    "training:\n  global_batch_size: 1\nlr_scheduler:\n  type: X\n"
                    "  warmup_steps: -3\n")
    config = load_config(path)
    source = load_source(path)
    with pytest.raises(ConfigError) as info:
        structure_settings(WarmupSettings, config.lr_scheduler.extras, ("lr_scheduler",), source)
    issue = info.value.errors[0]
    assert (issue.line, issue.path) == (10, "lr_scheduler.warmup_steps")
    assert str(issue).startswith(f"{path}:10: lr_scheduler.warmup_steps: must be >= 0")


def test_architectures_as_hugging_face_writes_it() -> None:
    from mf_config import TrainConfig

    base = {"train_dataset": {"dataloader": {"type": "Mock"}},
            "training": {"global_batch_size": 1}}
    config = TrainConfig.from_dict({**base, "model": {"architectures": ["Qwen3ForCausalLM"]}})
    assert config.model.architecture() == "Qwen3ForCausalLM"
    assert TrainConfig.from_dict({**base, "model": {"architectures": "X"}}).model.architecture() \
        == "X"
    with pytest.raises(ConfigError, match=r"model.architectures: must name one model class"):
        TrainConfig.from_dict({**base, "model": {"architectures": ["A", "B"]}})


def test_installed_entry_points_are_hidden_from_mf_config_tests() -> None:
    from mf_config import components

    assert components.installed_entry_points("models") == ()  # conftest hides the installed ones
