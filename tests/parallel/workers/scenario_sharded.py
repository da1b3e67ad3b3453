"""Every sharded data-parallel strategy against plain data parallel: what
test_runtime_sharded.py compares.

A scenario of runtime_suite.py: `run` returns this rank's results. Trains the same 3-layer MLP
(1955 parameters: slices of unequal length need padding) for `steps` AdamW steps with each
variant: `plain` (GradientReducer's whole buckets + AdamW per parameter, the reference), `optim`
and `optim_grads` (ZeRO-1/2), and `optim_grads_params` (FSDP, the first two linear layers as
units) under each reshard_after_forward_policy, their slices reduced by the same reducer
(`slice_adamw`).
"""

import mindspore as ms
from mindspore import ops
from mindspore.experimental.optim import AdamW
from slice_adamw import SliceAdamW
from tiny_problem import local_batch, tiny_mlp

from mf_config import ParallelismConfig, TrainingConfig
from mf_parallel import make_plan
from mf_parallel.runtime import Collectives, GradientReducer
from mf_parallel.runtime.fully_sharded import FullyShardedDataParallel
from mf_parallel.runtime.sharded import ShardedDataParallel

BATCH = 8
HYPER = {"lr": 1e-2, "betas": (0.9, 0.95), "eps": 1e-8, "weight_decay": 0.1}


def run(connect, *, world: int, shard: int, steps: int) -> dict:
    """`world` data-parallel ranks in shards of `shard` (-1: all of them; fewer: HSDP, the
    shards replicated); `connect` gives this rank's communication for the plan."""
    plan = make_plan(ParallelismConfig(data_parallel_shard=shard),
                     TrainingConfig(global_batch_size=BATCH, local_batch_size=BATCH // world),
                     world)
    comm = connect(plan)
    collectives = Collectives(comm)
    x, y = local_batch(comm, BATCH)

    def train(net, params, update) -> None:
        grad_fn = ms.value_and_grad(lambda a, b: ops.mse_loss(net(a), b), None, params)
        for _ in range(steps):
            _, grads = grad_fn(x, y)
            update(grads)

    def plain() -> dict:
        net = tiny_mlp(33, depth=2)
        params = net.trainable_params()
        optimizer = AdamW(params, **HYPER)
        reducer = GradientReducer.data_parallel(collectives, [p.shape for p in params],
                                                average=True)
        train(net, params, lambda grads: optimizer(tuple(reducer.reduce_whole(grads))))
        return {"weights": [p.asnumpy().tolist() for p in params]}

    def zero(strategy: str) -> dict:
        net = tiny_mlp(33, depth=2)
        params = net.trainable_params()
        sharded = ShardedDataParallel(params, collectives, strategy)
        train(net, params, SliceAdamW(sharded, collectives, **HYPER).step)
        return {"weights": [p.asnumpy().tolist() for p in params],
                "held": sharded.held_bytes()}

    def fully_sharded(policy: str) -> dict:
        net = tiny_mlp(33, depth=2)
        fsdp = FullyShardedDataParallel(net, [net[0], net[2]], collectives,
                                        reshard_after_forward_policy=policy)
        train(net, fsdp.params, SliceAdamW(fsdp, collectives, **HYPER).step)
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
    return result
