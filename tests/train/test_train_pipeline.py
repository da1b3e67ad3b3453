"""`mf-train --nproc N` with pipeline parallelism on real msrun ranks: every schedule gives the
losses, gradient norms and weights of one process; pipeline x FSDP and pipeline x tensor
parallelism too; a pipelined run resumes bit for bit; each stage saves its own parameters
under the model-wide names."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("mindspore")

from test_train_sharded import checkpoint_files, steps

from mf_train.checkpoint.layout import iteration_name
from mf_train.cli import run

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "qwen3_tiny.yaml"
SCHEDULES = {
    "gpipe": ["parallelism.pipeline_parallel_schedule=gpipe"],
    "1f1b": [],
    "interleaved_1f1b": ["parallelism.pipeline_parallel_schedule=interleaved_1f1b",
                         "parallelism.pipeline_parallel_interleave_num=2"],
}
STAGE_LAYERS = {"gpipe": ([0, 1], [2, 3]), "1f1b": ([0, 1], [2, 3]),
                "interleaved_1f1b": ([0, 2], [1, 3])}
pytestmark = pytest.mark.ranks


def arguments(prefix: str, output: Path, *more: str) -> list[str]:
    """The tiny Qwen3 (4 layers, tied embeddings) shrunk as in test_train_ranks.py: 4 steps of
    2 micro-batches, a checkpoint at steps 2 and 4."""
    sets = [f"train_dataset.dataloader.config.data_path=['1','{prefix}']", "training.steps=4",
            "model.hidden_size=32", "model.intermediate_size=64", "model.head_dim=8",
            "train_dataset.dataloader.config.seq_length=32", "model.max_position_embeddings=32",
            "recompute.mode=None", "recompute.select_module=null", "lr_scheduler.warmup_steps=1",
            f"checkpoint.save_path={output / 'ckpt'}", "checkpoint.save_interleaved_steps=2",
            *more]
    return ["--config", str(EXAMPLE), "--output-dir", str(output),
            *[arg for value in sets for arg in ("--set", value)]]


def ranks(prefix: str, output: Path, nproc: int, *more: str) -> None:
    assert run([*arguments(prefix, output, *more), "--nproc", str(nproc),
                "--timeout", "600"]) == 0


def model_file(output: Path, step: int, rank: int, world: int) -> dict[str, np.ndarray]:
    return checkpoint_files(output, step, "model", rank, world)


def assert_same_run(got: Path, want: Path, rel: float = 1e-5) -> None:
    one, other = steps(want), steps(got)
    assert len(one) == len(other) == 4
    assert [s["loss"] for s in other] == pytest.approx([s["loss"] for s in one], rel=rel)
    assert [s["grad_norm"] for s in other] == pytest.approx([s["grad_norm"] for s in one],
                                                            rel=rel)
    assert one[-1]["loss"] < one[0]["loss"]


@pytest.fixture(scope="module")
def single(data_prefix, tmp_path_factory) -> Path:
    output = tmp_path_factory.mktemp("single")
    assert run(arguments(data_prefix, output)) == 0
    return output


@pytest.fixture(scope="module")
def pipelined(data_prefix, tmp_path_factory):
    """Each schedule's 2-stage run, launched once on first use."""
    outputs: dict[str, Path] = {}

    def output_of(schedule: str) -> Path:
        if schedule not in outputs:
            output = tmp_path_factory.mktemp(schedule)
            ranks(data_prefix, output, 2, "parallelism.pipeline_parallel=2",
                  *SCHEDULES[schedule])
            outputs[schedule] = output
        return outputs[schedule]

    return output_of


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
    """Stage files together hold the one-process model's weights after 4 steps; the tied
    embedding's two copies (first and last stage) are equal bit for bit."""
    want = model_file(single, 4, 0, 1)
    stages = [model_file(pipelined(schedule), 4, rank, 2) for rank in (0, 1)]
    for stage, layers in zip(stages, STAGE_LAYERS[schedule], strict=True):
        held = {int(name.split(".")[1]) for name in stage if name.startswith("decoder_layers.")}
        assert held == set(layers)
    assert "final_norm.weight" in stages[1] and "final_norm.weight" not in stages[0]
    np.testing.assert_array_equal(stages[0]["embedding.weight"], stages[1]["embedding.weight"])
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
    again, reference = steps(resumed), steps(whole)[2:]
    assert [s["step"] for s in again] == [3, 4]
    assert [(s["loss"], s["grad_norm"]) for s in again] == \
        [(s["loss"], s["grad_norm"]) for s in reference]
    for rank in (0, 1):
        got, want = model_file(resumed, 4, rank, 2), model_file(whole, 4, rank, 2)
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


def test_pipeline_with_tensor_parallel_matches_one_process(data_prefix, single,
                                                          tmp_path) -> None:
    """4 ranks: 2 stages x tensor parallel 2 (sequence parallel): the vocabulary-split tied
    embedding's copies and the stage messages (sequence slices) line up."""
    ranks(data_prefix, tmp_path, 4, "parallelism.pipeline_parallel=2",
          "parallelism.tensor_parallel=2")
    assert_same_run(tmp_path, single)


def test_four_stages_match_one_process(data_prefix, single, tmp_path) -> None:
    """One layer per stage, 4 micro-batches of one sample: messages pass through the middle
    stages (two neighbours each) and the tied embedding's copies are on stages 0 and 3."""
    ranks(data_prefix, tmp_path, 4, "parallelism.pipeline_parallel=4",
          "training.local_batch_size=1")
    assert_same_run(tmp_path, single)
    stages = [model_file(tmp_path, 4, rank, 4) for rank in range(4)]
    assert [sorted(name.split(".")[1] for name in stage if name.startswith("decoder_layers")
                   and name.endswith("input_norm.weight")) for stage in stages] == \
        [["0"], ["1"], ["2"], ["3"]]
    np.testing.assert_array_equal(stages[0]["embedding.weight"], stages[3]["embedding.weight"])


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
