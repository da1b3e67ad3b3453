"""The embedding's health: its local gradient norm each step, and a warning above a threshold.

A loss spike in a large run usually shows first in the embedding table's gradient (the rows of
rare tokens get huge updates). MindFormers' health check compares the embedding's local norm
with `monitor.health_checkpoint.embedding_local_norm_threshold`; here the norm is the L2 norm
of this rank's accumulated gradient of the embedding parameters (names containing `embed`),
before the data-parallel reduction and clipping, as `train_state`'s `device_norm` measures a
parameter. Every step it reaches metrics.jsonl and TensorBoard as `embedding_local_norm`; a
step above the threshold logs a warning naming the step, the norm and the threshold. The norm
is computed on the device during the step and read at its end (`on_step_end`).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from mf_config import HealthCheckpointConfig

from ..observe.callbacks import Callback, StepRecord, TrainContext
from .train_state import grad_norm

logger = logging.getLogger(__name__)
EMBEDDING = "embed"
"""What an embedding parameter's name contains (`embedding.weight`, `model.embed_tokens`)."""


class EmbeddingHealthMonitor(Callback):
    """Records the embedding's local gradient norm; warns when it exceeds the threshold."""

    def __init__(self, config: HealthCheckpointConfig | None = None):
        config = config if config is not None else HealthCheckpointConfig()
        self.threshold = config.embedding_local_norm_threshold
        self._norm: Any = None

    def record(self, names: Sequence[str], grads: Sequence[Any]) -> None:
        """This rank's accumulated gradients of the step (`grads[i]` of `names[i]`)."""
        squares = [grad_norm(grad) ** 2 for name, grad in zip(names, grads, strict=True)
                   if EMBEDDING in name and grad is not None]
        if not squares:
            self._norm = None
            return
        total = squares[0]  # float or 0-d tensor: left where it was computed
        for square in squares[1:]:
            total = total + square
        self._norm = total ** 0.5

    def on_step_begin(self, ctx: TrainContext, step: int) -> None:
        self._norm = None

    def on_step_end(self, ctx: TrainContext, record: StepRecord) -> None:
        if self._norm is None:
            return
        norm = record.extra["embedding_local_norm"] = float(self._norm)
        if not norm <= self.threshold:  # NaN counts as above
            logger.warning("step %d rank %d: the embedding's local gradient norm %.6g exceeds "
                           "monitor.health_checkpoint.embedding_local_norm_threshold (%g)",
                           record.step, ctx.rank, norm, self.threshold)
