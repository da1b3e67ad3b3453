"""`mf-train --nproc N --set parallelism.context_parallel=...` on real msrun ranks: each
attention method (colossal, ulysses, hybrid) gives the losses and gradient norms of one
process, with and without packed documents (compact and dense document masks); context
parallelism composes with data, tensor and sharded data parallelism and with DeepSeek-V3's
experts; a run resumes bit for bit; what cannot run is refused before any rank starts."""

from __future__ import annotations

import pytest

pytest.importorskip("mindspore")

from runs import (
    DATA,
    DEEPSEEK,
    DEEPSEEK_3_LAYERS,
    QWEN3,
    QWEN3_2_LAYERS,
    Case,
    assert_resumed_exactly,
    saved_tensors,
    steps,
    train,
)
from same_tensors import assert_same_tensors

from mf_train.checkpoint.layout import iteration_name
from mf_train.launch.cli import run

PACKING = {
    "plain": (),
    "compact": (f"{DATA}reset_position_ids=true", f"{DATA}reset_attention_mask=true",
                f"{DATA}create_compressed_eod_mask=true", f"{DATA}eod_mask_loss=true"),
    "dense": (f"{DATA}reset_position_ids=true", f"{DATA}reset_attention_mask=true",
              f"{DATA}create_attention_mask=true"),
}
CP_2 = "parallelism.context_parallel=2"
METHODS = {
    "colossal": (2, (CP_2,)),
    "ulysses": (2, (CP_2, "parallelism.context_parallel_method=ulysses")),
    "hybrid": (4, ("parallelism.context_parallel=4", "parallelism.context_parallel_method=hybrid",
                   "parallelism.ulysses_degree_in_cp=2")),
}
EACH_METHOD = [("colossal", "compact", "causal", True), ("ulysses", "plain", "full", False),
               ("ulysses", "dense", "causal", False), ("hybrid", "compact", "causal", True)]
"""(method, packing, `context_parallel_mask_type`, `context_parallel_async`)."""
BALANCED = ("model.aux_loss_alpha=0.1",)
"""A balance-loss coefficient large enough to move the gradients."""


def qwen3(packing: str, *layout: str, nproc: int = 2, **more) -> Case:
    """The tiny Qwen3 (2 layers, 4 heads of 8, 2 key/value heads) on sequences of 32,
    documents packed as `packing` says, 4 steps, a checkpoint at steps 2 and 4."""
    return Case(QWEN3, (*QWEN3_2_LAYERS, *PACKING[packing]), layout, nproc, **more)


CASES = {
    # colossal on plain sequences: the test_compiled_layouts.py matrix's run too
    "colossal": qwen3("plain", CP_2, alone=True, log=(
        "context parallel 2 (keys and values all-gathered over 2 (colossal)) x data "
        "parallel 2 (replicated) over data x context")),
    **{f"{method}-{packing}": qwen3(
        packing, *METHODS[method][1], f"parallelism.context_parallel_mask_type={mask}",
        f"parallelism.context_parallel_async={str(overlap).lower()}",
        nproc=METHODS[method][0],
        log="overlapped with attention over this rank's keys" if overlap else None)
       for method, packing, mask, overlap in EACH_METHOD},
    "data": qwen3("compact", CP_2, "parallelism.data_parallel_shard=1", nproc=4),
    "deepseek": Case(DEEPSEEK, (*DEEPSEEK_3_LAYERS, *BALANCED, *PACKING["compact"]),
                     METHODS["ulysses"][1]),
    "tensor": qwen3("plain", CP_2, "parallelism.tensor_parallel=2", nproc=4, job="slow"),
    "fsdp": qwen3("plain", CP_2, "parallelism.data_parallel_shard=2", nproc=4, job="slow"),
    "deepseek experts": Case(DEEPSEEK, (*DEEPSEEK_3_LAYERS, *BALANCED),
                             (CP_2, "parallelism.expert_parallel=2"), 4, job="slow"),
}
pytestmark = pytest.mark.ranks


def test_packing_changes_the_loss(runs) -> None:
    """The tiny corpus has ends of documents inside the 32-token samples: the document masks
    and restarting positions change every step's loss."""
    plain, compact, dense = (steps(runs(QWEN3, *QWEN3_2_LAYERS, *PACKING[name]))
                             for name in ("plain", "compact", "dense"))
    assert all(abs(p["loss"] - c["loss"]) > 1e-4 for p, c in zip(plain, compact, strict=True))
    assert all(abs(p["loss"] - d["loss"]) > 1e-4 for p, d in zip(plain, dense, strict=True))


def test_colossal_matches_one_process(layout_runs) -> None:
    layout_runs.check("colossal")


@pytest.mark.parametrize(("method", "packing", "mask_type", "overlap"), EACH_METHOD)
def test_each_method_matches_one_process(layout_runs, method, packing, mask_type,
                                         overlap) -> None:
    """`context_parallel_mask_type: full` splits the sequence into contiguous chunks (no load
    balancing); attention is still causal, by global token index. `context_parallel_async`
    attends to this rank's keys while the others' are gathered and merges the two parts
    (the blocking gather runs in the other tests: colossal, CP x DP, CP x TP)."""
    layout_runs.check(f"{method}-{packing}")


def test_context_and_data_parallel_on_four_ranks(layout_runs) -> None:
    """CP 2 x DP 2 (replicated): the gradients are averaged over data x context."""
    layout_runs.check("data")


def test_a_context_parallel_run_resumes_bit_for_bit(data_prefix, layout_runs, tmp_path) -> None:
    colossal = layout_runs("colossal")
    train(QWEN3, tmp_path, data_prefix, *QWEN3_2_LAYERS, *METHODS["colossal"][1],
          f"checkpoint.load_path={colossal / 'ckpt' / iteration_name(2)}", nproc=2)
    assert_resumed_exactly(tmp_path, colossal)
    assert_same_tensors(saved_tensors(tmp_path, 4), saved_tensors(colossal, 4), rel=0, atol=0)


def test_deepseek_v3_with_context_parallel(layout_runs) -> None:
    """MLA's heads exchanged (ulysses), the balance loss counted over the whole sequences
    (a coefficient large enough to move the gradients), packed documents."""
    layout_runs.check("deepseek")


@pytest.mark.slow
@pytest.mark.parametrize("name", ["tensor", "fsdp"])
def test_context_parallel_with_tensor_or_fsdp_on_four_ranks(layout_runs, name) -> None:
    layout_runs.check(name)


@pytest.mark.slow
def test_deepseek_v3_with_context_and_expert_parallel(layout_runs) -> None:
    layout_runs.check("deepseek experts")


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
