"""Data parallel 2 x tensor parallel 2 (with sequence parallelism) on 4 ranks: a small language
model trained for a few AdamW steps, next to its unsharded twin trained in the same process on
the whole global batch; what test_runtime_dp_tp.py compares.

A scenario of runtime_suite.py: `run` returns this rank's results: groups, losses and weights
of both.

Model (Megatron's [sequence, batch] layout): vocabulary-parallel embedding -> column-parallel
linear -> tanh -> row-parallel linear -> column-parallel output head -> vocabulary-parallel
cross-entropy, mean over tokens. Gradients: the sequence-parallel sum over the tensor group,
then the data-parallel mean over the data group.
"""

import mindspore as ms
import numpy as np
from mindspore import Parameter, Tensor, nn, ops
from mindspore.experimental.optim import AdamW

from mf_config import ParallelismConfig, TrainingConfig
from mf_parallel import make_plan
from mf_parallel.runtime import Collectives, GradientReducer
from mf_parallel.runtime.tensor_parallel import (
    ColumnParallelLinear,
    RowParallelLinear,
    TensorGroup,
    VocabParallelEmbedding,
    vocab_parallel_cross_entropy,
)

SEQ, GLOBAL_BATCH, VOCAB, HIDDEN, FFN = 4, 4, 8, 6, 8


def run(connect, *, world: int, steps: int) -> dict:
    """`world` (4) ranks as data parallel 2 x tensor parallel 2; `connect` gives this rank's
    communication for the plan."""
    plan = make_plan(ParallelismConfig(tensor_parallel=2),
                     TrainingConfig(global_batch_size=GLOBAL_BATCH, local_batch_size=2), world)
    comm = connect(plan)
    collectives = Collectives(comm)
    group = TensorGroup(collectives)  # sequence parallel: on, as with any tensor parallelism

    rng = np.random.default_rng(0)  # the same full weights and global batch on every rank
    full = {"table": rng.normal(0, 0.5, (VOCAB, HIDDEN)),
            "w1": rng.normal(0, 0.5, (FFN, HIDDEN)), "b1": rng.normal(0, 0.5, FFN),
            "w2": rng.normal(0, 0.5, (HIDDEN, FFN)), "b2": rng.normal(0, 0.5, HIDDEN),
            "head": rng.normal(0, 0.5, (VOCAB, HIDDEN))}
    full = {name: value.astype(np.float32) for name, value in full.items()}
    ids = rng.integers(0, VOCAB, (SEQ, GLOBAL_BATCH)).astype(np.int32)
    targets = rng.integers(0, VOCAB, (SEQ, GLOBAL_BATCH)).astype(np.int32)
    local = GLOBAL_BATCH // comm.group_size("data")
    columns = slice(comm.group_rank("data") * local, (comm.group_rank("data") + 1) * local)

    # The parallel model on this rank.
    model = nn.CellList([VocabParallelEmbedding(full["table"], group),  # unique parameter names
                         ColumnParallelLinear(full["w1"], full["b1"], group),
                         RowParallelLinear(full["w2"], full["b2"], group),
                         ColumnParallelLinear(full["head"], None, group)])
    embedding, up, down, head = model
    params = [embedding.weight, up.weight, up.bias, down.weight, down.bias, head.weight]

    def parallel_loss(tokens, labels):
        hidden = down(ops.tanh(up(embedding(tokens))))
        return vocab_parallel_cross_entropy(head(hidden), labels, group).mean()

    optimizer = AdamW(params, lr=1e-2)
    # the record's partial groups: the sequence-parallel bias's gradient over the tensor group
    partial = [("loss", "tensor") if p is down.bias else ("loss",) for p in params]
    reducer = GradientReducer(collectives, partial, [p.shape for p in params], average=True)
    grad_fn = ms.value_and_grad(parallel_loss, None, params)
    losses = []
    for _ in range(steps):
        loss, grads = grad_fn(Tensor(ids[:, columns]), Tensor(targets[:, columns]))
        optimizer(tuple(reducer.reduce_whole(grads)))
        mean = collectives.all_reduce(loss, "data") / comm.group_size("data")
        losses.append(float(mean.asnumpy()))

    # The unsharded twin, on the whole global batch.
    twin = {name: Parameter(Tensor(value), name=name) for name, value in full.items()}

    def twin_loss(tokens, labels):
        hidden = ops.gather(twin["table"], tokens, 0)
        hidden = ops.tanh(ops.matmul(hidden, twin["w1"].T) + twin["b1"])
        hidden = ops.matmul(hidden, twin["w2"].T) + twin["b2"]
        logits = ops.matmul(hidden, twin["head"].T)
        return ops.cross_entropy(logits.reshape(-1, VOCAB), labels.reshape(-1))

    twin_params = list(twin.values())
    twin_optimizer = AdamW(twin_params, lr=1e-2)
    twin_grad_fn = ms.value_and_grad(twin_loss, None, twin_params)
    twin_losses = []
    for _ in range(steps):
        loss, grads = twin_grad_fn(Tensor(ids), Tensor(targets))
        twin_optimizer(grads)
        twin_losses.append(float(loss.asnumpy()))

    split_axis = {"table": 0, "w1": 0, "b1": 0, "w2": 1, "b2": None, "head": 0}
    twin_shards = [twin[name].asnumpy() if axis is None
                   else group.shard(twin[name].asnumpy(), axis)
                   for name, axis in split_axis.items()]
    return {"groups": comm.group_ranks, "losses": losses, "twin_losses": twin_losses,
            "weights": [p.asnumpy().tolist() for p in params],
            "twin_weights": [w.tolist() for w in twin_shards]}
