"""MindFormers' train_state monitor: this rank's losses and gradient norms of each step.

`monitor.train_state` (`TrainStateConfig`) switches four values on; the loop hands them over
during the step and `on_step_end` puts them into `record.extra`:

    local_loss   loss of micro-batch k on this rank           local_loss/micro{k}
    local_norm   L2 norm of a parameter's gradient from       local_norm/{name}/micro{k}
                 micro-batch k on this rank
    device_loss  this rank's loss of the step (its micro-     device_loss
                 batch losses combined, before the data-
                 parallel all-reduce)
    device_norm  L2 norm of a parameter's accumulated         device_norm/{name}
                 gradient on this rank (after the micro-
                 batches, before the data-parallel
                 reduction and clipping)

k counts micro-batches from 1, as in MindFormers' logs. `local_norm` and `device_norm` select
parameters: true = all, a string or a list of strings = the parameters whose name contains
one of them (MindFormers' substring filter), false / "" / [] = off. Under ZeRO or FSDP a
rank's gradient is its shard, so its norm is the shard's.

The values are per rank. Every rank logs its own as one JSON line
(`train_state step 3 rank 1: {...}`, logger `mf_train.monitor.train_state`, as MindFormers
logs them); rank 0's also reach metrics.jsonl and TensorBoard through `record.extra`.

What the loop calls (each is a cheap no-op when its switch is off, so it may call them
unconditionally; numbers may be floats, numpy scalars or 0-d tensors):

    for k, micro_batch in enumerate(micro_batches, start=1):
        loss, grads = ...                                  # this micro-batch's gradients
        train_state.record_local_loss(k, loss)             # the micro-batch's own loss
        train_state.record_local_norms(k, names, grads)
    train_state.record_device_loss(step_loss_on_this_rank)   # before the all-reduce
    train_state.record_device_norms(names, accumulated_grads)  # before the reduction

Norms are computed here (`grad_norms`), for the selected parameters only: numpy arrays in
float64, MindSpore tensors on their device in float32 (sum of squares). Tensors stay on the
device during the step and are read in `on_step_end`, after the step's update is queued
(nothing the monitor records makes the step wait: `mf_train.step.host_reads`).
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from mf_config import TrainStateConfig

from ..observe.callbacks import Callback, StepRecord, TrainContext

logger = logging.getLogger(__name__)


class NameFilter:
    """Which parameters a norm switch selects: all, those whose name contains one of the
    patterns, or none."""

    def __init__(self, setting: bool | str | list[str]):
        self.enabled, self.patterns = _parse(setting)

    def __call__(self, name: str) -> bool:
        if not self.enabled:
            return False
        return not self.patterns or any(pattern in name for pattern in self.patterns)

    def select(self, names: Sequence[str]) -> list[str]:
        return [name for name in names if self(name)]


def _parse(setting: bool | str | list[str]) -> tuple[bool, list[str]]:
    if isinstance(setting, bool):
        return setting, []
    patterns = [setting] if isinstance(setting, str) else list(setting)
    patterns = [pattern for pattern in patterns if pattern]
    return bool(patterns), patterns


class TrainStateMonitor(Callback):
    """Collects the train_state values of a step; see the module docstring."""

    def __init__(self, config: TrainStateConfig | None = None):
        config = config if config is not None else TrainStateConfig()
        self.local_loss = config.local_loss
        self.device_loss = config.device_loss
        self.local_norm = NameFilter(config.local_norm)
        self.device_norm = NameFilter(config.device_norm)
        self._values: dict[str, float] = {}

    @property
    def active(self) -> bool:
        return (self.local_loss or self.device_loss or self.local_norm.enabled
                or self.device_norm.enabled)

    def record_local_loss(self, micro_step: int, loss: Any) -> None:
        """The loss of micro-batch `micro_step` (1-based) on this rank."""
        if self.local_loss:
            self._values[f"local_loss/micro{_micro(micro_step)}"] = loss

    def record_local_norms(self, micro_step: int, names: Sequence[str],
                           grads: Sequence[Any]) -> None:
        """Norms of the gradients of micro-batch `micro_step` (1-based), for the parameters
        `local_norm` selects; `grads[i]` belongs to `names[i]` (None: no gradient)."""
        if not self.local_norm.enabled:
            return
        suffix = f"/micro{_micro(micro_step)}"
        for name, norm in grad_norms(names, grads, self.local_norm).items():
            self._values[f"local_norm/{name}{suffix}"] = norm

    def record_device_loss(self, loss: Any) -> None:
        """This rank's loss of the step."""
        if self.device_loss:
            self._values["device_loss"] = loss

    def record_device_norms(self, names: Sequence[str], grads: Sequence[Any]) -> None:
        """Norms of the accumulated gradients the update uses, for the parameters
        `device_norm` selects."""
        if not self.device_norm.enabled:
            return
        for name, norm in grad_norms(names, grads, self.device_norm).items():
            self._values[f"device_norm/{name}"] = norm

    def on_step_begin(self, ctx: TrainContext, step: int) -> None:
        self._values = {}

    def on_step_end(self, ctx: TrainContext, record: StepRecord) -> None:
        if not self._values:
            return
        values = {key: float(value) for key, value in self._values.items()}
        record.extra.update(values)
        logger.info("train_state step %d rank %d: %s", record.step, ctx.rank,
                    json.dumps({key: _rounded(value) for key, value in values.items()}))
        self._values = {}


def grad_norms(names: Sequence[str], grads: Sequence[Any],
               selected: NameFilter | None = None) -> dict[str, Any]:
    """`{name: L2 norm of its gradient}` (`grad_norm`) for the names `selected` accepts (all
    when None); a None gradient is left out."""
    if len(names) != len(grads):
        raise ValueError(f"grad_norms: {len(names)} parameter names but {len(grads)} gradients")
    return {name: grad_norm(grad) for name, grad in zip(names, grads, strict=True)
            if grad is not None and (selected is None or selected(name))}


def grad_norm(grad: Any) -> Any:
    """sqrt(sum(g**2)): a float64 float for numpy arrays; for MindSpore tensors, a 0-d
    float32 tensor on their device (`float()` reads it)."""
    if isinstance(grad, np.ndarray | np.generic):
        return float(np.sqrt(np.sum(np.square(grad, dtype=np.float64))))
    import mindspore as ms
    from mindspore import ops

    return ops.sqrt(ops.sum(ops.square(grad.astype(ms.float32))))


def _micro(micro_step: int) -> int:
    if micro_step < 1:
        raise ValueError(f"micro_step counts micro-batches from 1, got {micro_step}")
    return micro_step


def _rounded(value: float) -> float | str:
    return float(f"{value:.6g}") if math.isfinite(value) else str(value)
