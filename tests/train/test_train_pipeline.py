"""`mf-train --nproc N` with pipeline parallelism on real msrun ranks: every schedule gives the
losses, gradient norms and weights of one process; pipeline x FSDP and pipeline x tensor
parallelism too; a pipelined run resumes bit for bit; each stage saves its own parameters
under the model-wide names."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("mindspore")

from runs import (
    QWEN3,
    QWEN3_4_LAYERS,
    Case,
    assert_resumed_exactly,
    rank_pieces,
    saved_tensors,
    train,
    worker_log,
)
from same_tensors import assert_same_tensors

from mf_train.checkpoint.layout import iteration_name
from mf_train.launch.cli import run

PIPELINE_2 = "parallelism.pipeline_parallel=2"
SCHEDULES = {
    "gpipe": ("parallelism.pipeline_parallel_schedule=gpipe",),
    "1f1b": (),
    "interleaved_1f1b": ("parallelism.pipeline_parallel_schedule=interleaved_1f1b",
                         "parallelism.pipeline_parallel_interleave_num=2"),
}
STAGE_LAYERS = {"gpipe": ([0, 1], [2, 3]), "1f1b": ([0, 1], [2, 3]),
                "interleaved_1f1b": ([0, 2], [1, 3])}
PIPELINE_X_TENSOR = (PIPELINE_2, "parallelism.tensor_parallel=2")
"""2 stages x tensor parallel 2 on 4 ranks (a run tests/train/test_checkpoint_layouts.py
continues from)."""
SPLIT = "parallelism.pipeline_parallel_enable_dxdw_split=true"
ONE_SAMPLE = "training.local_batch_size=1"


def case(*layout: str, nproc: int = 4, alone: bool = False, log: str | None = None,
         job: str = "") -> Case:
    """The tiny Qwen3 (4 layers, tied embeddings) narrowed: 4 steps of 2 micro-batches, a
    checkpoint at steps 2 and 4, laid out by `layout` on `nproc` ranks."""
    return Case(QWEN3, QWEN3_4_LAYERS, layout, nproc, log=log, alone=alone, job=job)


CASES = {
    # the test_compiled_layouts.py matrix and test_checkpoint_layouts.py read these too
    **{schedule: case(PIPELINE_2, *sets, nproc=2, alone=True, log=f"pipeline 2 ({schedule}")
       for schedule, sets in SCHEDULES.items()},
    "tensor": case(*PIPELINE_X_TENSOR, alone=True),
    "FSDP": case(PIPELINE_2, "parallelism.data_parallel_shard_strategy=optim_grads_params",
                 log="pipeline 2 (1f1b; this stage 0: layers 0-1) x FSDP over 2 ranks"),
    "four stages": case("parallelism.pipeline_parallel=4",
                        "parallelism.pipeline_parallel_overlap_p2p=true", ONE_SAMPLE,
                        log="pipeline 4 (1f1b; this stage 0: layers 0; messages overlapped)"),
    "context split": case(PIPELINE_2, "parallelism.context_parallel=2", SPLIT, log=(
        "pipeline 2 (1f1b, backward split into B and W (ZB-H1); this stage 0: layers 0-1) "
        "x context parallel 2 (")),
    "four stages split": case("parallelism.pipeline_parallel=4", SPLIT, ONE_SAMPLE, log=(
        "pipeline 4 (1f1b, backward split into B and W (ZB-H1); this stage 0")),
    "3D": case(PIPELINE_2, "parallelism.tensor_parallel=2", ONE_SAMPLE, nproc=8, job="slow",
               log=("pipeline 2 (1f1b; this stage 0: layers 0-1) x FSDP over 2 ranks, tensor "
                    "parallel 2 (sequence parallel)")),
}
pytestmark = pytest.mark.ranks


def model_file(output: Path, rank: int, world: int) -> dict[str, np.ndarray]:
    """What `rank` wrote of the model at step 4 (a stage's tensors are whole)."""
    pieces = rank_pieces(output, 4, "model", rank, world)
    assert all(piece.whole for piece in pieces)
    return {piece.name: values.reshape(piece.shape) for piece, values in pieces.items()}


@pytest.mark.parametrize("schedule", list(SCHEDULES))
def test_each_schedule_matches_one_process(layout_runs, schedule) -> None:
    output = layout_runs.check(schedule)
    layers = ", ".join(str(i) for i in STAGE_LAYERS[schedule][0])
    if schedule != "interleaved_1f1b":
        layers = "0-1"
    assert f"this stage 0: layers {layers})" in worker_log(output)


@pytest.mark.parametrize("schedule", list(SCHEDULES))
def test_each_stage_saves_its_parameters_under_model_wide_names(layout_runs, schedule) -> None:
    """Stage files together hold the one-process model's weights after 4 steps, each stage
    its own layers; the tied embedding once, by the first stage (the last holds a copy)."""
    want = saved_tensors(layout_runs.one_process(schedule), 4)
    stages = [model_file(layout_runs(schedule), rank, 2) for rank in (0, 1)]
    for stage, layers in zip(stages, STAGE_LAYERS[schedule], strict=True):
        held = {int(name.split(".")[1]) for name in stage if name.startswith("decoder_layers.")}
        assert held == set(layers)
    assert "final_norm.weight" in stages[1] and "final_norm.weight" not in stages[0]
    assert "embedding.weight" in stages[0] and "embedding.weight" not in stages[1]
    assert_same_tensors({**stages[0], **stages[1]}, want, rel=1e-4)


def test_a_pipelined_run_resumes_bit_for_bit(data_prefix, layout_runs, tmp_path) -> None:
    """Steps 3-4 resumed from the 1F1B run's step-2 checkpoint: the same losses, norms and
    final weights as the uninterrupted run, bit for bit."""
    whole = layout_runs("1f1b")
    resumed = tmp_path / "resumed"
    train(QWEN3, resumed, data_prefix, *QWEN3_4_LAYERS, PIPELINE_2,
          f"checkpoint.load_path={whole / 'ckpt' / iteration_name(2)}", nproc=2)
    assert_resumed_exactly(resumed, whole)
    assert_same_tensors(saved_tensors(resumed, 4), saved_tensors(whole, 4), rel=0, atol=0)


def test_pipeline_with_fsdp_matches_one_process(layout_runs) -> None:
    """4 ranks: 2 stages x FSDP over 2 data-parallel ranks (reshard policy `default`, which
    keeps parameters gathered between forward and backward under pipelining)."""
    layout_runs.check("FSDP")


def test_pipeline_with_tensor_parallel_matches_one_process(layout_runs) -> None:
    """4 ranks: 2 stages x tensor parallel 2 (sequence parallel): the vocabulary-split tied
    embedding's copies and the stage messages (sequence slices) line up."""
    layout_runs.check("tensor")


def test_four_stages_match_one_process(layout_runs) -> None:
    """One layer per stage, 4 micro-batches of one sample: messages pass through the middle
    stages (two neighbours each), launched without waiting and waited for where used
    (`pipeline_parallel_overlap_p2p`), and the tied embedding's copies are on stages 0 and 3."""
    output = layout_runs.check("four stages")
    stages = [model_file(output, rank, 4) for rank in range(4)]
    assert [sorted(name.split(".")[1] for name in stage if name.startswith("decoder_layers")
                   and name.endswith("input_norm.weight")) for stage in stages] == \
        [["0"], ["1"], ["2"], ["3"]]
    assert ["embedding.weight" in stage for stage in stages] == [True, False, False, False]


@pytest.mark.slow  # 8 ranks on 2 cores: about 60-75 s
def test_eight_ranks_pipeline_fsdp_and_tensor_parallel(layout_runs) -> None:
    """3D: 2 stages x FSDP over 2 data-parallel ranks x tensor parallel 2, micro-batches of one
    sample (2 per data-parallel rank and step), against one process on the same global batch."""
    layout_runs.check("3D")


def test_context_parallel_with_pipeline_and_the_split_backward(layout_runs) -> None:
    """4 ranks: 2 stages x context parallel 2 (colossal): each stage pair passes its sequence
    chunks' hidden states (half of each sample's tokens), the tied embedding's copies line up
    over the pipeline group of each context rank, the loss and the norm count every token
    once; with `pipeline_parallel_enable_dxdw_split`, 1F1B's backwards as B (input gradient)
    and W (weight gradient) in ZB-H1's order. (Ulysses with interleaved stages:
    test_deepseek_v3_pipeline.py.)"""
    layout_runs.check("context split")


def test_four_stages_with_the_split_backward(layout_runs) -> None:
    """4 micro-batches of one sample over 4 stages, stage s keeping up to s Ws for the end."""
    layout_runs.check("four stages split")


def test_the_split_backward_of_another_schedule_is_refused_before_launch(tmp_path,
                                                                         capsys) -> None:
    status = run(["--config", str(QWEN3), "--output-dir", str(tmp_path), "--nproc", "2",
                  "--set", "parallelism.pipeline_parallel=2",
                  "--set", "parallelism.pipeline_parallel_schedule=gpipe",
                  "--set", "parallelism.pipeline_parallel_enable_dxdw_split=true"])
    err = capsys.readouterr().err
    assert status == 2
    assert err.startswith("mf-train: gpipe has no form with the backward split into input and "
                          "weight gradients (pipeline_parallel_enable_dxdw_split)")
    assert "starting 2 ranks" not in err
