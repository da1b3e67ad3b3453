"""One process of `pipeline.py`: `mf-train` as a rank (or alone), with every step timed.

Usage: pipeline_worker.py OUT_DIR MF_TRAIN_ARGS...   (under msrun, or one process)

The trainer's code is not changed: before training starts this wraps, on the classes,
`TrainStep.__call__` (the whole step), the layout's `forward_backward`, `reduce` and the
optimizer's `step`, and, under pipelining, `StageRunner.run`, `_forward`, `_backward`,
`_weights` (W of a split backward) and `_transfer` (each action of the stage's program).
Each call is recorded as (name, start, end, details) with `time.perf_counter()`
(CLOCK_MONOTONIC: one clock for all processes of the host, so the ranks' timelines line up)
and the process's CPU time at both ends. Kernels launch synchronously on CPU (mf-train's
`launch_blocking`), so a call's wall time is its computation. Written to
OUT_DIR/timeline_<rank>.json when training ends.

MF_BENCH_PIN: "rank" pins this process (before MindSpore starts its threads) to the core
whose number is its rank; a comma-separated list pins it to those cores.
"""

from __future__ import annotations

import functools
import json
import os
import sys
import time
from pathlib import Path

RANK = int(os.environ.get("RANK_ID", "0"))
PIN = os.environ.get("MF_BENCH_PIN", "")
if PIN:
    cores = {RANK % os.cpu_count()} if PIN == "rank" else {int(c) for c in PIN.split(",")}
    os.sched_setaffinity(0, cores)

from mf_train.launch.cli import run_training  # noqa: E402  (after pinning: MindSpore's threads)
from mf_train.layouts.pipeline_executor import StageRunner  # noqa: E402
from mf_train.trainer import TrainStep  # noqa: E402

EVENTS: list[list] = []
STATE = {"step": -1, "stage": None}


def record(name: str, details=None):
    """Decorator: time each call of the wrapped function as event `name`; `details(args)`
    gives what to store about the call."""

    def wrap(fn):
        @functools.wraps(fn)
        def timed(*args, **kwargs):
            start, cpu = time.perf_counter(), time.process_time()
            try:
                return fn(*args, **kwargs)
            finally:
                EVENTS.append([STATE["step"], name, start, time.perf_counter(), cpu,
                               time.process_time(), details(args) if details else None])
        return timed

    return wrap


original_call = TrainStep.__call__


def step_call(self, micro_batches, lr):
    """The whole step, with the layout's pieces wrapped on the instance the first time."""
    layout = self.layout
    if not getattr(layout, "_bench_wrapped", False):
        layout.forward_backward = record("forward_backward")(layout.forward_backward)
        layout.reduce = record("reduce")(layout.reduce)
        layout.optimizer.step = record("optimizer")(layout.optimizer.step)
        layout._bench_wrapped = True
        runner = getattr(layout, "runner", None)
        STATE["stage"] = None if runner is None else runner.stage
    STATE["step"] += 1
    return record("step")(original_call)(self, micro_batches, lr)


TrainStep.__call__ = step_call
StageRunner.run = record("run")(StageRunner.run)
StageRunner._forward = record("F", lambda a: [a[1].virtual, a[2], a[1].last])(
    StageRunner._forward)
StageRunner._backward = record("B", lambda a: [a[1].virtual, a[2], a[1].last])(
    StageRunner._backward)
StageRunner._weights = record("W", lambda a: [a[1].virtual, a[2], a[1].last])(
    StageRunner._weights)
StageRunner._transfer = record("T", lambda a: [
    a[1].message.carries.value, a[1].message.microbatch, a[1].message.sender,
    a[1].source, a[1].target])(StageRunner._transfer)


if __name__ == "__main__":
    out_dir = Path(sys.argv[1])
    world = int(os.environ.get("MS_WORKER_NUM", "1"))
    status = run_training(sys.argv[2:], world_size=world)
    if os.environ.get("MS_ROLE") == "MS_SCHED":  # msrun's scheduler runs this script too
        raise SystemExit(status)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / f"timeline_{RANK}.json").write_text(json.dumps(
        {"rank": RANK, "stage": STATE["stage"], "world": world,
         "affinity": sorted(os.sched_getaffinity(0)), "events": EVENTS}))
    raise SystemExit(status)
