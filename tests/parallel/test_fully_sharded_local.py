"""Fully sharded data parallel in one process: the wrapper's own checks and its hooks (the
real-rank comparison with plain data parallel is in test_runtime_sharded.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("mindspore")

import mindspore as ms
from mindspore import nn, ops

from mf_parallel.runtime.fully_sharded import FullyShardedDataParallel
from mf_parallel.runtime.sharded import ShardedDataParallel

sys.path.insert(0, str(Path(__file__).resolve().parent / "workers"))
from slice_adamw import SliceAdamW
from tiny_problem import tiny_mlp


def test_nested_units_are_refused(collectives) -> None:
    net = tiny_mlp(4, depth=2)
    with pytest.raises(ValueError, match=r"is in units 0 and 1: fully sharded units must not "
                                         r"nest or share parameters"):
        FullyShardedDataParallel(net, [net, net[0]], collectives)


def test_a_unit_outside_the_model_is_refused(collectives) -> None:
    net, other = tiny_mlp(4), nn.Dense(2, 2)
    with pytest.raises(ValueError, match=r"unit 0 \(Dense\) has parameter .* not a trainable "
                                         r"parameter of the model"):
        FullyShardedDataParallel(net, [other], collectives)


def test_a_unit_without_parameters_is_refused(collectives) -> None:
    net = tiny_mlp(4)
    with pytest.raises(ValueError, match=r"unit 0 \(Tanh\) has no trainable parameters"):
        FullyShardedDataParallel(net, [net[1]], collectives)


def test_zero_1_2_point_to_fully_sharded_for_stage_3(collectives) -> None:
    with pytest.raises(ValueError, match=r"not 'optim_grads_params' \(use fully_sharded"):
        ShardedDataParallel(tiny_mlp(4).trainable_params(), collectives,
                            "optim_grads_params")


def test_forward_and_backward_gather_and_free_the_units(collectives) -> None:
    """One step under `always`: parameters are empty before and after, full inside the
    unit's forward; gradients equal those of an unsharded copy."""
    net, reference = tiny_mlp(5, depth=2), tiny_mlp(5, depth=2)
    fsdp = FullyShardedDataParallel(net, [net[0], net[2]], collectives,
                                    reshard_after_forward_policy="always")
    seen = []
    net[2].register_forward_pre_hook(
        lambda _cell, _inputs: seen.append([tuple(p.shape) for p in fsdp.params]))
    x = ops.ones((3, 16), ms.float32)
    _, grads = ms.value_and_grad(lambda a: net(a).sum(), None, fsdp.params)(x)
    _, expected = ms.value_and_grad(lambda a: reference(a).sum(), None,
                                    reference.trainable_params())(x)
    # Hooks run in registration order: unit 1 gathered; unit 0 already freed; root gathered.
    assert seen == [[(0,), (0,), (5, 5), (5,), (8, 5), (8,)]]
    for got, want in zip(grads, expected, strict=True):
        np.testing.assert_array_equal(got.asnumpy(), want.asnumpy())
    assert [tuple(p.shape) for p in fsdp.params][:4] == [(0,), (0,), (0,), (0,)]
    SliceAdamW(fsdp, collectives, lr=1e-2).step(grads)
    assert all(tuple(p.shape) == (0,) for p in fsdp.params)


@pytest.mark.parametrize("dtype", [ms.float32, ms.bfloat16])  # bfloat16: no CPU pad kernel
@pytest.mark.parametrize(("before", "shape", "after"), [(0, (3,), 6), (3, (3,), 3),
                                                        (6, (3,), 0), (0, (4,), 0),
                                                        (2, (2, 3), 4)])
def test_a_rank_s_chunk_is_placed_between_zeros(dtype, before, shape, after) -> None:
    """What each rank contributes to the emulated all-gather of one tensor: its chunk of
    rows at their place, zeros elsewhere, in memory of its own."""
    from mf_parallel.runtime.flat_shard import _padded

    values = np.arange(1, int(np.prod(shape)) + 1, dtype=np.float32).reshape(shape)
    part = ms.Tensor(values).astype(dtype)
    placed = _padded(part, before, after)
    want = np.zeros((before + shape[0] + after, *shape[1:]), np.float32)
    want[before:before + shape[0]] = values
    assert placed.dtype == dtype
    np.testing.assert_array_equal(placed.astype(ms.float32).asnumpy(), want)
    assert placed.data_ptr() != part.data_ptr()


@pytest.mark.parametrize(("shapes", "shards"), [([(2, 3), (6,), (1,)], 3), ([(4, 4)], 4),
                                                ([(5, 2), (3,)], 4), ([(), (7,)], 2)])
def test_each_rank_s_slice_is_each_tensor_s_chunk(shapes, shards) -> None:
    """Every rank's slice, cut from the tensors, is chunk r of each tensor (numpy's cut),
    the whole buffer is the slices in rank order, and the ranges and tables agree with it."""
    from types import SimpleNamespace

    from mf_parallel.runtime.flat_shard import FlatShard

    rng = np.random.default_rng(3)
    arrays = [rng.normal(size=shape).astype(np.float32) for shape in shapes]
    tensors = [ms.Tensor(a) for a in arrays]
    slices = []
    for rank in range(shards):
        comm = SimpleNamespace(group_size=lambda kind, n=shards: n if kind == "shard" else 1,
                               group_rank=lambda kind, r=rank: r)
        flat = FlatShard(shapes, SimpleNamespace(comm=comm))
        want, table = [], []
        for number, a in enumerate(arrays, start=1):
            chunk = -(-a.size // shards)
            piece = a.reshape(-1)[rank * chunk:(rank + 1) * chunk]
            want += [piece, np.zeros(chunk - piece.size, np.float32)]
            table += [number] * piece.size + [0] * (chunk - piece.size)
        want = np.concatenate(want)
        mine = flat.own_tensors(tensors).asnumpy()
        np.testing.assert_array_equal(mine, want)
        for index, low, high, offset in flat.own_ranges():
            np.testing.assert_array_equal(mine[offset:offset + high - low],
                                          arrays[index].reshape(-1)[low:high])
        assert flat.own_values(range(1, len(shapes) + 1)).tolist() == table
        slices.append(mine)
    np.testing.assert_array_equal(flat.flatten(tensors).asnumpy(), np.concatenate(slices))


def test_units_cut_as_they_are_built_train_as_units_cut_after(collectives) -> None:
    """A model whose units were cut to this rank's slice as soon as they existed (their
    parameters empty before the wrapper sees them) gives the gradients and update of one
    wrapped whole; a unit that lost parameters since it was cut is refused."""
    from mf_parallel.runtime.flat_shard import BUILT_SHAPE, built_shape, preslice

    net, reference = tiny_mlp(5, depth=2), tiny_mlp(5, depth=2)
    shapes = [tuple(p.shape) for p in net.trainable_params()]
    for unit in (net[0], net[2]):
        preslice(unit, collectives)
    assert [tuple(p.shape) for p in net[0].trainable_params()] == [(0,), (0,)]
    assert [built_shape(p) for p in net.trainable_params()] == shapes
    cut = FullyShardedDataParallel(net, [net[0], net[2]], collectives)
    whole = FullyShardedDataParallel(reference, [reference[0], reference[2]], collectives)
    steps = [SliceAdamW(wrapper, collectives, lr=1e-2) for wrapper in (cut, whole)]

    x = ops.ones((3, 16), ms.float32)
    for _ in range(2):
        _, got = ms.value_and_grad(lambda a: net(a).sum(), None, cut.params)(x)
        _, want = ms.value_and_grad(lambda a: reference(a).sum(), None, whole.params)(x)
        for g, w in zip(got, want, strict=True):
            np.testing.assert_array_equal(g.asnumpy(), w.asnumpy())
        steps[0].step(got)
        steps[1].step(want)
    for a, b in zip(cut.full_parameters(), whole.full_parameters(), strict=True):
        np.testing.assert_array_equal(a.asnumpy(), b.asnumpy())
    again = tiny_mlp(5, depth=2)
    preslice(again[0], collectives)
    delattr(again[0].trainable_params()[1], BUILT_SHAPE)
    again[0].trainable_params()[1].requires_grad = False
    with pytest.raises(ValueError, match=r"a slice of \d+ elements was cut when the unit was "
                                         r"built; its parameters now need \d+"):
        FullyShardedDataParallel(again, [again[0]], collectives)


def test_a_unit_s_master_is_its_slice_not_a_host_copy(collectives) -> None:
    """The slice a unit was cut to becomes its master as it is: a Parameter made from a
    tensor would copy it into host memory outside MindSpore's pool (a rank's whole share of
    the parameters beside the pool's, until the first update replaced it)."""
    from mf_parallel.runtime.flat_shard import preslice

    net = tiny_mlp(5, depth=2)
    mine = [preslice(unit, collectives) for unit in (net[0], net[2])]
    values = [m.asnumpy().copy() for m in mine]
    fsdp = FullyShardedDataParallel(net, [net[0], net[2]], collectives)
    for unit, slice_, value in zip(fsdp.units, mine, values, strict=True):
        assert unit.master.data_ptr() == slice_.data_ptr()
        assert tuple(unit.master.shape) == (unit.flat.length,)
        np.testing.assert_array_equal(unit.master.asnumpy(), value)


@pytest.mark.parametrize("presliced", [False, True], ids=["cut-by-wrapper", "cut-as-built"])
def test_compiled_units_keep_their_tensors_and_train_as_pynative_ones(collectives,
                                                                      presliced) -> None:
    """Units compiled with `mindspore.jit` hold the parameter tensors of their first call:
    with `keep_tensors`, freeing resizes each parameter's storage to nothing (its tensor and
    shape kept) and gathering refills it, so every step's graphs read the updated values.
    Three steps under `always` equal the same wrapper in PyNative."""
    from mf_parallel.runtime.flat_shard import preslice

    net, reference = tiny_mlp(5, depth=2), tiny_mlp(5, depth=2)
    if presliced:
        for unit in (net[0], net[2]):
            preslice(unit, collectives)
    for unit in (net[0], net[2]):
        unit.construct = ms.jit(unit.construct)
    compiled = FullyShardedDataParallel(net, [net[0], net[2]], collectives,
                                        reshard_after_forward_policy="always",
                                        keep_tensors=True)
    pynative = FullyShardedDataParallel(reference, [reference[0], reference[2]], collectives,
                                        reshard_after_forward_policy="always")
    steps = [SliceAdamW(wrapper, collectives, lr=1e-2) for wrapper in (compiled, pynative)]
    x = ops.ones((3, 16), ms.float32)
    for _ in range(3):
        _, got = ms.value_and_grad(lambda a: net(a).sum(), None, compiled.params)(x)
        _, want = ms.value_and_grad(lambda a: reference(a).sum(), None, pynative.params)(x)
        for g, w in zip(got, want, strict=True):
            np.testing.assert_allclose(g.asnumpy(), w.asnumpy(), rtol=1e-6, atol=1e-7)
        steps[0].step(got)
        steps[1].step(want)
        kept = net[2].trainable_params()
        assert [tuple(p.shape) for p in kept] == [(5, 5), (5,)]  # shapes kept ...
        assert [p.untyped_storage().nbytes() for p in kept] == [0, 0]  # ... memory freed
    for a, b in zip(compiled.full_parameters(), pynative.full_parameters(), strict=True):
        np.testing.assert_allclose(a.asnumpy(), b.asnumpy(), rtol=1e-6, atol=1e-7)


class _LockstepRanks:
    """Collectives for `shards` ranks run one after the other in this process: every rank
    `FlatShard.all_gather`s its slice, a native all-gather returning every rank's part (known
    from their slices), an in-place one recording each rank's contribution, summed once all
    ranks have run; a reduction sums `shards` equal contributions."""

    def __init__(self, shards: int, native: bool, emulated: bool = True):
        from types import SimpleNamespace

        self.shards, self.native, self.emulated = shards, native, emulated
        self.rank, self.parts, self.calls = 0, [], 0
        self.contributions: dict[int, list[np.ndarray]] = {}
        self.summed: dict[int, object] = {}
        self.comm = SimpleNamespace(group_size=lambda kind: shards if kind == "shard" else 1,
                                    group_rank=lambda kind: self.rank if kind == "shard" else 0)

    def emulates(self, operation: str) -> bool:
        return self.emulated

    def gathers_natively(self, kind: str) -> bool:
        return self.native

    def all_gather(self, part, kind):
        from mindspore import ops

        pieces = self.parts[self.calls]  # every rank's part of this tensor
        np.testing.assert_array_equal(  # this rank sends its own chunk of it
            part.astype(ms.float32).asnumpy().reshape(-1),
            pieces[self.rank].astype(ms.float32).asnumpy())
        self.calls += 1
        return ops.cat([p.reshape(part.shape) for p in pieces])

    def all_reduce_in_place(self, full, kind) -> None:
        self.contributions.setdefault(self.calls, []).append(
            full.astype(ms.float32).asnumpy().copy())
        self.summed[self.calls] = full  # the tensor all_gather must return
        self.calls += 1

    def all_reduce(self, tensor, kind):  # the replicate group: one rank
        return tensor

    def reduce_scatter_slices(self, slice_of, kind):
        return slice_of(self.rank) * self.shards

    def reduce_scatter(self, flat, kind):
        step = flat.shape[0] // self.shards
        return flat[self.rank * step:(self.rank + 1) * step] * self.shards


@pytest.mark.parametrize("dtype", [ms.float32, ms.bfloat16])
@pytest.mark.parametrize("way", ["native", "in place", "large, not rows, in place"])
@pytest.mark.parametrize(("shapes", "shards"), [
    ([(8, 3), (4,), (3, 4)], 4),           # whole rows; a dim 0 the ranks do not divide
    ([(2, 3), (6,), (1,)], 3),             # padded; fewer elements than ranks
    ([(), (7,), (0, 2), (5, 5)], 2)])      # a scalar, an empty tensor, an odd square
def test_all_gather_rebuilds_every_tensor_on_every_rank(monkeypatch, dtype, way, shapes,
                                                        shards) -> None:
    """Each rank's `all_gather` of its slice gives every tensor whole, in its shape and in
    memory of its own, by the backend's all-gather or summed in place; the emulated and the
    native reduce-scatter of equal gradients give each rank its slice of their sum."""
    from mf_parallel.runtime import flat_shard
    from mf_parallel.runtime.flat_shard import FlatShard

    if way.startswith("large"):  # a tensor that is not whole rows goes in place on CPU
        monkeypatch.setattr(flat_shard, "IN_PLACE_GATHER_BYTES", 0)
    rng = np.random.default_rng(5)
    arrays = [rng.normal(size=shape).astype(np.float32) for shape in shapes]
    tensors = [ms.Tensor(a).astype(dtype) for a in arrays]
    want = [t.astype(ms.float32).asnumpy() for t in tensors]
    ranks = _LockstepRanks(shards, native=way != "in place")
    slices = []
    for rank in range(shards):
        ranks.rank = rank
        slices.append(FlatShard(shapes, ranks).own_tensors(tensors))
    flat = FlatShard(shapes, ranks)
    nonempty = [i for i, a in enumerate(arrays) if a.size]  # each makes one collective call
    ranks.parts = [[s[flat.offsets[i]:flat.offsets[i] + flat.chunks[i]] for s in slices]
                   for i in nonempty]
    for rank in range(shards):
        ranks.rank, ranks.calls = rank, 0
        fulls = FlatShard(shapes, ranks).all_gather(slices[rank])
        assert [tuple(f.shape) for f in fulls] == [tuple(a.shape) for a in arrays]
        assert all(f.data_ptr() != slices[rank].data_ptr() for f in fulls if f.size)
        for i, full in enumerate(fulls):
            call = nonempty.index(i) if i in nonempty else None
            if call in ranks.contributions:  # summed in place: the tensor it gave to be summed
                assert full is ranks.summed[call]
            else:  # gathered by the backend's all-gather, or empty
                np.testing.assert_array_equal(full.astype(ms.float32).asnumpy(), want[i])
    in_place = {nonempty[call] for call in ranks.contributions}
    assert in_place == ({i for i in nonempty if len(shapes[i]) == 0
                         or shapes[i][0] % shards or arrays[i].size % shards}
                        if way.startswith("large") else
                        set(nonempty) if way == "in place" else set())
    for call, parts in ranks.contributions.items():  # each rank's part, summed as ranks do
        assert len(parts) == shards
        np.testing.assert_array_equal(sum(parts), want[nonempty[call]])
    for rank in range(shards):
        ranks.rank = rank
        mine = FlatShard(shapes, ranks)
        expected = (slices[rank] * shards).astype(ms.float32).asnumpy()
        emulated = mine.reduce_scatter_tensors(tensors).astype(ms.float32).asnumpy()
        native = mine.reduce_scatter(mine.flatten(tensors)).astype(ms.float32).asnumpy()
        np.testing.assert_array_equal(emulated, expected)
        np.testing.assert_array_equal(native, expected)


class _TiedTable(nn.Cell):
    """An embedding lookup and an output head sharing one `[6, 4]` table, then a dense layer."""

    def __init__(self):
        super().__init__()
        rng = np.random.default_rng(3)
        self.table = ms.Parameter(ms.Tensor(rng.normal(size=(6, 4)).astype(np.float32)),
                                  name="table")
        self.dense = nn.Dense(4, 4, weight_init=ms.Tensor(rng.normal(size=(4, 4)).astype(
            np.float32)), bias_init="zeros")
        self.ids = ms.Tensor(np.array([0, 5, 2, 2], np.int32))

    def construct(self, x):
        hidden = self.dense(ops.gather(self.table, self.ids, 0) + x)
        return ops.MatMul(transpose_b=True)(hidden, self.table)


def test_vocabulary_rows_are_the_master_tensor_and_train_as_a_plain_unit(collectives) -> None:
    """A vocabulary table's rows are its unit's 2-D master itself inside the passes (not a
    reshaped view of a 1-D slice, which MindSpore would copy at each use), and two steps
    train it as the same table kept in an ordinary unit does."""
    net, reference = _TiedTable(), _TiedTable()
    fsdp = FullyShardedDataParallel(net, [net.dense], collectives,
                                    vocabulary_tables=[net.table])
    plain = FullyShardedDataParallel(reference, [reference.dense], collectives)
    steps = [SliceAdamW(wrapper, collectives, lr=1e-2) for wrapper in (fsdp, plain)]
    (rows,) = fsdp.vocabulary_units
    assert tuple(rows.master.shape) == rows.slice_shape == (6, 4)
    x = ops.ones((4, 4), ms.float32)
    for _ in range(2):
        _, got = ms.value_and_grad(lambda a: net(a).sum(), None, fsdp.params)(x)
        assert net.table.data_ptr() == rows.master.data_ptr()
        _, want = ms.value_and_grad(lambda a: reference(a).sum(), None, plain.params)(x)
        steps[0].step(got)
        steps[1].step(want)
    for a, b in zip(fsdp.full_parameters(), plain.full_parameters(), strict=True):
        np.testing.assert_allclose(a.asnumpy(), b.asnumpy(), rtol=1e-6, atol=1e-7)
