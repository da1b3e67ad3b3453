"""The one interface the training step, the checkpoints and the logs use of an optimizer.

Two kinds implement it: `base.ParameterOptimizer` (AdamW, Muon) updates each parameter whole
from its whole gradient, and `sharded_adamw.ShardedAdamW` updates this rank's slice of the
parameters from its slice of the gradient (ZeRO and FSDP). Which gradients an optimizer takes
is the step layout's business (`mf_train.layouts`): the layout reduces the local gradients to
what its optimizer updates, takes their global norm and calls `step` with the live learning
rate and the clip coefficient. The norm lives with the layout because it depends on how the
gradients are spread over ranks (whole, split over the tensor group, sliced over the shard
group), not on the update rule.

The clip coefficient and the skip decision (`keep`) are tensors on the device: an update
neither reads them back nor branches on them. A step that is not kept runs the same kernels
with arguments that leave every parameter and state element as it was (the gradient zeroed,
so that a non-finite one cannot reach the state; a zero learning rate; moment decays of 1),
and the caller, once it has read that the step was skipped, takes the count back (`uncount`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import mindspore as ms
import numpy as np
from mindspore import Parameter, Tensor, ops

from ..checkpoint.pieces import Piece, whole_piece
from ..checkpoint.regions import RankRegions, refuse

FLOAT32 = ms.float32
STEP_KEY = "global_step"
"""The state-dict key of the update count (MindFormers' name)."""


class Optimizer(Protocol):
    """What every mf optimizer offers; see the module docstring."""

    names: list[str]
    """The names of the model's trainable parameters, in the order of their gradients."""
    params: list[Parameter]
    """Those parameters."""
    global_step: int
    """Updates done so far."""

    def step(self, grads: Sequence[Tensor], lr: float, clip: float | Tensor = 1.0,
             keep: Tensor | None = None) -> None:
        """One update from the reduced gradients of what this optimizer updates; counted.

        Args:
            grads: whole gradients aligned with `params`, or this rank's gradient slices.
            lr: the learning rate of this update (the schedule's, read every step).
            clip: the clip coefficient the gradients are scaled by (1: unclipped; a 0-d
                tensor from `gradient_norm.clip_coefficient`).
            keep: a 0-d bool tensor, whether the update applies (None: it does); where it
                is false every parameter and state element stays as it was.
        """
        ...

    def uncount(self) -> None:
        """Take back the count of the last `step`: its `keep` was false (the caller read
        it after the step)."""
        ...

    def state_dict(self) -> dict[str, np.ndarray]:
        """Copies of the update count, float32 masters and moments, for a checkpoint."""
        ...

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore `state_dict()`'s arrays.

        Raises:
            OptimizerStateError: before anything changes, when the state does not fit.
        """
        ...

    def reload_main_params_from_model(self) -> None:
        """Take the float32 masters from the model after weights were loaded into it."""
        ...

    def state_pieces(self, regions: RankRegions, count: bool = True) -> dict[Any, Any]:
        """What this rank writes of the state in a sharded checkpoint
        (`checkpoint.regions.pieces`): each state tensor under the model-wide key one process
        gives it (`adam_m.<name>`), as the region of it this rank owns; with `count`, the
        update count on the rank that writes scalars."""
        ...

    def load_state_pieces(self, index: Any, model: Any, regions: RankRegions) -> None:
        """Restore the state from a sharded checkpoint's optimizer pieces (`index`), reading
        only what this rank holds, whatever layout saved them; the float32 masters from the
        model's pieces (`model`) when the saving run kept none (float32 parameters).

        Raises:
            OptimizerStateError: before anything changes, when the state does not fit.
        """
        ...

    def groups_summary(self) -> dict[str, list[str]]:
        """Parameter names by group (weight decay, and Muon/AdamW for Muon), for the log."""
        ...


class OptimizerStateError(ValueError):
    """A state dict that does not fit this optimizer (missing, extra or mis-shaped keys)."""


def counted(pieces: dict[Piece, Any], step: int, regions: RankRegions,
            count: bool = True) -> dict[Piece, Any]:
    """`pieces` with the update count `step` where this rank writes scalars (and `count`)."""
    if count and regions.writes_scalars:
        pieces[whole_piece(STEP_KEY, (1,))] = np.array([step], np.int64)
    return pieces


def read_count(index: Any, problems: list[str], optimizer: str) -> int:
    """The update count a checkpoint's optimizer pieces (`index`) hold, once `problems`
    (what they lack of the state, `checkpoint.regions.check`) are none.

    Raises:
        OptimizerStateError: naming every problem, the count's included.
    """
    step = index.read_whole(STEP_KEY).reshape(-1) if index.has(STEP_KEY) else None
    if step is None:
        problems = [f"{STEP_KEY}: missing", *problems]
    elif step.size != 1 or not np.issubdtype(step.dtype, np.integer) or step[0] < 0:
        problems = [f"{STEP_KEY}: expected one integer >= 0, got {step.dtype} of shape "
                    f"{step.shape}", *problems]
    refuse(problems, f"{optimizer} state does not fit {index.directory} (saved by another "
           "optimizer?)", OptimizerStateError)
    return int(step[0])


def checked_lr(lr: float) -> float:
    """`lr` as a float; `ValueError` unless it is finite and >= 0."""
    value = float(lr)
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"learning rate must be a finite number >= 0, got {lr!r}")
    return value


def gated(value: float, keep: Tensor | None, otherwise: float) -> float | Tensor:
    """An update's argument: `value`, or with `keep`, a 0-d float32 tensor that is `value`
    where the update applies and `otherwise` (the argument that changes nothing) where not."""
    if keep is None:
        return value
    return ops.select(keep, Tensor(value, FLOAT32), Tensor(otherwise, FLOAT32))


def update_gradient(grad: Tensor, clip: float | Tensor, keep: Tensor | None) -> Tensor:
    """`grad` in float32, times the clip coefficient, and zero where the update does not
    apply (a skipped step's gradient may hold infinities or NaNs)."""
    if grad.dtype != FLOAT32:
        grad = ops.cast(grad, FLOAT32)
    if isinstance(clip, Tensor) or clip != 1.0:
        grad = grad * clip
    if keep is not None:
        grad = ops.masked_fill(grad, ops.logical_not(keep), 0.0)
    return grad
