"""DeepSeek-V3's auxiliary-loss-free bias and MoE monitor on real msrun ranks: `mf-train
--nproc 2` with plain data parallelism, FSDP, expert parallelism and two pipeline stages equals
one process over 4 steps (losses, the step's global tokens per expert, the moved
`e_score_correction_bias` on both ranks), and rank 0's metrics show each rank's own load (and,
with expert parallelism, what each rank's experts computed; with pipeline stages, every
stage's layers)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("mindspore")

from runs import DEEPSEEK, SHORT, Case, saved_tensors, steps

LAYOUTS = {"replicated": "parallelism.data_parallel_shard=1",
           "fsdp": "parallelism.data_parallel_shard_strategy=optim_grads_params",
           "expert": "parallelism.expert_parallel=2",
           "pipeline": "parallelism.pipeline_parallel=2"}
SETTINGS = (*SHORT, "model.seq_length=32", "model.moe_router_bias_update_rate=0.01",
            "model.n_group=1", "model.topk_group=1",
            "monitor.moe_monitor.save_tokens_per_expert_interval=1",
            "checkpoint.save_interleaved_steps=4")
"""4 steps of the tiny DeepSeek-V3 (global batch 4, sequences of 32), a faster bias (0.01) so
that it moves visibly, no group limit (with the example's two groups of two experts the loads
come in pairs and the bias here swings back to 0 every other step), tokens per expert recorded
every step, a checkpoint at step 4."""
CASES = {layout: Case(DEEPSEEK, SETTINGS, (setting,)) for layout, setting in LAYOUTS.items()}
pytestmark = pytest.mark.ranks


def biases(output: Path) -> dict[str, np.ndarray]:
    """The routers' expert biases in the step-4 checkpoint."""
    return {name: array for name, array in saved_tensors(output, 4).items()
            if name.endswith("e_score_correction_bias")}


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_two_ranks_move_the_bias_as_one_process(layout_runs, layout) -> None:
    single, output = layout_runs.one_process(layout), layout_runs(layout)
    one, two = steps(single), steps(output)
    assert len(one) == len(two) == 4
    # Host reads inside a step: one routing table per MoE layer (2) and forward; one
    # micro-batch a rank, or, in 2 stages, 2 micro-batches x (F, and B's recompute) x 1 layer.
    assert [s["host_reads"] for s in one] == [4] * 4  # 2 micro-batches
    assert [s["host_reads"] for s in two] == [4 if layout == "pipeline" else 2] * 4
    assert [s["loss"] for s in two] == pytest.approx([s["loss"] for s in one], rel=1e-5,
                                                     abs=1e-5)
    counts = [key for key in one[0] if key.endswith(tuple(f"expert{e}" for e in range(4)))]
    assert len(counts) == 2 * 4  # target layers 1 and 2 of the example, 4 experts each
    for a, b in zip(one, two, strict=True):  # the global counts of every step
        assert {key: b[key] for key in counts} == {key: a[key] for key in counts}
    want = biases(single)
    for layer in (1, 2):  # the sum of the sign steps of the recorded global counts
        moves = [np.sign(np.mean(c) - np.array(c)) for c in
                 ([s[f"moe/layer{layer}/expert{e}"] for e in range(4)] for s in one)]
        bias = want[f"decoder_layers.{layer}.mlp.router.e_score_correction_bias"]
        np.testing.assert_allclose(bias, np.float32(0.01) * np.sum(moves, 0), atol=1e-7)
        assert np.abs(bias).max() > 0
    got = biases(output)
    assert got.keys() == want.keys()
    for name in want:
        np.testing.assert_allclose(got[name], want[name], atol=1e-5, err_msg=name)
    logged = {rank: own_counts(output, rank) for rank in (0, 1)}
    if layout == "pipeline":  # stage 0: layers 0-1, stage 1: layer 2; each routes the batch
        for step in two:  # rank 0's metrics have both stages' layers
            for layer, rank in ((1, 0), (2, 1)):
                assert logged[rank][step["step"], layer].tolist() == [
                    step[f"moe/layer{layer}/expert{e}"] for e in range(4)]
                assert (step["step"], layer) not in logged[1 - rank]
        assert not [key for key in two[0] if "/rank" in key]
        return
    # rank 0's metrics: each rank's own imbalance, from the counts that rank logged, which
    # sum to the global counts
    for step in two:
        for layer in (1, 2):
            rows = [logged[rank][step["step"], layer] for rank in (0, 1)]
            assert (rows[0] + rows[1]).tolist() == [step[f"moe/layer{layer}/expert{e}"]
                                                    for e in range(4)]
            for rank, row in enumerate(rows):
                assert step[f"moe/layer{layer}/rank{rank}/max_over_mean"] == pytest.approx(
                    row.max() / row.mean())
    assert not [key for key in one[0] if "/rank" in key]
    # expert parallelism 2: rank 0 holds experts 0-1, rank 1 experts 2-3, so each rank's
    # experts computed the global counts of its two experts
    for step in two:
        for layer in (1, 2):
            held = {0: (0, 1), 1: (2, 3)}
            for rank in (0, 1):
                key = f"moe/layer{layer}/rank{rank}/processed"
                if layout != "expert":
                    assert key not in step
                    continue
                assert step[key] == sum(step[f"moe/layer{layer}/expert{e}"] for e in held[rank])


def own_counts(output: Path, rank: int) -> dict[tuple[int, int], np.ndarray]:
    """(step, layer) -> the tokens per expert `rank` routed, from its own JSON lines."""
    found = {}
    for line in (output / "moe_tokens" / f"rank_{rank}.jsonl").read_text().splitlines():
        record = json.loads(line)
        assert record["rank"] == rank
        found[record["step"], record["layer"]] = np.array(record["tpe"])
    assert '"tpe"' not in (output / "logs" / f"worker_{rank}.log").read_text()
    return found
