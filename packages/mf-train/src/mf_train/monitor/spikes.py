"""Loss and gradient-norm spikes: a step whose loss or global gradient norm exceeds `factor`
times its running average is a `spike` event in metrics.jsonl and a warning.

The running average is the mean of the last `WINDOW` steps that were not skipped and not
spikes themselves (a spike would raise the bar for the next), once `WARMUP` such steps have
run (the first steps' loss falls fast). The event follows the step's line:
`{"event": "spike", "step": 120, "metric": "grad_norm", "value": 41.2, "average": 3.9,
"factor": 3.0}`. It only reports: a step whose gradient norm is not finite or above
`monitor.health_checkpoint.global_norm_skip_threshold` is skipped by the trainer itself.
"""

from __future__ import annotations

import logging
import math
from collections import deque

from ..observe.callbacks import Callback, StepRecord, TrainContext

logger = logging.getLogger(__name__)
WINDOW = 20
WARMUP = 5
METRICS = ("loss", "grad_norm")


class SpikeMonitor(Callback):
    """Finds the spikes of each step (rank 0's record, the same on every rank).

    Args:
        factor: how many times its running average a value must exceed (0: never).
    """

    def __init__(self, factor: float = 3.0):
        self.factor = factor
        self.recent = {metric: deque(maxlen=WINDOW) for metric in METRICS}

    def on_step_end(self, ctx: TrainContext, record: StepRecord) -> None:
        if self.factor <= 0 or record.skipped:
            return
        for metric in METRICS:
            value, recent = getattr(record, metric), self.recent[metric]
            if not math.isfinite(value):
                continue
            average = sum(recent) / len(recent) if len(recent) >= WARMUP else None
            if average is not None and value > self.factor * average:
                record.events.append({"event": "spike", "step": record.step, "metric": metric,
                                      "value": value, "average": average,
                                      "factor": self.factor})
                if ctx.is_main:
                    logger.warning("step %d: %s %.6g is %.3g times its running average %.6g "
                                   "(--spike-factor %g)", record.step, metric, value,
                                   value / average, average, self.factor)
                continue
            recent.append(value)
