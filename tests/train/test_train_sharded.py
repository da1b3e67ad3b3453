"""`mf-train --nproc 2` with each sharded data-parallel strategy (ZeRO-1, ZeRO-2, FSDP) on real
msrun ranks: losses and gradient norms equal the single-process run, checkpoints hold the whole
model and per-rank optimizer slices, a sharded run resumes exactly, and what cannot be sharded
is refused before any rank starts."""

from __future__ import annotations

import functools
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

pytest.importorskip("mindspore")

from runs import (
    QWEN3,
    QWEN3_2_LAYERS,
    arguments,
    assert_resumed_exactly,
    rank_arrays,
    steps,
    train,
    worker_log,
)

from mf_config import load_config
from mf_parallel.runtime.tensor_parallel import TensorGroup
from mf_train.checkpoint.layout import iteration_name
from mf_train.checkpoint.params import apply_model_params, model_arrays
from mf_train.cli import run
from mf_train.models import build_model, hf_state, load_hf_state

FSDP_STRATEGY = "optim_grads_params"
STRATEGIES = {"optim": "ZeRO-1 over 2 ranks", "optim_grads": "ZeRO-2 over 2 ranks",
              "optim_grads_params": "FSDP over 2 ranks, reshard policy default",
              "replicated": "data parallel 2 (replicated)"}
pytestmark = pytest.mark.ranks


def strategy_setting(strategy: str) -> str:
    """The setting of a strategy; `replicated`: shard degree 1, plain data parallelism."""
    return ("parallelism.data_parallel_shard=1" if strategy == "replicated"
            else f"parallelism.data_parallel_shard_strategy={strategy}")


def checkpoint_files(output: Path, step: int, kind: str, rank: int,
                     world: int = 2) -> dict[str, np.ndarray]:
    return rank_arrays(output, step, kind, rank, world)


@pytest.fixture(scope="module")
def single(runs) -> Path:
    """The 2-layer tiny Qwen3, 4 steps, checkpoints at steps 2 and 4 (tests/train/runs.py)."""
    return runs(QWEN3, *QWEN3_2_LAYERS)


@pytest.fixture(scope="module")
def sharded(runs):
    """Each strategy's 2-rank run, launched once on first use."""
    return lambda strategy: runs(QWEN3, *QWEN3_2_LAYERS, strategy_setting(strategy), nproc=2)


def two_ranks(prefix: str, output: Path, *more: str) -> None:
    train(QWEN3, output, prefix, *QWEN3_2_LAYERS, *more, nproc=2, timeout=300)


@pytest.mark.parametrize("strategy", list(STRATEGIES))
def test_each_strategy_matches_one_process(single, sharded, strategy) -> None:
    output = sharded(strategy)
    one, two = steps(single), steps(output)
    assert len(one) == len(two) == 4
    assert [s["loss"] for s in two] == pytest.approx([s["loss"] for s in one], rel=1e-5)
    assert [s["grad_norm"] for s in two] == pytest.approx([s["grad_norm"] for s in one],
                                                          rel=1e-5)
    assert one[-1]["loss"] < one[0]["loss"]
    assert one[0]["grad_norm"] > 1.0  # max_norm 1: the first steps are clipped
    assert STRATEGIES[strategy] in worker_log(output)


@pytest.mark.parametrize("strategy", ["optim", "optim_grads_params"])
def test_checkpoint_holds_the_whole_model_and_each_ranks_slices(single, sharded,
                                                                strategy) -> None:
    output = sharded(strategy)
    want = checkpoint_files(single, 4, "model", 0, world=1)
    for rank in (0, 1):
        model = checkpoint_files(output, 4, "model", rank)
        assert model.keys() == want.keys()
        for name, array in want.items():
            np.testing.assert_allclose(model[name], array, rtol=1e-4, atol=1e-6, err_msg=name)
    total = sum(array.size for array in want.values())
    layouts = []
    for rank in (0, 1):
        opt = checkpoint_files(output, 4, "opt", rank)
        assert sorted(opt) == ["adam_m.flat", "adam_v.flat", "global_step", "main_param.flat",
                               "shard_layout"]
        layouts.append(opt["shard_layout"].tolist())
        assert opt["adam_v.flat"].shape == (layouts[-1][3],) and opt["global_step"][0] == 4
    # shard degree, shard rank, elements, slice length, buffers (every strategy: one per
    # decoder layer, 2, and the root)
    buffers = 3
    assert [layout[:3] for layout in layouts] == [[2, 0, total], [2, 1, total]]
    assert all(layout[4] == buffers for layout in layouts)
    assert 2 * layouts[0][3] - total in range(0, 2 * buffers)  # halves, padded per buffer


def test_fsdp_resumes_exactly(data_prefix, sharded, tmp_path) -> None:
    """Steps 3-4 resumed from FSDP's step-2 checkpoint equal the uninterrupted run's."""
    whole = sharded("optim_grads_params")
    resumed = tmp_path / "resumed"
    two_ranks(data_prefix, resumed, "parallelism.data_parallel_shard_strategy="
                                    "optim_grads_params",
              f"checkpoint.load_path={whole / 'ckpt' / 'iteration_00000002'}",
              "checkpoint.enable_save=false")
    assert_resumed_exactly(resumed, whole)


def test_fsdp_loads_weights_saved_by_zero(data_prefix, single, sharded, tmp_path) -> None:
    """Weights only (`no_load_optim`): FSDP gathers its model, loads the whole model ZeRO-1
    saved at step 2 and takes its slices from it; it then trains as one process does from its
    own step-2 weights."""
    common = ("checkpoint.no_load_optim=true", "checkpoint.enable_save=false",
              "training.steps=2")
    one, two = tmp_path / "one", tmp_path / "two"
    saved_by_one = single / "ckpt" / iteration_name(2)
    train(QWEN3, one, data_prefix, *QWEN3_2_LAYERS, f"checkpoint.load_path={saved_by_one}",
          *common)
    saved_by_zero = sharded("optim") / "ckpt" / iteration_name(2)
    two_ranks(data_prefix, two, f"checkpoint.load_path={saved_by_zero}",
              "parallelism.data_parallel_shard_strategy=optim_grads_params", *common)
    expected = [s["loss"] for s in steps(one)]
    assert [s["loss"] for s in steps(two)] == pytest.approx(expected, rel=1e-5)
    assert expected[0] != pytest.approx(steps(single)[0]["loss"], rel=1e-6)  # weights loaded


# ---------------------------------------------------------------- with tensor parallelism

TP_STRATEGIES = {"optim": "ZeRO-1 over 2 ranks, tensor parallel 2 (sequence parallel)",
                 "optim_grads": "ZeRO-2 over 2 ranks, tensor parallel 2 (sequence parallel)",
                 "optim_grads_params": "FSDP over 2 ranks, tensor parallel 2 (sequence "
                                       "parallel), reshard policy default"}


def with_tensor_parallel_settings(strategy: str) -> tuple[str, ...]:
    """Data parallel (sharded by `strategy`) x tensor parallel 2."""
    return (*QWEN3_2_LAYERS, "parallelism.tensor_parallel=2",
            f"parallelism.data_parallel_shard_strategy={strategy}")


def run_with_tensor_parallel(prefix: str, output: Path, strategy: str, *more: str,
                             nproc: int = 4) -> None:
    """`nproc` ranks as data parallel (sharded by `strategy`) x tensor parallel 2."""
    train(QWEN3, output, prefix, *with_tensor_parallel_settings(strategy), *more, nproc=nproc)


@pytest.fixture(scope="module")
def with_tensor_parallel(runs):
    """Each strategy's 4-rank run (data parallel 2 x tensor parallel 2), launched once on
    first use: ranks 0 and 1 form a tensor group, 0 and 2 a shard group."""
    return lambda strategy: runs(QWEN3, *with_tensor_parallel_settings(strategy), nproc=4)


def tensor_rank(rank: int, size: int) -> SimpleNamespace:
    """What a model reads of its `TensorGroup` while it is built (no communication)."""
    group = SimpleNamespace(rank=rank, size=size, sequence_parallel=True)
    group.shard = functools.partial(TensorGroup.shard, group)
    return group


def as_tensor_shards(whole: dict[str, np.ndarray], data_prefix: str,
                     size: int) -> list[dict[str, np.ndarray]]:
    """A one-process checkpoint's weights cut as each tensor rank holds them: the model's own
    Hugging Face weight maps say how (fused projections interleave the ranks' rows)."""
    config = load_config(QWEN3, [f"train_dataset.dataloader.config.data_path=['1','{data_prefix}']",
                                 *QWEN3_2_LAYERS])
    model = build_model(config.model)
    apply_model_params(model.parameters_and_names(), whole)
    weights = hf_state(model)
    shards = []
    for rank in range(size):
        shard = build_model(config.model, tensor_group=tensor_rank(rank, size))
        load_hf_state(shard, weights)
        shards.append(model_arrays(shard.parameters_and_names()))
    return shards


def assert_tensor_shards_of(single: Path, output: Path, data_prefix: str,
                            world: int) -> list[dict[str, np.ndarray]]:
    """Each rank of `output` saved at step 4 its tensor rank's shards (tensor innermost:
    rank r is tensor rank r % 2) of the weights `single` saved; returns those shards."""
    want = as_tensor_shards(checkpoint_files(single, 4, "model", 0, world=1), data_prefix, 2)
    for rank in range(world):
        model = checkpoint_files(output, 4, "model", rank, world=world)
        assert model.keys() == want[rank % 2].keys()
        for name, array in want[rank % 2].items():
            np.testing.assert_allclose(model[name], array, rtol=1e-4, atol=1e-6,
                                       err_msg=f"rank {rank}: {name}")
    return want


def assert_same_steps(one: list[dict], other: list[dict]) -> None:
    assert len(one) == len(other) == 4
    assert [s["loss"] for s in other] == pytest.approx([s["loss"] for s in one], rel=1e-5)
    assert [s["grad_norm"] for s in other] == pytest.approx([s["grad_norm"] for s in one],
                                                            rel=1e-5)


@pytest.mark.parametrize("strategy", list(TP_STRATEGIES))
def test_sharding_with_tensor_parallelism_matches_one_process(single, with_tensor_parallel,
                                                              strategy) -> None:
    output = with_tensor_parallel(strategy)
    assert_same_steps(steps(single), steps(output))
    assert TP_STRATEGIES[strategy] in worker_log(output)


@pytest.mark.parametrize("strategy", ["optim_grads", "optim_grads_params"])
def test_sharding_with_tensor_parallelism_saves_each_ranks_tensor_shards(
        data_prefix, single, with_tensor_parallel, strategy) -> None:
    """The final weights equal the one-process run's, cut into tensor shards: each rank's
    model file holds its tensor rank's shards whole (FSDP gathers them over the shard
    group), the same on the two ranks of a shard group; the optimizer files hold slices of
    a tensor shard's flat buffers."""
    output = with_tensor_parallel(strategy)
    want = assert_tensor_shards_of(single, output, data_prefix, world=4)
    saved = [checkpoint_files(output, 4, "model", rank, world=4) for rank in (0, 2)]
    for name in saved[0]:
        np.testing.assert_array_equal(saved[0][name], saved[1][name], err_msg=name)
    per_shard = sum(array.size for array in want[0].values())
    layouts = [checkpoint_files(output, 4, "opt", rank, world=4)["shard_layout"].tolist()
               for rank in range(4)]
    assert [layout[:3] for layout in layouts] == [[2, 0, per_shard], [2, 0, per_shard],
                                                  [2, 1, per_shard], [2, 1, per_shard]]


def test_fsdp_with_tensor_parallelism_resumes_exactly(data_prefix, with_tensor_parallel,
                                                      tmp_path) -> None:
    """Steps 3-4 resumed on 4 ranks from the step-2 checkpoint equal the uninterrupted run's
    bit for bit."""
    whole = with_tensor_parallel(FSDP_STRATEGY)
    resumed = tmp_path / "resumed"
    run_with_tensor_parallel(data_prefix, resumed, FSDP_STRATEGY,
                             f"checkpoint.load_path={whole / 'ckpt' / iteration_name(2)}",
                             "checkpoint.enable_save=false")
    again, reference = steps(resumed), steps(whole)[2:]
    assert [s["step"] for s in again] == [3, 4]
    assert [(s["loss"], s["grad_norm"]) for s in again] == \
        [(s["loss"], s["grad_norm"]) for s in reference]


def test_hsdp_with_tensor_parallelism_matches_one_process(data_prefix, runs, tmp_path) -> None:
    """8 ranks: data parallel 4 = replicate 2 x shard 2 (FSDP), x tensor parallel 2, one
    sample per data-parallel rank, against one process taking the same 4 samples one by
    one; the final weights too."""
    eight = tmp_path / "eight"
    batch = "training.local_batch_size=1"
    one = runs(QWEN3, *QWEN3_2_LAYERS, batch)
    run_with_tensor_parallel(data_prefix, eight, FSDP_STRATEGY, batch,
                             "parallelism.data_parallel_shard=2", nproc=8)
    assert_same_steps(steps(one), steps(eight))
    assert "FSDP over 2 ranks x 2 replicas, tensor parallel 2" in worker_log(eight)
    assert_tensor_shards_of(one, eight, data_prefix, world=8)


REFUSED = {
    "muon": (2, ["optimizer.type=Muon"],
             "optimizer.type: Muon cannot run under optim_grads_params (FSDP) with "
             "data_parallel_shard 2: its Newton-Schulz step needs each weight matrix whole"),
    "swap": (2, ["swap.enable=true", "swap.layer_swap=[{'layers': ['0']}]"],
             "swap.enable: swap cannot run under optim_grads_params (FSDP) with "
             "data_parallel_shard 2: both use MindSpore's saved-tensor hooks, which do not "
             "stack"),
    "recompute_comm": (4, ["parallelism.tensor_parallel=2", "recompute_comm.enable=true",
                           "recompute_comm.select_module={'attention.qkv': ['0']}"],
                       "recompute_comm.enable: communication recompute cannot run under "
                       "optim_grads_params (FSDP)"),
}


@pytest.mark.parametrize("case", list(REFUSED))
def test_what_cannot_be_sharded_is_refused_before_the_ranks_start(data_prefix, tmp_path, capsys,
                                                                  case) -> None:
    ranks, settings, message = REFUSED[case]
    args = arguments(QWEN3, tmp_path, data_prefix, [*QWEN3_2_LAYERS, *settings])
    assert run([*args, "--nproc", str(ranks), "--timeout", "60"]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "logs").exists()
