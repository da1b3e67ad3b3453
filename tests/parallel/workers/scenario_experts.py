"""The expert dispatch on real ranks against an in-process twin that holds every expert and
every rank's tokens: what test_runtime_expert_dispatch.py compares.

A scenario of runtime_suite.py: `run` returns this rank's results. Each rank routes its own
tokens (different on every rank) to experts spread over the expert group; the loss is
sum(output * probe) summed over ranks. The twin computes that loss in one process, so its
gradients are what each rank must get: the tokens' and routing weights' for its own tokens,
and for each expert it holds the gradient from every rank's tokens.
"""

import mindspore as ms
import numpy as np
from mindspore import Parameter, Tensor, nn, ops

from mf_config import ParallelismConfig, TrainingConfig
from mf_parallel import make_plan
from mf_parallel.runtime import Collectives
from mf_parallel.runtime.expert_dispatch import ExpertGroup

TOKENS, HIDDEN, TOP_K = 12, 6, 2


class Expert(nn.Cell):
    """One expert: tanh(rows @ weight.T)."""

    def __init__(self, weight: np.ndarray):
        super().__init__()
        self.weight = Parameter(Tensor(weight))

    def construct(self, rows):
        return ops.tanh(ops.matmul(rows, self.weight.T))


def run(connect, *, world: int, dispatcher: str, npu_nums_per_device: int) -> dict:
    """Expert parallel over all `world` ranks with `dispatcher`, in devices of
    `npu_nums_per_device` ranks; `connect` gives this rank's communication for the plan."""
    plan = make_plan(ParallelismConfig(expert_parallel=world,
                                       moe_token_dispatcher_type=dispatcher,
                                       npu_nums_per_device=npu_nums_per_device),
                     TrainingConfig(global_batch_size=world), world)
    comm = connect(plan)
    group = ExpertGroup(Collectives(comm), dispatcher)
    experts = 2 * world
    rng = np.random.default_rng(0)  # the same full arrays on every rank
    expert_weights = rng.normal(size=(experts, HIDDEN, HIDDEN)).astype(np.float32) * 0.5
    x_all = rng.normal(size=(world, TOKENS, HIDDEN)).astype(np.float32)
    w_all = rng.uniform(0.1, 1.0, size=(world, TOKENS, TOP_K)).astype(np.float32)
    probe_all = rng.normal(size=(world, TOKENS, HIDDEN)).astype(np.float32)
    # No token is routed to the last rank's experts (it computes nothing and receives no row),
    # and the first rank keeps all its tokens for its own experts.
    idx_all = np.stack([np.stack([rng.choice(experts - 2, TOP_K, replace=False)
                                  for _ in range(TOKENS)]) for _ in range(world)])
    idx_all[0, :, 0] = 0
    idx_all[0, :, 1] = 1

    me = comm.rank
    mine = {e: Expert(expert_weights[e]) for e in group.local_experts(experts)}
    params = [mine[e].weight for e in sorted(mine)]
    last = {}

    def loss_fn(x, w):
        result = group.dispatch(x, Tensor(idx_all[me].astype(np.int32)), w, experts,
                                lambda e, rows: mine[e](rows))
        assert result.indices.tolist() == idx_all[me].tolist()
        last["load"], last["received"] = result.load, result.rows_received
        last["out"] = result.output
        return (result.output * Tensor(probe_all[me])).sum()

    grad_fn = ms.value_and_grad(loss_fn, (0, 1), params)
    _, ((dx, dw), dexperts) = grad_fn(Tensor(x_all[me]), Tensor(w_all[me]))

    # The twin: every expert, every rank's tokens, one process.
    twin = [Expert(expert_weights[e]) for e in range(experts)]

    def twin_loss(x, w):
        total = 0
        for r in range(world):
            per_slot = ops.stack([ops.stack([twin[int(idx_all[r, t, j])](x[r, t:t + 1])[0]
                                             for j in range(TOP_K)]) for t in range(TOKENS)])
            out = (per_slot * w[r].expand_dims(-1)).sum(1)
            total = total + (out * Tensor(probe_all[r])).sum()
            if r == me:
                last["twin_out"] = out
        return total

    twin_grad = ms.value_and_grad(twin_loss, (0, 1), [e.weight for e in twin])
    _, ((tdx, tdw), tdexperts) = twin_grad(Tensor(x_all), Tensor(w_all))
    counts = np.bincount(idx_all.reshape(-1), minlength=experts)
    return {
        "rank": me, "out": last["out"].asnumpy().tolist(),
        "twin_out": last["twin_out"].asnumpy().tolist(),
        "dx": dx.asnumpy().tolist(), "twin_dx": tdx.asnumpy()[me].tolist(),
        "dw": dw.asnumpy().tolist(), "twin_dw": tdw.asnumpy()[me].tolist(),
        "experts": sorted(mine),
        "dexperts": [g.asnumpy().tolist() for g in dexperts],
        "twin_dexperts": [tdexperts[e].asnumpy().tolist() for e in sorted(mine)],
        "load": last["load"].tolist(), "counts": counts.tolist(), "received": last["received"],
    }
