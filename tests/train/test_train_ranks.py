"""`mf-train --nproc 2` on real msrun ranks: data parallel and tensor parallel equal the
single-process run, summed and averaged gradients give the same update, and a failing rank
stops the job with that rank's error."""

from __future__ import annotations

import re

import pytest

pytest.importorskip("mindspore")

from runs import CONSOLE, QWEN3, QWEN3_2_LAYERS, Case, arguments, steps, worker_log

from mf_train.launch.cli import run

REPLICATED = "parallelism.data_parallel_shard=1"
CASES = {  # other test files read both runs too
    "data parallel": Case(QWEN3, QWEN3_2_LAYERS, (REPLICATED,), alone=True),
    "tensor parallel": Case(QWEN3, QWEN3_2_LAYERS, ("parallelism.tensor_parallel=2",),
                            alone=True),
}
pytestmark = pytest.mark.ranks


def test_two_rank_data_parallel_matches_one_process(layout_runs) -> None:
    """Replicated data parallelism (data_parallel_shard 1; the sharded strategies are
    test_train_sharded.py's)."""
    layout_runs.check("data parallel")


def test_two_rank_tensor_parallel_matches_one_process(layout_runs) -> None:
    """Tensor parallel 2 with sequence parallelism (vocabulary-parallel embedding and loss,
    column/row-parallel attention and MLP) against the single-process run."""
    layout_runs.check("tensor parallel")


def test_summed_and_averaged_gradients_give_the_same_update(runs, layout_runs) -> None:
    """`disable_gradient_division` true (the default, MindFormers'): gradients summed over the
    ranks, each rank's loss divided by 2 first; false: the reduced gradients averaged. With
    two ranks both scalings are exact powers of two, so the runs agree bit for bit. (The
    summed run is the default one the data-parallel test compares.)"""
    summed = steps(layout_runs("data parallel"))
    averaged = steps(runs(QWEN3, *QWEN3_2_LAYERS, REPLICATED,
                          "parallelism.disable_gradient_division=false", nproc=2))
    assert len(summed) == 4
    assert [(m["loss"], m["grad_norm"]) for m in summed] == \
        [(m["loss"], m["grad_norm"]) for m in averaged]
    # what differs is each rank's gradient before the reduction: half as large when summed
    assert [m["embedding_local_norm"] for m in summed] == pytest.approx(
        [m["embedding_local_norm"] / 2 for m in averaged], rel=1e-6)


def test_a_failing_rank_stops_the_job_with_its_error(data_prefix, tmp_path, capsys) -> None:
    """The byte-level corpus (ids up to 256) for a model of 200 ids: nothing the launcher
    checks, and each rank finds the first id outside the vocabulary when it reads a sample
    (a .bin that disagrees with its .idx is refused before launch: test_input_checks.py)."""
    args = arguments(QWEN3, tmp_path, data_prefix, [*QWEN3_2_LAYERS, "model.vocab_size=200"])
    assert run([*args, "--nproc", "2", "--timeout", "300"]) == 1
    err = capsys.readouterr().err
    assert "failed: " in err and "worker_" in err
    assert "is outside the model's vocabulary: model.vocab_size is 200" in err


FLOAT16_REDUCTION = (*QWEN3_2_LAYERS, REPLICATED, "recompute.select_module={mlp: ['1']}",
                     "parallelism.cpu_offload=true", "parallelism.reduce_dtype=float16")
"""Replicated data parallelism with the gradients reduced in float16; the two settings that
have no effect (recompute.mode stays None) make it the run of the console test too."""


def test_gradients_reduced_in_float16_stay_near_float32(runs, layout_runs) -> None:
    """`reduce_dtype: float16` casts each bucket to float16 for the all-reduce (the exact sums
    against numpy: tests/parallel/test_runtime_collectives.py): the first step's loss is the
    float32 run's (same weights); every gradient norm differs from float32's (the cast
    happened) by float16's rounding (measured: 2e-5 relative), and the losses stay within
    1e-5 of float32's and of one process (measured: equal in float32)."""
    half = steps(runs(QWEN3, *FLOAT16_REDUCTION, nproc=2))
    full = steps(layout_runs("data parallel"))
    assert half[0]["loss"] == full[0]["loss"]
    for one, other in zip(half, full, strict=True):
        assert one["grad_norm"] != other["grad_norm"]
        assert one["grad_norm"] == pytest.approx(other["grad_norm"], rel=1e-4)
    for reference in (full, steps(layout_runs.one_process("data parallel"))):
        assert [s["loss"] for s in half] == pytest.approx([s["loss"] for s in reference],
                                                          rel=1e-5)


def test_the_console_says_each_warning_once_without_mindspore_info(runs) -> None:
    """What a user's terminal shows of `--nproc 2`: a configuration warning (mf-config's) and
    a no-effect warning (the trainer's) once each, from the launcher; none of MindSpore's C++
    INFO lines, which stay in the rank's log."""
    output = runs(QWEN3, *FLOAT16_REDUCTION, nproc=2)
    console = (output / CONSOLE).read_text(encoding="utf-8")
    assert console.count("recompute.select_module: warning: ignored because mode is 'None'") == 1
    assert console.count("parallelism.cpu_offload: warning: has no effect") == 1
    assert "ConfigWarning" not in console
    assert re.search(r"^\[rank 0\] .* step \[2/4\] loss ", console, re.MULTILINE)
    assert not re.search(r"^\[rank 0\] \[(INFO|DEBUG)\] ", console, re.MULTILINE)
    assert re.search(r"^\[INFO\] DISTRIBUTED\(", worker_log(output), re.MULTILINE)
