"""One rank of `sharded_memory.py`: a few optimizer steps of one strategy; reports memory.

Usage: sharded_memory_worker.py OUT_DIR STRATEGY MILLIONS_OF_PARAMETERS
"""

import json
import os
import resource
import sys
from pathlib import Path

import numpy as np
from mindspore import Parameter, Tensor
from mindspore.experimental.optim import AdamW

from mf_config import ParallelismConfig, TrainingConfig
from mf_parallel import make_plan
from mf_parallel.runtime import Collectives, GradientSync, init_communication
from mf_parallel.runtime.sharded import ShardedDataParallel


def peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


out_dir, strategy, millions = Path(sys.argv[1]), sys.argv[2], float(sys.argv[3])
world = int(os.environ.get("MS_WORKER_NUM", "1"))
plan = make_plan(ParallelismConfig(), TrainingConfig(global_batch_size=world), world)
comm = init_communication(plan, "CPU")
collectives = Collectives(comm)
shapes = [(1024, int(millions * 1024 * 1024) // (8 * 1024))] * 8  # 8 tensors
rng = np.random.default_rng(comm.rank)
params = [Parameter(Tensor(rng.normal(size=s).astype(np.float32)), name=f"p{i}")
          for i, s in enumerate(shapes)]
grads = [Tensor(rng.normal(size=s).astype(np.float32)) for s in shapes]
before = peak_mib()  # parameters and gradients exist: what follows is the strategy's doing
if strategy == "plain":
    optimizer = AdamW(params, lr=1e-3)
    sync = GradientSync(collectives, shapes, average=True)
    for _ in range(3):
        optimizer(sync(grads))
    held = {"params": sum(p.size for p in params) * 4, "grads": sum(p.size for p in params) * 4,
            "optimizer": 2 * sum(p.size for p in params) * 4}
else:
    sharded = ShardedDataParallel(params, collectives, strategy, lr=1e-3)
    for _ in range(3):
        sharded.step(grads)
    held = sharded.held_bytes()
result = {"rank": comm.rank, "strategy": strategy, "world": world,
          "parameters": int(sum(p.size for p in params)), "held": held,
          "peak_increase_mib": peak_mib() - before}
(out_dir / f"{strategy}_{world}_rank{comm.rank}.json").write_text(json.dumps(result))
