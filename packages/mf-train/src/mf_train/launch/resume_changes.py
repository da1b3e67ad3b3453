"""What a resumed run changes from the run that saved its checkpoint.

Every checkpoint holds the effective configuration of the run that saved it (`config.yaml`,
`checkpoint.layout.RUN_CONFIG`). A run that resumes one compares its own effective
configuration with it, setting by setting, before any rank starts:

- a change to the `model` section is refused, listing every difference: the saved weights
  and optimizer state have the saved model's shape and meaning;
- every other change (steps, schedule, data, logging, compile, the parallel layout: a
  checkpoint loads onto any layout) applies from the resumed step, and is listed in one
  warning; a new `training.steps` that the learning-rate schedule follows says that the
  schedule is stretched (or shrunk) and from which step the rates differ.

The paths the launcher itself decides (`checkpoint.load_path`, `checkpoint.save_path`) are
not compared. A checkpoint without a saved configuration (an earlier mf's, or Hugging Face
weights) is not compared. No MindSpore here.
"""

from __future__ import annotations

from typing import Any

import attrs

from mf_config import ConfigError, TrainConfig
from mf_config.validate import config_from_source
from mf_config.yaml_source import load_text

from ..checkpoint import layout
from ..checkpoint.errors import CheckpointError

NOT_COMPARED = frozenset({"checkpoint.load_path", "checkpoint.save_path"})
REFUSED = ("model.",)
"""Settings a resumed run cannot change."""


@attrs.frozen
class Changes:
    """The differences from the saved run, as `path: saved -> now` lines.

    Attributes:
        directory: the checkpoint directory resumed.
        refused: changes that cannot apply (empty: the run may resume).
        applied: changes that apply from the resumed step.
        step: the step the checkpoint holds.
    """

    directory: str
    refused: tuple[str, ...]
    applied: tuple[str, ...]
    step: int

    def refusal(self) -> str:
        return (f"{self.directory} was saved by a run with another model; a resumed run cannot "
                "change it (" + "; ".join(self.refused) + "): resume with the saved model "
                f"settings ({self.directory}/{layout.RUN_CONFIG} has them), or start a new run")

    def warning(self) -> str:
        return (f"resuming {self.directory} at step {self.step} with settings changed from the "
                "run that saved it, applied from here: " + "; ".join(self.applied))


def changes(config: TrainConfig, load_path: str | None) -> Changes | None:
    """The differences between `config` and the configuration saved with the checkpoint
    `load_path` designates; None when there is nothing to compare with (no checkpoint to
    load, none found there yet, Hugging Face weights, no saved configuration) or nothing
    changed."""
    if not load_path:
        return None
    try:
        directory = layout.find_checkpoint(load_path)
        if directory is None:
            return None
        common = layout.read_common(directory)
        text = layout.read_run_config(directory, common)
    except (CheckpointError, OSError):
        return None  # the trainer's load reports what is wrong with it
    if text is None:
        return None
    try:
        saved = config_from_source(load_text(text, str(directory / layout.RUN_CONFIG)))
    except ConfigError:
        return None  # saved by another version of mf-config: nothing reliable to compare
    old, new = _flat(saved.to_dict()), _flat(config.to_dict())
    differences = sorted(key for key in old.keys() | new.keys()
                         if key not in NOT_COMPARED and old.get(key) != new.get(key))
    if not differences:
        return None
    step = int(common.get("global_step", 0))
    lines = {key: f"{key}: {_shown(old.get(key))} -> {_shown(new.get(key))}"
             for key in differences}
    if "training.steps" in lines and "lr_scheduler.total_steps" not in new:
        lines["training.steps"] += (
            f" (the learning-rate schedule follows training.steps: it is now "
            f"{new['training.steps']} steps long, so the rates from step {step + 1} on differ "
            "from the saved run's)")
    refused = tuple(lines[key] for key in differences if key.startswith(REFUSED))
    applied = tuple(lines[key] for key in differences if not key.startswith(REFUSED))
    return Changes(str(directory), refused, applied, step)


def _flat(data: Any, prefix: str = "") -> dict[str, Any]:
    """`{"a": {"b": 1}}` as `{"a.b": 1}` (lists kept whole)."""
    if not isinstance(data, dict):
        return {prefix: data}
    flat: dict[str, Any] = {}
    for key, value in data.items():
        flat.update(_flat(value, f"{prefix}{key}." if isinstance(value, dict) and value
                          else f"{prefix}{key}"))
    return flat


def _shown(value: Any) -> str:
    return "(unset)" if value is None else repr(value)
