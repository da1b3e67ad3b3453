"""Data-parallel training of a small MLP; the same script runs alone or on every msrun rank.

Usage: dp_worker.py OUT_DIR MODE STEPS   (MODE: mean or sum, as disable_gradient_division)
Each rank takes its contiguous slice of a fixed global batch of 8 samples; with one process
the slice is the whole batch. Writes rank<r>.json: gradients of the first step (after sync),
losses, and the weights after STEPS AdamW steps.
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

out_dir, mode, steps = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
world = int(os.environ.get("MS_WORKER_NUM", "1"))
GLOBAL_BATCH = 8
plan = make_plan(ParallelismConfig(disable_gradient_division=(mode == "sum")),
                 TrainingConfig(global_batch_size=GLOBAL_BATCH,
                                local_batch_size=GLOBAL_BATCH // world),
                 world)
comm = init_communication(plan, "CPU")
ms.set_seed(0)

net = tiny_mlp(32)
x, y = local_batch(comm, GLOBAL_BATCH)

optimizer = AdamW(net.trainable_params(), lr=1e-2)
params = list(optimizer.parameters)
sync = GradientSync(Collectives(comm), [p.shape for p in params], average=(mode == "mean"))
small_buckets = GradientSync(Collectives(comm), [p.shape for p in params],
                             average=(mode == "mean"), bucket_bytes=256)


def loss_fn(x, y):
    return ops.mse_loss(net(x), y)


grad_fn = ms.value_and_grad(loss_fn, None, optimizer.parameters)
result = {"rank": comm.rank, "losses": [], "buckets": len(sync.buckets),
          "small_buckets": len(small_buckets.buckets)}
for step in range(steps):
    loss, grads = grad_fn(x, y)
    synced = sync(grads)
    if step == 0:
        result["grads"] = [g.asnumpy().tolist() for g in synced]
        result["grads_small_buckets"] = [g.asnumpy().tolist() for g in small_buckets(grads)]
        result["grads_per_parameter"] = [g.asnumpy().tolist() for g in sync.per_parameter(grads)]
    result["losses"].append(float(sync.average_loss(loss).asnumpy()))
    optimizer(synced)
result["weights"] = [p.asnumpy().tolist() for p in params]
result["names"] = [p.name for p in params]
(out_dir / f"rank{comm.rank}.json").write_text(json.dumps(result))
