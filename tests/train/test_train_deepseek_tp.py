"""`mf-train` on examples/deepseek_v3_tiny.yaml with tensor parallelism on real msrun ranks:
tensor parallel 2 on 2 ranks, and tensor parallel 2 x FSDP 2 on 4 ranks, equal the
one-process run over 4 steps (losses, gradient norms, and the weights the ranks save, merged
back into whole tensors); a tensor size that does not divide the heads is refused before any
rank starts."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("mindspore")

from runs import DEEPSEEK, DEEPSEEK_3_LAYERS, Case, arguments, saved_tensors
from same_tensors import assert_same_tensors

from mf_train.launch.cli import run
from mf_train.models.blocks import fuse_rows
from mf_train.models.deepseek_v3 import hf_parameter_names, tensor_split_axis

pytestmark = pytest.mark.ranks


def merge_tensor_shards(shards: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """Whole weights from each tensor rank's saved shards: split parameters concatenated
    along their split axis (a fused `gate_up` part by part, since each rank holds
    `[gate_r; up_r]`); replicated ones must be equal on every rank, and one copy is kept."""
    merged = {}
    for name, first in shards[0].items():
        axis = tensor_split_axis(name)
        if axis is None:
            for rank, shard in enumerate(shards[1:], 1):
                np.testing.assert_array_equal(shard[name], first,
                                              err_msg=f"{name}: tensor rank {rank} differs")
            merged[name] = first
            continue
        parts = len(hf_parameter_names(name))
        pieces = [np.split(shard[name], parts, axis=0) if parts > 1 else [shard[name]]
                  for shard in shards]
        whole = [np.concatenate([piece[p] for piece in pieces], axis=axis) for p in range(parts)]
        merged[name] = fuse_rows(whole) if parts > 1 else whole[0]
    return merged


TENSOR_2 = "parallelism.tensor_parallel=2"
CASES = {
    # the example (3 layers: one dense, two MoE; balance loss on), 4 steps of 2 micro-batches
    # of 2 x 32 tokens, checkpoints at steps 2 and 4; tensor parallel 2 on 2 ranks (sequence
    # parallel; no data parallelism)
    "tensor parallel": Case(DEEPSEEK, DEEPSEEK_3_LAYERS, (TENSOR_2,), log="tensor parallel 2"),
    # tensor parallel 2 x FSDP 2 on 4 ranks (tensor innermost: ranks 0 and 1 a tensor group,
    # 0 and 2 a shard group)
    "with FSDP": Case(DEEPSEEK, DEEPSEEK_3_LAYERS, (
        TENSOR_2, "parallelism.data_parallel_shard_strategy=optim_grads_params"), 4,
        log="FSDP over 2 ranks, tensor parallel 2 (sequence parallel)"),
}


def assert_shards_merge_into_one_process(layout_runs, name: str) -> None:
    """The checkpoint's shards of the two tensor places merge into the one-process weights
    after 4 steps."""
    merged = merge_tensor_shards([saved_tensors(layout_runs(name), 4, place=(r, 2))
                                  for r in (0, 1)])
    assert_same_tensors(merged, saved_tensors(layout_runs.one_process(name), 4))


def test_tensor_parallel_matches_one_process(layout_runs) -> None:
    layout_runs.check("tensor parallel")


def test_tensor_parallel_weights_merge_into_the_one_process_weights(layout_runs) -> None:
    assert_shards_merge_into_one_process(layout_runs, "tensor parallel")


def test_tensor_parallel_with_fsdp_matches_one_process(layout_runs) -> None:
    layout_runs.check("with FSDP")


def test_tensor_parallel_with_fsdp_weights_merge_into_the_one_process_weights(
        layout_runs) -> None:
    assert_shards_merge_into_one_process(layout_runs, "with FSDP")


def test_a_tensor_size_not_dividing_the_heads_is_refused_before_the_ranks_start(
        data_prefix, tmp_path, capsys) -> None:
    args = arguments(DEEPSEEK, tmp_path, data_prefix, [*DEEPSEEK_3_LAYERS,
                     "parallelism.tensor_parallel=2", "model.num_attention_heads=3"])
    assert run([*args, "--nproc", "2", "--timeout", "60"]) == 2
    assert ("model.num_attention_heads: 3 is not divisible by parallelism.tensor_parallel (2)"
            in capsys.readouterr().err)
    assert not (tmp_path / "logs").exists()
