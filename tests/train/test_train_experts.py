"""`mf-train --nproc N` with expert parallelism on real msrun ranks (DeepSeek-V3 tiny): both
token dispatchers give the losses, gradient norms and weights of one process; each rank saves
only its routed experts; expert parallelism composes with FSDP; a run resumes bit for bit."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("mindspore")

from runs import (
    DEEPSEEK,
    DEEPSEEK_3_LAYERS,
    PREFIXES,
    assert_resumed_exactly,
    assert_same_run,
    rank_pieces,
    saved_tensors,
    train,
    worker_log,
)

from mf_train.checkpoint.layout import iteration_name

DISPATCHERS = {
    "alltoall": [],
    "alltoall_deredundancy": ["parallelism.moe_token_dispatcher_type=alltoall_deredundancy",
                              "parallelism.npu_nums_per_device=1"],
}
pytestmark = pytest.mark.ranks


def ranks(prefix: str, output: Path, nproc: int, *more: str) -> None:
    """The tiny DeepSeek-V3 (3 layers: one dense, two with 4 routed experts, top 2) on
    sequences of 32, 4 steps, a checkpoint at steps 2 and 4, on `nproc` ranks."""
    train(DEEPSEEK, output, prefix, *DEEPSEEK_3_LAYERS, *more, nproc=nproc)


def experts_written(output: Path, rank: int, world: int) -> set[int]:
    """The routed experts whose weights `rank` wrote into the step-4 checkpoint."""
    pieces = rank_pieces(output, 4, "model", rank, world, PREFIXES[DEEPSEEK])
    return {int(piece.name.split(".mlp.experts.")[1].split(".")[0]) for piece in pieces
            if ".mlp.experts." in piece.name}


def assert_same_weights(got: Path, want: Path) -> None:
    """The checkpoint after 4 steps holds the one-process model."""
    whole, merged = saved_tensors(want, 4), saved_tensors(got, 4)
    assert merged.keys() == whole.keys()
    for name, array in whole.items():
        np.testing.assert_allclose(merged[name], array, rtol=1e-4, atol=1e-6, err_msg=name)


@pytest.fixture(scope="module")
def single(runs) -> Path:
    return runs(DEEPSEEK, *DEEPSEEK_3_LAYERS)


@pytest.fixture(scope="module")
def two_ranks(runs):
    """Each dispatcher's expert-parallel 2 run, launched once on first use."""
    return lambda dispatcher: runs(DEEPSEEK, *DEEPSEEK_3_LAYERS, "parallelism.expert_parallel=2",
                                   *DISPATCHERS[dispatcher], nproc=2)


@pytest.mark.parametrize("dispatcher", list(DISPATCHERS))
def test_expert_parallel_matches_one_process(single, two_ranks, dispatcher) -> None:
    output = two_ranks(dispatcher)
    assert_same_run(output, single)
    assert_same_weights(output, single)
    assert [experts_written(output, rank, 2) for rank in (0, 1)] == [{0, 1}, {2, 3}]
    log = worker_log(output)
    dispatch = "all-to-all" if dispatcher == "alltoall" else "deredundant, devices of 1"
    assert f"expert parallel 2 (experts 0-1 of 4 here, {dispatch}) x FSDP over 2 ranks" in log


def test_expert_parallel_resumes_bit_for_bit(data_prefix, two_ranks, tmp_path) -> None:
    """Steps 3-4 resumed from the all-to-all run's step-2 checkpoint (the experts' optimizer
    state in each rank's file): the same losses, norms and final weights, bit for bit."""
    whole = two_ranks("alltoall")
    ranks(data_prefix, tmp_path, 2, "parallelism.expert_parallel=2",
          f"checkpoint.load_path={whole / 'ckpt' / iteration_name(2)}")
    assert_resumed_exactly(tmp_path, whole)
    got, want = saved_tensors(tmp_path, 4), saved_tensors(whole, 4)
    assert got.keys() == want.keys()
    for name in want:
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)


@pytest.mark.parametrize(("strategy", "layout"), [("optim_grads_params", "FSDP"),
                                                  ("optim_grads", "ZeRO-2")])
def test_sharded_over_four_ranks_with_expert_parallel_two(data_prefix, single, tmp_path,
                                                         strategy, layout) -> None:
    """FSDP or ZeRO-2 over 4 ranks x expert parallel 2: each expert on two ranks (its
    expert-data group), whose gradients are summed over just those two, and the experts
    sliced over those two as the rest is over the four (each keeps AdamW's state of half its
    experts), by the same optimizer and backward pass as the rest."""
    ranks(data_prefix, tmp_path, 4, "parallelism.expert_parallel=2",
          "training.local_batch_size=1",
          f"parallelism.data_parallel_shard_strategy={strategy}")
    assert_same_run(tmp_path, single)
    assert_same_weights(tmp_path, single)
    # ranks 0 and 2 hold experts 0-1, ranks 1 and 3 experts 2-3; each MoE layer's experts
    # are one buffer whose tensors are each cut in two: each rank writes half of each of its
    # experts, and no other expert
    assert [experts_written(tmp_path, rank, 4) for rank in range(4)] == \
        [{0, 1}, {2, 3}, {0, 1}, {2, 3}]
    assert ("expert parallel 2 (experts 0-1 of 4 here, all-to-all, sliced over 2 expert-data "
            f"ranks) x {layout} over 4 ranks") in worker_log(tmp_path)
    # AdamW's state: each rank writes (and holds) the moments of its half of its experts
    held = [sum(piece.stop - piece.start for piece in
                rank_pieces(tmp_path, 4, "opt", rank, 4, PREFIXES[DEEPSEEK])
                if piece.name.startswith("adam_m.") and ".mlp.experts." in piece.name)
            for rank in range(4)]
    experts = {name: array.size for name, array in saved_tensors(single, 4).items()
               if ".mlp.experts." in name}
    per_rank = sum(experts.values()) // 2  # each rank's 2 of the 4 experts
    assert held == [per_rank // 2] * 4


def test_tensor_fsdp_and_expert_parallel_on_four_ranks(data_prefix, single, tmp_path) -> None:
    """Tensor parallel 2 x FSDP 2 x expert parallel 2 (over the shard ranks): each tensor rank
    routes its sequence slice to the experts of its expert group; the two tensor ranks of a
    place hold the same experts, sum their gradients and slice them (the expert-data
    group)."""
    ranks(data_prefix, tmp_path, 4, "parallelism.expert_parallel=2",
          "parallelism.tensor_parallel=2")
    assert_same_run(tmp_path, single)
    assert ("expert parallel 2 (experts 0-1 of 4 here, all-to-all, sliced over 2 expert-data "
            "ranks) x FSDP over 2 ranks, tensor parallel 2 (sequence parallel)"
            ) in worker_log(tmp_path)


def test_expert_parallel_over_the_tensor_ranks(data_prefix, single, tmp_path) -> None:
    """2 ranks, tensor parallel 2 x expert parallel 2: no data-parallel ranks to lay the
    experts over, so they are split over the tensor ranks (each routes its sequence slice)."""
    ranks(data_prefix, tmp_path, 2, "parallelism.expert_parallel=2",
          "parallelism.tensor_parallel=2", "parallelism.moe_token_dispatcher_type="
          "alltoall_deredundancy", "parallelism.npu_nums_per_device=2")
    assert_same_run(tmp_path, single)
    assert [experts_written(tmp_path, rank, 2) for rank in (0, 1)] == [{0, 1}, {2, 3}]


def test_zero2_with_averaged_gradients(data_prefix, single, tmp_path) -> None:
    """ZeRO-2 inside, gradients averaged (`disable_gradient_division: false`): the experts'
    summed gradients are divided by the data-parallel size like the others."""
    ranks(data_prefix, tmp_path, 2, "parallelism.expert_parallel=2",
          "parallelism.data_parallel_shard_strategy=optim_grads",
          "parallelism.disable_gradient_division=false")
    assert_same_run(tmp_path, single)
    assert_same_weights(tmp_path, single)
