"""Loading mf checkpoints, and resuming from `checkpoint.load_path`."""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
from safetensors.numpy import load_file

from mf_config import CheckpointConfig
from mf_config.component_settings import settings_error
from mf_config.yaml_source import Source

from . import layout
from .errors import CheckpointError
from .hf import is_hf_checkpoint, load_hf_weights
from .reading import read_files
from .state import TrainState


class LoadedCheckpoint(NamedTuple):
    """One rank's part of a checkpoint; unpacks as `(model_params, optimizer_state, state)`."""

    model_params: dict[str, np.ndarray]
    optimizer_state: dict[str, np.ndarray] | None
    state: TrainState


class Resumed(NamedTuple):
    """What `checkpoint.load_path` gave: an mf checkpoint (`kind == "mf"`: arrays under mf's
    parameter names, optimizer state unless `no_load_optim`, run state) or Hugging Face
    weights (`kind == "hf"`: arrays under HF names for `load_hf_state`; no optimizer state,
    no run state)."""

    path: Path
    kind: str
    model_params: dict[str, np.ndarray]
    optimizer_state: dict[str, np.ndarray] | None
    state: TrainState | None


def load_checkpoint(path: str | os.PathLike[str], rank: int = 0, *,
                    load_optimizer: bool = True, world_size: int | None = None,
                    workers: int = 1) -> LoadedCheckpoint:
    """Rank `rank`'s arrays and the run state of the checkpoint at `path` (an
    `iteration_XXXXXXXX` directory, or a save root: its newest complete checkpoint).
    `world_size`, when given, must equal the saving run's (no resharding). The model and
    optimizer files are read `workers` at a time (`checkpoint.load_worker_number`)."""
    directory = layout.find_checkpoint(path)
    if directory is None:
        raise CheckpointError(f"{path} holds no complete checkpoint")
    common = layout.read_common(directory)
    saved_world = int(common.get("world_size", 1))
    if world_size is not None and world_size != saved_world:
        raise CheckpointError(f"{directory} was saved by {saved_world} rank(s); this run has "
                              f"{world_size} (loading onto another world size is not supported)")
    if not 0 <= rank < saved_world:
        raise CheckpointError(f"{directory} was saved by {saved_world} rank(s); it has no "
                              f"files for rank {rank}")
    prefix = str(common.get("prefix", ""))

    def file(kind: str) -> Path:
        return directory / layout.rank_file(prefix, kind, rank, saved_world)

    arrays = [file("model")]
    if load_optimizer:
        if not common.get("has_optimizer") or not file("opt").is_file():
            raise CheckpointError(
                f"no_load_optim is False but no optimizer checkpoint found in {directory}. "
                "It was saved with checkpoint.no_save_optim: True; set checkpoint.no_load_optim: "
                "True to load the weights only (the run then does not resume exactly).")
        arrays.append(file("opt"))
    model, *optimizer = read_files(_read_arrays, arrays, workers)
    rng = _read_json(file("rng"))
    state = TrainState.from_common(common, rng, str(directory / layout.COMMON))
    return LoadedCheckpoint(model, optimizer[0] if optimizer else None, state)


def resume(config: CheckpointConfig, rank: int = 0, world_size: int = 1,
           source: Source | None = None) -> Resumed | None:
    """What `checkpoint.load_path` designates for this rank, or None when it is empty (start
    from scratch) or a directory without any complete checkpoint yet (with a warning).
    Respects `no_load_optim`; a missing path is a `ConfigError` at `checkpoint.load_path`."""
    if not config.load_path:
        return None
    path = Path(config.load_path)
    if not path.exists():
        raise settings_error([(("checkpoint", "load_path"),
                               f"{path} does not exist")], source)
    if is_hf_checkpoint(path):
        if not config.no_load_optim:
            raise settings_error([(("checkpoint", "no_load_optim"),
                                   "Resume training (no_load_optim=False) is not supported for "
                                   f"HuggingFace checkpoints ({path}); set no_load_optim: True "
                                   "to load its weights only")], source)
        return Resumed(path, "hf", load_hf_weights(path, config.load_worker_number), None,
                       None)
    directory = layout.find_checkpoint(path)
    if directory is None:
        warnings.warn(f"checkpoint.load_path {path} holds no complete checkpoint yet; "
                      "training starts from scratch", RuntimeWarning, stacklevel=2)
        return None
    loaded = load_checkpoint(directory, rank, load_optimizer=not config.no_load_optim,
                             world_size=world_size, workers=config.load_worker_number)
    return Resumed(directory, "mf", *loaded)


def _read_arrays(path: Path) -> dict[str, np.ndarray]:
    if not path.is_file():
        raise CheckpointError(f"{path}: missing")
    try:
        return load_file(str(path))
    except Exception as exc:  # safetensors' own error types: re-raised naming the file
        raise CheckpointError(f"{path}: cannot read it as safetensors ({exc})") from None


def _read_json(path: Path) -> Any:
    if not path.is_file():
        raise CheckpointError(f"{path}: missing")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"{path}: cannot read it as JSON ({exc})") from None
