"""Sample checkpoints for the checkpoint tests (test_checkpoint.py, test_checkpoint_modes.py):
the model and optimizer arrays, run progress and checkpoint settings of a small saved step."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from mf_config import CheckpointConfig
from mf_train.checkpoint import CheckpointManager, RunProgress

SHAPES = {"embed.weight": (10, 4), "layers.0.mlp.down.weight": (4, 6), "norm.weight": (4,)}
"""The sample model's parameter names and shapes."""


def config(root: Path, **overrides) -> CheckpointConfig:
    """Checkpoint settings saving under `root`, with `overrides`."""
    return CheckpointConfig(save_path=str(root), **overrides)


def arrays(seed: int) -> dict[str, np.ndarray]:
    """Model arrays of `SHAPES` drawn from `seed`, with a -0.0 and a NaN in norm.weight."""
    rng = np.random.default_rng(seed)
    values = {name: rng.standard_normal(shape).astype(np.float32)
              for name, shape in SHAPES.items()}
    values["norm.weight"][:2] = [-0.0, np.float32(np.nan)]  # bit patterns a cast could change
    return values


def optimizer_state(seed: int) -> dict[str, np.ndarray]:
    """An optimizer state of `SHAPES` (first moments and the global step) drawn from `seed`."""
    state = {f"adam_m.{name}": value * 0.5 for name, value in arrays(seed + 100).items()}
    state["global_step"] = np.array([seed], dtype=np.int64)
    return state


def train_state(step: int, rng: dict | None = None) -> RunProgress:
    """The run progress of step `step` (global batch 8, 100 steps per epoch)."""
    return RunProgress(global_step=step, consumed_samples=8 * step, global_batch_size=8,
                      step_num=100, rng=rng if rng is not None else {"python": step},
                      extra={"skipped_steps": 1})


def save(manager: CheckpointManager, step: int) -> None:
    """Save step `step`'s sample arrays, optimizer state and progress with `manager`."""
    manager.save(step, arrays(step), optimizer_state(step), train_state(step))
