"""`mf-train` on examples/deepseek_v3_tiny.yaml with tensor parallelism on real msrun ranks:
tensor parallel 2 on 2 ranks, and tensor parallel 2 x FSDP 2 on 4 ranks, equal the
one-process run over 4 steps (losses, gradient norms, and the weights the ranks save, merged
back into whole tensors); a tensor size that does not divide the heads is refused before any
rank starts."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("mindspore")

from runs import DEEPSEEK, DEEPSEEK_3_LAYERS, arguments, saved_tensors, steps, worker_log

from mf_train.cli import run
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


@pytest.fixture(scope="module")
def single(runs) -> Path:
    """The example (3 layers: one dense, two MoE; balance loss on), 4 steps of 2 micro-batches
    of 2 x 32 tokens, checkpoints at steps 2 and 4."""
    return runs(DEEPSEEK, *DEEPSEEK_3_LAYERS)


@pytest.fixture(scope="module")
def tensor_parallel(runs) -> Path:
    """Tensor parallel 2 on 2 ranks (sequence parallel; no data parallelism)."""
    return runs(DEEPSEEK, *DEEPSEEK_3_LAYERS, "parallelism.tensor_parallel=2", nproc=2)


@pytest.fixture(scope="module")
def with_fsdp(runs) -> Path:
    """Tensor parallel 2 x FSDP 2 on 4 ranks (tensor innermost: ranks 0 and 1 a tensor
    group, 0 and 2 a shard group)."""
    return runs(DEEPSEEK, *DEEPSEEK_3_LAYERS, "parallelism.tensor_parallel=2",
                "parallelism.data_parallel_shard_strategy=optim_grads_params", nproc=4)


def assert_same_steps(one: list[dict], other: list[dict]) -> None:
    assert len(one) == len(other) == 4
    assert [s["loss"] for s in other] == pytest.approx([s["loss"] for s in one], rel=1e-5)
    assert [s["grad_norm"] for s in other] == pytest.approx([s["grad_norm"] for s in one],
                                                            rel=1e-5)
    assert one[-1]["loss"] < one[0]["loss"]


def assert_same_weights(single: Path, output: Path) -> None:
    """The checkpoint's shards of the two tensor places merge into the one-process weights
    after 4 steps."""
    want = saved_tensors(single, 4)
    merged = merge_tensor_shards([saved_tensors(output, 4, place=(r, 2)) for r in (0, 1)])
    assert merged.keys() == want.keys()
    for name, array in want.items():
        assert merged[name].shape == array.shape, name
        np.testing.assert_allclose(merged[name], array, rtol=1e-5, atol=1e-6, err_msg=name)


def test_tensor_parallel_matches_one_process(single, tensor_parallel) -> None:
    assert_same_steps(steps(single), steps(tensor_parallel))
    assert "tensor parallel 2" in worker_log(tensor_parallel)


def test_tensor_parallel_weights_merge_into_the_one_process_weights(single,
                                                                    tensor_parallel) -> None:
    assert_same_weights(single, tensor_parallel)


def test_tensor_parallel_with_fsdp_matches_one_process(single, with_fsdp) -> None:
    assert_same_steps(steps(single), steps(with_fsdp))
    assert "FSDP over 2 ranks, tensor parallel 2 (sequence parallel)" in worker_log(with_fsdp)


def test_tensor_parallel_with_fsdp_weights_merge_into_the_one_process_weights(
        single, with_fsdp) -> None:
    assert_same_weights(single, with_fsdp)


def test_a_tensor_size_not_dividing_the_heads_is_refused_before_the_ranks_start(
        data_prefix, tmp_path, capsys) -> None:
    args = arguments(DEEPSEEK, tmp_path, data_prefix, [*DEEPSEEK_3_LAYERS,
                     "parallelism.tensor_parallel=2", "model.num_attention_heads=3"])
    assert run([*args, "--nproc", "2", "--timeout", "60"]) == 2
    assert ("model.num_attention_heads: 3 is not divisible by parallelism.tensor_parallel (2)"
            in capsys.readouterr().err)
    assert not (tmp_path / "logs").exists()
