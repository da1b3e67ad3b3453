"""Sharded data parallel (`optim`, `optim_grads`, HSDP) against plain data parallel.

Usage: sharded_worker.py OUT_DIR STRATEGY SHARD_DEGREE STEPS
STRATEGY `plain` runs GradientSync + AdamW per parameter (the reference).
"""

import json
import os
import sys
from pathlib import Path

import mindspore as ms
from mindspore import ops
from mindspore.experimental.optim import AdamW
from tiny_problem import local_batch, tiny_mlp

from mf_config import ParallelismConfig, TrainingConfig
from mf_parallel import make_plan
from mf_parallel.runtime import Collectives, GradientSync, init_communication
from mf_parallel.runtime.sharded import ShardedDataParallel

out_dir, strategy, shard, steps = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
world = int(os.environ.get("MS_WORKER_NUM", "1"))
BATCH = 8
plan = make_plan(ParallelismConfig(data_parallel_shard=shard),
                 TrainingConfig(global_batch_size=BATCH, local_batch_size=BATCH // world), world)
comm = init_communication(plan, "CPU")
net = tiny_mlp(33)  # 833 parameters: slices of unequal length need padding
x, y = local_batch(comm, BATCH)
params = net.trainable_params()
collectives = Collectives(comm)
HYPER = {"lr": 1e-2, "betas": (0.9, 0.95), "eps": 1e-8, "weight_decay": 0.1}
if strategy == "plain":
    optimizer = AdamW(params, **HYPER)
    sync = GradientSync(collectives, [p.shape for p in params], average=True)
else:
    sharded = ShardedDataParallel(params, collectives, strategy, average=True, **HYPER)
grad_fn = ms.value_and_grad(lambda a, b: ops.mse_loss(net(a), b), None, params)
for _ in range(steps):
    _, grads = grad_fn(x, y)
    if strategy == "plain":
        optimizer(sync(grads))
    else:
        sharded.step(grads)
result = {"weights": [p.asnumpy().tolist() for p in params],
          "held": None if strategy == "plain" else sharded.held_bytes(),
          "groups": comm.group_ranks}
(out_dir / f"rank{comm.rank}.json").write_text(json.dumps(result))
