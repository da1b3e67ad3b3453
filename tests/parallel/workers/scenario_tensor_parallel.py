"""Every tensor-parallel layer against its unsharded twin, forward and gradients: what
test_runtime_tensor_parallel.py compares. The twin runs in the same process on the full
weights.

A scenario of runtime_suite.py: `run` returns this rank's results.
"""

import mindspore as ms
import numpy as np
from mindspore import Tensor, ops

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

SEQ, HIDDEN, FFN, VOCAB = 4, 6, 8, 10


def run(connect, *, world: int, sequence_parallel: bool) -> dict:
    """Tensor parallel over all `world` ranks, with or without sequence parallelism;
    `connect` gives this rank's communication for the plan."""
    sp = sequence_parallel
    plan = make_plan(ParallelismConfig(tensor_parallel=world), TrainingConfig(), world)
    comm = connect(plan)
    collectives = Collectives(comm)
    group = TensorGroup(collectives, sequence_parallel=sp)
    rng = np.random.default_rng(0)  # the same full tensors on every rank

    x = rng.normal(size=(SEQ, HIDDEN)).astype(np.float32)
    w1 = rng.normal(size=(FFN, HIDDEN)).astype(np.float32)
    b1 = rng.normal(size=FFN).astype(np.float32)
    w2 = rng.normal(size=(HIDDEN, FFN)).astype(np.float32)
    b2 = rng.normal(size=HIDDEN).astype(np.float32)
    table = rng.normal(size=(VOCAB, HIDDEN)).astype(np.float32)
    ids = np.array([0, 9, 4, 5], np.int32)
    probe = rng.normal(size=(SEQ, HIDDEN)).astype(np.float32)  # loss = sum(output * probe)
    logits = rng.normal(size=(SEQ, VOCAB)).astype(np.float32)
    targets = np.array([1, 8, 5, 4], np.int32)

    def seq_slice(a):
        return group.shard(a, 0) if sp else a

    results = {"rank": comm.rank}

    # Column -> Row MLP (the Megatron pair), input and output split along the sequence with SP.
    column = ColumnParallelLinear(w1, b1, group)
    row = RowParallelLinear(w2, b2, group)
    params = [column.weight, column.bias, row.weight, row.bias]

    def mlp_loss(inp):
        return (row(ops.tanh(column(inp))) * Tensor(seq_slice(probe))).sum()

    _, (dx, grads) = ms.value_and_grad(mlp_loss, 0, params)(Tensor(seq_slice(x)))
    # the record's partial groups: with SP the row bias is used on sequence slices
    partial = [("loss", "tensor") if sp and p is row.bias else ("loss",) for p in params]
    grads = GradientReducer(collectives, partial, [p.shape for p in params],
                            average=False).reduce_whole(grads)
    results["mlp"] = {"out": row(ops.tanh(column(Tensor(seq_slice(x))))).asnumpy().tolist(),
                      "dx": dx.asnumpy().tolist(),
                      "grads": [g.asnumpy().tolist() for g in grads]}

    # The unsharded twin.
    W1, B1, W2, B2 = (ms.Parameter(Tensor(a), name=n) for a, n in
                      ((w1, "w1"), (b1, "b1"), (w2, "w2"), (b2, "b2")))

    def twin_loss(inp):
        hidden = ops.tanh(ops.matmul(inp, W1.T) + B1)
        return ((ops.matmul(hidden, W2.T) + B2) * Tensor(probe)).sum()

    _, (tdx, tgrads) = ms.value_and_grad(twin_loss, 0, [W1, B1, W2, B2])(Tensor(x))
    out = ops.matmul(ops.tanh(ops.matmul(Tensor(x), W1.T) + B1), W2.T) + B2
    results["mlp_twin"] = {"out": seq_slice(out.asnumpy()).tolist(),
                           "dx": seq_slice(tdx.asnumpy()).tolist(),
                           "grads": [group.shard(tgrads[0].asnumpy(), 0).tolist(),
                                     group.shard(tgrads[1].asnumpy(), 0).tolist(),
                                     group.shard(tgrads[2].asnumpy(), 1).tolist(),
                                     tgrads[3].asnumpy().tolist()]}

    # Embedding.
    embedding = VocabParallelEmbedding(table, group)
    emb_out = embedding(Tensor(ids))
    _, (emb_grad,) = ms.value_and_grad(
        lambda i: (embedding(i) * Tensor(seq_slice(probe))).sum(), None, [embedding.weight])(
        Tensor(ids))
    full_grad = np.zeros_like(table)
    np.add.at(full_grad, ids, probe)
    results["embedding"] = {"out": emb_out.asnumpy().tolist(),
                            "grad": emb_grad.asnumpy().tolist(),
                            "twin_out": seq_slice(table[ids]).tolist(),
                            "twin_grad": group.shard(full_grad, 0).tolist()}

    # Vocabulary-parallel cross-entropy (tokens are not split by sequence here).
    shard_logits = Tensor(group.shard(logits, 1))
    tokens = vocab_parallel_cross_entropy(shard_logits, Tensor(targets), group)
    mean, dz = ms.value_and_grad(
        lambda z: vocab_parallel_cross_entropy(z, Tensor(targets), group).mean(), 0)(
        shard_logits)
    twin_mean, twin_dz = ms.value_and_grad(
        lambda z: ops.cross_entropy(z, Tensor(targets)), 0)(Tensor(logits))
    results["cross_entropy"] = {"tokens": tokens.asnumpy().tolist(),
                                "mean": float(mean.asnumpy()),
                                "dlogits": dz.asnumpy().tolist(),
                                "twin_mean": float(twin_mean.asnumpy()),
                                "twin_dlogits": group.shard(twin_dz.asnumpy(), 1).tolist()}
    return results
