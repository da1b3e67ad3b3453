"""TensorBoard event files, written by rank 0 with tensorboardX's protobufs.

Directory: `monitor.tensorboard.output_dir` (as written, relative to the working directory),
or `<output_dir>/tensorboard` when it is empty. Every `log_interval` steps
(`step % log_interval == 0`, as MindFormers' TensorboardMonitor) one event at global step
`record.step` holds the scalars `loss`, `lr`, `grad_norm`, `tokens_per_s`, `step_time`
(seconds), those of `tokens_per_s_per_rank`, `tflops`, `mfu`, `elapsed_s`, `eta_s` and
`peak_memory_gib` the record has (`StepRecord.scalars`), and every `record.extra` value (tag
= its key), and one more event holds `loss_vs_samples` at step `consumed_samples`. Monitors
with their own interval (MoE counts) reach TensorBoard only on steps that are also logging
steps; metrics.jsonl has every value.
Tags keep letters, digits and `_ . / -`; other characters become `_` (TensorBoard's rule).

The events go through tensorboardX's synchronous `EventsWriter`, not its `SummaryWriter`:
`SummaryWriter.flush()` does not drain the background queue, so the events of the steps
before a checkpoint could be missing after a crash. Here the file is flushed every
`queue_size` events, after each checkpoint and at the end.

A resumed run starts a new event file with a `SessionLog.START` at `start_step + 1`
(tensorboardX's `purge_step`): TensorBoard hides the events the earlier run wrote for the steps
that run again.

tensorboardX's package `__init__` imports PyTorch when it is installed (for `SummaryWriter`'s
tensor conversions, which this writer does not use): 2.5 s and 190 MiB of resident memory on
rank 0, measured here. `_import_tensorboardx` loads its writer and protobufs with `torch`
hidden from that import (tensorboardX handles a missing torch); a process that imported torch
before keeps it.
"""

from __future__ import annotations

import re
import sys
import time
from pathlib import Path
from typing import Any

from mf_config import TensorboardConfig

from ..observe.callbacks import Callback, StepRecord, TrainContext

DEFAULT_DIR = "tensorboard"
_NOT_IN_TAG = re.compile(r"[^A-Za-z0-9_./\-]")


def _import_tensorboardx() -> None:
    """Import tensorboardX's event writer and protobufs without importing PyTorch (see the
    module docstring)."""
    if "tensorboardX" in sys.modules:
        return
    hide = "torch" not in sys.modules
    if hide:
        sys.modules["torch"] = None  # type: ignore[assignment]  # `import torch` fails
    try:
        import tensorboardX.event_file_writer
        import tensorboardX.proto.event_pb2
        import tensorboardX.proto.summary_pb2  # noqa: F401
    finally:
        if hide:
            del sys.modules["torch"]


def event_dir(config: TensorboardConfig, output_dir: Path) -> Path:
    """Where the event files go: `monitor.tensorboard.output_dir`, else `<output_dir>/
    tensorboard`."""
    return Path(config.output_dir) if config.output_dir else Path(output_dir) / DEFAULT_DIR


class TensorboardWriter(Callback):
    """Scalars of each logged step in TensorBoard event files (rank 0 only)."""

    def __init__(self, config: TensorboardConfig | None = None):
        self.config = config if config is not None else TensorboardConfig()
        self.log_dir: Path | None = None
        self._events: Any = None
        self._unflushed = 0

    def on_train_begin(self, ctx: TrainContext) -> None:
        if not ctx.is_main:
            return
        _import_tensorboardx()
        from tensorboardX.event_file_writer import EventsWriter

        self.log_dir = event_dir(self.config, ctx.output_dir)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        # Event files are named by the second and the host: the counter keeps a run that
        # resumes within the same second from overwriting the earlier run's file.
        earlier = len(list(self.log_dir.glob("events.out.tfevents.*")))
        self._events = EventsWriter(str(self.log_dir / "events"), f".{earlier}")
        if ctx.resumed or earlier:  # a fresh start over a run that saved nothing hides it
            self._write_purge(ctx.start_step + 1)

    def on_step_end(self, ctx: TrainContext, record: StepRecord) -> None:
        if self._events is None or record.step % self.config.log_interval:
            return
        values = {**record.scalars(), **record.extra}
        self._write(record.step, values)
        self._write(record.consumed_samples, {"loss_vs_samples": record.loss})
        if self._unflushed >= self.config.queue_size:
            self._flush()

    def on_save(self, ctx: TrainContext, step: int, path: Path) -> None:
        if self._events is not None:
            self._flush()

    def on_train_end(self, ctx: TrainContext, last: StepRecord | None) -> None:
        if self._events is not None:
            self._events.close()
            self._events = None

    def _write(self, step: int, values: dict[str, float]) -> None:
        from tensorboardX.proto.event_pb2 import Event
        from tensorboardX.proto.summary_pb2 import Summary

        summary = Summary(value=[Summary.Value(tag=_tag(tag), simple_value=float(value))
                                 for tag, value in values.items()])
        self._events.write_event(Event(wall_time=time.time(), step=step, summary=summary))
        self._unflushed += 1

    def _write_purge(self, step: int) -> None:
        from tensorboardX.proto.event_pb2 import Event, SessionLog

        self._events.write_event(Event(wall_time=time.time(), step=step,
                                       session_log=SessionLog(status=SessionLog.START)))

    def _flush(self) -> None:
        self._events.flush()
        self._unflushed = 0


def _tag(name: str) -> str:
    return _NOT_IN_TAG.sub("_", name)
