"""DeepSeek-V3 in pipeline stages on real msrun ranks: `mf-train --nproc N` with
`pipeline_parallel` gives the losses and gradient norms of one process, the balance loss of
every stage's routers included (a coefficient large enough to move them): 2 stages with the
backward split into input and weight gradients (and its weights; resumed bit for bit), and on
4 ranks 1F1B x tensor parallel 2 and 2 interleaved chunks x expert or context parallel 2 (the
plain 2-stage 1F1B run is test_deepseek_v3_ranks.py's)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("mindspore")

from runs import (
    DEEPSEEK,
    DEEPSEEK_3_LAYERS,
    assert_resumed_exactly,
    assert_same_run,
    saved_tensors,
    train,
    worker_log,
)

from mf_train.checkpoint.layout import iteration_name

BALANCED = (*DEEPSEEK_3_LAYERS, "model.aux_loss_alpha=0.1")
"""The tiny DeepSeek-V3 (3 layers: one dense, two with 4 routed experts, top 2), 4 steps of 2
micro-batches, a balance loss that moves the gradients."""
FOUR_LAYERS = (*BALANCED, "model.num_hidden_layers=4")
INTERLEAVED = ("parallelism.pipeline_parallel=2",
               "parallelism.pipeline_parallel_schedule=interleaved_1f1b",
               "parallelism.pipeline_parallel_interleave_num=2")
SPLIT = "parallelism.pipeline_parallel_enable_dxdw_split=true"
pytestmark = pytest.mark.ranks


@pytest.fixture(scope="module")
def single(runs) -> Path:
    return runs(DEEPSEEK, *BALANCED)


@pytest.fixture(scope="module")
def two_stages(runs) -> Path:
    """2 stages with the backward split (ZB-H1): each chunk's balance loss is in what its B
    and its W differentiate."""
    return runs(DEEPSEEK, *BALANCED, "parallelism.pipeline_parallel=2", SPLIT, nproc=2)


def test_two_stages_match_one_process(single, two_stages) -> None:
    assert_same_run(two_stages, single)
    assert ("pipeline 2 (1f1b, backward split into B and W (ZB-H1); this stage 0: layers 0-1) "
            "x no data parallelism" in worker_log(two_stages))
    got, want = saved_tensors(two_stages, 4), saved_tensors(single, 4)
    assert got.keys() == want.keys()
    for name, array in want.items():
        np.testing.assert_allclose(got[name], array, rtol=1e-4, atol=1e-6, err_msg=name)


def test_a_pipelined_run_resumes_bit_for_bit(data_prefix, two_stages, tmp_path) -> None:
    train(DEEPSEEK, tmp_path, data_prefix, *BALANCED, "parallelism.pipeline_parallel=2", SPLIT,
          f"checkpoint.load_path={two_stages / 'ckpt' / iteration_name(2)}", nproc=2)
    assert_resumed_exactly(tmp_path, two_stages)
    got, want = saved_tensors(tmp_path, 4), saved_tensors(two_stages, 4)
    assert got.keys() == want.keys()
    for name in want:
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)


@pytest.mark.parametrize(("shape", "sets"), [
    (FOUR_LAYERS, [*INTERLEAVED, "parallelism.expert_parallel=2",
                   "training.local_batch_size=1"]),  # 2 micro-batches on each data rank
    (BALANCED, ["parallelism.pipeline_parallel=2", "parallelism.tensor_parallel=2"]),
    (BALANCED, ["parallelism.pipeline_parallel=2", "parallelism.expert_parallel=2",
                "parallelism.data_parallel_shard_strategy=optim_grads",
                "parallelism.moe_token_dispatcher_type=alltoall_deredundancy",
                "parallelism.npu_nums_per_device=1"]),
    (FOUR_LAYERS, [*INTERLEAVED, "parallelism.context_parallel=2",
                   "parallelism.context_parallel_method=ulysses",
                   "parallelism.pipeline_parallel_overlap_p2p=true"]),
], ids=["interleaved-expert", "tensor", "expert-zero2-deredundant", "interleaved-context"])
def test_two_stages_with_another_degree_on_four_ranks(data_prefix, runs, tmp_path, shape,
                                                      sets) -> None:
    """1F1B with tensor parallel 2, or with expert parallel 2 through the deredundant
    dispatcher and ZeRO-2 over each stage's 2 data ranks; 4 layers in 4 virtual stages
    (stage 0: layers 0 and 2) with expert parallel 2 (each stage's 2 data ranks shard the rest
    of the stage, FSDP) or context parallel 2 (ulysses; its stage messages launched without
    waiting, waited for where used: `pipeline_parallel_overlap_p2p`)."""
    one = runs(DEEPSEEK, *shape)
    train(DEEPSEEK, tmp_path, data_prefix, *shape, *sets, nproc=4)
    assert_same_run(tmp_path, one)
    log = worker_log(tmp_path)
    if "interleave_num=2" in " ".join(sets):
        assert "this stage 0: layers 0, 2" in log
    if "parallelism.pipeline_parallel_overlap_p2p=true" in sets:
        assert "layers 0, 2; messages overlapped)" in log
    if "parallelism.expert_parallel=2" in sets:
        dispatcher, strategy = (("deredundant, devices of 1", "ZeRO-2")
                                if "parallelism.npu_nums_per_device=1" in sets
                                else ("all-to-all", "FSDP"))
        assert (f"x expert parallel 2 (experts 0-1 of 4 here, {dispatcher}) x {strategy} over "
                "2 ranks" in log)
