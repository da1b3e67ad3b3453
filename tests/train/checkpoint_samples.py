"""Sample checkpoints for the checkpoint tests (test_checkpoint.py, test_checkpoint_modes.py):
the model and optimizer arrays, run progress and checkpoint settings of a small saved step;
and a saved checkpoint turned into an earlier format (`as_format_2`)."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import numpy as np
from safetensors.numpy import load_file, save_file

from mf_config import CheckpointConfig
from mf_train.checkpoint import CheckpointManager, RunProgress
from mf_train.checkpoint.layout import FORMAT
from mf_train.checkpoint.pieces import Piece

SHAPES = {"embed.weight": (10, 4), "layers.0.mlp.down.weight": (4, 6), "norm.weight": (4,)}
"""The sample model's parameter names and shapes."""


def config(root: Path, **overrides) -> CheckpointConfig:
    """Checkpoint settings saving under `root`, with `overrides`."""
    return CheckpointConfig(save_path=str(root), **overrides)


def arrays(seed: int) -> dict[str, np.ndarray]:
    """Model arrays of `SHAPES` drawn from `seed`, with a -0.0 and a subnormal in
    norm.weight (a state with a NaN is never saved)."""
    rng = np.random.default_rng(seed)
    values = {name: rng.standard_normal(shape).astype(np.float32)
              for name, shape in SHAPES.items()}
    values["norm.weight"][:2] = [-0.0, np.float32(1e-45)]  # bit patterns a cast could change
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


def as_format_2(saved: Path, copy: Path, world_size: int | None = None) -> Path:
    """A copy at `copy` of the one-process checkpoint directory `saved` as an earlier mf
    wrote it (format 2: each rank's file holding its tensors in their shapes under plain
    names; no piece index; no configuration). `world_size` overrides the one `common.json`
    records."""
    shutil.copytree(saved, copy)
    common = json.loads((copy / "common.json").read_text())
    assert common["world_size"] == 1 and common["version"] == 3
    files = {}
    for name, entry in common["files"].items():
        path = copy / name
        if "pieces" in entry:
            flat = load_file(str(path))
            shaped = {}
            for record in entry["pieces"]:
                piece = Piece.from_record(record)
                assert piece.whole and piece.tensor is None
                shaped[piece.name] = flat[piece.key].reshape(piece.shape)
            save_file(shaped, str(path), metadata={"format": FORMAT})
        files[name] = {"bytes": path.stat().st_size,
                       "sha256": hashlib.sha256(path.read_bytes()).hexdigest()}
    common.update(version=2, files=files, world_size=world_size or 1)
    del common["config"], common["sha256"]  # an earlier mf saved no configuration, nor
    # the SHA-256 of common.json's own content
    (copy / "config.yaml").unlink()
    (copy / "common.json").write_text(json.dumps(common))
    return copy
