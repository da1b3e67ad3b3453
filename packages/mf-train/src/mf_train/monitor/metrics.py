"""`metrics.jsonl`: one JSON object per optimizer step, written by rank 0.

A step line holds `step`, `total_steps`, `loss`, `lr`, `grad_norm`, `step_time` (seconds),
`tokens`, `tokens_per_s`, `consumed_samples`, `skipped`, `time` (Unix seconds),
`peak_memory_gib` (the largest rank's peak memory so far) and `peak_memory_rank` (which rank,
with several), and the
record's `extra` values (the monitors' `local_loss/micro1`, `moe/layer3/expert0`, ...) as
top-level keys. Other lines are events and carry an `event` key:
* `{"event": "start", "step": 0, ...}` opens a new run (`build_peak_memory_gib`: the largest
  rank's peak memory once the model, optimizer and resumed state were built);
* `{"event": "resume", "step": N, ...}` marks a run resumed after N steps: the steps after the
  resumed checkpoint that the earlier run had already logged stay above the marker; for each
  step, the last line written is the one that counts;
* `{"event": "save", "step": N, "path": ...}` follows each checkpoint.

The file is only ever appended to, never truncated: a run owns its output directory
(`mf_train.run_directory`), and a resumed run continues its predecessor's file. It is never
opened through a symbolic link (`mf_train.no_follow`). Each line is flushed as it is written
(line-buffered file), so a crash loses no finished step.
Non-finite numbers are written as `null` (strict JSON; `skipped` says why a step has no loss).
"""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path
from typing import IO, Any

from ..callbacks import Callback, StepRecord, TrainContext
from ..no_follow import open_no_follow

FILE_NAME = "metrics.jsonl"


class MetricsWriter(Callback):
    """Appends one line per step to `<output_dir>/metrics.jsonl` (or `path`) on rank 0."""

    def __init__(self, path: Path | None = None):
        self.path = path
        self._file: IO[str] | None = None

    def on_train_begin(self, ctx: TrainContext) -> None:
        if not ctx.is_main:
            return
        path = Path(self.path) if self.path is not None else ctx.output_dir / FILE_NAME
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        fd = open_no_follow(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        self._file = os.fdopen(fd, "a", encoding="utf-8", buffering=1)
        event = {"event": "resume" if ctx.resumed else "start", "step": ctx.start_step,
                 "total_steps": ctx.total_steps, "world_size": ctx.world_size}
        if ctx.build_peak_memory_gib is not None:
            event["build_peak_memory_gib"] = ctx.build_peak_memory_gib
        self._write(event)

    def on_step_end(self, ctx: TrainContext, record: StepRecord) -> None:
        if self._file is not None:
            self._write(step_line(record))

    def on_save(self, ctx: TrainContext, step: int, path: Path) -> None:
        if self._file is not None:
            self._write({"event": "save", "step": step, "path": str(path)})

    def on_train_end(self, ctx: TrainContext, last: StepRecord | None) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def _write(self, line: dict[str, Any]) -> None:
        assert self._file is not None
        line.setdefault("time", round(time.time(), 3))
        self._file.write(json.dumps(line, allow_nan=False) + "\n")


def step_line(record: StepRecord) -> dict[str, Any]:
    """The JSON object of one step: the record's fields, then its extras (non-finite -> null)."""
    line: dict[str, Any] = {
        "step": record.step, "total_steps": record.total_steps,
        **{key: _number(value) for key, value in record.scalars().items()},
        "tokens": record.tokens, "consumed_samples": record.consumed_samples,
        "skipped": record.skipped, "time": round(time.time(), 3),
    }
    if record.peak_memory_rank is not None:
        line["peak_memory_rank"] = record.peak_memory_rank
    for key, value in record.extra.items():
        if key in line:
            raise ValueError(f"StepRecord.extra key {key!r} repeats a step field")
        line[key] = _number(value)
    return line


def _number(value: Any) -> float | None:
    value = float(value)
    return value if math.isfinite(value) else None
