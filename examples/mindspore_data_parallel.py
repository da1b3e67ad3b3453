"""A plain MindSpore training script made data parallel with mf-parallel alone (no YAML).

Run it alone:   python examples/mindspore_data_parallel.py
On 2 ranks:     python -c "from mf_parallel.launch import run_ranks; \
                run_ranks('examples/mindspore_data_parallel.py', 2, log_dir='logs', timeout=600)"
On several hosts, msrun directly (one command per host, same master address and port):
    msrun --worker_num=16 --local_worker_num=8 --master_addr=10.0.0.1 --master_port=8118 \
          --node_rank=0 --log_dir=logs --join=True examples/mindspore_data_parallel.py
"""

import os

import mindspore as ms
import numpy as np
from mindspore import Tensor, nn, ops
from mindspore.experimental.optim import AdamW

from mf_config import ParallelismConfig, TrainingConfig
from mf_parallel import make_plan
from mf_parallel.runtime import Collectives, GradientReducer, init_communication

GLOBAL_BATCH = 8
world = int(os.environ.get("MS_WORKER_NUM", "1"))
plan = make_plan(ParallelismConfig(disable_gradient_division=False),
                 TrainingConfig(global_batch_size=GLOBAL_BATCH,
                                local_batch_size=GLOBAL_BATCH // world), world)
comm = init_communication(plan, "CPU")  # "Ascend" or "GPU" on accelerators
ms.set_seed(0)

net = nn.SequentialCell(nn.Dense(16, 32), nn.Tanh(), nn.Dense(32, 8))
optimizer = AdamW(net.trainable_params(), lr=1e-2)
collectives = Collectives(comm)
reducer = GradientReducer.data_parallel(collectives, [p.shape for p in optimizer.parameters],
                                        average=True)
grad_fn = ms.value_and_grad(lambda x, y: ops.mse_loss(net(x), y), None, optimizer.parameters)

data = np.random.default_rng(0)  # one global batch to fit, the same on every rank
x = Tensor(data.normal(size=(GLOBAL_BATCH, 16)).astype(np.float32))
y = Tensor(data.normal(size=(GLOBAL_BATCH, 8)).astype(np.float32))
local = GLOBAL_BATCH // world
mine = slice(comm.group_rank("data") * local, (comm.group_rank("data") + 1) * local)
for step in range(10):
    loss, grads = grad_fn(x[mine], y[mine])
    optimizer(tuple(reducer.reduce_whole(grads)))  # averaged over the data-parallel group
    mean = collectives.all_reduce(loss, "data") / world  # the ranks' mean loss
    print(f"step {step} loss {float(mean.asnumpy()):.6f}", flush=True)
