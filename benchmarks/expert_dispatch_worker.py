"""One process of `expert_dispatch.py`: `mf-train` as a rank (or alone), with the step and
every piece of the expert dispatch timed.

Usage: expert_dispatch_worker.py OUT_DIR MF_TRAIN_ARGS...   (under msrun, or one process)

The trainer's code is not changed: this wraps `TrainStep.__call__` (the step), mf-parallel's
`ExpertGroup.routing_tables` (the all-gather of the routing tables), `ExpertGroup.dispatch`
(a MoE layer's routed part, forward: tables, exchanges and the experts), the exchange
functions of `expert_exchange` that the forward cells and their backward both call
(`_exchange`: all-to-all-v; `_gather_rows` / `_scatter_rows`: inside a device), and, without
expert parallelism, `MoE._routed` (the routed experts' forward on one process). Kernels launch
synchronously on CPU (mf-train's default there), so a call's wall time is its work. Each
dispatch's rows received are recorded too. Written to OUT_DIR/timeline_<rank>.json.
"""

from __future__ import annotations

import functools
import json
import os
import sys
import time
from pathlib import Path

from mf_parallel.runtime import expert_exchange
from mf_parallel.runtime.expert_dispatch import ExpertGroup
from mf_train.launch.cli import run_training
from mf_train.models.moe import MoE
from mf_train.trainer import TrainStep

RANK = int(os.environ.get("RANK_ID", "0"))
EVENTS: list[list] = []
STATE = {"step": -1}


def record(name: str, details=None):
    """Decorator: each call of the wrapped function as event (step, name, start, end,
    details(result))."""

    def wrap(fn):
        @functools.wraps(fn)
        def timed(*args, **kwargs):
            start = time.perf_counter()
            result = fn(*args, **kwargs)
            EVENTS.append([STATE["step"], name, start, time.perf_counter(),
                           details(result) if details else None])
            return result
        return timed

    return wrap


original_call = TrainStep.__call__


def step_call(self, micro_batches, lr):
    STATE["step"] += 1
    return record("step")(original_call)(self, micro_batches, lr)


TrainStep.__call__ = step_call
ExpertGroup.routing_tables = record("tables")(ExpertGroup.routing_tables)
ExpertGroup.dispatch = record("dispatch", lambda done: done.rows_received)(ExpertGroup.dispatch)
MoE._routed = record("routed")(MoE._routed)
for function in ("_exchange", "_gather_rows", "_scatter_rows"):
    setattr(expert_exchange, function, record(function.strip("_"))(
        getattr(expert_exchange, function)))


if __name__ == "__main__":
    out_dir = Path(sys.argv[1])
    world = int(os.environ.get("MS_WORKER_NUM", "1"))
    status = run_training(sys.argv[2:], world_size=world)
    if os.environ.get("MS_ROLE") == "MS_SCHED":  # msrun's scheduler runs this script too
        raise SystemExit(status)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / f"timeline_{RANK}.json").write_text(json.dumps(
        {"rank": RANK, "world": world, "events": EVENTS}))
    raise SystemExit(status)
