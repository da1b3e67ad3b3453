"""Monitoring of a training run: the built-in callbacks and the run's callback list.

* `metrics.MetricsWriter`: `<output_dir>/metrics.jsonl`, one JSON line per step (rank 0).
* `tensorboard.TensorboardWriter`: TensorBoard event files through tensorboardX (rank 0).
* `progress.ProgressBar`: a tqdm bar when stderr is a terminal (rank 0).
* `train_state.TrainStateMonitor`: local/device losses and gradient norms (every rank).
* `moe.MoeMonitor`: tokens per expert of MoE layers every N steps (every rank).
* `health.EmbeddingHealthMonitor`: the embedding's local gradient norm against its threshold.
* `spikes.SpikeMonitor`: a loss or gradient norm above a factor of its running average.
* `wandb.WandbWriter`: the same scalars as TensorBoard in a Weights & Biases run (rank 0),
  only when a `callbacks:` item names `type: wandb` (it needs `mf-train[wandb]`).

`standard_callbacks(monitor, user)` is the list a run uses: collectors, then the user's
callbacks, then the writers (see `mf_train.observe.callbacks` for the hook points and the order).
"""

from __future__ import annotations

from collections.abc import Sequence

from mf_config import MonitorConfig, ProfilerConfig
from mf_config.yaml_source import Source

from ..observe.callbacks import Callback, CallbackList, LossLogger
from .health import EmbeddingHealthMonitor
from .metrics import MetricsWriter
from .moe import MoeMonitor
from .progress import ProgressBar
from .spikes import SpikeMonitor
from .tensorboard import TensorboardWriter
from .train_state import TrainStateMonitor

__all__ = ["EmbeddingHealthMonitor", "MetricsWriter", "MoeMonitor", "ProgressBar",
           "TensorboardWriter", "TrainStateMonitor", "standard_callbacks"]


def standard_callbacks(monitor: MonitorConfig, user: Sequence[Callback] = (),
                       source: Source | None = None,
                       profiler: ProfilerConfig | None = None,
                       step_times: bool = False, spike_factor: float = 3.0) -> CallbackList:
    """The built-in callbacks (always on) around the user's, in calling order:
    TrainStateMonitor, MoeMonitor, EmbeddingHealthMonitor, SpikeMonitor, *user, LossLogger,
    MetricsWriter,
    TensorboardWriter, ProgressBar, then the profiler when `profiler.enable_profiling` (last,
    so that a profiled step includes the other callbacks' work). The loop reaches the three
    collectors with `callbacks.find(TrainStateMonitor)` and so on."""
    profiling: list[Callback] = []
    if profiler is not None and profiler.enable_profiling:
        from ..observe.profiling import profiler_callbacks  # imports MindSpore

        profiling = profiler_callbacks(profiler, source)
    return CallbackList([
        TrainStateMonitor(monitor.train_state),
        MoeMonitor(monitor.moe_monitor, source),
        EmbeddingHealthMonitor(monitor.health_checkpoint),
        SpikeMonitor(spike_factor),
        *user,
        LossLogger(step_times=step_times),
        MetricsWriter(),
        TensorboardWriter(monitor.tensorboard),
        ProgressBar(),
        *profiling,
    ])
