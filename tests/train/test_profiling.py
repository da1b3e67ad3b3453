"""The profiler callback with MindSpore's real CPU profiler.

Fake training steps drive the callback's hooks; step `s` runs `s` MatMuls and one operator
of its own (Tanh, ReLU, Sigmoid, Exp, Neg for steps 1..5), so the operators in the profile
tell exactly which steps were recorded: the expected counts are written out from the step
range, independently of the callback's arithmetic.
"""

from __future__ import annotations

import csv
import json
import logging
from collections import Counter
from pathlib import Path

import attrs
import mindspore as ms
import numpy as np
import pytest
from mindspore import ops
from mindspore.profiler import AicoreMetrics, ProfilerActivity, ProfilerLevel

from mf_config import ConfigError, ProfilerConfig
from mf_train.observe import profiling
from mf_train.observe.callbacks import Callback, StepRecord, TrainContext
from mf_train.observe.profiling import (
    ProfilerCallback,
    profile_options,
    profiler_callbacks,
    profiler_level,
)

X = ms.Tensor(np.full((8, 8), 0.125, np.float32))
MARKER_OPS = {1: ops.tanh, 2: ops.relu, 3: ops.sigmoid, 4: ops.exp, 5: ops.neg}
MARKER_NAMES = {1: "Tanh", 2: "ReLU", 3: "Sigmoid", 4: "Exp", 5: "Neg"}


def config(**changes) -> ProfilerConfig:
    return ProfilerConfig(**({"enable_profiling": True} | changes))


def expected_ops(steps: range) -> Counter:
    """What steps `steps` run: `s` MatMuls and one marker operator each."""
    return Counter({"MatMul": sum(steps)}) + Counter(MARKER_NAMES[s] for s in steps)


def work(step: int) -> None:
    y = X
    for _ in range(step):
        y = ops.matmul(y, X)
    MARKER_OPS[step](y).asnumpy()


def record(step: int, total: int) -> StepRecord:
    return StepRecord(step=step, total_steps=total, loss=1.0, lr=1e-3, grad_norm=1.0,
                      step_time=0.01, tokens=16, consumed_samples=step)


def train(callback: Callback, ctx: TrainContext, stop_after: int | None = None) -> None:
    """The loop's hook order over steps `start_step + 1 ..`, stopping early if asked."""
    callback.on_train_begin(ctx)
    last = None
    for step in range(ctx.start_step + 1, (stop_after or ctx.total_steps) + 1):
        callback.on_step_begin(ctx, step)
        work(step)
        last = record(step, ctx.total_steps)
        callback.on_step_end(ctx, last)
    callback.on_train_end(ctx, last)


def run_dir(directory: Path) -> Path:
    """The one `<host>_<pid>_<time>_ascend_ms` folder MindSpore writes per profiled run."""
    runs = list(directory.glob("*_ascend_ms"))
    assert len(runs) == 1, runs
    return runs[0]


def op_type_counts(run: Path) -> Counter:
    (table,) = (run / "FRAMEWORK").glob("cpu_op_type_info_*.csv")
    with table.open() as file:
        return Counter({row["op_type"]: int(row["type_occurrences"])
                        for row in csv.DictReader(file)})


def trace_counts(run: Path) -> Counter:
    events = json.loads((run / "ASCEND_PROFILER_OUTPUT" / "trace_view.json").read_text())
    ops_run = [e for e in events if e["ph"] == "X"]
    assert all(float(e["dur"]) > 0 for e in ops_run)
    return Counter(e["name"] for e in ops_run)


# ------------------------------------------------------------------ real profiles


def test_records_exactly_the_configured_steps_under_the_default_directory(tmp_path, caplog):
    callback = ProfilerCallback(config(start_step=2, end_step=3))
    with caplog.at_level(logging.WARNING, logger="mf_train.observe.profiling"):
        train(callback, TrainContext(output_dir=tmp_path, total_steps=4))
    ours = [r for r in caplog.records if r.name == "mf_train.observe.profiling"]
    assert ours == []  # a complete range: no "training ended" warning

    run = run_dir(tmp_path / "profile" / "rank_0")
    assert op_type_counts(run) == expected_ops(range(2, 4)) == {"MatMul": 5, "ReLU": 1,
                                                                "Sigmoid": 1}
    assert trace_counts(run) == expected_ops(range(2, 4))
    assert callback.steps == range(2, 4)
    assert not list((run / "FRAMEWORK").glob("cpu_ms_memory_record_*"))  # profile_memory off


def test_resumed_run_relative_path_other_rank_level_and_memory(tmp_path, monkeypatch, caplog):
    """Steps count from the checkpoint's step; `rank_1` under a relative output_path; level 2
    reaches MindSpore; profile_memory writes the allocator's record."""
    monkeypatch.chdir(tmp_path)
    passed = {}

    def spy(**kwargs):
        passed.update(kwargs)
        return real_profile(**kwargs)

    real_profile = profiling.profile
    monkeypatch.setattr(profiling, "profile", spy)
    callback = ProfilerCallback(config(start_step=2, end_step=4, output_path="prof",
                                       profiler_rank=[1], profiler_level=2,
                                       profile_memory=True))
    ctx = TrainContext(output_dir=tmp_path / "out", total_steps=5, rank=1, world_size=2,
                       start_step=2)
    with caplog.at_level(logging.WARNING, logger="mf_train.observe.profiling"):
        train(callback, ctx)

    assert "training runs steps 3..5: profiling steps 3..4" in caplog.text
    run = run_dir(tmp_path / "prof" / "rank_1")
    assert op_type_counts(run) == expected_ops(range(3, 5))
    assert passed["experimental_config"].profiler_level is ProfilerLevel.Level2
    assert passed["profile_memory"] is True
    (memory,) = (run / "FRAMEWORK").glob("cpu_ms_memory_record_*.txt")
    rows = list(csv.DictReader(memory.open()))
    assert rows and all(int(row["Total Allocated(Byte)"]) > 0 for row in rows)
    assert not (tmp_path / "out").exists()


def test_early_stop_flushes_the_steps_recorded(tmp_path, caplog):
    callback = ProfilerCallback(config(start_step=2, end_step=4))
    with caplog.at_level(logging.WARNING, logger="mf_train.observe.profiling"):
        train(callback, TrainContext(output_dir=tmp_path, total_steps=5), stop_after=3)

    assert "the profile holds steps 2..3" in caplog.text
    assert op_type_counts(run_dir(tmp_path / "profile" / "rank_0")) == expected_ops(range(2, 4))


def test_end_step_past_the_last_step_warns_at_start_and_profiles_to_the_end(tmp_path, caplog):
    callback = ProfilerCallback(config(start_step=3, end_step=10))
    ctx = TrainContext(output_dir=tmp_path, total_steps=3)
    with caplog.at_level(logging.WARNING, logger="mf_train.observe.profiling"):
        callback.on_train_begin(ctx)
        assert "steps 3..10 were asked, but training runs steps 1..3: profiling steps 3..3" \
            in caplog.text
        for step in (1, 2, 3):
            callback.on_step_begin(ctx, step)
            work(step)
            callback.on_step_end(ctx, record(step, 3))
        callback.on_train_end(ctx, None)

    assert op_type_counts(run_dir(tmp_path / "profile" / "rank_0")) == {"MatMul": 3,
                                                                        "Sigmoid": 1}


# ------------------------------------------------------------------ nothing written


@pytest.mark.parametrize("changes, rank", [
    ({"enable_profiling": False}, 0),
    ({"profiler_rank": [0]}, 1),
    ({"start_step": 4, "end_step": 5}, 0),  # past training.steps: warned below
])
def test_nothing_is_written(tmp_path, caplog, changes, rank):
    callback = ProfilerCallback(config(**changes))
    with caplog.at_level(logging.WARNING, logger="mf_train.observe.profiling"):
        train(callback, TrainContext(output_dir=tmp_path, total_steps=3, rank=rank,
                                     world_size=2))
    assert list(tmp_path.iterdir()) == []
    assert callback.directory is None
    if "start_step" in changes:
        assert "steps 4..5 were asked, but training runs steps 1..3: nothing is profiled" \
            in caplog.text


def test_training_ending_before_the_range_records_nothing_and_mstx_warns_once(tmp_path,
                                                                              caplog):
    """Stopped two steps before the range: the profiler was not even set up yet (its warm-up
    is the step before the range)."""
    callback = ProfilerCallback(config(start_step=4, end_step=4, mstx=True), device="CPU")
    ctx = TrainContext(output_dir=tmp_path, total_steps=4)
    with caplog.at_level(logging.WARNING, logger="mf_train.observe.profiling"):
        train(callback, ctx, stop_after=1)
    assert caplog.text.count("profiler.mstx: mstx markers exist on Ascend only; ignored on "
                             "the CPU backend") == 1
    assert "training ended after step 1, before the profiled steps 4..4" in caplog.text
    assert list(tmp_path.iterdir()) == []


def test_rank_outside_the_job_is_warned_on_rank_0(tmp_path, caplog):
    callback = ProfilerCallback(config(start_step=9, end_step=9, profiler_rank=[0, 3]))
    with caplog.at_level(logging.WARNING, logger="mf_train.observe.profiling"):
        callback.on_train_begin(TrainContext(output_dir=tmp_path, total_steps=2,
                                             world_size=2))
    assert "profiler.profiler_rank: ranks [3] are not in this job of 2 ranks" in caplog.text


# ------------------------------------------------------------------ options and errors


@pytest.mark.parametrize("level, expected, metrics", [
    (0, ProfilerLevel.Level0, AicoreMetrics.AiCoreNone),
    (1, ProfilerLevel.Level1, AicoreMetrics.PipeUtilization),
    (2, ProfilerLevel.Level2, AicoreMetrics.PipeUtilization),
])
def test_level_mapping(level, expected, metrics):
    assert profiler_level(level) is expected
    options = profile_options(config(profiler_level=level), "CPU")
    assert options["experimental_config"].profiler_level is expected
    assert options["experimental_config"].aic_metrics is metrics


@pytest.mark.parametrize("device, changes, activities, with_stack, mstx", [
    ("CPU", {}, [ProfilerActivity.CPU], True, False),
    ("CPU", {"mstx": True}, [ProfilerActivity.CPU], True, False),
    ("Ascend", {"mstx": True}, [ProfilerActivity.CPU, ProfilerActivity.NPU], True, True),
    ("Ascend", {"profile_cpu": False}, [ProfilerActivity.NPU], False, False),
    ("GPU", {"with_stack": False}, [ProfilerActivity.CPU, ProfilerActivity.GPU], False, False),
])
def test_activities_stack_and_mstx_by_backend(device, changes, activities, with_stack, mstx):
    options = profile_options(config(**changes), device)
    assert options["activities"] == activities
    assert options["with_stack"] is with_stack
    assert options["experimental_config"].mstx is mstx


@pytest.mark.parametrize("changes, where, words", [
    ({"start_step": 3, "end_step": 2}, "profiler.end_step", "must be >= start_step (3), got 2"),
    ({"start_step": 0}, "profiler.start_step", "must be >= 1, got 0"),
    ({"profiler_level": 3}, "profiler.profiler_level", "must be 0, 1 or 2, got 3"),
    ({"profiler_rank": [0, -1]}, "profiler.profiler_rank[1]", "must be a rank >= 0, got -1"),
    ({"profile_cpu": False}, "profiler.profile_cpu", "nothing would be recorded"),
    ({"output_path": "out/a+b"}, "profiler.output_path", "refuses: +"),
])
def test_invalid_settings_are_config_errors(changes, where, words):
    with pytest.raises(ConfigError) as caught:
        ProfilerCallback(config(**changes), device="CPU")
    (issue,) = caught.value.errors
    assert issue.path == where and words in issue.message
    ProfilerCallback(attrs.evolve(config(**changes), enable_profiling=False), device="CPU")


def test_output_path_that_is_a_file_and_bad_default_directory(tmp_path):
    (tmp_path / "taken").write_text("")
    with pytest.raises(ConfigError, match="is a file"):
        ProfilerCallback(config(output_path=str(tmp_path / "taken")))
    callback = ProfilerCallback(config())
    with pytest.raises(ConfigError) as caught:
        callback.on_train_begin(TrainContext(output_dir=tmp_path / "run@1", total_steps=2))
    (issue,) = caught.value.errors
    assert issue.path == "profiler.output_path"
    assert "the default directory" in issue.message and "refuses: @" in issue.message
    assert list(tmp_path.iterdir()) == [tmp_path / "taken"]


def test_profiler_callbacks_for_the_run_list():
    assert profiler_callbacks(ProfilerConfig()) == []
    (callback,) = profiler_callbacks(config(start_step=2, end_step=2))
    assert isinstance(callback, ProfilerCallback) and callback.config.start_step == 2
