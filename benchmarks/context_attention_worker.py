"""One process of `context_attention.py`: one Qwen3 attention block, forward + backward, timed
and its peak memory measured, as one rank of a context-parallel group (under msrun) or alone.

Usage: context_attention_worker.py OUT_DIR STEPS WARMUP CONFIG [--set KEY=VALUE ...]

The pieces are built as the trainer builds them: the configuration through mf-config with the
`--set` overrides, the plan (`make_job_plan`), communication and the plan's groups
(`init_communication`), `Collectives`, `ContextGroup` when `parallelism.context_parallel` > 1,
and a one-layer `Qwen3ForCausalLM` built with `context_group=`. The block measured is that layer's
`attention` cell (`Qwen3Attention.construct(x, cos, sin, mask)`: the fused qkv projection, q/k
norms, rotary, the context exchanges, the softmax attention, the output projection), on the
inputs the model gives: `model.attending(input_ids)` (`AttentionPlaces`: this rank's rotary
positions and the mask by global token index) and `model.rotary.at(positions)`. Its input is
this rank's `[S / context, 1, hidden]` hidden states; forward + backward is
`value_and_grad` of `sum(out * cotangent)` with respect to the input and the block's weights.

Timing: kernels launch synchronously on CPU (the trainer's default there), so a call's wall
time is its work. The exchanges are timed by wrapping what they call: mf-parallel's
`sequence_to_heads` / `heads_to_sequence` (Ulysses, forward and backward) and
`Collectives.all_gather` / `reduce_scatter` (the colossal all-gather and its backward); nested
calls count once. With `context_parallel_async` the all-gather is started
(`Collectives.start_all_gather`) and waited for (`Pending.wait`): both are timed, so
the figure is the time the exchanges hold the step up, not the time they are under way.

Memory: the high-water mark of resident memory (`VmHWM` of /proc/self/status, reset with
`/proc/self/clear_refs` "5" just before the first step) minus the resident memory then
(`VmRSS`), over the warm-up and measured steps. MindSpore's CPU memory pool keeps what the
first step allocated, so the first step sets it. Also recorded: the process's CPU time per
step (user + system, all threads), to tell work from waiting on the shared cores. Written to
OUT_DIR/rank_<rank>.json.
"""

from __future__ import annotations

import functools
import json
import os
import statistics
import sys
import time
from pathlib import Path

import mindspore as ms
import numpy as np
from mindspore import Tensor

from mf_config import load_config
from mf_config.components import sequence_length
from mf_parallel.runtime import context_parallel
from mf_parallel.runtime.collectives import Collectives, Pending
from mf_parallel.runtime.comm import init_communication
from mf_parallel.runtime.context_parallel import ContextGroup
from mf_train.parallelize import build_parallel_model
from mf_train.preflight.job import make_job_plan
from mf_train.trainer import launch_synchronously_on_cpu

EXCHANGE = {"seconds": 0.0, "depth": 0}


def timed_exchange(fn):
    """`fn` with its wall time added to EXCHANGE (outermost call only: the Ulysses exchange
    calls the all-gather inside)."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        EXCHANGE["depth"] += 1
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            EXCHANGE["depth"] -= 1
            if EXCHANGE["depth"] == 0:
                EXCHANGE["seconds"] += time.perf_counter() - start

    return wrapper


for _name in ("sequence_to_heads", "heads_to_sequence"):  # looked up at call time by the cells
    setattr(context_parallel, _name, timed_exchange(getattr(context_parallel, _name)))
for _name in ("all_gather", "reduce_scatter", "start_all_gather"):
    setattr(Collectives, _name, timed_exchange(getattr(Collectives, _name)))
Pending.wait = timed_exchange(Pending.wait)


def status_kib(field: str) -> int:
    """A `kB` field of /proc/self/status (VmRSS, VmHWM)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


def build(config_path: str, overrides: list[str], world: int):
    """The attention cell of a one-layer Qwen3, its inputs and a cotangent, built as the
    trainer builds them."""
    config = load_config(config_path, overrides)
    plan = make_job_plan(config, world)
    comm = init_communication(plan, "CPU")
    launch_synchronously_on_cpu("CPU")
    ms.set_seed(config.training.seed)
    context = (ContextGroup(Collectives(comm), plan.dims.context_causal,
                            plan.dims.context_overlap)
               if plan.dims.context > 1 else None)
    model = build_parallel_model(config.model, seed=config.training.seed,
                                 context_group=context)
    attention = model.decoder_layers.by_id(0).attention
    seq = sequence_length(config) // plan.dims.context
    hidden = model.settings.hidden_size
    rng = np.random.default_rng(comm.rank)
    input_ids = Tensor(rng.integers(0, 256, (1, seq)).astype(np.int32))
    attending = model.attending(input_ids)
    cos, sin = model.rotary.at(attending.positions)
    x = Tensor(rng.standard_normal((seq, 1, hidden)).astype(np.float32))
    cotangent = Tensor(rng.standard_normal((seq, 1, hidden)).astype(np.float32))
    return comm, context, attention, (x, cos, sin, attending.mask), cotangent


def main() -> None:
    out_dir, steps, warmup, config_path = (Path(sys.argv[1]), int(sys.argv[2]),
                                           int(sys.argv[3]), sys.argv[4])
    overrides = [arg for arg in sys.argv[5:] if arg != "--set"]
    world = int(os.environ.get("MS_WORKER_NUM", "1"))
    comm, context, attention, (x, cos, sin, mask), cotangent = build(config_path, overrides,
                                                                     world)
    if os.environ.get("MS_ROLE") == "MS_SCHED":  # msrun's scheduler runs this script too
        return

    def objective(x: Tensor) -> Tensor:
        return (attention(x, cos, sin, mask) * cotangent).sum()

    step = ms.value_and_grad(objective, grad_position=0, weights=attention.trainable_params())
    before = status_kib("VmRSS")
    Path("/proc/self/clear_refs").write_text("5")  # the high-water mark restarts here
    times, exchanges, cpu = [], [], []
    for index in range(warmup + steps):
        EXCHANGE["seconds"] = 0.0
        start, start_cpu = time.perf_counter(), time.process_time()
        loss, grads = step(x)
        loss.asnumpy()  # synchronise (the launch is synchronous on CPU anyway)
        if index >= warmup:
            times.append(time.perf_counter() - start)
            cpu.append(time.process_time() - start_cpu)
            exchanges.append(EXCHANGE["seconds"])
    peak = status_kib("VmHWM") - before
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / f"rank_{comm.rank}.json").write_text(json.dumps({
        "rank": comm.rank, "world": world,
        "method": ("one" if context is None
                   else context.method() + (" async" if context.overlap else "")),
        "tokens": int(x.shape[0]), "step_ms": 1e3 * statistics.median(times),
        "steps_ms": [1e3 * t for t in times],
        "exchange_ms": 1e3 * statistics.median(exchanges),
        "cpu_ms": 1e3 * statistics.median(cpu), "peak_mib": peak / 1024,
        "rss_before_mib": before / 1024, "loss": float(loss.asnumpy()),
        "grads": len(grads[1])}))


if __name__ == "__main__":
    main()
