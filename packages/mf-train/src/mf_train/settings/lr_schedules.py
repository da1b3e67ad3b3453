"""The keys each learning-rate schedule reads under `lr_scheduler` (MindFormers' names and
defaults; the formulas are in `mf_train.lr_schedules`).

Validation (`mf-config validate`) structures them through the entry points of
`mf_config.lr_schedulers`, and `config_problems` builds the schedule over `training.steps`, so
that settings which do not fit together (a warm-up given neither as steps nor as a ratio, an
`lr_end` above the learning rate) are found before training starts.

No `from __future__ import annotations` here: cattrs reads the field types at run time.
"""

from typing import ClassVar

from mf_config.errors import Path
from mf_config.sections import Section, TrainConfig, section, setting


@section
class WarmupSettings(Section):
    """Keys every schedule here shares: the warm-up and the schedule's length."""

    warmup_steps: int | None = setting(
        None, "Warm-up steps; required unless warmup_ratio is given.", ge=0)
    warmup_ratio: float | None = setting(
        None, "Warm-up as a fraction of total_steps; overrides warmup_steps.", ge=0, le=1)
    warmup_lr_init: float = setting(0.0, "Rate at step 0, rising linearly to learning_rate.",
                                    ge=0)
    total_steps: int | None = setting(
        None, "Length of the schedule; defaults to training.steps.", gt=0)

    key_hints: ClassVar[dict[str, str]] = {}
    """Keys of other tools, with what to write instead (see `structure_settings`)."""

    def config_problems(self, config: TrainConfig, path: Path) -> list[tuple[Path, str]]:
        """What building this schedule over `training.steps` finds (see `lr_schedules`)."""
        from ..lr_schedules import schedule_problems

        return schedule_problems(config.lr_scheduler, self, config.training.steps, path)


@section
class ConstantWarmUpLRSettings(WarmupSettings):
    """ConstantWarmUpLR: warm-up, then `learning_rate`."""


@section
class LinearWithWarmUpLRSettings(WarmupSettings):
    """LinearWithWarmUpLR: warm-up, then linear to 0 at total_steps."""


@section
class CosineWithWarmUpLRSettings(WarmupSettings):
    """CosineWithWarmUpLR: warm-up, then cosine from learning_rate to lr_end."""

    key_hints: ClassVar[dict[str, str]] = {
        "min_lr": "MindFormers schedules have no min_lr; the floor is lr_end"}

    warmup_steps: int | None = setting(0, "Warm-up steps.", ge=0)
    num_cycles: float = setting(0.5, "Cosine waves over the decay; 0.5 is one half-wave down.",
                                ge=0)
    lr_end: float = setting(0.0, "Rate the cosine ends at.", ge=0)
    decay_steps: int | None = setting(
        None, "Step from which the rate is lr_end; defaults to total_steps.", ge=0)
    decay_ratio: float | None = setting(
        None, "decay_steps as a fraction of total_steps; overrides decay_steps.", ge=0, le=1)


@section
class CosineWithRestartsAndWarmUpLRSettings(WarmupSettings):
    """CosineWithRestartsAndWarmUpLR: warm-up, then num_cycles cosine half-waves, each
    restarting at learning_rate."""

    key_hints: ClassVar[dict[str, str]] = {
        "min_lr": "MindFormers schedules have no min_lr; the floor is lr_end"}

    num_cycles: float = setting(1.0, "Half-waves (restarts) over the decay.", ge=0)
    lr_end: float = setting(0.0, "Rate each half-wave ends at.", ge=0)
    decay_steps: int | None = setting(
        None, "Step from which the rate is lr_end; defaults to total_steps.", ge=0)


@section
class PolynomialWithWarmUpLRSettings(WarmupSettings):
    """PolynomialWithWarmUpLR: warm-up, then `(1 - progress) ** power` down to lr_end."""

    key_hints: ClassVar[dict[str, str]] = {
        "min_lr": "MindFormers schedules have no min_lr; the floor is lr_end"}

    lr_end: float = setting(1e-7, "Rate the decay ends at; must be below learning_rate.", ge=0)
    power: float = setting(1.0, "Exponent of the decay; 1 is linear.", gt=0)
    decay_steps: int | None = setting(
        None, "Length of the decay; defaults to total_steps - warmup_steps.", ge=0)


@section
class WarmUpStableDecayLRSettings(WarmupSettings):
    """WarmUpStableDecayLR: warm-up, learning_rate until decay_start_steps, then linear to
    lr_end at total_steps."""

    key_hints: ClassVar[dict[str, str]] = {
        "min_lr": "MindFormers schedules have no min_lr; the floor is lr_end"}

    lr_end: float = setting(1e-7, "Rate at total_steps; must be below learning_rate.", ge=0)
    decay_start_steps: int | None = setting(
        None, "Step the linear decay starts at; required unless decay_start_ratio is given.",
        ge=0)
    decay_start_ratio: float | None = setting(
        None, "decay_start_steps as a fraction of total_steps; overrides decay_start_steps.",
        ge=0, le=1)


@section
class ConstantWithCoolDownLRSettings(WarmupSettings):
    """ConstantWithCoolDownLR (DeepSeek-V3): warm-up, keep, cosine to lr_end1, hold lr_end1,
    then lr_end2."""

    key_hints: ClassVar[dict[str, str]] = {
        "min_lr": "MindFormers schedules have no min_lr; the floor is lr_end1"}

    keep_steps: int = setting(0, "Steps at learning_rate after the warm-up.", ge=0)
    decay_steps: int | None = setting(
        None, "Steps of the cosine decay; required unless decay_ratio is given.", ge=0)
    decay_ratio: float | None = setting(
        None, "decay_steps as a fraction of total_steps; overrides decay_steps.", ge=0, le=1)
    num_cycles: float = setting(0.5, "Cosine waves over the decay; 0.5 is one half-wave down.",
                                ge=0)
    lr_end1: float = setting(0.0, "Rate the cosine ends at, held for final_steps.", ge=0)
    final_steps: int = setting(0, "Steps at lr_end1 after the decay.", ge=0)
    lr_end2: float | None = setting(None, "Rate after final_steps; defaults to lr_end1.", ge=0)
