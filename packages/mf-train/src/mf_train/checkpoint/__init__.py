"""Checkpoints: MindFormers' directory layout, written atomically (optionally in the
background), found and loaded with clear errors; plus Hugging Face safetensors reading.

Saving (one `CheckpointManager` per rank; each rank passes the pieces it owns, `pieces`)::

    manager = CheckpointManager(config.checkpoint, rank, world_size, barrier=barrier)
    if manager.should_save(step, last=step == total_steps):
        manager.save(step, model_pieces(layout, regions),
                     optimizer.state_pieces(regions), RunProgress(global_step=step, ...))
    ...
    manager.wait()                      # after the last step (async_save)

Resuming::

    resumed = resume(config.checkpoint, rank, world_size)
    if resumed and resumed.kind == "pieces":      # any layout's sharded checkpoint
        with resumed.model_params as model:
            load_model_pieces(layout, regions, model)
            with resumed.optimizer_state as state:
                optimizer.load_state_pieces(state, model, regions)
        restore_rng_state(resumed.state.rng)      # when the world size is the saver's
    elif resumed and resumed.kind == "mf":        # format 2: this rank's own files
        apply_model_params(model.parameters_and_names(), resumed.model_params)
        optimizer.load_state_dict(resumed.optimizer_state)
    elif resumed:                                 # Hugging Face weights, read slice by slice
        with resumed.model_params as weights:
            load_hf_state(model, weights)
        optimizer.reload_main_params_from_model()

The layout is described in `layout`, the pieces and reading by overlap in `pieces`, the
save protocol in `writer`, the dtype policy
(bfloat16 stored as float32) in `params`, what the RNG state covers in `rng`.
"""

from .errors import CheckpointError, CorruptCheckpointError
from .hf import HFCheckpoint, is_hf_checkpoint, load_hf_weights
from .layout import (
    candidates,
    check_complete,
    complete_iterations,
    find_checkpoint,
    read_tracker,
)
from .params import apply_model_params, host_array, model_arrays
from .progress import RunProgress
from .reader import LoadedCheckpoint, Resumed, load_checkpoint, resume
from .rng import capture_rng_state, restore_rng_state
from .writer import CheckpointManager

__all__ = [
    "CheckpointError",
    "CheckpointManager",
    "CorruptCheckpointError",
    "HFCheckpoint",
    "LoadedCheckpoint",
    "Resumed",
    "RunProgress",
    "apply_model_params",
    "candidates",
    "capture_rng_state",
    "check_complete",
    "complete_iterations",
    "find_checkpoint",
    "host_array",
    "is_hf_checkpoint",
    "load_checkpoint",
    "load_hf_weights",
    "model_arrays",
    "read_tracker",
    "restore_rng_state",
    "resume",
]
