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
    assert_resumed_exactly,
    assert_same_run,
    rank_pieces,
    saved_tensors,
    train,
)

from mf_train.checkpoint.layout import iteration_name
from mf_train.cli import run

SCHEDULES = {
    "gpipe": ["parallelism.pipeline_parallel_schedule=gpipe"],
    "1f1b": [],
    "interleaved_1f1b": ["parallelism.pipeline_parallel_schedule=interleaved_1f1b",
                         "parallelism.pipeline_parallel_interleave_num=2"],
}
STAGE_LAYERS = {"gpipe": ([0, 1], [2, 3]), "1f1b": ([0, 1], [2, 3]),
                "interleaved_1f1b": ([0, 2], [1, 3])}
pytestmark = pytest.mark.ranks


def ranks(prefix: str, output: Path, nproc: int, *more: str) -> None:
    """The tiny Qwen3 (4 layers, tied embeddings) narrowed: 4 steps of 2 micro-batches, a
    checkpoint at steps 2 and 4, on `nproc` ranks."""
    train(QWEN3, output, prefix, *QWEN3_4_LAYERS, *more, nproc=nproc)


def model_file(output: Path, rank: int, world: int) -> dict[str, np.ndarray]:
    """What `rank` wrote of the model at step 4 (a stage's tensors are whole)."""
    pieces = rank_pieces(output, 4, "model", rank, world)
    assert all(piece.whole for piece in pieces)
    return {piece.name: values.reshape(piece.shape) for piece, values in pieces.items()}


PIPELINE_X_TENSOR = ("parallelism.pipeline_parallel=2", "parallelism.tensor_parallel=2")
"""2 stages x tensor parallel 2 on 4 ranks (a run tests/train/test_checkpoint_layouts.py
continues from)."""


@pytest.fixture(scope="module")
def single(runs) -> Path:
    return runs(QWEN3, *QWEN3_4_LAYERS)


@pytest.fixture(scope="module")
def pipelined(runs):
    """Each schedule's 2-stage run, launched once on first use."""
    return lambda schedule: runs(QWEN3, *QWEN3_4_LAYERS, "parallelism.pipeline_parallel=2",
                                 *SCHEDULES[schedule], nproc=2)


@pytest.mark.parametrize("schedule", list(SCHEDULES))
def test_each_schedule_matches_one_process(single, pipelined, schedule) -> None:
    output = pipelined(schedule)
    assert_same_run(output, single)
    log = (output / "logs" / "worker_0.log").read_text()
    layers = ", ".join(str(i) for i in STAGE_LAYERS[schedule][0])
    if schedule != "interleaved_1f1b":
        layers = "0-1"
    assert f"pipeline 2 ({schedule}" in log and f"this stage 0: layers {layers})" in log


@pytest.mark.parametrize("schedule", list(SCHEDULES))
def test_each_stage_saves_its_parameters_under_model_wide_names(single, pipelined,
                                                                schedule) -> None:
    """Stage files together hold the one-process model's weights after 4 steps, each stage
    its own layers; the tied embedding once, by the first stage (the last holds a copy)."""
    want = saved_tensors(single, 4)
    stages = [model_file(pipelined(schedule), rank, 2) for rank in (0, 1)]
    for stage, layers in zip(stages, STAGE_LAYERS[schedule], strict=True):
        held = {int(name.split(".")[1]) for name in stage if name.startswith("decoder_layers.")}
        assert held == set(layers)
    assert "final_norm.weight" in stages[1] and "final_norm.weight" not in stages[0]
    assert "embedding.weight" in stages[0] and "embedding.weight" not in stages[1]
    merged = {**stages[0], **stages[1]}
    assert merged.keys() == want.keys()
    for name, array in want.items():
        np.testing.assert_allclose(merged[name], array, rtol=1e-4, atol=1e-6, err_msg=name)


def test_a_pipelined_run_resumes_bit_for_bit(data_prefix, pipelined, tmp_path) -> None:
    """Steps 3-4 resumed from the 1F1B run's step-2 checkpoint: the same losses, norms and
    final weights as the uninterrupted run, bit for bit."""
    whole = pipelined("1f1b")
    resumed = tmp_path / "resumed"
    ranks(data_prefix, resumed, 2, "parallelism.pipeline_parallel=2",
          f"checkpoint.load_path={whole / 'ckpt' / iteration_name(2)}")
    assert_resumed_exactly(resumed, whole)
    got, want = saved_tensors(resumed, 4), saved_tensors(whole, 4)
    assert got.keys() == want.keys()
    for name in want:
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)


def test_pipeline_with_fsdp_matches_one_process(data_prefix, single, tmp_path) -> None:
    """4 ranks: 2 stages x FSDP over 2 data-parallel ranks (reshard policy `default`, which
    keeps parameters gathered between forward and backward under pipelining)."""
    ranks(data_prefix, tmp_path, 4, "parallelism.pipeline_parallel=2",
          "parallelism.data_parallel_shard_strategy=optim_grads_params")
    assert_same_run(tmp_path, single)
    log = (tmp_path / "logs" / "worker_0.log").read_text()
    assert "pipeline 2 (1f1b; this stage 0: layers 0-1) x FSDP over 2 ranks" in log


def test_pipeline_with_tensor_parallel_matches_one_process(runs, single) -> None:
    """4 ranks: 2 stages x tensor parallel 2 (sequence parallel): the vocabulary-split tied
    embedding's copies and the stage messages (sequence slices) line up."""
    assert_same_run(runs(QWEN3, *QWEN3_4_LAYERS, *PIPELINE_X_TENSOR, nproc=4), single)


def test_four_stages_match_one_process(data_prefix, single, tmp_path) -> None:
    """One layer per stage, 4 micro-batches of one sample: messages pass through the middle
    stages (two neighbours each), launched without waiting and waited for where used
    (`pipeline_parallel_overlap_p2p`), and the tied embedding's copies are on stages 0 and 3."""
    ranks(data_prefix, tmp_path, 4, "parallelism.pipeline_parallel=4",
          "parallelism.pipeline_parallel_overlap_p2p=true", "training.local_batch_size=1")
    assert_same_run(tmp_path, single)
    assert ("pipeline 4 (1f1b; this stage 0: layers 0; messages overlapped)"
            in (tmp_path / "logs" / "worker_0.log").read_text())
    stages = [model_file(tmp_path, rank, 4) for rank in range(4)]
    assert [sorted(name.split(".")[1] for name in stage if name.startswith("decoder_layers")
                   and name.endswith("input_norm.weight")) for stage in stages] == \
        [["0"], ["1"], ["2"], ["3"]]
    assert ["embedding.weight" in stage for stage in stages] == [True, False, False, False]


@pytest.mark.slow  # 8 ranks on 2 cores: about 60-75 s
def test_eight_ranks_pipeline_fsdp_and_tensor_parallel(data_prefix, single, tmp_path) -> None:
    """3D: 2 stages x FSDP over 2 data-parallel ranks x tensor parallel 2, micro-batches of one
    sample (2 per data-parallel rank and step), against one process on the same global batch."""
    ranks(data_prefix, tmp_path, 8, "parallelism.pipeline_parallel=2",
          "parallelism.tensor_parallel=2", "training.local_batch_size=1")
    assert_same_run(tmp_path, single)
    log = (tmp_path / "logs" / "worker_0.log").read_text()
    assert ("pipeline 2 (1f1b; this stage 0: layers 0-1) x FSDP over 2 ranks, tensor parallel 2 "
            "(sequence parallel)") in log


def test_context_parallel_with_pipeline_and_the_split_backward(data_prefix, single,
                                                                tmp_path) -> None:
    """4 ranks: 2 stages x context parallel 2 (colossal): each stage pair passes its sequence
    chunks' hidden states (half of each sample's tokens), the tied embedding's copies line up
    over the pipeline group of each context rank, the loss and the norm count every token
    once; with `pipeline_parallel_enable_dxdw_split`, 1F1B's backwards as B (input gradient)
    and W (weight gradient) in ZB-H1's order. (Ulysses with interleaved stages:
    test_deepseek_v3_pipeline.py.)"""
    ranks(data_prefix, tmp_path, 4, "parallelism.pipeline_parallel=2",
          "parallelism.context_parallel=2",
          "parallelism.pipeline_parallel_enable_dxdw_split=true")
    assert_same_run(tmp_path, single)
    log = (tmp_path / "logs" / "worker_0.log").read_text()
    assert ("pipeline 2 (1f1b, backward split into B and W (ZB-H1); this stage 0: layers 0-1) "
            "x context parallel 2 (") in log


def test_four_stages_with_the_split_backward(data_prefix, single, tmp_path) -> None:
    """4 micro-batches of one sample over 4 stages, stage s keeping up to s Ws for the end."""
    ranks(data_prefix, tmp_path, 4, "parallelism.pipeline_parallel=4",
          "parallelism.pipeline_parallel_enable_dxdw_split=true", "training.local_batch_size=1")
    assert_same_run(tmp_path, single)
    assert ("pipeline 4 (1f1b, backward split into B and W (ZB-H1); this stage 0"
            in (tmp_path / "logs" / "worker_0.log").read_text())


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
