"""Throughput on the step line, in metrics.jsonl and in the summary: model FLOPs per token
against a count made here by hand from the models' weight matrices, elapsed time and ETA,
tokens/s per rank, TFLOP/s and MFU, and a real run's metrics.jsonl holding them consistently.

Only the real runs import MindSpore (through tests/train/runs.py).
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest

from mf_config import load_config
from mf_config.components import model_shape
from mf_train.launch.summary import summary_lines
from mf_train.observe.callbacks import StepRecord, duration, format_step_line
from mf_train.observe.model_flops import flops_per_token
from mf_train.observe.throughput import PeakFlops, RunPace, Throughput

ROOT = Path(__file__).resolve().parents[2]
REPLICATED = "parallelism.data_parallel_shard=1"


def training_flops(matrices: list[tuple[int, int]], attention_forward: int) -> int:
    """Forward and backward FLOPs of one token: each `(in, out)` weight matrix it is
    multiplied by costs 2·in·out forward (a multiply and an add per weight) and twice that
    backward (the input's gradient and the weight's); so does the attention."""
    forward = sum(2 * rows * cols for rows, cols in matrices) + attention_forward
    return 3 * forward


# ----------------------------------------------------------------------- FLOPs per token


def test_qwen3_flops_per_token_by_hand() -> None:
    """examples/qwen3_tiny.yaml: hidden 64, 4 layers, 4 query heads and 2 key/value heads of
    16, SwiGLU 176, vocabulary 512 (tied head: still a matmul), sequence 128."""
    layer = [(64, 4 * 16), (64, 2 * 16), (64, 2 * 16), (4 * 16, 64),  # q, k, v, o
             (64, 176), (64, 176), (176, 64)]                          # gate, up, down
    head = [(64, 512)]
    # each of 4 heads: a score against each of 128 keys (16 multiply-adds), then 128 values
    # of 16 summed with those weights
    attention = 4 * (4 * (2 * 128 * 16) + 4 * (2 * 128 * 16))
    want = training_flops(layer * 4 + head, attention)
    assert want == 3 * (2 * (4 * 46080 + 32768) + 131072) == 1_695_744
    shape = model_shape(load_config(ROOT / "examples" / "qwen3_tiny.yaml").model)
    assert flops_per_token(shape, 128) == want


@pytest.mark.parametrize("q_lora", [None, 16])
def test_deepseek_v3_flops_per_token_by_hand(q_lora) -> None:
    """examples/deepseek_v3_tiny.yaml: hidden 64, 3 layers (the first dense, SwiGLU 176; then
    4 routed experts of 48, top 2, and 1 shared), 4 heads of latent attention (kv rank 32,
    query/key 16 + 8 rotary, value 16), vocabulary 512, sequence 128; the query projection
    whole or through a rank-16 compression."""
    query = [(64, 4 * 24)] if q_lora is None else [(64, q_lora), (q_lora, 4 * 24)]
    attention_matrices = [*query, (64, 32 + 8),        # kv_a_proj_with_mqa: latent + rotary key
                          (32, 4 * (16 + 16)),         # kv_b_proj: keys (no rope) and values
                          (4 * 16, 64)]                # o_proj
    dense = [(64, 176), (64, 176), (176, 64)]
    expert = [(64, 48), (64, 48), (48, 64)]
    moe = [(64, 4)] + expert * 3                       # router, 2 routed + 1 shared expert
    layers = attention_matrices * 3 + dense + moe * 2
    # per layer: 4 heads score 128 keys over 16 + 8 dimensions, then sum 128 values of 16
    attention = 3 * (4 * 2 * 128 * 24 + 4 * 2 * 128 * 16)
    want = training_flops([*layers, (64, 512)], attention)
    if q_lora is None:
        assert want == 3 * (2 * 173056 + 122880) == 1_406_976
    sets = [] if q_lora is None else [f"model.q_lora_rank={q_lora}"]
    shape = model_shape(load_config(ROOT / "examples" / "deepseek_v3_tiny.yaml", sets).model)
    assert flops_per_token(shape, 128) == want


def test_flops_grow_with_the_sequence_by_the_attention_term_only() -> None:
    shape = model_shape(load_config(ROOT / "examples" / "qwen3_tiny.yaml").model)
    # 4 layers x 3 (forward and backward) x 2 (scores, values) x 2 FLOPs x 4 heads x 16 wide
    assert flops_per_token(shape, 129) - flops_per_token(shape, 128) == 4 * 3 * 2 * 2 * 4 * 16
    with pytest.raises(ValueError, match="seq_length"):
        flops_per_token(shape, 0)


# ----------------------------------------------------------------------- pace and rates


def test_eta_is_the_mean_steady_step_times_the_steps_left() -> None:
    ticks = iter([100.0, 105.0, 106.0, 110.0, 111.5, 112.0, 113.0])  # start, 6 step ends
    pace = RunPace(6, clock=lambda: next(ticks))
    steady = [True, True, False, True, True, True]  # step 3 compiled a graph (4 s)
    done = [pace.step_done(step, ok) for step, ok in zip(range(1, 7), steady, strict=True)]
    # step 1 alone: no ETA (compilation, warm-up); then the mean of steps 2, 4.. (1, 1.5,
    # 0.5, 1 s), step 3's compilation left out
    assert done == [(5.0, None), (6.0, 4.0), (10.0, 3.0), (11.5, 2.5), (12.0, 1.0),
                    (13.0, 0.0)]


def test_a_run_whose_every_step_compiles_still_has_an_eta() -> None:
    ticks = iter([0.0, 5.0, 7.0, 8.0])
    pace = RunPace(4, clock=lambda: next(ticks))
    assert [pace.step_done(step, steady=False) for step in (1, 2, 3)] == [
        (5.0, None), (7.0, 4.0), (8.0, 1.5)]


def test_a_resumed_run_counts_its_own_steps_only() -> None:
    ticks = iter([0.0, 2.0, 3.0, 3.5])
    pace = RunPace(11, clock=lambda: next(ticks))
    assert pace.step_done(9) == (2.0, None)
    assert pace.step_done(10) == (3.0, 1.0)
    assert pace.step_done(11) == (3.5, 0.0)


def test_throughput_fills_per_rank_tflops_and_mfu() -> None:
    throughput = Throughput(4, flops_per_token=10**9, peak=PeakFlops(2e12, "given"))
    record = make_record(tokens=4000, step_time=1.0)
    throughput.fill(record)
    assert (record.tokens_per_s, record.tokens_per_s_per_rank) == (4000.0, 1000.0)
    assert record.tflops == pytest.approx(1.0)  # 1e9 FLOPs x 1000 tokens/s
    assert record.mfu == pytest.approx(0.5)
    unknown = Throughput(2, unknown="no shape")
    record = make_record(tokens=4000, step_time=1.0)
    unknown.fill(record)
    assert (record.tokens_per_s_per_rank, record.tflops, record.mfu) == (2000.0, None, None)
    assert unknown.describe() == ("model FLOPs per token unknown (no shape): the step lines "
                                  "give no TFLOP/s or MFU")


def test_durations() -> None:
    assert [duration(s) for s in (0.0, 8.14, 59.9, 61, 3599, 3600, 7530)] == [
        "0.0s", "8.1s", "59.9s", "1m01s", "59m59s", "1h00m", "2h05m"]


def make_record(**changes) -> StepRecord:
    fields = {"step": 3, "total_steps": 100, "loss": 4.1234564, "lr": 1e-4,
              "grad_norm": 1.2345, "step_time": 0.123, "tokens": 1518, "consumed_samples": 24}
    return StepRecord(**(fields | changes))


def test_step_line_with_throughput_and_time() -> None:
    record = make_record(tokens_per_s_per_rank=6170.7, tflops=0.04567, mfu=0.02771,
                         elapsed_s=75.3, eta_s=12.0, peak_memory_gib=4.61, peak_memory_rank=1)
    assert format_step_line(record) == (
        "step [  3/100] loss 4.123456 lr 1.0e-04 grad_norm 1.234 tokens/s(global) 12341 "
        "tokens/s/rank 6171 tflops/rank 0.0457 mfu 2.77% step_time 123 ms elapsed 1m15s "
        "eta 12.0s peak_mem 4.61 GiB (rank 1)")
    assert {"tokens_per_s_per_rank", "tflops", "mfu", "elapsed_s", "eta_s"} <= \
        set(record.scalars())


def test_summary_gives_the_mean_tokens_per_s_and_mfu_after_the_first_step(tmp_path) -> None:
    lines = [{"event": "start", "step": 0, "total_steps": 3},
             {"step": 1, "loss": 5.0, "tokens": 512, "step_time": 4.0, "mfu": 0.001},
             {"step": 2, "loss": 4.5, "tokens": 512, "step_time": 0.5, "mfu": 0.02},
             {"step": 3, "loss": 4.0, "tokens": 512, "step_time": 0.25, "mfu": 0.04}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    head = summary_lines(tmp_path, tmp_path / "ckpt", tmp_path / "tb", 5.0)[0]
    # steps 2-3: 1024 tokens in 0.75 s; MFU (0.02 x 0.5 + 0.04 x 0.25) / 0.75 = 2.67 %
    assert head == ("finished steps 1-3 of 3 (3 in this run) in 5.0s; final loss 4.000000; "
                    "mean 1365 tokens/s (global), MFU 2.67% (steps 2-3)")


# ----------------------------------------------------------------------- a real run


def check_run(output: Path, world: int) -> None:
    """Every step line of `output`'s metrics.jsonl (the tiny Qwen3 of QWEN3_2_LAYERS, 4 steps)
    carries the new fields, consistent with each other and with the start event."""
    from runs import QWEN3, QWEN3_2_LAYERS, steps

    events = [json.loads(line) for line in (output / "metrics.jsonl").read_text().splitlines()]
    [start] = [event for event in events if event.get("event") == "start"]
    config = load_config(QWEN3, [*QWEN3_2_LAYERS])
    shape = model_shape(config.model)
    assert start["model_flops_per_token"] == flops_per_token(shape, 32)
    assert start["world_size"] == world and start["peak_tflops"] > 0
    assert start["peak_source"].startswith(
        "measured once on this machine (float32 1024x1024 matmul on CPU, fastest of 5, ")
    logged = steps(output)
    assert [line["step"] for line in logged] == [1, 2, 3, 4]
    for line in logged:
        assert line["tokens_per_s"] == pytest.approx(line["tokens"] / line["step_time"])
        assert line["tokens_per_s_per_rank"] * world == pytest.approx(line["tokens_per_s"])
        assert line["tflops"] == pytest.approx(
            start["model_flops_per_token"] * line["tokens_per_s_per_rank"] / 1e12)
        assert line["mfu"] == pytest.approx(line["tflops"] / start["peak_tflops"])
        assert 0 < line["mfu"] < 1
    elapsed = [line["elapsed_s"] for line in logged]
    assert elapsed == sorted(elapsed) and elapsed[0] > 0
    periods = [elapsed[0]] + [b - a for a, b in itertools.pairwise(elapsed)]
    assert "eta_s" not in logged[0]  # the first step alone: no ETA
    for index, line in enumerate(logged[1:-1], 1):  # the mean step after the first (none of
        timed = periods[1:index + 1]                # these compiles), times the steps left
        assert line["eta_s"] == pytest.approx(sum(timed) / len(timed) * (4 - line["step"]),
                                              abs=1e-6)
    assert logged[-1]["eta_s"] == 0.0 and logged[-2]["eta_s"] > 0


def test_a_run_logs_time_throughput_and_mfu(runs) -> None:
    pytest.importorskip("mindspore")
    from runs import QWEN3, QWEN3_2_LAYERS

    check_run(runs(QWEN3, *QWEN3_2_LAYERS), world=1)


@pytest.mark.ranks
def test_two_ranks_split_tokens_per_s_and_flops_per_rank(runs) -> None:
    """Replicated data parallelism on 2 ranks (a run test_train_ranks.py shares)."""
    pytest.importorskip("mindspore")
    from runs import QWEN3, QWEN3_2_LAYERS

    check_run(runs(QWEN3, *QWEN3_2_LAYERS, REPLICATED, nproc=2), world=2)
