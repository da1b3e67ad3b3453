"""Gradients reduced as the backward pass produces them (`ShardedGradients`), in one process:
the hooks take every gradient, autograd hands back placeholders, buffers are reduced in one
fixed order, and the sums equal numpy's sums of the whole gradients (the reduction over real
ranks is compared with plain data parallelism in test_runtime_sharded.py and
tests/train/test_train_sharded.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("mindspore")

import mindspore as ms
from mindspore import ops

from mf_parallel.runtime import GradientReducer
from mf_parallel.runtime.grad_shards import ShardedGradients
from mf_parallel.runtime.sharded import ShardedDataParallel

sys.path.insert(0, str(Path(__file__).resolve().parent / "workers"))
from tiny_problem import tiny_mlp


def problem(collectives, *, prepare=None):
    """A 3-layer MLP in three buffers (layer 0, layer 2, the rest), a logging reduction."""
    net = tiny_mlp(6, depth=2)
    params = net.trainable_params()
    sharded = ShardedDataParallel(params, collectives, "optim_grads",
                                  units=[net[0].trainable_params(), net[2].trainable_params()])
    order: list[str] = []

    def reduce_bucket(bucket, grads):
        order.append(bucket.name)
        return GradientReducer.data_parallel(collectives, [p.shape for p in params],
                                             average=False).reduce_flat(bucket, grads)

    grads = ShardedGradients(sharded.buffers, params, reduce_bucket, prepare=prepare)
    grad_fn = ms.value_and_grad(lambda x: (net(x) ** 2).sum(), None, params)
    return net, params, sharded, grads, grad_fn, order


def whole_grads(net, x) -> list[np.ndarray]:
    _, grads = ms.value_and_grad(lambda a: (net(a) ** 2).sum(), None,
                                 net.trainable_params())(x)
    return [g.asnumpy() for g in grads]


def flat_sum(batches: list[list[np.ndarray]], params, sharded) -> list[np.ndarray]:
    """numpy: each buffer's gradients summed over the micro-batches, laid end to end."""
    index = {id(p): i for i, p in enumerate(params)}
    out = []
    for bucket in sharded.buffers:
        out.append(sum(np.concatenate([b[index[id(p)]].reshape(-1) for p in bucket.params])
                       for b in batches))
    return out


def test_hooks_reduce_every_buffer_during_backward(collectives) -> None:
    net, params, sharded, grads, grad_fn, order = problem(collectives)
    inputs = [ops.ones((3, 16), ms.float32), ops.ones((3, 16), ms.float32) * 0.5]
    expected = flat_sum([whole_grads(net, x) for x in inputs], params, sharded)
    watched = frozenset({0})
    for x in inputs:
        with grads.collecting(watched):
            _, returned = grad_fn(x)
            grads.finish_micro_batch(returned)
        assert all(tuple(g.shape) == (1,) for g in returned)  # placeholders, not gradients
        np.testing.assert_allclose(grads.watched_grads[0].asnumpy(),
                                   whole_grads(net, x)[0], rtol=1e-6)
        assert set(grads.watched_grads) == {0}
    assert grads.hooked == 2 * len(params)
    assert order == ["bucket2", "bucket1", "bucket0"] * 2  # backward's order, every time
    for got, want in zip(grads.take(), expected, strict=True):
        np.testing.assert_allclose(got.asnumpy(), want, rtol=1e-5, atol=1e-6)
    with pytest.raises(RuntimeError, match="no gradient was reduced"):
        grads.take()


@pytest.mark.parametrize("case", ["optional", "alone after layer 0", "not optional"])
def test_an_optional_gradient_that_does_not_come_is_zeros(collectives, case) -> None:
    """A parameter the forward pass never uses (an expert no token went to): MindSpore calls
    its hook only at the end of the pass, with zeros. Optional, in layer 2's buffer, or in a
    buffer of its own placed after layer 0's (used before it), its buffer is reduced during
    the pass, before that call, the gradient taken as zeros (the call then ignored); not
    optional, its buffer waits for the call, holding the buffers after it back. The sums
    equal numpy's in every case."""
    net = tiny_mlp(6, depth=2)
    spare = ms.Parameter(ms.Tensor(np.ones((3, 2), np.float32)), name="spare")
    spare_hooked: list[bool] = []
    spare.register_hook(lambda grad: spare_hooked.append(True))
    params = [*net.trainable_params(), spare]
    alone = case == "alone after layer 0"
    layer2 = net[2].trainable_params() + ([] if alone else [spare])
    sharded = ShardedDataParallel(
        params, collectives, "optim_grads",
        units=[net[0].trainable_params(), layer2, *([[spare]] if alone else [])])
    order: list[tuple[str, bool]] = []

    def reduce_bucket(bucket, grads):
        order.append((bucket.name, bool(spare_hooked)))
        return GradientReducer.data_parallel(collectives, [p.shape for p in params],
                                             average=False).reduce_flat(bucket, grads)

    grads = ShardedGradients(sharded.buffers, params, reduce_bucket,
                             optional=[] if case == "not optional" else [len(params) - 1],
                             after={2: 0} if alone else None)
    x = ops.ones((3, 16), ms.float32)
    with grads.collecting():
        _, returned = ms.value_and_grad(lambda a: (net(a) ** 2).sum(), None, params)(x)
        grads.finish_micro_batch(returned)
    assert spare_hooked == [True]
    assert order == {
        "optional": [("bucket2", False), ("bucket1", False), ("bucket0", False)],
        "alone after layer 0": [("bucket3", False), ("bucket1", False), ("bucket0", False),
                                ("bucket2", False)],
        "not optional": [("bucket2", False), ("bucket1", True), ("bucket0", True)]}[case]
    whole = [*whole_grads(net, x), np.zeros((3, 2), np.float32)]
    for got, want in zip(grads.take(), flat_sum([whole], params, sharded), strict=True):
        np.testing.assert_allclose(got.asnumpy(), want, rtol=1e-6, atol=1e-7)


def test_without_collecting_the_hooks_do_nothing_and_add_all_frees(collectives) -> None:
    """Outside `collecting` (a composing layout's own backward) autograd returns the whole
    gradients; `add_all` reduces them and clears the list entry by entry."""
    net, params, sharded, grads, grad_fn, order = problem(
        collectives, prepare=lambda index, grad: grad * 2.0)
    x = ops.ones((3, 16), ms.float32)
    _, returned = grad_fn(x)
    assert [tuple(g.shape) for g in returned] == [tuple(p.shape) for p in params]
    assert grads.hooked == 0
    listed = list(returned)
    grads.add_all(listed)
    assert listed == [None] * len(params)
    assert order == ["bucket2", "bucket1", "bucket0"]
    for got, want in zip(grads.take(), flat_sum([whole_grads(net, x)], params, sharded),
                         strict=True):
        np.testing.assert_allclose(got.asnumpy(), 2.0 * want, rtol=1e-6, atol=1e-7)
