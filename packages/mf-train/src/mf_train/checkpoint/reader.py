"""Loading mf checkpoints, and resuming from `checkpoint.load_path`."""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
from safetensors.numpy import load

from mf_config import CheckpointConfig
from mf_config.component_settings import settings_error
from mf_config.yaml_source import Source

from . import layout
from .atomic import bytes_digest
from .errors import CheckpointError, CorruptCheckpointError
from .hf import HFCheckpoint, is_hf_checkpoint
from .pieces import PieceIndex, verify_share
from .progress import RunProgress
from .reading import read_files

LOG = logging.getLogger(__name__)

_NO_OPTIMIZER = ("no_load_optim is False but no optimizer checkpoint found in {directory}. It "
                 "was saved with checkpoint.no_save_optim: True; set "
                 "checkpoint.no_load_optim: True to load the weights only (the run then does "
                 "not resume exactly).")


class LoadedCheckpoint(NamedTuple):
    """One rank's part of a checkpoint; unpacks as `(model_params, optimizer_state, state)`."""

    model_params: dict[str, np.ndarray]
    optimizer_state: dict[str, np.ndarray] | None
    state: RunProgress


class Resumed(NamedTuple):
    """What `checkpoint.load_path` gave: a sharded mf checkpoint (`kind == "pieces"`: the
    model's and, unless `no_load_optim`, the optimizer's `PieceIndex`, each rank reading
    what it holds; run state, with this rank's generator states when the world size is the
    saving run's), an mf checkpoint of format 1 or 2 (`kind == "mf"`: this rank's arrays
    under mf's parameter names, optimizer state unless `no_load_optim`, run state) or Hugging
    Face weights (`kind == "hf"`: the checkpoint opened for `load_hf_state` to read each
    rank's slices from, to be closed after; no optimizer state, no run state)."""

    path: Path
    kind: str
    model_params: dict[str, np.ndarray] | HFCheckpoint | PieceIndex
    optimizer_state: dict[str, np.ndarray] | PieceIndex | None
    state: RunProgress | None


def load_checkpoint(path: str | os.PathLike[str], rank: int = 0, *,
                    load_optimizer: bool = True, world_size: int | None = None,
                    workers: int = 1) -> LoadedCheckpoint:
    """Rank `rank`'s arrays and the run state of the checkpoint at `path` (an
    `iteration_XXXXXXXX` directory, or a save root: its newest complete checkpoint).
    `world_size`, when given, must equal the saving run's (no resharding). The model and
    optimizer files are read `workers` at a time (`checkpoint.load_worker_number`); each file
    read must match the SHA-256 `common.json` records (`CorruptCheckpointError` otherwise).
    A sharded checkpoint (format 3) gives every tensor whole, as one process holds it
    (tensors split by tensor parallelism: `load_pieces`)."""
    directory = layout.find_checkpoint(path)
    if directory is None:
        raise CheckpointError(f"{path} holds no complete checkpoint")
    common = layout.read_common(directory)
    recorded = {name: layout.recorded(entry) for name, entry in common.get("files", {}).items()}
    saved_world = int(common.get("world_size", 1))
    sharded = int(common.get("version", 1)) >= layout.SHARDED_VERSION
    if world_size is not None and world_size != saved_world and not sharded:
        raise CheckpointError(
            f"{directory} was saved by {saved_world} rank(s) in format 2 (an earlier mf's), "
            f"which loads only on the layout that saved it; this run has {world_size}: "
            f"{conversion(directory, common)}")
    if not 0 <= rank < saved_world:
        raise CheckpointError(f"{directory} was saved by {saved_world} rank(s); it has no "
                              f"files for rank {rank}")
    prefix = str(common.get("prefix", ""))
    if sharded:
        return _whole_arrays(directory, common, rank, load_optimizer)

    def file(kind: str) -> tuple[Path, str | None]:
        name = layout.rank_file(prefix, kind, rank, saved_world)
        return directory / name, recorded.get(name, (0, None))[1]

    arrays = [file("model")]
    if load_optimizer:
        if not common.get("has_optimizer") or not file("opt")[0].is_file():
            raise CheckpointError(_NO_OPTIMIZER.format(directory=directory))
        arrays.append(file("opt"))
    model, *optimizer = read_files(lambda item: _read_arrays(*item), arrays, workers)
    rng = _read_json(*file("rng"))
    state = RunProgress.from_common(common, rng, str(directory / layout.COMMON))
    return LoadedCheckpoint(model, optimizer[0] if optimizer else None, state)


def conversion(directory: Path, common: dict[str, Any]) -> str:
    """How to turn a format-2 checkpoint into one that loads on any layout: `convert it on its
    layout, training nothing: `mf-train ... --set training.steps=S` saves step S in ...`."""
    step, world = int(common.get("global_step", 0)), int(common.get("world_size", 1))
    return (f"convert it on its layout, training nothing: `mf-train --config <its train.yaml> "
            f"--nproc {world} --output-dir <new directory> --set checkpoint.load_path="
            f"{directory} --set training.steps={step}` saves step {step} in the format that "
            "loads on any layout")


def resume(config: CheckpointConfig, rank: int = 0, world_size: int = 1,
           source: Source | None = None,
           agree: Callable[[bool], bool] | None = None) -> Resumed | None:
    """What `checkpoint.load_path` designates for this rank, or None when it is empty (start
    from scratch) or a directory without any complete checkpoint yet (with a warning).
    Respects `no_load_optim`; a missing path is a `ConfigError` at `checkpoint.load_path`.

    A save root falls back from a corrupt checkpoint (a file whose bytes do not match its
    recorded SHA-256) to the next newest complete one, with a warning. Every rank must make
    the same choice though each reads only its own files: `agree(ok)` returns whether every
    rank's read went well (an all-reduce; the identity on one process)."""
    if not config.load_path:
        return None
    path = Path(config.load_path)
    if not path.exists():
        raise settings_error([(("checkpoint", "load_path"),
                               f"{path} does not exist")], source)
    if is_hf_checkpoint(path):
        return _hf_weights(path, config, source)
    directory = layout.find_checkpoint(path)
    if directory is None:
        LOG.warning("checkpoint.load_path %s holds no complete checkpoint yet; training starts "
                    "from scratch", path)
        return None
    tries = [directory] if directory == path else layout.candidates(path)
    for candidate in tries:
        loaded, corrupt = _load_agreed(candidate, config, rank, world_size, agree)
        if loaded is not None:
            return Resumed(candidate, "pieces" if _sharded(candidate) else "mf", *loaded)
        if candidate == path:  # the one the user named: no other to fall back to
            raise corrupt or CorruptCheckpointError(f"{candidate} is corrupt on another rank")
        LOG.warning("%s is corrupt (%s): it is not resumed; trying the next newest complete "
                    "checkpoint", candidate, corrupt or "on another rank")
    raise CheckpointError(f"{path}: every complete checkpoint is corrupt; nothing to resume "
                          "from")


def load_pieces(directory: Path, rank: int, world_size: int, load_optimizer: bool,
                ) -> tuple[PieceIndex, PieceIndex | None, RunProgress]:
    """A sharded checkpoint opened for one rank of a run of `world_size` ranks (any layout):
    the model's and optimizer's indexes and the run state. This rank checks the SHA-256 of
    its share of the files (`verify_share`: together the ranks check each once); its
    generator states come back only when the world size is the saving run's.

    Raises:
        CorruptCheckpointError: a file of this rank's share is damaged.
        CheckpointError: the optimizer state is wanted and was not saved.
    """
    common = layout.read_common(directory)
    verify_share(directory, common, rank, world_size)
    if load_optimizer and not common.get("has_optimizer"):
        raise CheckpointError(_NO_OPTIMIZER.format(directory=directory))
    saved_world = int(common.get("world_size", 1))
    rng = None
    if saved_world == world_size:
        name = layout.rank_file(str(common.get("prefix", "")), "rng", rank, saved_world)
        rng = _read_json(directory / name, layout.recorded(common["files"][name])[1]
                         if name in common.get("files", {}) else None)
    state = RunProgress.from_common(common, rng, str(directory / layout.COMMON))
    model = PieceIndex(directory, common, "model", verify=False)
    optimizer = PieceIndex(directory, common, "opt", verify=False) if load_optimizer else None
    return model, optimizer, state


def _whole_arrays(directory: Path, common: dict[str, Any], rank: int,
                  load_optimizer: bool) -> LoadedCheckpoint:
    """Every tensor of a sharded checkpoint whole (`load_checkpoint`)."""
    model, optimizer, state = load_pieces(directory, 0, 1, load_optimizer)
    arrays = []
    for index in (model, optimizer):
        if index is None:
            arrays.append(None)
            continue
        if index.degree is not None:
            raise CheckpointError(f"{directory}: saved split over tensor_parallel "
                                  f"{index.degree}; read it with load_pieces, per tensor "
                                  "place")
        with index:
            arrays.append({name: index.read_whole(name) for name in sorted(index.names())})
    saved_world = int(common.get("world_size", 1))
    name = layout.rank_file(str(common.get("prefix", "")), "rng", rank, saved_world)
    rng = _read_json(directory / name) if 0 <= rank < saved_world else None
    return LoadedCheckpoint(arrays[0], arrays[1], state.with_rng(rng))


def _hf_weights(path: Path, config: CheckpointConfig, source: Source | None) -> Resumed:
    """Hugging Face weights to start from; resuming from them (`no_load_optim: False`) is
    refused: they carry no optimizer state or run progress."""
    if not config.no_load_optim:
        raise settings_error([(("checkpoint", "no_load_optim"),
                               "Resume training (no_load_optim=False) is not supported for "
                               f"HuggingFace checkpoints ({path}); set no_load_optim: True "
                               "to load its weights only")], source)
    return Resumed(path, "hf", HFCheckpoint(path), None, None)


def _load_agreed(directory: Path, config: CheckpointConfig, rank: int, world_size: int,
                 agree: Callable[[bool], bool] | None,
                 ) -> tuple[tuple[Any, Any, RunProgress] | None, CorruptCheckpointError | None]:
    """This rank's part of `directory` (`load_pieces` or `load_checkpoint`), or
    (None, why) when any rank found it corrupt."""
    loaded, corrupt = None, None
    try:
        if _sharded(directory):
            loaded = load_pieces(directory, rank, world_size, not config.no_load_optim)
        else:
            loaded = load_checkpoint(directory, rank, load_optimizer=not config.no_load_optim,
                                     world_size=world_size, workers=config.load_worker_number)
    except CorruptCheckpointError as exc:
        corrupt = exc
    everyone = agree(corrupt is None) if agree is not None else corrupt is None
    return (loaded, None) if everyone else (None, corrupt)


def _sharded(directory: Path) -> bool:
    """Whether the checkpoint stores pieces (format 3), loadable onto any layout."""
    return int(layout.read_common(directory).get("version", 1)) >= layout.SHARDED_VERSION


def _read_verified(path: Path, sha256: str | None) -> bytes:
    """The bytes of `path`, checked against the SHA-256 `common.json` records for it."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise CheckpointError(f"{path}: missing") from None
    except OSError as exc:
        raise CheckpointError(f"{path}: cannot be read ({exc.strerror or exc})") from None
    if sha256 is not None and bytes_digest(data) != sha256:
        raise CorruptCheckpointError(f"{path}: its bytes do not match the SHA-256 recorded in "
                                     f"{layout.COMMON} (damaged after it was written)")
    return data


def _read_arrays(path: Path, sha256: str | None = None) -> dict[str, np.ndarray]:
    data = _read_verified(path, sha256)
    try:
        return load(data)
    except Exception as exc:  # safetensors' own error types: re-raised naming the file
        raise CheckpointError(f"{path}: cannot read it as safetensors ({exc})") from None


def _read_json(path: Path, sha256: str | None = None) -> Any:
    data = _read_verified(path, sha256)
    try:
        return json.loads(data.decode("utf-8"))
    except ValueError as exc:
        raise CheckpointError(f"{path}: cannot read it as JSON ({exc})") from None
