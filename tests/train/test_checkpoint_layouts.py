"""Checkpoints moved between layouts, on real msrun ranks: the step-2 checkpoint one layout
saved, continued by another layout or number of ranks, gives steps 3-4 of the uninterrupted
run within 1e-5 (the layouts are numerically equivalent, not bit-identical): weights, AdamW
moments, the step count and the data position all carry over. Tensor-parallel shards are cut
again for another degree; ZeRO and FSDP slices are read by overlap."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("mindspore")

from runs import (
    DEEPSEEK,
    DEEPSEEK_3_LAYERS,
    QWEN3,
    QWEN3_2_LAYERS,
    QWEN3_4_LAYERS,
    assert_pieces_follow_record,
    assert_resumed_across_layouts,
    steps,
    train,
)
from test_train_pipeline import PIPELINE_X_TENSOR

from mf_train.checkpoint import load_hf_weights
from mf_train.checkpoint.layout import iteration_name
from mf_train.checkpoint.pieces import Piece
from mf_train.cli import run

pytestmark = pytest.mark.ranks
TENSOR_2 = "parallelism.tensor_parallel=2"
ONE_SAMPLE = "training.local_batch_size=1"
"""On 4 data-parallel ranks: the global batch of 4 as one sample per rank."""


def continued(saved: Path, config: Path, output: Path, prefix: str, *sets: str,
              nproc: int = 1) -> Path:
    """`output` trained from `saved`'s step-2 checkpoint to step 4, saving nothing."""
    load = f"checkpoint.load_path={saved / 'ckpt' / iteration_name(2)}"
    train(config, output, prefix, *sets, load, "checkpoint.enable_save=false", nproc=nproc,
          timeout=300)
    return output


@pytest.fixture(scope="module")
def single(runs) -> Path:
    """The 2-layer tiny Qwen3 on one process (tests/train/runs.py)."""
    return runs(QWEN3, *QWEN3_2_LAYERS)


def test_one_process_checkpoint_continues_under_tensor_parallelism(data_prefix, single,
                                                                   tmp_path) -> None:
    """Each tensor rank cuts its shard of every split weight (fused qkv and gate_up
    included) and of its moments out of the whole saved tensors. 4 ranks: tensor parallel 2
    x data parallel 2, one sample per rank, the layers compiled (`context.compile`: the
    regions' collectives inside the graphs, over tensor groups smaller than the world)."""
    continued(single, QWEN3, tmp_path, data_prefix, *QWEN3_2_LAYERS, TENSOR_2, ONE_SAMPLE,
              "context.compile=true", nproc=4)
    assert_resumed_across_layouts(tmp_path, single)
    assert steps(tmp_path)[0]["compiled_graphs"] >= 2  # both layers, forward and backward


def test_tensor_parallel_checkpoint_continues_on_one_process(data_prefix, runs, single,
                                                             tmp_path) -> None:
    """One process gathers each weight from the two tensor places' shards."""
    saved = runs(QWEN3, *QWEN3_2_LAYERS, TENSOR_2, nproc=2)
    continued(saved, QWEN3, tmp_path, data_prefix, *QWEN3_2_LAYERS)
    assert_resumed_across_layouts(tmp_path, single)


def test_zero_1_on_two_ranks_continues_as_zero_2_on_four(data_prefix, runs, single,
                                                         tmp_path) -> None:
    """The slices move to another shard degree: each of 4 ranks reads the ranges of its
    slices from the 2 saved ones (one sample per rank, the same global batch)."""
    saved = runs(QWEN3, *QWEN3_2_LAYERS, "parallelism.data_parallel_shard_strategy=optim",
                 nproc=2)
    continued(saved, QWEN3, tmp_path, data_prefix, *QWEN3_2_LAYERS, ONE_SAMPLE,
              "parallelism.data_parallel_shard_strategy=optim_grads", nproc=4)
    assert_resumed_across_layouts(tmp_path, single)


def test_pipeline_and_tensor_checkpoint_continues_under_fsdp_on_four(data_prefix, runs,
                                                                     tmp_path) -> None:
    """Stages x tensor shards in, FSDP slices out: each FSDP rank reads its ranges of the
    weights gathered from the two tensor places of the stage that saved them."""
    saved = runs(QWEN3, *QWEN3_4_LAYERS, *PIPELINE_X_TENSOR, nproc=4)
    continued(saved, QWEN3, tmp_path, data_prefix, *QWEN3_4_LAYERS, ONE_SAMPLE,
              "parallelism.data_parallel_shard_strategy=optim_grads_params", nproc=4)
    assert_resumed_across_layouts(tmp_path, runs(QWEN3, *QWEN3_4_LAYERS))


def test_context_parallel_checkpoint_continues_on_one_process(data_prefix, runs, single,
                                                              tmp_path) -> None:
    saved = runs(QWEN3, *QWEN3_2_LAYERS, "parallelism.context_parallel=2", nproc=2)
    continued(saved, QWEN3, tmp_path, data_prefix, *QWEN3_2_LAYERS)
    assert_resumed_across_layouts(tmp_path, single)


@pytest.fixture(scope="module")
def experts(runs) -> Path:
    """DeepSeek-V3 (3 layers, two with 4 routed experts) with expert parallelism 2."""
    return runs(DEEPSEEK, *DEEPSEEK_3_LAYERS, "parallelism.expert_parallel=2", nproc=2)


def test_expert_parallel_checkpoint_continues_on_one_process(data_prefix, runs, experts,
                                                             tmp_path) -> None:
    """One process reads every expert from the rank that held it; the routers' expert
    bias carries over."""
    continued(experts, DEEPSEEK, tmp_path, data_prefix, *DEEPSEEK_3_LAYERS)
    assert_resumed_across_layouts(tmp_path, runs(DEEPSEEK, *DEEPSEEK_3_LAYERS))


def test_expert_parallel_checkpoint_continues_with_tensor_parallelism(data_prefix, runs,
                                                                      experts,
                                                                      tmp_path) -> None:
    """4 ranks, experts over 2 x tensor parallel 2: each rank cuts its tensor shard of its
    experts (and of multi-head latent attention) out of the whole saved tensors."""
    continued(experts, DEEPSEEK, tmp_path, data_prefix, *DEEPSEEK_3_LAYERS,
              "parallelism.expert_parallel=2", TENSOR_2, nproc=4)
    assert_resumed_across_layouts(tmp_path, runs(DEEPSEEK, *DEEPSEEK_3_LAYERS))


SAVED = {
    "tensor": (QWEN3, QWEN3_2_LAYERS, [TENSOR_2], 2),
    "zero_1": (QWEN3, QWEN3_2_LAYERS, ["parallelism.data_parallel_shard_strategy=optim"], 2),
    "fsdp": (QWEN3, QWEN3_2_LAYERS,
             ["parallelism.data_parallel_shard_strategy=optim_grads_params"], 2),
    "context": (QWEN3, QWEN3_2_LAYERS, ["parallelism.context_parallel=2"], 2),
    "pipeline_x_tensor": (QWEN3, QWEN3_4_LAYERS, list(PIPELINE_X_TENSOR), 4),
    "experts": (DEEPSEEK, DEEPSEEK_3_LAYERS, ["parallelism.expert_parallel=2"], 2),
}
"""Runs of other tests, each with its one-process run: (example, shape, layout, ranks)."""


def saved_elements(output: Path, kind: str) -> dict[str, int]:
    """How many elements of each tensor the step-4 checkpoint's files hold together."""
    common = json.loads((output / "ckpt" / iteration_name(4) / "common.json").read_text())
    held: dict[str, int] = {}
    for file, entry in common["files"].items():
        if f"-{kind}-" in file:
            for record in entry["pieces"]:
                piece = Piece.from_record(record)
                held[piece.name] = held.get(piece.name, 0) + piece.stop - piece.start
    return held


@pytest.mark.parametrize("layout", list(SAVED))
def test_each_rank_writes_the_regions_the_record_says_it_owns(runs, layout) -> None:
    """The placement record, worked out from the saved configuration alone, names every
    piece each rank wrote (`runs.assert_pieces_follow_record`)."""
    config, shape, sets, nproc = SAVED[layout]
    assert_pieces_follow_record(runs(config, *shape, *sets, nproc=nproc))


@pytest.mark.parametrize("layout", list(SAVED))
def test_a_save_holds_one_copy_and_exports_without_its_configuration(runs, layout,
                                                                     tmp_path) -> None:
    """Every rank writes only what it is the first holder of: the files of a save hold
    each tensor's elements once (the one-process checkpoint's count), not once per rank.
    `export-hf` reads the run's configuration from the checkpoint and gives the one-process
    run's weights (to the runs' rounding)."""
    config, shape, sets, nproc = SAVED[layout]
    saved, single = runs(config, *shape, *sets, nproc=nproc), runs(config, *shape)
    for kind in ("model", "opt"):
        assert saved_elements(saved, kind) == saved_elements(single, kind)
    for output in (saved, single):
        assert run(["export-hf", "--checkpoint", str(output / "ckpt"),
                    "--output", str(tmp_path / output.name)]) == 0
    got, want = (load_hf_weights(tmp_path / output.name) for output in (saved, single))
    assert got.keys() == want.keys()
    for name, value in want.items():
        np.testing.assert_allclose(got[name], value, rtol=1e-4, atol=1e-5, err_msg=name)
