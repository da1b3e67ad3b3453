"""Where a step's time goes, in a real run's metrics.jsonl: the phases of each step sum to the
wall time between two step lines, and the launched part of them to `step_time`."""

from __future__ import annotations

import itertools
import json

import pytest

pytest.importorskip("mindspore")

from runs import QWEN3, QWEN3_2_LAYERS, steps

from mf_train.observe.step_times import PHASES, REPORTED, format_step_times, step_times


def test_the_phases_sum_to_the_time_between_step_lines(runs) -> None:
    output = runs(QWEN3, *QWEN3_2_LAYERS)
    lines = [json.loads(line) for line in (output / "metrics.jsonl").read_text().splitlines()]
    records = steps(output)
    assert len(records) == 4
    for record in records:
        named = sum(record[f"time/{phase}"] for phase in PHASES)
        assert named + record["time/other"] == pytest.approx(record["time/iteration"], abs=1e-6)
        launched = sum(record[f"time/{phase}"] for phase in
                       ("forward_backward", "reduction", "optimizer", "readback"))
        assert launched == pytest.approx(record["step_time"], rel=0.05, abs=0.002)
        assert record["time/save"] >= 0 and record["time/data"] >= 0
    # between two step lines (their Unix `time`, to the millisecond), one iteration; writing
    # the line itself falls outside it (a few ms, tens on a loaded 2-core host)
    for before, after in itertools.pairwise(records):
        assert after["time/iteration"] == pytest.approx(after["time"] - before["time"],
                                                        rel=0.05, abs=0.03)
    # the step after a checkpoint (step 2's, synchronous here) carries its save
    saved = [line["step"] for line in lines if line.get("event") == "save"]
    assert 2 in saved and records[2]["time/save"] > 0
    assert records[1]["time/save"] == 0


def test_the_slowest_rank_is_the_one_with_the_most_own_work() -> None:
    """Rank 1 loads its data 0.5 s longer; rank 0 waits that long in the reduction."""
    #        data  fwd_bwd reduce optim readback save  other iteration
    rank_0 = [0.01, 0.30, 0.55, 0.05, 0.0, 0.0, 0.01, 0.92]
    rank_1 = [0.51, 0.31, 0.04, 0.05, 0.0, 0.0, 0.01, 0.92]
    times = step_times([rank_0, rank_1])
    assert times["time/slowest_rank"] == 1
    assert (times["time/data"], times["time/data_min"], times["time/data_rank"]) == (
        0.51, 0.01, 1)
    assert (times["time/reduction"], times["time/reduction_rank"]) == (0.55, 0)
    assert format_step_times(times).endswith(", slowest rank 1 (data +500 ms)")
    assert set(step_times([rank_0])) == {f"time/{phase}" for phase in REPORTED}


def test_the_step_line_names_the_slowest_rank_and_phase() -> None:
    extra = {f"time/{phase}": 0.010 for phase in (*PHASES, "other", "iteration")}
    extra.update({f"time/{phase}_min": 0.010 for phase in (*PHASES, "other", "iteration")})
    extra.update({f"time/{phase}_rank": 0 for phase in (*PHASES, "other", "iteration")})
    extra.update({"time/data": 0.035, "time/data_rank": 1, "time/slowest_rank": 1})
    assert format_step_times(extra) == (
        "time data 35 ms fwd_bwd 10 ms reduce 10 ms optim 10 ms readback 10 ms save 10 ms "
        "other 10 ms, slowest rank 1 (data +25 ms)")
