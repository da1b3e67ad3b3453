"""Every sharded data-parallel strategy against plain data parallel, in one launch.

Usage: sharded_worker.py OUT_DIR SHARD_DEGREE STEPS
Trains the same 3-layer MLP (1955 parameters: slices of unequal length need padding) for
STEPS AdamW steps with each variant: `plain` (GradientSync + AdamW per parameter, the
reference), `optim` and `optim_grads` (ZeRO-1/2), and `optim_grads_params` (FSDP, the first
two linear layers as units) under each reshard_after_forward_policy. Writes rank<r>.json.
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
from mf_parallel.runtime.fully_sharded import FullyShardedDataParallel
from mf_parallel.runtime.sharded import ShardedDataParallel

out_dir, shard, steps = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
world = int(os.environ.get("MS_WORKER_NUM", "1"))
BATCH = 8
plan = make_plan(ParallelismConfig(data_parallel_shard=shard),
                 TrainingConfig(global_batch_size=BATCH, local_batch_size=BATCH // world), world)
comm = init_communication(plan, "CPU")
collectives = Collectives(comm)
x, y = local_batch(comm, BATCH)
HYPER = {"lr": 1e-2, "betas": (0.9, 0.95), "eps": 1e-8, "weight_decay": 0.1}


def train(net, params, update) -> None:
    grad_fn = ms.value_and_grad(lambda a, b: ops.mse_loss(net(a), b), None, params)
    for _ in range(steps):
        _, grads = grad_fn(x, y)
        update(grads)


def plain() -> dict:
    net = tiny_mlp(33, depth=2)
    params = net.trainable_params()
    optimizer = AdamW(params, **HYPER)
    sync = GradientSync(collectives, [p.shape for p in params], average=True)
    train(net, params, lambda grads: optimizer(sync(grads)))
    return {"weights": [p.asnumpy().tolist() for p in params]}


def zero(strategy: str) -> dict:
    net = tiny_mlp(33, depth=2)
    params = net.trainable_params()
    sharded = ShardedDataParallel(params, collectives, strategy, average=True, **HYPER)
    train(net, params, sharded.step)
    return {"weights": [p.asnumpy().tolist() for p in params], "held": sharded.held_bytes()}


def fully_sharded(policy: str) -> dict:
    net = tiny_mlp(33, depth=2)
    fsdp = FullyShardedDataParallel(net, [net[0], net[2]], collectives,
                                    reshard_after_forward_policy=policy, average=True, **HYPER)
    train(net, fsdp.params, fsdp.step)
    return {"weights": [t.asnumpy().tolist() for t in fsdp.full_parameters()],
            "held": fsdp.held_bytes(),
            "between_steps_shapes": [list(p.shape) for p in fsdp.params],
            "reshard_after_forward": [u.reshard_after_forward for u in fsdp.units],
            "gathers": [u.gathers for u in fsdp.units] + [fsdp.root.gathers],
            "saved_replaced": fsdp.saved.replaced}


result = {"groups": comm.group_ranks, "plain": plain(),
          "optim": zero("optim"), "optim_grads": zero("optim_grads")}
for policy in ("always", "never", "default"):
    result[f"fsdp_{policy}"] = fully_sharded(policy)
(out_dir / f"rank{comm.rank}.json").write_text(json.dumps(result))
