"""`metrics.jsonl`: one JSON object per optimizer step, written by rank 0.

A step line holds `step`, `total_steps`, `loss`, `lr`, `grad_norm`, `step_time` (seconds),
`tokens` (over all ranks), `tokens_per_s` (global: `tokens / step_time`),
`tokens_per_s_per_rank` (`tokens_per_s / world_size`), `tflops` (achieved TFLOP/s of a rank:
model FLOPs per token x `tokens_per_s_per_rank`), `mfu` (`tflops / peak_tflops`, a fraction),
`elapsed_s` (seconds since this run's first step began), `eta_s` (seconds left: the mean step
of this run, the first left out, times the steps left), `consumed_samples`, `skipped`, `time`
(Unix seconds), `peak_memory_gib` (the largest rank's peak memory so far) and
`peak_memory_rank` (which rank, with several), and the record's `extra` values (the monitors'
`local_loss/micro1`, `moe/layer3/expert0`, ...) as top-level keys; a value the trainer could
not know (`tflops` of a model without a shape) is left out. Other lines are events and carry
an `event` key:
* `{"event": "start", "step": 0, ...}` opens a new run (`build_peak_memory_gib`: the largest
  rank's peak memory once the model, optimizer and resumed state were built;
  `model_flops_per_token`, `peak_tflops` and `peak_source`: what `tflops` and `mfu` are made
  of, `mf_train.observe.throughput`);
* `{"event": "resume", "step": N, ...}` marks a run resumed after N steps: the steps after the
  resumed checkpoint that the earlier run had already logged stay above the marker; for each
  step, the last line written is the one that counts;
* `{"event": "rewind", "step": N, "superseded": [first, last]}` precedes the resume event of a
  run resumed from a step before the last one the file records (a newer checkpoint was
  damaged, or the run was killed between checkpoints), or the start event (N = 0) of a run
  that starts afresh over one that failed before its first checkpoint: the records of steps
  first..last written before it are superseded by the ones that follow. `read_steps` gives
  one record per step accordingly; TensorBoard hides the superseded events too
  (`tensorboard`'s purge);
* `{"event": "save", "step": N, "path": ...}` follows each checkpoint;
* `{"event": "spike", "step": N, "metric": "loss", "value": ..., "average": ..., "factor":
  ...}` follows a step whose loss or gradient norm spiked (`monitor.spikes`);
* `{"event": "restart", "attempt": K, "step": N, "cause": ..., "wait_s": ...}`: the launcher
  started the job again after a failure (`mf_train.launch.restarts`).

The file is only ever appended to, never truncated: a run owns its output directory
(`mf_train.preflight.run_directory`), and a resumed run continues its predecessor's file. It is
never opened through a symbolic link (`mf_train.no_follow`). Each line is flushed as it is written
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

from ..no_follow import open_no_follow
from ..observe.callbacks import Callback, StepRecord, TrainContext

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
        recorded = _last_step(path)  # opened: not a symbolic link
        self._file = os.fdopen(fd, "a", encoding="utf-8", buffering=1)
        if recorded is not None and recorded > ctx.start_step:
            self._write({"event": "rewind", "step": ctx.start_step,
                         "superseded": [ctx.start_step + 1, recorded]})
        event = {"event": "resume" if ctx.resumed else "start", "step": ctx.start_step,
                 "total_steps": ctx.total_steps, "world_size": ctx.world_size}
        for key in ("build_peak_memory_gib", "model_flops_per_token", "peak_tflops",
                    "peak_source"):
            if getattr(ctx, key) is not None:
                event[key] = getattr(ctx, key)
        self._write(event)

    def on_step_end(self, ctx: TrainContext, record: StepRecord) -> None:
        if self._file is not None:
            self._write(step_line(record))
            for event in record.events:
                self._write(dict(event))

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


def read_steps(path: Path) -> list[dict[str, Any]]:
    """The step records of a metrics.jsonl, one per step in step order: the last written
    counts, and a `rewind` (or `resume`) event at step N drops the records of later steps
    written before it."""
    kept: dict[int, dict[str, Any]] = {}
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        entry = json.loads(line)
        event = entry.get("event")
        if event in ("rewind", "resume"):
            kept = {step: record for step, record in kept.items() if step <= entry["step"]}
        elif event is None:
            kept[entry["step"]] = entry
    return [kept[step] for step in sorted(kept)]


def _last_step(path: Path) -> int | None:
    """The largest step a metrics.jsonl records (None: no file or no step)."""
    try:
        steps = read_steps(path)
    except (OSError, ValueError):
        return None
    return steps[-1]["step"] if steps else None


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
