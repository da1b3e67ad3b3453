"""The section classes: frozen, keyword-only, compared and shown field by field."""

from __future__ import annotations

import attrs
import pytest

from mf_config import ModelConfig, ProfilerConfig, TrainConfig, TrainingConfig


def test_equality_is_field_by_field_and_type_strict() -> None:
    assert TrainConfig() == TrainConfig()
    assert TrainingConfig(steps=2) != TrainingConfig()
    assert TrainingConfig() != ProfilerConfig()
    assert TrainingConfig() != "TrainingConfig()"
    assert ModelConfig(model_type="q", extras={"a": 1}) != ModelConfig(model_type="q")
    assert ModelConfig(model_type="q", extras={"a": 1}) == ModelConfig(model_type="q",
                                                                       extras={"a": 1})


def test_sections_are_frozen_keyword_only_and_unhashable() -> None:
    config = TrainingConfig()
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        config.steps = 3  # type: ignore[misc]
    with pytest.raises(TypeError):
        TrainingConfig(10)  # type: ignore[misc]
    with pytest.raises(TypeError, match="unhashable"):
        hash(TrainConfig())
    assert attrs.evolve(config, steps=3).steps == 3


def test_repr_shows_every_field() -> None:
    assert repr(ProfilerConfig(start_step=2, end_step=4)) == (
        "ProfilerConfig(enable_profiling=False, start_step=2, end_step=4, output_path=None, "
        "profiler_rank=None, profiler_level=0, mstx=False, profile_memory=False, "
        "with_stack=True, profile_cpu=True)")
    assert repr(ModelConfig(model_type="q", extras={"a": 1})) == (
        "ModelConfig(extras={'a': 1}, model_type='q', architectures=None)")
