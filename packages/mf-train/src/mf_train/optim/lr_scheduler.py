"""The `lr_scheduler` section -> an `LrSchedule` (`mf_train.optim.lr_schedules`) over the run's
steps.

The schedule class comes from the `LR_SCHEDULERS` registry; its keys are its `Settings`
(`mf_train.settings.lr_schedules`, which `mf-config validate` checks too), structured and
checked here, with every problem a `ConfigError` at `lr_scheduler.<key>`.
"""

from __future__ import annotations

from typing import Any

from mf_config import LrSchedulerConfig
from mf_config.component_settings import settings_error, structure_settings
from mf_config.sections import declared_fields
from mf_config.yaml_source import Source

from ..registry import LR_SCHEDULERS
from .lr_schedules import PATH, ConstantLR, LrSchedule, SettingProblems


def build_lr_schedule(config: LrSchedulerConfig, total_steps: int,
                      source: Source | None = None) -> LrSchedule:
    """The learning-rate schedule of a run (`type: null` is the constant `learning_rate`).

    Args:
        config: the `lr_scheduler` section.
        total_steps: `training.steps` (a `total_steps` key under `lr_scheduler` overrides it).
        source: the YAML source, for error lines.

    Returns:
        The schedule: `schedule(step)` is the rate of the update after `step` updates.

    Raises:
        ConfigError: naming `lr_scheduler.<key>` of every problem.
    """
    if type(total_steps) is not int or total_steps < 1:
        raise ValueError(f"total_steps (training.steps) must be a positive integer, got "
                         f"{total_steps!r}")
    if config.type is None:
        _reject_keys_without_type(config, source)
        return ConstantLR(config.learning_rate)
    cls = LR_SCHEDULERS.get(config.type, (*PATH, "type"), source)
    settings_class = getattr(cls, "Settings", None)
    if settings_class is None:
        raise settings_error([((*PATH, "type"), f"{config.type!r} is not an mf learning-rate "
                                                "schedule: it declares no Settings class")],
                             source)
    settings = structure_settings(settings_class, config.extras, PATH, source,
                                  owner=f"learning-rate scheduler type {config.type!r}",
                                  also_allowed=declared_fields(LrSchedulerConfig))
    length = _schedule_length(settings, total_steps)
    try:
        return cls(config.learning_rate, settings, length)
    except SettingProblems as exc:
        raise settings_error([((*PATH, key), message) for key, message in exc.found],
                             source) from None


def _reject_keys_without_type(config: LrSchedulerConfig, source: Source | None) -> None:
    """Keys for a schedule while `type` is null would be ignored silently: refuse them."""
    if not config.extras:
        return
    message = (f"is a scheduler key, but lr_scheduler.type is null (a constant "
               f"learning_rate); set type to one of {', '.join(LR_SCHEDULERS.names())}, or "
               "remove the key")
    raise settings_error([((*PATH, key), message) for key in config.extras], source)


def _schedule_length(settings: Any, total_steps: int) -> int:
    """`lr_scheduler.total_steps` when written, else the trainer's `training.steps` (a
    schedule shorter than the run is warned about when the file is validated)."""
    written = getattr(settings, "total_steps", None)
    return total_steps if written is None else written
