"""`mf-train --nproc N` with expert parallelism on real msrun ranks (DeepSeek-V3 tiny): both
token dispatchers give the losses, gradient norms and weights of one process; each rank saves
only its routed experts; expert parallelism composes with FSDP; a run resumes bit for bit."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("mindspore")

from runs import (
    DEEPSEEK,
    DEEPSEEK_3_LAYERS,
    PREFIXES,
    Case,
    assert_resumed_exactly,
    rank_pieces,
    saved_tensors,
    train,
)
from same_tensors import assert_same_tensors

from mf_train.checkpoint.layout import iteration_name

EXPERT_2 = "parallelism.expert_parallel=2"
DISPATCHERS = {
    "alltoall": (),
    "alltoall_deredundancy": ("parallelism.moe_token_dispatcher_type=alltoall_deredundancy",
                              "parallelism.npu_nums_per_device=1"),
}
SHARDED = {"FSDP": "optim_grads_params", "ZeRO-2": "optim_grads"}


def case(*layout: str, nproc: int = 2, weights: float | None = 1e-4, alone: bool = False,
         log: str | None = None) -> Case:
    """The tiny DeepSeek-V3 (3 layers: one dense, two with 4 routed experts, top 2) on
    sequences of 32, 4 steps, a checkpoint at steps 2 and 4, expert parallel 2 and `layout`
    on `nproc` ranks."""
    return Case(DEEPSEEK, DEEPSEEK_3_LAYERS, (EXPERT_2, *layout), nproc, weights, log, alone)


CASES = {
    # the test_compiled_layouts.py matrix compares the two dispatchers' runs too
    **{dispatcher: case(*sets, alone=True, log=(
        f"expert parallel 2 (experts 0-1 of 4 here, "
        f"{'all-to-all' if dispatcher == 'alltoall' else 'deredundant, devices of 1'}) x "
        "FSDP over 2 ranks")) for dispatcher, sets in DISPATCHERS.items()},
    **{layout: case("training.local_batch_size=1",
                    f"parallelism.data_parallel_shard_strategy={strategy}", nproc=4,
                    log=("expert parallel 2 (experts 0-1 of 4 here, all-to-all, sliced over 2 "
                         f"expert-data ranks) x {layout} over 4 ranks"))
       for layout, strategy in SHARDED.items()},
    "tensor x FSDP": case("parallelism.tensor_parallel=2", nproc=4, weights=None, log=(
        "expert parallel 2 (experts 0-1 of 4 here, all-to-all, sliced over 2 expert-data "
        "ranks) x FSDP over 2 ranks, tensor parallel 2 (sequence parallel)")),
    "over the tensor ranks": case("parallelism.tensor_parallel=2",
                                  "parallelism.moe_token_dispatcher_type=alltoall_deredundancy",
                                  "parallelism.npu_nums_per_device=2", weights=None),
    "ZeRO-2 averaged": case("parallelism.data_parallel_shard_strategy=optim_grads",
                            "parallelism.disable_gradient_division=false"),
}
pytestmark = pytest.mark.ranks


def experts_written(output: Path, rank: int, world: int) -> set[int]:
    """The routed experts whose weights `rank` wrote into the step-4 checkpoint."""
    pieces = rank_pieces(output, 4, "model", rank, world, PREFIXES[DEEPSEEK])
    return {int(piece.name.split(".mlp.experts.")[1].split(".")[0]) for piece in pieces
            if ".mlp.experts." in piece.name}


@pytest.mark.parametrize("dispatcher", list(DISPATCHERS))
def test_expert_parallel_matches_one_process(layout_runs, dispatcher) -> None:
    output = layout_runs.check(dispatcher)
    assert [experts_written(output, rank, 2) for rank in (0, 1)] == [{0, 1}, {2, 3}]


def test_expert_parallel_resumes_bit_for_bit(data_prefix, layout_runs, tmp_path) -> None:
    """Steps 3-4 resumed from the all-to-all run's step-2 checkpoint (the experts' optimizer
    state in each rank's file): the same losses, norms and final weights, bit for bit."""
    whole = layout_runs("alltoall")
    train(DEEPSEEK, tmp_path, data_prefix, *DEEPSEEK_3_LAYERS, EXPERT_2,
          f"checkpoint.load_path={whole / 'ckpt' / iteration_name(2)}", nproc=2)
    assert_resumed_exactly(tmp_path, whole)
    assert_same_tensors(saved_tensors(tmp_path, 4), saved_tensors(whole, 4), rel=0, atol=0)


@pytest.mark.parametrize("layout", list(SHARDED))
def test_sharded_over_four_ranks_with_expert_parallel_two(layout_runs, layout) -> None:
    """FSDP or ZeRO-2 over 4 ranks x expert parallel 2: each expert on two ranks (its
    expert-data group), whose gradients are summed over just those two, and the experts
    sliced over those two as the rest is over the four (each keeps AdamW's state of half its
    experts), by the same optimizer and backward pass as the rest."""
    output = layout_runs.check(layout)
    # ranks 0 and 2 hold experts 0-1, ranks 1 and 3 experts 2-3; each MoE layer's experts
    # are one buffer whose tensors are each cut in two: each rank writes half of each of its
    # experts, and no other expert
    assert [experts_written(output, rank, 4) for rank in range(4)] == \
        [{0, 1}, {2, 3}, {0, 1}, {2, 3}]
    # AdamW's state: each rank writes (and holds) the moments of its half of its experts
    held = [sum(piece.stop - piece.start for piece in
                rank_pieces(output, 4, "opt", rank, 4, PREFIXES[DEEPSEEK])
                if piece.name.startswith("adam_m.") and ".mlp.experts." in piece.name)
            for rank in range(4)]
    experts = {name: array.size for name, array in
               saved_tensors(layout_runs.one_process(layout), 4).items()
               if ".mlp.experts." in name}
    per_rank = sum(experts.values()) // 2  # each rank's 2 of the 4 experts
    assert held == [per_rank // 2] * 4


def test_tensor_fsdp_and_expert_parallel_on_four_ranks(layout_runs) -> None:
    """Tensor parallel 2 x FSDP 2 x expert parallel 2 (over the shard ranks): each tensor rank
    routes its sequence slice to the experts of its expert group; the two tensor ranks of a
    place hold the same experts, sum their gradients and slice them (the expert-data
    group)."""
    layout_runs.check("tensor x FSDP")


def test_expert_parallel_over_the_tensor_ranks(layout_runs) -> None:
    """2 ranks, tensor parallel 2 x expert parallel 2: no data-parallel ranks to lay the
    experts over, so they are split over the tensor ranks (each routes its sequence slice)."""
    output = layout_runs.check("over the tensor ranks")
    assert [experts_written(output, rank, 2) for rank in (0, 1)] == [{0, 1}, {2, 3}]


def test_zero2_with_averaged_gradients(layout_runs) -> None:
    """ZeRO-2 inside, gradients averaged (`disable_gradient_division: false`): the experts'
    summed gradients are divided by the data-parallel size like the others."""
    layout_runs.check("ZeRO-2 averaged")
