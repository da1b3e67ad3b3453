"""Sharded AdamW in one process: the slice math against numpy AdamW on whole tensors (a slice
that starts mid-parameter and ends in padding), per-element weight decay, the state dict's
layout check, and FSDP's hooks with recompute inside the training step (the 2-rank runs are
in test_train_sharded.py)."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest

pytest.importorskip("mindspore")

import mindspore as ms
from mindspore import Parameter, Tensor, ops
from mindspore import float32 as FLOAT32

from mf_config import (
    CheckpointConfig,
    LayerSpec,
    ModelConfig,
    OptimizerConfig,
    ParallelismConfig,
    RecomputeConfig,
    TrainingConfig,
)
from mf_memory.recompute import apply_recompute
from mf_parallel import make_plan
from mf_parallel.placement import ParameterSpec, ShardingTable, place_parameters
from mf_parallel.runtime import Collectives, init_communication
from mf_parallel.runtime.flat_shard import FlatShard
from mf_train.checkpoint import CheckpointManager, RunProgress
from mf_train.checkpoint.layout import read_common
from mf_train.checkpoint.pieces import Deferred, Piece, PieceIndex
from mf_train.checkpoint.regions import RankRegions
from mf_train.layouts import FSDP, LayoutParts, MicroBatch, SingleRank, ZeRO
from mf_train.layouts.gradient_norm import OwnedNorm
from mf_train.models import build_model
from mf_train.optim import OptimizerStateError, ShardedAdamW, build_optimizer
from mf_train.optim.protocol import counted
from mf_train.trainer import TrainStep

ms.set_context(mode=ms.PYNATIVE_MODE)
ms.set_device("CPU")

BETAS, EPS, LR, WD = (0.9, 0.95), 1e-8, 0.05, 0.1


# ---------------------------------------------------------------- the slice math, on a stub


class StubShard:
    """Stands in for mf-parallel: 3 ranks share `a` (6 elements), `b.bias` (6) and `c` (1),
    each tensor cut into 3 chunks (`c`'s padded to one element each); this is rank 1, whose
    slice is elements 2..3 of `a`, 2..3 of `b.bias` and `c`'s padding."""

    def __init__(self, params):
        self.params = params
        self.flat = FlatShard([p.shape for p in params], stub_collectives())
        assert (self.flat.length, self.flat.total) == (5, 13)
        self.master = Parameter(Tensor(self._mine(params)), name="stub_master")
        self.slice_shape = (self.flat.length,)
        self.buffers = [self]
        self.published = []

    @staticmethod
    def _mine(arrays) -> np.ndarray:
        """Rank 1's slice of `arrays`, cut here with numpy: chunk 1 of each of 3."""
        pieces = []
        for a in arrays:
            flat = np.asarray(a.asnumpy() if hasattr(a, "asnumpy") else a,
                              np.float32).reshape(-1)
            chunk = -(-flat.size // 3)
            piece = flat[chunk:2 * chunk]
            pieces += [piece, np.zeros(chunk - piece.size, np.float32)]
        return np.concatenate(pieces)

    def publish(self, slices):
        self.published.append(slices[0].asnumpy().copy())


def reduced_slice(grads) -> Tensor:
    """Rank 1's slice of the reduced gradients, `grads` standing for their sum over the ranks
    (what the layouts' reducer gives the optimizer)."""
    return Tensor(StubShard._mine(grads))


def stub_collectives(squares_elsewhere: float = 0.0) -> SimpleNamespace:
    comm = SimpleNamespace(group_size=lambda kind: 3, group_rank=lambda kind: 1)
    return SimpleNamespace(comm=comm,
                           all_reduce=lambda t, kind: t + squares_elsewhere)


def numpy_adamw(p, g, m, v, step, lr, wd):
    p = p * np.float32(1.0 - lr * wd)
    m = m * BETAS[0] + g * (1 - BETAS[0])
    v = v * BETAS[1] + g * g * (1 - BETAS[1])
    denominator = np.sqrt(v / (1 - BETAS[1] ** step)) + EPS
    return p - (lr / (1 - BETAS[0] ** step)) * (m / denominator), m, v


def stub_problem():
    rng = np.random.default_rng(0)
    a = Parameter(Tensor(rng.normal(size=(2, 3)).astype(np.float32)), name="a")  # decayed
    b = Parameter(Tensor(rng.normal(size=(6,)).astype(np.float32)), name="b.bias")  # not
    c = Parameter(Tensor(rng.normal(size=(1,)).astype(np.float32)), name="c")  # not owned
    sharded = StubShard([a, b, c])
    optimizer = ShardedAdamW([("a", a), ("b.bias", b), ("c", c)], sharded,
                             stub_collectives(), betas=BETAS, eps=EPS,
                             weight_decays=[WD, 0.0, WD])
    grads = [Tensor(rng.normal(size=shape).astype(np.float32)) for shape in ((2, 3), (6,), (1,))]
    return sharded, optimizer, grads


def test_slice_update_equals_whole_tensor_adamw_with_per_parameter_decay() -> None:
    sharded, optimizer, grads = stub_problem()
    whole = [p.asnumpy().reshape(-1) for p in sharded.params]
    moments = [(np.zeros_like(w), np.zeros_like(w)) for w in whole]
    flat_grads = [g.asnumpy().reshape(-1) for g in grads]
    for step in (1, 2, 3):
        grad = reduced_slice(grads)
        optimizer.step([grad], LR)
        for i, rate in enumerate((WD, 0.0, WD)):
            whole[i], m, v = numpy_adamw(whole[i], flat_grads[i], *moments[i], step, LR, rate)
            moments[i] = (m, v)
        expected = StubShard._mine(whole)
        np.testing.assert_allclose(sharded.published[-1], expected, rtol=1e-6, atol=1e-7)
    assert optimizer.global_step == 3
    # elements 2..3 of a (decayed), 2..3 of b.bias (not), padding: ids into [0.0, 0.1]
    assert optimizer.rates == [0.0, WD]
    assert optimizer.rate_ids.asnumpy().tolist() == [1, 1, 0, 0, 0]


def test_norm_sums_the_squares_of_every_ranks_slice() -> None:
    sharded, _, grads = stub_problem()
    optimizer = ShardedAdamW([(p.name, p) for p in sharded.params], sharded,
                             stub_collectives(squares_elsewhere=4.0), betas=BETAS, eps=EPS)
    mine = StubShard._mine(grads)
    grad = reduced_slice(grads)
    norm = OwnedNorm([True], lambda squares: optimizer.collectives.all_reduce(squares,
                                                                              "world"))([grad])
    np.testing.assert_array_equal(grad.asnumpy(), mine)
    assert float(norm.asnumpy()) == pytest.approx(math.sqrt(float((mine ** 2).sum()) + 4.0),
                                                  rel=1e-6)


def test_norm_with_tensor_parallelism_counts_replicated_elements_on_one_tensor_rank() -> None:
    """`a` split by tensor parallelism, `b.bias` and `c` replicated: a rank at the second
    tensor place owns the two elements of `a` in its slice (the first tensor place's rank
    owns the replicated ones); the sum over the world adds what the other ranks own (the
    stand-in adds 4.0)."""
    sharded, _, grads = stub_problem()
    owned = sharded.buffers[0].flat.own_values([1.0, 0.0, 0.0])
    assert owned.tolist() == [1.0, 1.0, 0.0, 0.0, 0.0]
    norm = OwnedNorm([owned], lambda squares: squares + 4.0)
    value = norm([reduced_slice(grads)])
    mine = StubShard._mine(grads).astype(np.float64)
    assert float(value.asnumpy()) == pytest.approx(math.sqrt((mine[:2] ** 2).sum() + 4.0),
                                                  rel=1e-6)


def test_clip_scales_the_slice_like_the_whole_gradient() -> None:
    (s1, clipped_opt, grads), (s2, scaled_opt, _) = stub_problem(), stub_problem()
    grad = reduced_slice(grads)
    clipped_opt.step([grad], LR, clip=0.25)
    scaled = reduced_slice([g * 0.25 for g in grads])
    scaled_opt.step([scaled], LR)
    np.testing.assert_array_equal(s1.published[-1], s2.published[-1])


def test_a_slice_step_not_kept_changes_nothing() -> None:
    """ZeRO's and FSDP's update with `keep` false (NaN slice, decayed parameters): the
    masters and moments stay bit-identical; uncounted, the next kept step equals a run
    without the skipped one."""
    (s1, gated, grads), (s2, plain, _) = stub_problem(), stub_problem()
    grad = reduced_slice(grads)
    gated.step([grad], LR, keep=Tensor(True))
    plain.step([reduced_slice(grads)], LR)
    before = {key: value.copy() for key, value in gated.state_dict().items()}
    gated.step([grad * np.float32(np.nan)], LR, clip=Tensor(np.float32(0.5)),
               keep=Tensor(False))
    gated.uncount()
    for key, value in gated.state_dict().items():
        np.testing.assert_array_equal(value, before[key], err_msg=key)
    gated.step([grad], LR, keep=Tensor(True))
    plain.step([reduced_slice(grads)], LR)
    np.testing.assert_array_equal(s1.published[-1], s2.published[-1])
    assert gated.global_step == plain.global_step == 2


def test_state_dict_round_trip_and_layout_check() -> None:
    _, optimizer, grads = stub_problem()
    optimizer.step([reduced_slice(grads)], LR)
    state = optimizer.state_dict()
    assert sorted(state) == ["adam_m.flat", "adam_v.flat", "global_step", "main_param.flat",
                             "shard_layout"]
    assert state["shard_layout"].tolist() == [3, 1, 13, 5, 1, 2]
    _, fresh, _ = stub_problem()
    fresh.load_state_dict(state)
    assert fresh.global_step == 1
    np.testing.assert_array_equal(fresh.exp_avg_sq.asnumpy(), state["adam_v.flat"])
    other = dict(state, shard_layout=np.array([2, 1, 13, 7, 1, 2], np.int64))
    with pytest.raises(OptimizerStateError, match=r"saved with shard degree 2, shard rank 1, "
                                                  r"elements 13, slice length 7, buffers 1, "
                                                  r"slice order 2; this run has shard degree 3"):
        fresh.load_state_dict(other)
    # state saved when a slice was one range of the tensors end to end (no slice order),
    # here of the same length: refused, not read in the wrong order
    older = dict(state, shard_layout=np.array([3, 1, 13, 5, 1], np.int64))
    with pytest.raises(OptimizerStateError, match=r"saved by an earlier mf, in which a slice "
                                                  r"was one range .*checkpoint\.no_load_optim"):
        fresh.load_state_dict(older)
    with pytest.raises(OptimizerStateError, match=r"missing key 'adam_m.flat'"):
        fresh.load_state_dict({k: v for k, v in state.items() if k != "adam_m.flat"})


def test_own_ranges_are_each_tensor_s_chunk() -> None:
    """Rank 1 of 3: elements 2..3 of `a` at 0 of its slice, 2..3 of `b.bias` at 2; `c` (one
    element, in rank 0's chunk) nothing, its padding at 4."""
    sharded, _, _ = stub_problem()
    assert sharded.flat.own_ranges() == [(0, 2, 4, 0), (1, 2, 4, 2)]
    assert sharded.flat.own_values([7.0, 8.0, 9.0]).tolist() == [7.0, 7.0, 8.0, 8.0, 0.0]


class RowsStub(StubShard):
    """Stands in for FSDP's vocabulary unit: one `[6, 2]` table on 3 ranks, this rank (1)
    holding rows 2..3 as a 2-D master (`slice_shape`), its gradient reduced to 1-D."""

    def __init__(self, params):
        self.params = params
        self.flat = FlatShard([p.shape for p in params], stub_collectives())
        self.slice_shape = (2, 2)
        self.master = Parameter(Tensor(self._mine(params).reshape(2, 2)), name="rows")
        self.buffers = [self]
        self.published = []

    def as_slice(self, values):
        return values if tuple(values.shape) == self.slice_shape else values.reshape(2, 2) * 1


def test_a_2d_slice_updates_in_place_and_round_trips() -> None:
    """A buffer whose master is 2-D (vocabulary rows): the optimizer's master is that tensor
    itself, updated in place as whole-tensor AdamW updates the rows; the state dict is flat
    and loads back into 2-D state."""
    rng = np.random.default_rng(1)
    table = Parameter(Tensor(rng.normal(size=(6, 2)).astype(np.float32)), name="table")
    sharded = RowsStub([table])
    optimizer = ShardedAdamW([("table", table)], sharded, stub_collectives(), betas=BETAS,
                             eps=EPS, weight_decays=[WD])
    assert optimizer.masters[0].data_ptr() == sharded.master.data_ptr()
    assert tuple(optimizer.exp_avg_sq.shape) == (4,)
    whole, m, v = table.asnumpy(), np.zeros((6, 2), np.float32), np.zeros((6, 2), np.float32)
    for step in (1, 2):
        grad = rng.normal(size=(6, 2)).astype(np.float32)
        optimizer.step([Tensor(grad[2:4].reshape(-1))], LR)
        whole, m, v = numpy_adamw(whole, grad, m, v, step, LR, WD)
        np.testing.assert_allclose(sharded.master.asnumpy(), whole[2:4], rtol=1e-6, atol=1e-7)
    state = optimizer.state_dict()
    assert state["main_param.flat"].shape == (4,)
    np.testing.assert_allclose(state["adam_m.flat"], m[2:4].reshape(-1), rtol=1e-6)
    fresh = RowsStub([table])
    again = ShardedAdamW([("table", table)], fresh, stub_collectives(), betas=BETAS, eps=EPS,
                         weight_decays=[WD])
    again.load_state_dict(state)
    assert [tuple(t.shape) for t in (*again.masters, *again.avgs, *again.avg_sqs)] == [(2, 2)] * 3
    for key, value in again.state_dict().items():
        np.testing.assert_array_equal(value, state[key], err_msg=key)


def stub_regions() -> RankRegions:
    """`StubShard`'s rank 1 in the placement record: 3 ZeRO-1 ranks, each writing its chunks
    (none of `c`, whose chunk on rank 1 is padding)."""
    plan = make_plan(ParallelismConfig(data_parallel_shard=3),
                     TrainingConfig(global_batch_size=3, local_batch_size=1), 3)
    table = ShardingTable([ParameterSpec(name, shape, where="head") for name, shape in
                           (("a", (2, 3)), ("b.bias", (6,)), ("c", (1,)))])
    return RankRegions(place_parameters(table, plan, "optim"), plan, 1)


def test_state_pieces_are_one_process_adamw_state_cut_where_the_slice_cuts(tmp_path) -> None:
    """After two steps the pieces hold, under one process's keys, exactly the moments numpy
    AdamW gives the whole tensors, over this rank's ranges; saved and read back by overlap
    they restore a fresh optimizer's slices (masters from the weights: float32)."""
    sharded, optimizer, grads = stub_problem()
    whole = [p.asnumpy().reshape(-1) for p in sharded.params]
    moments = [(np.zeros_like(w), np.zeros_like(w)) for w in whole]
    for step in (1, 2):
        optimizer.step([reduced_slice(grads)], LR)
        for i, rate in enumerate((WD, 0.0, WD)):
            whole[i], *moments[i] = numpy_adamw(whole[i], grads[i].asnumpy().reshape(-1),
                                                *moments[i], step, LR, rate)
    pieces = optimizer.state_pieces(stub_regions())
    assert sorted(piece.key for piece in pieces) == [
        "adam_m.a@2:4", "adam_m.b.bias@2:4", "adam_v.a@2:4", "adam_v.b.bias@2:4"]
    pieces.update(counted({}, optimizer.global_step, RankRegions()))  # rank 0 writes it
    for piece, values in pieces.items():
        if piece.name == "global_step":
            assert values.tolist() == [2]
            continue
        which, _, name = piece.name.partition(".")
        m, v = moments[["a", "b.bias"].index(name)]
        want = (m if which == "adam_m" else v)[piece.start:piece.stop]
        assert isinstance(values, Deferred)  # read when the writer reaches it
        np.testing.assert_allclose(values.read(), want, rtol=1e-5, atol=1e-8, err_msg=piece.key)
    mine = optimizer.master.asnumpy()  # the slice publish hands mf-parallel
    weights = {Piece("a", (2, 3), 2, 4): mine[:2], Piece("b.bias", (6,), 2, 4): mine[2:4]}
    CheckpointManager(CheckpointConfig(save_path=str(tmp_path))).save(
        2, weights, pieces, RunProgress(global_step=2, consumed_samples=8,
                                        global_batch_size=4))
    directory = tmp_path / "iteration_00000002"
    common = read_common(directory)
    _, fresh, _ = stub_problem()
    with PieceIndex(directory, common, "opt") as state, \
            PieceIndex(directory, common, "model") as model:
        fresh.load_state_pieces(state, model, stub_regions())
    assert fresh.global_step == 2
    for got, want in ((fresh.exp_avg, optimizer.exp_avg), (fresh.exp_avg_sq,
                                                            optimizer.exp_avg_sq),
                      (fresh.master, optimizer.master)):
        np.testing.assert_array_equal(got.asnumpy(), want.asnumpy())


def test_groups_summary_names_the_decayed_parameters() -> None:
    _, optimizer, _ = stub_problem()
    assert optimizer.groups_summary() == {"weight_decay": ["a", "c"],
                                          "no_weight_decay": ["b.bias"]}


# ---------------------------------------------------------------- FSDP hooks in the step

SIZES = {"vocab_size": 64, "hidden_size": 16, "intermediate_size": 32,
         "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1,
         "head_dim": 8, "rms_norm_eps": 1e-6, "max_position_embeddings": 16,
         "tie_word_embeddings": True}
OPTIMIZER = OptimizerConfig(weight_decay=WD, weight_decay_exclude=["norm"])


TRAINING = TrainingConfig(global_batch_size=2, local_batch_size=2)


@pytest.fixture(scope="module")
def collectives() -> Collectives:
    plan = make_plan(ParallelismConfig(), TRAINING, 1)
    return Collectives(init_communication(plan, "CPU"))


def micro_batches(step: int) -> list[MicroBatch]:
    data = np.random.default_rng(step).integers(0, SIZES["vocab_size"], (2, 9)).astype(np.int32)
    return [MicroBatch(data[:, :-1], data[:, 1:])]


def train(strategy: str | None, collectives, recompute: RecomputeConfig | None):
    model = build_model(ModelConfig(model_type="qwen3", extras=dict(SIZES)), seed=5)
    if recompute is not None:
        apply_recompute(model, recompute)
    if strategy is None:
        optimizer = build_optimizer(OPTIMIZER, [(p.name, p) for p in model.trainable_params()])
        layout = SingleRank(model, optimizer)
    else:
        parallelism = ParallelismConfig(data_parallel_shard_strategy=strategy,
                                        reshard_after_forward_policy="always")
        dims = make_plan(parallelism, TRAINING, 1).dims
        parts = LayoutParts(model, OPTIMIZER, parallelism, dims, collectives, None)
        layout = (FSDP if strategy == "optim_grads_params" else ZeRO).build(parts)
    step = TrainStep(layout, max_norm=0.5)
    outcomes = [step(micro_batches(i), lr=1e-2) for i in range(2)]
    return model, layout, outcomes


RECOMPUTE = {
    "none": None,
    "full": RecomputeConfig(mode="full", full_recompute_layer=[LayerSpec.parse("0-1")]),
    "select": RecomputeConfig(mode="select",
                              select_module={"attention": [LayerSpec.parse("0")],
                                             "mlp": [LayerSpec.parse("1")]}),
}


@pytest.fixture(scope="module")
def plain(collectives):
    """The reference: mf_train's AdamW on whole tensors (recompute changes no bit)."""
    _, layout, outcomes = train(None, collectives, None)
    return layout, outcomes


@pytest.mark.parametrize("recompute", list(RECOMPUTE))
def test_fsdp_step_equals_plain_adamw(collectives, plain, recompute) -> None:
    """One shard (collectives are the identity) but every FSDP hook at work: placeholders
    between steps, gathers around each layer, saved weights replaced by references."""
    plain_opt, plain = plain
    _, sharded_opt, fsdp = train("optim_grads_params", collectives, RECOMPUTE[recompute])
    assert all(tuple(p.shape) == (0,) for p in sharded_opt.params)  # placeholders
    fsdp_wrapper = sharded_opt.sharded  # policy "always": each layer gathered twice a step
    assert [unit.gathers for unit in fsdp_wrapper.units] == [4, 4]
    assert fsdp_wrapper.root.gathers == 2
    for got, want in zip(fsdp, plain, strict=True):
        assert got.loss == pytest.approx(want.loss, rel=1e-6)
        assert got.grad_norm == pytest.approx(want.grad_norm, rel=1e-5)
    assert plain[0].grad_norm > 0.5  # clipping was at work
    with sharded_opt.whole_model():
        whole = [p.asnumpy().copy() for p in sharded_opt.params]
    assert all(tuple(p.shape) == (0,) for p in sharded_opt.params)  # freed again
    for got, want in zip(whole, plain_opt.params, strict=True):
        np.testing.assert_allclose(got, want.asnumpy(), rtol=1e-5, atol=1e-6)


def test_zero_step_equals_plain_adamw(collectives, plain) -> None:
    plain_opt, plain = plain
    _, zero_opt, zero = train("optim_grads", collectives, None)
    for got, want in zip(zero, plain, strict=True):
        assert got.loss == pytest.approx(want.loss, rel=1e-6)
        assert got.grad_norm == pytest.approx(want.grad_norm, rel=1e-5)
    for got, want in zip(zero_opt.params, plain_opt.params, strict=True):
        np.testing.assert_allclose(got.asnumpy(), want.asnumpy(), rtol=1e-5, atol=1e-6)


def test_fsdp_masters_reload_from_the_gathered_model_or_from_the_shards(collectives) -> None:
    """Weights loaded into the gathered model become the slices (a format-2 resume); slices
    published to the sharded units (the sharded and Hugging Face loads) become them too,
    with nothing gathered; a model half gathered is refused."""
    _, layout, _ = train("optim_grads_params", collectives, None)
    optimizer = layout.optimizer
    with layout.whole_model():
        for param in optimizer.params:
            param.set_data(ops.ones(param.shape, param.dtype))
        optimizer.reload_main_params_from_model()
    assert optimizer.master.asnumpy().min() == optimizer.master.asnumpy().max() == 1.0
    with layout.whole_model():
        assert all(np.all(p.asnumpy() == 1.0) for p in optimizer.params)
    layout.publish_slices([ops.full((n,), 2.0, dtype=FLOAT32) for n in optimizer.lengths])
    optimizer.reload_main_params_from_model()
    assert all(tuple(p.shape) == (0,) for p in optimizer.params)  # nothing gathered
    assert optimizer.master.asnumpy().min() == optimizer.master.asnumpy().max() == 2.0
    with layout.whole_model():
        assert all(np.all(p.asnumpy() == 2.0) for p in optimizer.params)
    layout.flat_buckets()[0].unshard()
    with pytest.raises(RuntimeError, match=r"some units are gathered and some are not"):
        optimizer.reload_main_params_from_model()
