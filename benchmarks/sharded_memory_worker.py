"""One rank of `sharded_memory.py`: a few training steps of one strategy; reports memory.

Usage: sharded_memory_worker.py OUT_DIR STRATEGY MILLIONS_OF_PARAMETERS
"""

import json
import os
import resource
import sys
from pathlib import Path

import mindspore as ms
import numpy as np
from mindspore import Tensor, nn
from mindspore.experimental.optim import AdamW

from mf_config import ParallelismConfig, TrainingConfig
from mf_parallel import make_plan
from mf_parallel.runtime import (
    Collectives,
    FullyShardedDataParallel,
    GradientReducer,
    ShardedDataParallel,
    init_communication,
)
from mf_parallel.runtime.flat_shard import built_shape
from mf_parallel.runtime.grad_shards import ShardedGradients

WIDTH, BATCH, STEPS = 1024, 4, 3


def peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def reducer(params) -> GradientReducer:
    return GradientReducer.data_parallel(collectives, [built_shape(p) for p in params],
                                         average=True)


def slice_update(wrapper):
    """AdamW on the wrapper's slices, the gradients reduced as mf-train's ZeRO and FSDP
    layouts reduce them."""
    grads = ShardedGradients(wrapper.buffers, wrapper.params, reducer(wrapper.params).reduce_flat)
    optimizer = AdamW([b.master for b in wrapper.buffers], lr=1e-3)

    def update(whole):
        if isinstance(wrapper, FullyShardedDataParallel):
            wrapper.reshard()
        grads.add_all(list(whole))
        optimizer(tuple(s.reshape(b.slice_shape) for b, s in zip(wrapper.buffers, grads.take(),
                                                                 strict=True)))
        if isinstance(wrapper, ShardedDataParallel):
            wrapper.publish([b.master + 0 for b in wrapper.buffers])
    return update


out_dir, strategy, millions = Path(sys.argv[1]), sys.argv[2], float(sys.argv[3])
world = int(os.environ.get("MS_WORKER_NUM", "1"))
plan = make_plan(ParallelismConfig(), TrainingConfig(global_batch_size=world * BATCH,
                                                     local_batch_size=BATCH), world)
comm = init_communication(plan, "CPU")
collectives = Collectives(comm)
layers = max(1, round(millions * 2**20 / (WIDTH * WIDTH)))
model = nn.SequentialCell(*[nn.Dense(WIDTH, WIDTH, has_bias=False) for _ in range(layers)])
rng = np.random.default_rng(comm.rank)
x = Tensor(rng.normal(size=(BATCH, WIDTH)).astype(np.float32))
count = sum(p.size for p in model.trainable_params())
if strategy == "plain":
    params = model.trainable_params()
    optimizer, sync = AdamW(params, lr=1e-3), reducer(params)
    update = lambda grads: optimizer(tuple(sync.reduce_whole(grads)))  # noqa: E731
    held = {"params": count * 4, "grads": count * 4, "optimizer": 2 * count * 4}
elif strategy == "optim_grads_params":
    fsdp = FullyShardedDataParallel(model, list(model), collectives)
    params, update, held = fsdp.params, slice_update(fsdp), fsdp.held_bytes()
else:
    params = model.trainable_params()
    sharded = ShardedDataParallel(params, collectives, strategy)
    update, held = slice_update(sharded), sharded.held_bytes()
grad_fn = ms.value_and_grad(lambda a: (model(a) ** 2).mean(), None, params)
before = peak_mib()  # the model and the strategy's state exist: what follows is the steps
for _ in range(STEPS):
    _, grads = grad_fn(x)
    update(grads)
result = {"rank": comm.rank, "strategy": strategy, "world": world, "parameters": int(count),
          "held": held, "setup_peak_mib": before, "peak_increase_mib": peak_mib() - before}
(out_dir / f"{strategy}_{world}_rank{comm.rank}.json").write_text(json.dumps(result))
