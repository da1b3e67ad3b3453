"""`mf-train --nproc N --set parallelism.context_parallel=...` on real msrun ranks: each
attention method (colossal, ulysses, hybrid) gives the losses and gradient norms of one
process, with and without packed documents (compact and dense document masks); context
parallelism composes with data, tensor and sharded data parallelism and with DeepSeek-V3's
experts; a run resumes bit for bit; what cannot run is refused before any rank starts."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("mindspore")

from runs import (
    DATA,
    DEEPSEEK,
    DEEPSEEK_3_LAYERS,
    QWEN3,
    QWEN3_2_LAYERS,
    assert_resumed_exactly,
    assert_same_run,
    saved_tensors,
    steps,
    train,
    worker_log,
)

from mf_train.checkpoint.layout import iteration_name
from mf_train.cli import run

PACKING = {
    "plain": [],
    "compact": [f"{DATA}reset_position_ids=true", f"{DATA}reset_attention_mask=true",
                f"{DATA}create_compressed_eod_mask=true", f"{DATA}eod_mask_loss=true"],
    "dense": [f"{DATA}reset_position_ids=true", f"{DATA}reset_attention_mask=true",
              f"{DATA}create_attention_mask=true"],
}
METHODS = {
    "colossal": (2, ["parallelism.context_parallel=2"]),
    "ulysses": (2, ["parallelism.context_parallel=2",
                    "parallelism.context_parallel_method=ulysses"]),
    "hybrid": (4, ["parallelism.context_parallel=4", "parallelism.context_parallel_method=hybrid",
                   "parallelism.ulysses_degree_in_cp=2"]),
}
SIZES = {QWEN3: QWEN3_2_LAYERS, DEEPSEEK: DEEPSEEK_3_LAYERS}
"""A tiny model (Qwen3: 2 layers, 4 heads of 8, 2 key/value heads) on sequences of 32, 4 steps,
a checkpoint at steps 2 and 4."""
pytestmark = pytest.mark.ranks


def launch(prefix: str, output: Path, nproc: int, *more: str, config: Path = QWEN3) -> Path:
    return train(config, output, prefix, *SIZES[config], *more, nproc=nproc)


@pytest.fixture(scope="module")
def single(runs):
    """The one-process run of each packing, launched once on first use."""
    return lambda packing: runs(QWEN3, *QWEN3_2_LAYERS, *PACKING[packing])


@pytest.fixture(scope="module")
def colossal(runs) -> Path:
    """Colossal CP 2 on plain sequences: the run the resume test continues."""
    return runs(QWEN3, *QWEN3_2_LAYERS, *METHODS["colossal"][1], nproc=2)


def test_packing_changes_the_loss(single) -> None:
    """The tiny corpus has ends of documents inside the 32-token samples: the document masks
    and restarting positions change every step's loss."""
    plain, compact, dense = (steps(single(name)) for name in ("plain", "compact", "dense"))
    assert all(abs(p["loss"] - c["loss"]) > 1e-4 for p, c in zip(plain, compact, strict=True))
    assert all(abs(p["loss"] - d["loss"]) > 1e-4 for p, d in zip(plain, dense, strict=True))


def test_colossal_matches_one_process(single, colossal) -> None:
    assert_same_run(colossal, single("plain"))
    log = worker_log(colossal)
    assert ("context parallel 2 (keys and values all-gathered over 2 (colossal)) x data "
            "parallel 2 (replicated) over data x context") in log


@pytest.mark.parametrize(("method", "packing", "mask_type", "overlap"), [
    ("colossal", "compact", "causal", True), ("ulysses", "plain", "full", False),
    ("ulysses", "dense", "causal", False), ("hybrid", "compact", "causal", True)])
def test_each_method_matches_one_process(data_prefix, single, tmp_path, method, packing,
                                         mask_type, overlap) -> None:
    """`context_parallel_mask_type: full` splits the sequence into contiguous chunks (no load
    balancing); attention is still causal, by global token index. `context_parallel_async`
    attends to this rank's keys while the others' are gathered and merges the two parts
    (the blocking gather runs in the other tests: colossal, CP x DP, CP x TP)."""
    nproc, sets = METHODS[method]
    output = launch(data_prefix, tmp_path, nproc, *sets, *PACKING[packing],
                    f"parallelism.context_parallel_mask_type={mask_type}",
                    f"parallelism.context_parallel_async={str(overlap).lower()}")
    assert_same_run(output, single(packing))
    if overlap:
        assert "overlapped with attention over this rank's keys" in worker_log(output)


def test_context_and_data_parallel_on_four_ranks(data_prefix, single, tmp_path) -> None:
    """CP 2 x DP 2 (replicated): the gradients are averaged over data x context."""
    output = launch(data_prefix, tmp_path, 4, "parallelism.context_parallel=2",
                    "parallelism.data_parallel_shard=1", *PACKING["compact"])
    assert_same_run(output, single("compact"))


def test_a_context_parallel_run_resumes_bit_for_bit(data_prefix, colossal, tmp_path) -> None:
    launch(data_prefix, tmp_path, 2, *METHODS["colossal"][1],
           f"checkpoint.load_path={colossal / 'ckpt' / iteration_name(2)}")
    assert_resumed_exactly(tmp_path, colossal)
    got, want = saved_tensors(tmp_path, 4), saved_tensors(colossal, 4)
    assert got.keys() == want.keys()
    for key in want:
        np.testing.assert_array_equal(got[key], want[key], err_msg=key)


def test_deepseek_v3_with_context_parallel(data_prefix, runs, tmp_path) -> None:
    """MLA's heads exchanged (ulysses), the balance loss counted over the whole sequences
    (a coefficient large enough to move the gradients), packed documents."""
    sets = ["model.aux_loss_alpha=0.1", *PACKING["compact"]]
    one = runs(DEEPSEEK, *DEEPSEEK_3_LAYERS, *sets)
    two = launch(data_prefix, tmp_path / "two", 2, *sets, *METHODS["ulysses"][1],
                 config=DEEPSEEK)
    assert_same_run(two, one)


@pytest.mark.slow
@pytest.mark.parametrize("sets", [
    ["parallelism.tensor_parallel=2"],
    ["parallelism.data_parallel_shard=2"],
], ids=["tensor", "fsdp"])
def test_context_parallel_with_tensor_or_fsdp_on_four_ranks(data_prefix, single, tmp_path,
                                                            sets) -> None:
    output = launch(data_prefix, tmp_path, 4, "parallelism.context_parallel=2", *sets)
    assert_same_run(output, single("plain"))


@pytest.mark.slow
def test_deepseek_v3_with_context_and_expert_parallel(data_prefix, runs, tmp_path) -> None:
    sets = ["model.aux_loss_alpha=0.1"]
    one = runs(DEEPSEEK, *DEEPSEEK_3_LAYERS, *sets)
    four = launch(data_prefix, tmp_path / "four", 4, *sets, "parallelism.context_parallel=2",
                  "parallelism.expert_parallel=2", config=DEEPSEEK)
    assert_same_run(four, one)


def test_ulysses_needs_heads_it_can_split(tmp_path, capsys) -> None:
    """4 query and 2 key/value heads over tensor 2 x Ulysses 2: refused before launch."""
    status = run(["--config", str(QWEN3), "--output-dir", str(tmp_path),
                  "--set", "parallelism.context_parallel=2", "--set",
                  "parallelism.context_parallel_method=ulysses",
                  "--set", "parallelism.tensor_parallel=2", "--nproc", "4"])
    err = capsys.readouterr().err
    assert status == 2
    assert ("model.num_key_value_heads: 2 heads are not divisible by tensor_parallel (2) x the "
            "Ulysses degree (2") in err
    assert "starting 4 ranks" not in err
