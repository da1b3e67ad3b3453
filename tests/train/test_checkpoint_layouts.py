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
)
from test_train_pipeline import PIPELINE_X_TENSOR

from mf_train.checkpoint import load_hf_weights
from mf_train.checkpoint.layout import iteration_name
from mf_train.checkpoint.pieces import Piece
from mf_train.launch.cli import run

pytestmark = pytest.mark.ranks
TENSOR_2 = "parallelism.tensor_parallel=2"
ONE_SAMPLE = "training.local_batch_size=1"
"""On 4 data-parallel ranks: the global batch of 4 as one sample per rank."""


FSDP = "parallelism.data_parallel_shard_strategy=optim_grads_params"
SOURCES = {
    "single": (QWEN3, QWEN3_2_LAYERS, (), 1),
    "tensor": (QWEN3, QWEN3_2_LAYERS, (TENSOR_2,), 2),
    "zero_1": (QWEN3, QWEN3_2_LAYERS, ("parallelism.data_parallel_shard_strategy=optim",), 2),
    "fsdp": (QWEN3, QWEN3_2_LAYERS, (FSDP,), 2),
    "pipeline_x_tensor": (QWEN3, QWEN3_4_LAYERS, PIPELINE_X_TENSOR, 4),
    "context": (QWEN3, QWEN3_2_LAYERS, ("parallelism.context_parallel=2",), 2),
    "experts": (DEEPSEEK, DEEPSEEK_3_LAYERS, ("parallelism.expert_parallel=2",), 2),
}
"""The runs whose step-2 checkpoints are continued: (example, shape, layout, ranks), each a
run other test files train too, with its one-process run (the shape alone)."""
CONTINUED = {
    # 4 ranks: tensor parallel 2 x data parallel 2, one sample per rank, the layers compiled
    "single on tensor x data": ("single", (TENSOR_2, ONE_SAMPLE, "context.compile=true"), 4),
    "tensor on one process": ("tensor", (), 1),
    "zero_1 as zero_2 on four": ("zero_1", (ONE_SAMPLE, "parallelism.data_parallel_shard_"
                                            "strategy=optim_grads"), 4),
    "pipeline_x_tensor as fsdp on four": ("pipeline_x_tensor", (ONE_SAMPLE, FSDP), 4),
    "context on one process": ("context", (), 1),
    "experts on one process": ("experts", (), 1),
    "experts with tensor": ("experts", ("parallelism.expert_parallel=2", TENSOR_2), 4),
}
"""Each continuation: the source (`SOURCES`), the layout it continues on, its ranks; those of
one rank count are trained in one msrun job."""


@pytest.fixture(scope="module")
def continued(runs, together):
    """`continued(name)` -> the output directories of the `CONTINUED` run `name` (trained
    from its source's step-2 checkpoint to step 4, saving nothing) and of its source's
    one-process run."""
    done: dict[str, Path] = {}

    def source(name: str) -> tuple[Path, Path]:
        config, shape, layout, nproc = SOURCES[name]
        return runs(config, *shape, *layout, nproc=nproc), runs(config, *shape)

    def settings(name: str) -> tuple[Path, tuple[str, ...]]:
        origin, layout, _ = CONTINUED[name]
        config, shape, _, _ = SOURCES[origin]
        load = f"checkpoint.load_path={source(origin)[0] / 'ckpt' / iteration_name(2)}"
        return config, (*shape, *layout, load, "checkpoint.enable_save=false")

    def get(name: str) -> tuple[Path, Path]:
        origin, _, nproc = CONTINUED[name]
        if nproc == 1:
            config, sets = settings(name)
            done[name] = runs(config, *sets)
        elif name not in done:
            group = [other for other, entry in CONTINUED.items() if entry[2] == nproc]
            done.update(zip(group, together([settings(other) for other in group], nproc),
                            strict=True))
        return done[name], source(origin)[1]

    return get


@pytest.mark.parametrize("name", list(CONTINUED))
def test_a_checkpoint_continues_on_another_layout(continued, name) -> None:
    """Tensor parallelism cuts each rank's shard of every split weight (fused qkv and gate_up
    included) and of its moments out of the whole saved tensors, compiled too (the regions'
    collectives inside the graphs, over tensor groups smaller than the world); one process
    gathers each weight from the tensor places' shards, every expert from the rank that held
    it (the routers' expert bias carries over); ZeRO and FSDP slices move to another shard
    degree, each rank reading the ranges of its slices from the saved ones; stages x tensor
    shards in, FSDP slices out; experts over 2 x tensor parallel 2 cut each rank's tensor
    shard of its experts (and of multi-head latent attention)."""
    output, single = continued(name)
    assert_resumed_across_layouts(output, single)
    if "context.compile=true" in CONTINUED[name][1]:
        assert steps(output)[0]["compiled_graphs"] >= 2  # both layers, forward and backward


SAVED = {name: source for name, source in SOURCES.items() if name != "single"}
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
