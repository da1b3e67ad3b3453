"""Data-parallel training of a small MLP, on the job's ranks or as one process: what
test_runtime_data_parallel.py compares.

A scenario of runtime_suite.py: `run` returns this rank's results. Each rank takes its
contiguous slice of a fixed global batch of 8 samples; with a one-rank plan (the one-process
reference) the slice is the whole batch. Results: gradients of the first step (after sync),
losses, and the weights after `steps` AdamW steps.
"""

import mindspore as ms
from mindspore import ops
from mindspore.experimental.optim import AdamW
from tiny_problem import local_batch, tiny_mlp

from mf_config import ParallelismConfig, TrainingConfig
from mf_parallel import make_plan
from mf_parallel.runtime import Collectives, GradientReducer

GLOBAL_BATCH = 8


def run(connect, *, world: int, mode: str, steps: int) -> dict:
    """`world` data-parallel ranks (1: one process); `mode` "mean" or "sum", as
    disable_gradient_division; `connect` gives this rank's communication for the plan."""
    plan = make_plan(ParallelismConfig(disable_gradient_division=(mode == "sum")),
                     TrainingConfig(global_batch_size=GLOBAL_BATCH,
                                    local_batch_size=GLOBAL_BATCH // world),
                     world)
    comm = connect(plan)
    ms.set_seed(0)

    net = tiny_mlp(32)
    x, y = local_batch(comm, GLOBAL_BATCH)

    optimizer = AdamW(net.trainable_params(), lr=1e-2)
    params = list(optimizer.parameters)
    collectives = Collectives(comm)

    def reducer(bucket_bytes: int) -> GradientReducer:  # every gradient over the data group
        return GradientReducer.data_parallel(collectives, [p.shape for p in params],
                                             average=(mode == "mean"), bucket_bytes=bucket_bytes)

    sync, small_buckets, per_parameter = reducer(25 << 20), reducer(256), reducer(0)

    def loss_fn(x, y):
        return ops.mse_loss(net(x), y)

    grad_fn = ms.value_and_grad(loss_fn, None, optimizer.parameters)
    result = {"rank": comm.rank, "losses": [], "buckets": len(sync.buckets),
              "small_buckets": len(small_buckets.buckets)}
    for step in range(steps):
        loss, grads = grad_fn(x, y)
        synced = sync.reduce_whole(grads)
        if step == 0:
            result["grads"] = [g.asnumpy().tolist() for g in synced]
            result["grads_small_buckets"] = [g.asnumpy().tolist()
                                             for g in small_buckets.reduce_whole(grads)]
            result["grads_per_parameter"] = [g.asnumpy().tolist()
                                             for g in per_parameter.reduce_whole(grads)]
        mean = collectives.all_reduce(loss, "data") / world if world > 1 else loss
        result["losses"].append(float(mean.asnumpy()))
        optimizer(tuple(synced))
    result["weights"] = [p.asnumpy().tolist() for p in params]
    result["names"] = [p.name for p in params]
    return result
