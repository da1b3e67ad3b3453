"""`mf-train --nproc 2` with each sharded data-parallel strategy (ZeRO-1, ZeRO-2, FSDP) on real
msrun ranks: losses and gradient norms equal the single-process run, checkpoints hold the whole
model and per-rank optimizer slices, a sharded run resumes exactly, and what cannot be sharded
is refused before any rank starts."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("mindspore")

import itertools

from checkpoint_samples import as_format_2
from runs import (
    QWEN3,
    QWEN3_2_LAYERS,
    Case,
    arguments,
    assert_resumed_across_layouts,
    assert_resumed_exactly,
    assert_same_weights,
    rank_pieces,
    saved_tensors,
    steps,
    train,
)
from same_tensors import assert_same_tensors
from tensor_groups import tensor_group

from mf_config import load_config
from mf_train.checkpoint.layout import iteration_name
from mf_train.checkpoint.params import apply_model_params, model_arrays
from mf_train.launch.cli import run
from mf_train.models import build_model, hf_state, load_hf_state
from mf_train.parallelize import build_parallel_model

FSDP_STRATEGY = "optim_grads_params"
STRATEGIES = {"optim": "ZeRO-1 over 2 ranks", "optim_grads": "ZeRO-2 over 2 ranks",
              "optim_grads_params": "FSDP over 2 ranks, reshard policy default, vocabulary "
                                    "split over the shard group",
              "replicated": "data parallel 2 (replicated)"}
pytestmark = pytest.mark.ranks


def strategy_setting(strategy: str) -> str:
    """The setting of a strategy; `replicated`: shard degree 1, plain data parallelism."""
    return ("parallelism.data_parallel_shard=1" if strategy == "replicated"
            else f"parallelism.data_parallel_shard_strategy={strategy}")


def two_ranks(prefix: str, output: Path, *more: str) -> None:
    train(QWEN3, output, prefix, *QWEN3_2_LAYERS, *more, nproc=2, timeout=300)


@pytest.mark.parametrize("strategy", list(STRATEGIES))
def test_each_strategy_matches_one_process(layout_runs, strategy) -> None:
    layout_runs.check(strategy)
    assert steps(layout_runs.one_process(strategy))[0]["grad_norm"] > 1.0  # max_norm 1: the
    # first steps are clipped


@pytest.mark.parametrize("strategy", ["optim", "optim_grads_params"])
def test_each_rank_saves_its_slices_of_the_one_process_checkpoint(layout_runs,
                                                                   strategy) -> None:
    """Each rank writes the ranges of every tensor (weights, AdamW moments) its slices
    hold, nothing gathered and nothing twice; together they are the one-process run's
    checkpoint (float32 parameters: no separate masters)."""
    output, single = layout_runs(strategy), layout_runs.one_process(strategy)
    for kind in ("model", "opt"):
        assert_same_weights(output, single, rel=1e-4, kind=kind, whole=True)
        want = saved_tensors(single, 4, kind)
        assert not any(name.startswith("main_param.")
                       for name in saved_tensors(output, 4, kind))
        ranges: dict[str, list[tuple[int, int]]] = {}
        for rank in (0, 1):
            held = rank_pieces(output, 4, kind, rank, world=2)
            assert sum(values.size for values in held.values()) < sum(
                array.size for array in want.values()) * 0.6  # about half each
            for piece in held:
                ranges.setdefault(piece.name, []).append((piece.start, piece.stop))
        for name, array in want.items():  # the two ranks' ranges tile each tensor once
            ends = sorted(ranges[name])
            assert ends[0][0] == 0 and ends[-1][1] == array.size, name
            assert all(a[1] == b[0] for a, b in itertools.pairwise(ends)), name


def test_fsdp_resumes_exactly(data_prefix, layout_runs, tmp_path) -> None:
    """Steps 3-4 resumed from FSDP's step-2 checkpoint equal the uninterrupted run's."""
    whole = layout_runs(FSDP_STRATEGY)
    resumed = tmp_path / "resumed"
    two_ranks(data_prefix, resumed, "parallelism.data_parallel_shard_strategy="
                                    "optim_grads_params",
              f"checkpoint.load_path={whole / 'ckpt' / 'iteration_00000002'}",
              "checkpoint.enable_save=false")
    assert_resumed_exactly(resumed, whole)


def test_fsdp_checkpoint_resumes_on_one_process(data_prefix, layout_runs, tmp_path) -> None:
    """FSDP's step-2 checkpoint (each rank's slices) continued by one process: steps 3-4
    are the uninterrupted one-process run's (weights, moments, step count, data position)."""
    saved = layout_runs(FSDP_STRATEGY) / "ckpt" / iteration_name(2)
    train(QWEN3, tmp_path, data_prefix, *QWEN3_2_LAYERS, f"checkpoint.load_path={saved}",
          "checkpoint.enable_save=false")
    assert_resumed_across_layouts(tmp_path, layout_runs.one_process(FSDP_STRATEGY))


def test_one_process_checkpoint_resumes_under_zero_2(data_prefix, runs, tmp_path) -> None:
    """One process's step-2 checkpoint continued by ZeRO-2 on 2 ranks, each reading only the
    ranges of its slices."""
    single = runs(QWEN3, *QWEN3_2_LAYERS)
    two_ranks(data_prefix, tmp_path, "parallelism.data_parallel_shard_strategy=optim_grads",
              f"checkpoint.load_path={single / 'ckpt' / iteration_name(2)}",
              "checkpoint.enable_save=false")
    assert_resumed_across_layouts(tmp_path, single)


def test_a_format_2_checkpoint_resumes_on_its_own_layout(data_prefix, runs,
                                                        tmp_path) -> None:
    """A checkpoint an earlier mf wrote (format 2: per-rank files, no piece index) still
    resumes on the layout that wrote it, bit for bit."""
    single = runs(QWEN3, *QWEN3_2_LAYERS)
    old = as_format_2(single / "ckpt" / iteration_name(2), tmp_path / "old" / iteration_name(2))
    train(QWEN3, tmp_path / "run", data_prefix, *QWEN3_2_LAYERS, f"checkpoint.load_path={old}",
          "checkpoint.enable_save=false")
    assert_resumed_exactly(tmp_path / "run", single)


def test_a_format_2_checkpoint_is_converted_without_training(data_prefix, runs,
                                                             tmp_path, capsys) -> None:
    """On another world size a format-2 checkpoint is refused in one line giving the command
    that converts it; that command (its layout, `training.steps` at the saved step, a new
    output directory) trains nothing and saves the same tensors in the sharded format, which
    then continues on 2 ranks under ZeRO-2 as the uninterrupted run."""
    single = runs(QWEN3, *QWEN3_2_LAYERS)
    old = as_format_2(single / "ckpt" / iteration_name(2), tmp_path / "old" / iteration_name(2))
    capsys.readouterr()
    refused = arguments(QWEN3, tmp_path / "refused", data_prefix,
                        [*QWEN3_2_LAYERS, f"checkpoint.load_path={old}"])
    assert run([*refused, "--nproc", "2", "--timeout", "300"]) != 0
    assert (f"{old} was saved by 1 rank(s) in format 2 (an earlier mf's), which loads only on "
            "the layout that saved it; this run has 2: convert it on its layout, training "
            "nothing: `mf-train --config <its train.yaml> --nproc 1 --output-dir <new "
            f"directory> --set checkpoint.load_path={old} --set training.steps=2` saves step 2"
            ) in capsys.readouterr().err
    converted = tmp_path / "converted"
    train(QWEN3, converted, data_prefix, *QWEN3_2_LAYERS, f"checkpoint.load_path={old}",
          "training.steps=2")
    assert steps(converted) == []
    for kind in ("model", "opt"):
        assert_same_tensors(saved_tensors(converted, 2, kind), saved_tensors(single, 2, kind),
                            rel=0, atol=0, what=kind)
    two_ranks(data_prefix, tmp_path / "zero2",
              "parallelism.data_parallel_shard_strategy=optim_grads",
              f"checkpoint.load_path={converted / 'ckpt'}", "checkpoint.enable_save=false")
    assert_resumed_across_layouts(tmp_path / "zero2", single)


def test_a_format_2_checkpoint_that_does_not_fit_names_its_conversion(data_prefix, runs,
                                                                       tmp_path,
                                                                       capsys) -> None:
    """On the same world size a format-2 checkpoint cannot tell a layout change from a model
    change (it has no configuration): the parameters that do not fit are listed, then the
    command that converts it on the layout that saved it."""
    single = runs(QWEN3, *QWEN3_2_LAYERS)
    old = as_format_2(single / "ckpt" / iteration_name(2), tmp_path / "old" / iteration_name(2))
    capsys.readouterr()
    args = arguments(QWEN3, tmp_path / "run", data_prefix,
                     [*QWEN3_2_LAYERS, f"checkpoint.load_path={old}", "model.intermediate_size=96"])
    assert run(args) == 1
    err = capsys.readouterr().err
    assert "checkpoint does not fit the model (4 problems)" in err
    assert "decoder_layers.0.mlp.gate_up.weight: shape (128, 32)" in err
    assert (f"{old} is in format 2 (an earlier mf's), which loads only on the layout that saved "
            "it; if that layout was not this one, convert it on its layout, training nothing: "
            "`mf-train --config <its train.yaml> --nproc 1 --output-dir <new directory> --set "
            f"checkpoint.load_path={old} --set training.steps=2`") in err
    assert "Traceback" not in err


def test_fsdp_loads_weights_saved_by_zero(data_prefix, layout_runs, tmp_path) -> None:
    """Weights only (`no_load_optim`): FSDP gathers its model, loads the whole model ZeRO-1
    saved at step 2 and takes its slices from it; it then trains as one process does from its
    own step-2 weights. The FSDP run compiles its layers (`context.compile`): the graphs
    keep their parameter tensors, whose storage FSDP frees and refills around each pass."""
    single = layout_runs.one_process("optim")
    common = ("checkpoint.no_load_optim=true", "checkpoint.enable_save=false",
              "training.steps=2")
    one, two = tmp_path / "one", tmp_path / "two"
    saved_by_one = single / "ckpt" / iteration_name(2)
    train(QWEN3, one, data_prefix, *QWEN3_2_LAYERS, f"checkpoint.load_path={saved_by_one}",
          *common)
    saved_by_zero = layout_runs("optim") / "ckpt" / iteration_name(2)
    two_ranks(data_prefix, two, f"checkpoint.load_path={saved_by_zero}",
              "parallelism.data_parallel_shard_strategy=optim_grads_params",
              "context.compile=true", *common)
    expected = [s["loss"] for s in steps(one)]
    assert [s["loss"] for s in steps(two)] == pytest.approx(expected, rel=1e-5)
    assert [s["grad_norm"] for s in steps(two)] == pytest.approx(
        [s["grad_norm"] for s in steps(one)], rel=1e-5)
    assert steps(two)[0]["compiled_graphs"] >= 2  # both layers, forward and backward
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


ONE_SAMPLE = "training.local_batch_size=1"
"""On 4 data-parallel ranks: the global batch of 4 as one sample per rank."""
HSDP = (strategy_setting(FSDP_STRATEGY), "parallelism.data_parallel_shard=2")
"""Data parallel 4 = replicate 2 x shard 2 (FSDP)."""
CASES = {
    # the 2-layer tiny Qwen3, 4 steps, checkpoints at steps 2 and 4: each strategy on 2
    # ranks (the test_compiled_layouts.py matrix and test_checkpoint_layouts.py read them too)
    **{strategy: Case(QWEN3, QWEN3_2_LAYERS, (strategy_setting(strategy),), alone=True,
                      log=line) for strategy, line in STRATEGIES.items()},
    # data parallel 2 (sharded by the strategy) x tensor parallel 2 on 4 ranks: ranks 0 and 1
    # form a tensor group, 0 and 2 a shard group (FSDP's is the matrix's run too)
    **{f"tensor {strategy}": Case(QWEN3, QWEN3_2_LAYERS,
                                  with_tensor_parallel_settings(strategy)[len(QWEN3_2_LAYERS):],
                                  4, log=line, alone=strategy == FSDP_STRATEGY)
       for strategy, line in TP_STRATEGIES.items()},
    # 4 (8) ranks, one sample per data-parallel rank, against one process taking the same 4
    # samples one by one (HSDP alone is the matrix's run too)
    "HSDP": Case(QWEN3, (*QWEN3_2_LAYERS, ONE_SAMPLE), HSDP, 4, weights=1e-4, alone=True, log=(
        "FSDP over 2 ranks x 2 replicas, reshard policy default, vocabulary split over the "
        "shard group")),
    "HSDP x tensor": Case(QWEN3, (*QWEN3_2_LAYERS, ONE_SAMPLE), (
        "parallelism.tensor_parallel=2", f"parallelism.data_parallel_shard_strategy="
        f"{FSDP_STRATEGY}", "parallelism.data_parallel_shard=2"), 8,
        log="FSDP over 2 ranks x 2 replicas, tensor parallel 2"),
}


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
        shard = build_parallel_model(config.model, tensor_group=tensor_group(rank, size))
        load_hf_state(shard, weights)
        shards.append(model_arrays(shard.parameters_and_names()))
    return shards


def assert_tensor_shards_of(single: Path, output: Path, data_prefix: str,
                            ) -> list[dict[str, np.ndarray]]:
    """The step-4 checkpoint of `output` holds at each tensor place the shards (of the
    weights `single` saved) that place trains with; returns those shards."""
    want = as_tensor_shards(saved_tensors(single, 4), data_prefix, 2)
    for place in range(2):
        assert_same_tensors(saved_tensors(output, 4, place=(place, 2)), want[place], rel=1e-4,
                            what=f"tensor place {place}")
    return want


@pytest.mark.parametrize("strategy", list(TP_STRATEGIES))
def test_sharding_with_tensor_parallelism_matches_one_process(layout_runs, strategy) -> None:
    layout_runs.check(f"tensor {strategy}")


@pytest.mark.parametrize("strategy", ["optim_grads", "optim_grads_params"])
def test_sharding_with_tensor_parallelism_saves_each_ranks_tensor_shards(
        data_prefix, layout_runs, strategy) -> None:
    """The final weights equal the one-process run's, cut into tensor shards: the checkpoint
    holds each tensor place's shards, each rank writing its slices of its place's shards
    (a weight tensor parallelism does not split: the first tensor place's ranks alone)."""
    output = layout_runs(f"tensor {strategy}")
    want = assert_tensor_shards_of(layout_runs.one_process(strategy), output, data_prefix)
    for rank in range(4):  # tensor innermost: rank r is tensor place r % 2
        for piece in rank_pieces(output, 4, "model", rank, world=4):
            assert piece.tensor in (None, (rank % 2, 2)), piece
            assert piece.tensor is not None or rank % 2 == 0, piece
    moments = saved_tensors(output, 4, "opt", place=(1, 2))
    assert {name.partition(".")[2] for name in moments if name != "global_step"} == \
        set(want[1])


def test_fsdp_with_tensor_parallelism_resumes_exactly(data_prefix, layout_runs,
                                                      tmp_path) -> None:
    """Steps 3-4 resumed on 4 ranks from the step-2 checkpoint equal the uninterrupted run's
    bit for bit."""
    whole = layout_runs(f"tensor {FSDP_STRATEGY}")
    resumed = tmp_path / "resumed"
    train(QWEN3, resumed, data_prefix, *with_tensor_parallel_settings(FSDP_STRATEGY),
          f"checkpoint.load_path={whole / 'ckpt' / iteration_name(2)}",
          "checkpoint.enable_save=false", nproc=4)
    assert_resumed_exactly(resumed, whole)


def test_hsdp_keeps_the_vocabulary_as_rows_and_matches_one_process(layout_runs) -> None:
    """4 ranks: data parallel 4 = replicate 2 x shard 2 (FSDP), no tensor parallelism, one
    sample per rank: the embedding stays as rows over the shard group (the tokens travel) and
    its rows' gradient is summed over the replicas; losses, norms and the final weights equal
    one process taking the same 4 samples one by one."""
    layout_runs.check("HSDP")


def test_hsdp_with_tensor_parallelism_matches_one_process(data_prefix, layout_runs) -> None:
    """8 ranks: data parallel 4 = replicate 2 x shard 2 (FSDP), x tensor parallel 2, one
    sample per data-parallel rank, against one process taking the same 4 samples one by
    one; the final weights too."""
    output = layout_runs.check("HSDP x tensor")
    assert_tensor_shards_of(layout_runs.one_process("HSDP x tensor"), output, data_prefix)


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
