"""DeepSeek-V3 in pipeline stages on real msrun ranks: `mf-train --nproc N` with
`pipeline_parallel` gives the losses and gradient norms of one process, the balance loss of
every stage's routers included (a coefficient large enough to move them): 2 stages with the
backward split into input and weight gradients (and its weights; resumed bit for bit), and on
4 ranks 1F1B x tensor parallel 2 and 2 interleaved chunks x expert or context parallel 2 (the
plain 2-stage 1F1B run is test_deepseek_v3_ranks.py's)."""

from __future__ import annotations

import pytest

pytest.importorskip("mindspore")

from runs import (
    DEEPSEEK,
    DEEPSEEK_3_LAYERS,
    Case,
    assert_resumed_exactly,
    saved_tensors,
    train,
    worker_log,
)
from same_tensors import assert_same_tensors

from mf_train.checkpoint.layout import iteration_name

BALANCED = (*DEEPSEEK_3_LAYERS, "model.aux_loss_alpha=0.1")
"""The tiny DeepSeek-V3 (3 layers: one dense, two with 4 routed experts, top 2), 4 steps of 2
micro-batches, a balance loss that moves the gradients."""
FOUR_LAYERS = (*BALANCED, "model.num_hidden_layers=4")
PIPELINE_2 = "parallelism.pipeline_parallel=2"
INTERLEAVED = (PIPELINE_2, "parallelism.pipeline_parallel_schedule=interleaved_1f1b",
               "parallelism.pipeline_parallel_interleave_num=2")
SPLIT = "parallelism.pipeline_parallel_enable_dxdw_split=true"
EXPERTS = "x expert parallel 2 (experts 0-1 of 4 here, {}) x {} over 2 ranks"
CASES = {
    # 2 stages with the backward split (ZB-H1): each chunk's balance loss is in what its B
    # and its W differentiate
    "two stages": Case(DEEPSEEK, BALANCED, (PIPELINE_2, SPLIT), 2, weights=1e-4, log=(
        "pipeline 2 (1f1b, backward split into B and W (ZB-H1); this stage 0: layers 0-1) "
        "x no data parallelism")),
    # 2 micro-batches on each data rank
    "interleaved-expert": Case(DEEPSEEK, FOUR_LAYERS, (
        *INTERLEAVED, "parallelism.expert_parallel=2", "training.local_batch_size=1"), 4,
        log="this stage 0: layers 0, 2"),
    "tensor": Case(DEEPSEEK, BALANCED, (PIPELINE_2, "parallelism.tensor_parallel=2"), 4),
    "expert-zero2-deredundant": Case(DEEPSEEK, BALANCED, (
        PIPELINE_2, "parallelism.expert_parallel=2",
        "parallelism.data_parallel_shard_strategy=optim_grads",
        "parallelism.moe_token_dispatcher_type=alltoall_deredundancy",
        "parallelism.npu_nums_per_device=1"), 4,
        log=EXPERTS.format("deredundant, devices of 1", "ZeRO-2")),
    "interleaved-context": Case(DEEPSEEK, FOUR_LAYERS, (
        *INTERLEAVED, "parallelism.context_parallel=2",
        "parallelism.context_parallel_method=ulysses",
        "parallelism.pipeline_parallel_overlap_p2p=true"), 4,
        log="this stage 0: layers 0, 2; messages overlapped)"),
}
pytestmark = pytest.mark.ranks


def test_two_stages_match_one_process(layout_runs) -> None:
    layout_runs.check("two stages")


def test_a_pipelined_run_resumes_bit_for_bit(data_prefix, layout_runs, tmp_path) -> None:
    two_stages = layout_runs("two stages")
    train(DEEPSEEK, tmp_path, data_prefix, *BALANCED, PIPELINE_2, SPLIT,
          f"checkpoint.load_path={two_stages / 'ckpt' / iteration_name(2)}", nproc=2)
    assert_resumed_exactly(tmp_path, two_stages)
    assert_same_tensors(saved_tensors(tmp_path, 4), saved_tensors(two_stages, 4), rel=0,
                        atol=0)


@pytest.mark.parametrize("name", [name for name, case in CASES.items() if case.nproc == 4])
def test_two_stages_with_another_degree_on_four_ranks(layout_runs, name) -> None:
    """1F1B with tensor parallel 2, or with expert parallel 2 through the deredundant
    dispatcher and ZeRO-2 over each stage's 2 data ranks; 4 layers in 4 virtual stages
    (stage 0: layers 0 and 2) with expert parallel 2 (each stage's 2 data ranks shard the rest
    of the stage, FSDP) or context parallel 2 (ulysses; its stage messages launched without
    waiting, waited for where used: `pipeline_parallel_overlap_p2p`)."""
    output = layout_runs.check(name)
    if name == "interleaved-expert":
        assert EXPERTS.format("all-to-all", "FSDP") in worker_log(output)
