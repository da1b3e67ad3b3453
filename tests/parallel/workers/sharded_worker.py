"""Sharded data parallel (`optim`, `optim_grads`, HSDP) against plain data parallel.

Usage: sharded_worker.py OUT_DIR STRATEGY SHARD_DEGREE STEPS
STRATEGY `plain` runs GradientSync + AdamW per parameter (the reference).
"""

import json
import os
import sys
from pathlib import Path

import mindspore as ms
import numpy as np
from mindspore import Tensor, nn, ops
from mindspore.experimental.optim import AdamW

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
rng = np.random.default_rng(0)
net = nn.SequentialCell(nn.Dense(16, 33), nn.Tanh(), nn.Dense(33, 8))  # 33: uneven slices
for param in net.trainable_params():
    param.set_data(Tensor(rng.normal(0, 0.3, param.shape).astype(np.float32)))
data = np.random.default_rng(1)
x_all = data.normal(size=(BATCH, 16)).astype(np.float32)
y_all = data.normal(size=(BATCH, 8)).astype(np.float32)
local = BATCH // world
rows = slice(comm.group_rank("data") * local, (comm.group_rank("data") + 1) * local)
x, y = Tensor(x_all[rows]), Tensor(y_all[rows])
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
