"""Monitors against real files: metrics.jsonl parsed back, TensorBoard event files decoded with
an independent TFRecord reader (length, masked CRC-32C, payload) and tensorboardX's `Event`
protobuf, the progress bar on a fake terminal, the train_state values against numpy, and the
MoE counts from a plain fake model.
"""

from __future__ import annotations

import io
import json
import logging
import math
import os
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from mf_config import (
    ConfigError,
    MoeMonitorConfig,
    MonitorConfig,
    TensorboardConfig,
    TrainStateConfig,
)
from mf_config.validate import check_source, load_source
from mf_train.models import build_model
from mf_train.monitor import (
    MetricsWriter,
    MoeMonitor,
    ProgressBar,
    TensorboardWriter,
    TrainStateMonitor,
    standard_callbacks,
)
from mf_train.monitor.metrics import read_steps
from mf_train.monitor.train_state import NameFilter, grad_norms
from mf_train.observe.callbacks import Callback, StepRecord, TrainContext

QWEN3_EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "qwen3_tiny.yaml"


def record(step: int, total: int = 5, **changes) -> StepRecord:
    fields = {"step": step, "total_steps": total, "loss": 5.0 - 0.5 * step, "lr": 1e-3 * step,
              "grad_norm": 0.25 * step, "step_time": 0.5, "tokens": 64 * step,
              "consumed_samples": 4 * step}
    return StepRecord(**(fields | changes))


def context(tmp_path: Path, **changes) -> TrainContext:
    return TrainContext(**({"output_dir": tmp_path, "total_steps": 5} | changes))


def run(callback: Callback, ctx: TrainContext, records: list[StepRecord]) -> None:
    callback.on_train_begin(ctx)
    for rec in records:
        callback.on_step_begin(ctx, rec.step)
        callback.on_step_end(ctx, rec)
    callback.on_train_end(ctx, records[-1] if records else None)


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


# ----------------------------------------------------------------------- metrics.jsonl


def test_metrics_lines_hold_the_values(tmp_path: Path) -> None:
    writer = MetricsWriter()
    ctx = context(tmp_path, world_size=2)
    writer.on_train_begin(ctx)
    writer.on_step_end(ctx, record(1, extra={"local_loss/micro1": 4.75}))
    writer.on_step_end(ctx, record(2, loss=float("nan"), grad_norm=float("inf"), skipped=True))
    writer.on_save(ctx, 2, tmp_path / "ckpt" / "iteration_00000002")
    writer.on_train_end(ctx, None)
    start, one, two, save = read_jsonl(tmp_path / "metrics.jsonl")
    assert {k: start[k] for k in ("event", "step", "total_steps", "world_size")} == {
        "event": "start", "step": 0, "total_steps": 5, "world_size": 2}
    assert {k: one[k] for k in ("step", "total_steps", "loss", "lr", "grad_norm", "step_time",
                                "tokens", "tokens_per_s", "consumed_samples", "skipped",
                                "local_loss/micro1")} == {
        "step": 1, "total_steps": 5, "loss": 4.5, "lr": 1e-3, "grad_norm": 0.25,
        "step_time": 0.5, "tokens": 64, "tokens_per_s": 128.0, "consumed_samples": 4,
        "skipped": False, "local_loss/micro1": 4.75}
    assert "event" not in one and one["time"] > 1.6e9
    assert (two["loss"], two["grad_norm"], two["skipped"]) == (None, None, True)
    assert save["event"] == "save" and save["step"] == 2
    assert save["path"] == str(tmp_path / "ckpt" / "iteration_00000002")


def test_metrics_lines_are_on_disk_before_the_file_is_closed(tmp_path: Path) -> None:
    writer = MetricsWriter()
    ctx = context(tmp_path)
    writer.on_train_begin(ctx)
    writer.on_step_end(ctx, record(1))
    assert [line.get("step") for line in read_jsonl(tmp_path / "metrics.jsonl")] == [0, 1]
    writer.on_train_end(ctx, None)


def test_a_resumed_run_appends_after_a_resume_marker(tmp_path: Path) -> None:
    run(MetricsWriter(), context(tmp_path), [record(1), record(2), record(3)])
    run(MetricsWriter(), context(tmp_path, start_step=2), [record(3, loss=9.0), record(4)])
    lines = read_jsonl(tmp_path / "metrics.jsonl")
    assert [(line.get("event"), line["step"]) for line in lines] == [
        ("start", 0), (None, 1), (None, 2), (None, 3), ("rewind", 2), ("resume", 2), (None, 3),
        (None, 4)]
    assert lines[4]["superseded"] == [3, 3]
    records = read_steps(tmp_path / "metrics.jsonl")
    assert [(record["step"], record["loss"]) for record in records] == [
        (1, record(1).loss), (2, record(2).loss), (3, 9.0), (4, record(4).loss)]


def test_the_file_is_never_truncated(tmp_path: Path) -> None:
    """A run owns its directory (run_directory refuses another run's); the writer only
    appends, so nothing a run wrote is ever lost to the next one."""
    run(MetricsWriter(), context(tmp_path), [record(1), record(2)])
    run(MetricsWriter(), context(tmp_path), [record(1, loss=9.0)])  # afresh: none saved
    lines = read_jsonl(tmp_path / "metrics.jsonl")
    assert [(line.get("event"), line["step"]) for line in lines] == [
        ("start", 0), (None, 1), (None, 2), ("rewind", 0), ("start", 0), (None, 1)]
    assert lines[3]["superseded"] == [1, 2]
    assert [(r["step"], r["loss"]) for r in read_steps(tmp_path / "metrics.jsonl")] == [(1, 9.0)]


def test_metrics_only_on_rank_0(tmp_path: Path) -> None:
    run(MetricsWriter(), context(tmp_path, rank=1, world_size=2), [record(1)])
    assert not (tmp_path / "metrics.jsonl").exists()


def test_an_extra_may_not_shadow_a_field(tmp_path: Path) -> None:
    writer = MetricsWriter(tmp_path / "m.jsonl")
    ctx = context(tmp_path)
    writer.on_train_begin(ctx)
    with pytest.raises(ValueError, match="extra key 'loss' repeats a step field"):
        writer.on_step_end(ctx, record(1, extra={"loss": 1.0}))
    writer.on_train_end(ctx, None)


# ----------------------------------------------------------------------- TensorBoard


def crc32c(data: bytes) -> int:
    """CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), bit by bit."""
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def masked(crc: int) -> int:
    """TFRecord's masked CRC: rotate right by 15, add 0xa282ead8 (mod 2**32)."""
    return ((((crc >> 15) | (crc << 17)) & 0xFFFFFFFF) + 0xA282EAD8) & 0xFFFFFFFF


def read_events(log_dir: Path) -> list:
    """Every `Event` of every event file in `log_dir`, checking each record's CRCs."""
    from tensorboardX.proto.event_pb2 import Event

    events = []
    for path in sorted(log_dir.glob("events.out.tfevents.*")):
        data, at = path.read_bytes(), 0
        while at < len(data):
            header = data[at:at + 8]
            (length,), (header_crc,) = struct.unpack("<Q", header), struct.unpack(
                "<I", data[at + 8:at + 12])
            payload = data[at + 12:at + 12 + length]
            (payload_crc,) = struct.unpack("<I", data[at + 12 + length:at + 16 + length])
            assert (header_crc, payload_crc) == (masked(crc32c(header)), masked(crc32c(payload)))
            events.append(Event.FromString(payload))
            at += 16 + length
    return events


def scalars(log_dir: Path) -> dict[str, list[tuple[int, float]]]:
    found: dict[str, list[tuple[int, float]]] = {}
    for event in read_events(log_dir):
        for value in event.summary.value:
            found.setdefault(value.tag, []).append((event.step, value.simple_value))
    return found


def test_tensorboard_scalars_are_written_and_read_back(tmp_path: Path) -> None:
    writer = TensorboardWriter(TensorboardConfig(output_dir=str(tmp_path / "tb"),
                                                 log_interval=2))
    records = [record(step, extra={"moe/layer1/expert0": 10.0 * step}) for step in range(1, 6)]
    run(writer, context(tmp_path), records)
    found = scalars(tmp_path / "tb")
    assert set(found) == {"loss", "lr", "grad_norm", "tokens_per_s", "step_time",
                          "loss_vs_samples", "moe/layer1/expert0"}
    assert found["loss"] == [(2, 4.0), (4, 3.0)]
    assert found["lr"] == [(2, pytest.approx(2e-3)), (4, pytest.approx(4e-3))]
    assert found["grad_norm"] == [(2, 0.5), (4, 1.0)]
    assert found["tokens_per_s"] == [(2, 256.0), (4, 512.0)]
    assert found["step_time"] == [(2, 0.5), (4, 0.5)]
    assert found["loss_vs_samples"] == [(8, 4.0), (16, 3.0)]
    assert found["moe/layer1/expert0"] == [(2, 20.0), (4, 40.0)]
    assert not (tmp_path / "tensorboard").exists()


def test_tensorboard_default_directory_rank_0_and_resume(tmp_path: Path) -> None:
    run(TensorboardWriter(), context(tmp_path, rank=1, world_size=2), [record(1)])
    assert not (tmp_path / "tensorboard").exists()
    run(TensorboardWriter(), context(tmp_path), [record(1), record(2)])
    run(TensorboardWriter(), context(tmp_path, start_step=1), [record(2, loss=7.0)])
    events = read_events(tmp_path / "tensorboard")
    starts = [event.step for event in events if event.HasField("session_log")]
    assert starts == [2]  # purge_step: TensorBoard drops the first run's step 2 and later
    assert scalars(tmp_path / "tensorboard")["loss"] == [(1, 4.5), (2, 4.0), (2, 7.0)]


def test_tensorboard_flushes_every_queue_size_events_and_on_save(tmp_path: Path) -> None:
    writer = TensorboardWriter(TensorboardConfig(queue_size=1000))
    ctx = context(tmp_path)
    writer.on_train_begin(ctx)
    writer.on_step_end(ctx, record(1))
    assert "loss" not in scalars(tmp_path / "tensorboard")  # still in the file buffer
    writer.on_save(ctx, 1, tmp_path / "ckpt")
    assert scalars(tmp_path / "tensorboard")["loss"] == [(1, 4.5)]
    writer.on_train_end(ctx, None)

    writer = TensorboardWriter(TensorboardConfig(output_dir=str(tmp_path / "q"), queue_size=4))
    writer.on_train_begin(ctx)
    writer.on_step_end(ctx, record(1))  # two events: the step's and loss_vs_samples
    assert "loss" not in scalars(tmp_path / "q")
    writer.on_step_end(ctx, record(2))
    assert scalars(tmp_path / "q")["loss"] == [(1, 4.5), (2, 4.0)]
    writer.on_train_end(ctx, None)


def test_tensorboard_tags_keep_tensorboard_characters(tmp_path: Path) -> None:
    extra = {"local_norm/layers.0.w-1/micro1": 1.0, "user/a b:c": 2.0}
    run(TensorboardWriter(), context(tmp_path), [record(1, extra=extra)])
    found = scalars(tmp_path / "tensorboard")
    assert found["local_norm/layers.0.w-1/micro1"] == [(1, 1.0)]
    assert found["user/a_b_c"] == [(1, 2.0)]


# ----------------------------------------------------------------------- progress bar


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_bar_on_a_terminal(tmp_path: Path) -> None:
    stream = Terminal()
    bar = ProgressBar(stream)
    ctx = context(tmp_path, total_steps=4, start_step=1)
    bar.on_train_begin(ctx)
    assert bar.shown
    for step in (2, 3):
        bar.on_step_begin(ctx, step)
        bar.on_step_end(ctx, record(step, total=4))
    bar.on_train_end(ctx, None)
    text = stream.getvalue()
    assert "3/4" in text and "loss=3.5000" in text and "lr=3.00e-03" in text
    assert not bar.shown


def test_no_progress_bar_without_a_terminal_or_off_rank_0(tmp_path: Path) -> None:
    for stream, rank in ((io.StringIO(), 0), (Terminal(), 1)):
        bar = ProgressBar(stream)
        run(bar, context(tmp_path, rank=rank, world_size=2), [record(1)])
        assert stream.getvalue() == "" and not bar.shown


# ----------------------------------------------------------------------- train_state


@pytest.mark.parametrize(("setting", "selected"), [
    (True, ["embed.weight", "layers.0.mlp.down.weight", "layers.1.attention.qkv.weight"]),
    (False, []),
    ("", []),
    ([], []),
    (["", ""], []),
    ("layers.0", ["layers.0.mlp.down.weight"]),
    (["embed", "attention"], ["embed.weight", "layers.1.attention.qkv.weight"]),
])
def test_norm_filters(setting, selected) -> None:
    names = ["embed.weight", "layers.0.mlp.down.weight", "layers.1.attention.qkv.weight"]
    assert NameFilter(setting).select(names) == selected


def test_train_state_values_reach_the_record(tmp_path: Path, caplog) -> None:
    caplog.set_level(logging.INFO, logger="mf_train.monitor.train_state")
    monitor = TrainStateMonitor(TrainStateConfig(local_loss=True, device_loss=True,
                                                 local_norm="mlp", device_norm=True))
    rng = np.random.default_rng(0)
    names = ["embed.weight", "layers.0.mlp.down.weight"]
    micro = [[rng.normal(size=(4, 3)).astype(np.float32), rng.normal(size=5)] for _ in range(2)]
    ctx = context(tmp_path, rank=1, world_size=2)
    monitor.on_step_begin(ctx, 1)
    for k, grads in enumerate(micro, start=1):
        monitor.record_local_loss(k, np.float32(2.0 + k))
        monitor.record_local_norms(k, names, grads)
    total = [micro[0][i] + micro[1][i] for i in range(2)]
    monitor.record_device_loss(2.5)
    monitor.record_device_norms(names, total)
    rec = record(1)
    monitor.on_step_end(ctx, rec)

    def norm(a):
        return math.sqrt(sum(float(x) ** 2 for x in np.ravel(a)))

    assert rec.extra.keys() == {"local_loss/micro1", "local_loss/micro2",
                                "local_norm/layers.0.mlp.down.weight/micro1",
                                "local_norm/layers.0.mlp.down.weight/micro2", "device_loss",
                                "device_norm/embed.weight", "device_norm/layers.0.mlp.down.weight"}
    assert rec.extra["local_loss/micro2"] == 4.0 and rec.extra["device_loss"] == 2.5
    assert rec.extra["local_norm/layers.0.mlp.down.weight/micro2"] == pytest.approx(
        norm(micro[1][1]), rel=1e-12)
    assert rec.extra["device_norm/embed.weight"] == pytest.approx(norm(total[0]), rel=1e-6)
    [message] = caplog.messages
    assert message.startswith("train_state step 1 rank 1: {")
    assert json.loads(message.split(": ", 1)[1])["device_loss"] == 2.5

    monitor.on_step_begin(ctx, 2)
    rec = record(2)
    monitor.on_step_end(ctx, rec)
    assert rec.extra == {}


def test_train_state_off_touches_nothing(tmp_path: Path) -> None:
    monitor = TrainStateMonitor()
    assert not monitor.active
    monitor.on_step_begin(context(tmp_path), 1)
    monitor.record_local_loss(1, object())  # would fail float() if it were read
    monitor.record_local_norms(1, ["w"], [object()])  # would fail a norm if it were computed
    monitor.record_device_loss(object())
    monitor.record_device_norms(["w"], [object()])
    rec = record(1)
    monitor.on_step_end(context(tmp_path), rec)
    assert rec.extra == {}


def test_train_state_argument_errors() -> None:
    monitor = TrainStateMonitor(TrainStateConfig(local_loss=True, local_norm=True))
    with pytest.raises(ValueError, match="micro_step counts micro-batches from 1, got 0"):
        monitor.record_local_loss(0, 1.0)
    with pytest.raises(ValueError, match="2 parameter names but 1 gradients"):
        monitor.record_local_norms(1, ["a", "b"], [np.ones(2)])


def test_grad_norms_of_mindspore_tensors_and_missing_grads() -> None:
    import mindspore as ms

    values = np.arange(-6, 6, dtype=np.float32).reshape(3, 4) / 4
    found = {name: float(norm) for name, norm in grad_norms(
        ["a", "b", "c"], [ms.Tensor(values), None, ms.Tensor(values[0])]).items()}
    assert found == {"a": pytest.approx(math.sqrt(float(np.sum(values.astype(np.float64) ** 2))),
                                        rel=1e-6),
                     "c": pytest.approx(math.sqrt(1.5 ** 2 + 1.25 ** 2 + 1 ** 2 + 0.75 ** 2),
                                        rel=1e-6)}


# ----------------------------------------------------------------------- MoE


class FakeMoeModel:
    """Two MoE layers (global ids 1 and 3), four experts; every forward routes new counts."""

    def __init__(self):
        self.forwards = 0

    def forward(self):
        self.forwards += 1

    def tokens_per_expert(self) -> dict[int, np.ndarray]:
        f = self.forwards
        return {1: np.array([f, 2 * f, 0, 1]), 3: np.array([4, 4, 4, 4 * f])}


def moe_run(monitor: MoeMonitor, ctx: TrainContext, steps: int, micro: int
            ) -> list[StepRecord]:
    records = []
    monitor.on_train_begin(ctx)
    for step in range(1, steps + 1):
        monitor.on_step_begin(ctx, step)
        for _ in range(micro):
            ctx.model.forward()
            monitor.record_forward()
        rec = record(step, total=steps)
        monitor.on_step_end(ctx, rec)
        records.append(rec)
    return records


def test_moe_counts_every_interval_for_target_layers(tmp_path: Path, caplog) -> None:
    caplog.set_level(logging.INFO, logger="mf_train.monitor.moe")
    ctx = context(tmp_path, model=FakeMoeModel())
    monitor = MoeMonitor(MoeMonitorConfig(save_tokens_per_expert_interval=2, target_layers=[1]))
    records = moe_run(monitor, ctx, steps=4, micro=1)
    assert [rec.extra for rec in records[::2]] == [{}, {}]
    # step 2 is the 2nd forward: counts [2, 4, 0, 1]; step 4: [4, 8, 0, 1]; mean 7/4 and 13/4
    assert records[1].extra == {"moe/layer1/expert0": 2.0, "moe/layer1/expert1": 4.0,
                                "moe/layer1/expert2": 0.0, "moe/layer1/expert3": 1.0,
                                "moe/layer1/max_over_mean": pytest.approx(4 / (7 / 4))}
    assert records[3].extra["moe/layer1/expert1"] == 8.0
    assert records[3].extra["moe/layer1/max_over_mean"] == pytest.approx(8 / (13 / 4))
    own = (tmp_path / "moe_tokens" / "rank_0.jsonl").read_text().splitlines()
    assert [json.loads(line) for line in own] == [
        {"step": 2, "layer": 1, "rank": 0, "tpe": [2, 4, 0, 1]},
        {"step": 4, "layer": 1, "rank": 0, "tpe": [4, 8, 0, 1]}]
    assert not any('"tpe"' in message for message in caplog.messages)  # off the console


def test_moe_sums_micro_batches_and_int_target_layers(tmp_path: Path, caplog) -> None:
    ctx = context(tmp_path, model=FakeMoeModel())
    monitor = MoeMonitor(MoeMonitorConfig(save_tokens_per_expert_interval=1, target_layers=2))
    [rec] = moe_run(monitor, ctx, steps=1, micro=3)
    # forwards 1, 2, 3 of layer 1: [1+2+3, 2+4+6, 0, 3]; layer 3 is outside range(2)
    assert {k: v for k, v in rec.extra.items() if "expert" in k} == {
        "moe/layer1/expert0": 6.0, "moe/layer1/expert1": 12.0, "moe/layer1/expert2": 0.0,
        "moe/layer1/expert3": 3.0}
    assert "target_layers: layers [0] are not MoE layers of this model" in caplog.text


def test_moe_without_record_forward_reads_the_last_forward(tmp_path: Path) -> None:
    ctx = context(tmp_path, model=FakeMoeModel())
    monitor = MoeMonitor(MoeMonitorConfig(save_tokens_per_expert_interval=1))
    monitor.on_step_begin(ctx, 1)
    ctx.model.forward()
    ctx.model.forward()
    rec = record(1)
    monitor.on_step_end(ctx, rec)
    assert rec.extra["moe/layer3/expert3"] == 8.0 and rec.extra["moe/layer1/expert1"] == 4.0


def test_moe_off_by_default_and_without_moe_layers(tmp_path: Path, caplog) -> None:
    assert not MoeMonitor().active
    monitor = MoeMonitor(MoeMonitorConfig(save_tokens_per_expert_interval=1))
    records = moe_run(monitor, context(tmp_path, model=FakeMoeModel()), steps=0, micro=0)
    assert records == [] and monitor.active
    monitor.on_train_begin(context(tmp_path, model=object()))
    assert not monitor.active
    assert "has no MoE layers (no tokens_per_expert()); MoE monitoring is off" in caplog.text


def test_a_dense_model_with_the_moe_monitor_is_said_once(tmp_path: Path, caplog) -> None:
    """Qwen3 has no MoE layers: validation says so (its line); the monitor, built for the
    model from those settings, turns off without saying it again in other words."""
    sets = ["monitor.moe_monitor.save_tokens_per_expert_interval=1"]
    config, issues = check_source(load_source(QWEN3_EXAMPLE, sets))
    assert [issue.path for issue in issues if issue.severity == "warning"] == [
        "monitor.moe_monitor.save_tokens_per_expert_interval"]
    monitor = MoeMonitor(config.monitor.moe_monitor)
    with caplog.at_level(logging.WARNING):
        monitor.on_train_begin(context(tmp_path, model=build_model(config.model)))
    assert not monitor.active
    assert caplog.records == []


def test_moe_target_layer_errors() -> None:
    with pytest.raises(ConfigError, match=r"monitor.moe_monitor.target_layers: an int selects "
                                          r"layers 0..N-1 and must be > 0, got 0"):
        MoeMonitor(MoeMonitorConfig(save_tokens_per_expert_interval=1, target_layers=0))
    with pytest.raises(ConfigError, match=r"layer ids must be >= 0, got \[-1\]"):
        MoeMonitor(MoeMonitorConfig(save_tokens_per_expert_interval=1, target_layers=[2, -1]))


# ----------------------------------------------------------------------- the run's list


class AddsExtra(Callback):
    """A user callback: sees the collectors' values, adds its own."""

    def __init__(self):
        self.seen: list[set[str]] = []

    def on_step_end(self, ctx, record):
        self.seen.append(set(record.extra))
        record.extra["user/twice_loss"] = 2 * record.loss


def test_standard_callbacks_order_and_a_whole_run(tmp_path: Path, caplog) -> None:
    caplog.set_level(logging.INFO)
    monitor = MonitorConfig(train_state=TrainStateConfig(local_loss=True),
                            moe_monitor=MoeMonitorConfig(save_tokens_per_expert_interval=2))
    user = AddsExtra()
    callbacks = standard_callbacks(monitor, [user])
    assert [type(cb).__name__ for cb in callbacks] == [
        "TrainStateMonitor", "MoeMonitor", "EmbeddingHealthMonitor", "SpikeMonitor",
        "AddsExtra", "LossLogger", "MetricsWriter", "TensorboardWriter", "ProgressBar"]
    train_state, moe = callbacks.find(TrainStateMonitor), callbacks.find(MoeMonitor)
    ctx = context(tmp_path, total_steps=2, model=FakeMoeModel())
    callbacks.on_train_begin(ctx)
    last = None
    for step in (1, 2):
        callbacks.on_step_begin(ctx, step)
        ctx.model.forward()
        moe.record_forward()
        train_state.record_local_loss(1, 3.0 + step)
        last = record(step, total=2)
        callbacks.on_step_end(ctx, last)
    callbacks.on_train_end(ctx, last)

    assert user.seen[0] == {"local_loss/micro1"}
    assert "moe/layer3/expert3" in user.seen[1]
    lines = [line for line in read_jsonl(tmp_path / "metrics.jsonl") if "event" not in line]
    assert [line["local_loss/micro1"] for line in lines] == [4.0, 5.0]
    assert [line["user/twice_loss"] for line in lines] == [9.0, 8.0]
    assert lines[1]["moe/layer3/expert3"] == 8.0 and "moe/layer3/expert3" not in lines[0]
    assert scalars(tmp_path / "tensorboard")["user/twice_loss"] == [(1, 9.0), (2, 8.0)]
    assert "step [2/2] loss 4.000000 lr 2.0e-03" in caplog.text


def test_tensorboard_writes_without_importing_pytorch(tmp_path: Path) -> None:
    """tensorboardX's package imports PyTorch when it is installed (seconds and ~190 MiB on
    rank 0); the writer does not need it. In a fresh process where `import torch` would
    succeed: a stand-in `torch` package first on the path records every import of it."""
    stand_in = tmp_path / "path" / "torch"
    stand_in.mkdir(parents=True)
    imports = tmp_path / "torch_imports.txt"
    (stand_in / "__init__.py").write_text(
        f"with open({str(imports)!r}, 'a') as f:\n    f.write('imported\\n')\n"
        "Tensor = object\n")
    script = (
        "import sys\n"
        "from pathlib import Path\n"
        "from mf_train.observe.callbacks import TrainContext\n"
        "from mf_train.monitor import TensorboardWriter\n"
        f"ctx = TrainContext(output_dir=Path({str(tmp_path)!r}), total_steps=1)\n"
        "writer = TensorboardWriter()\n"
        "writer.on_train_begin(ctx)\n"
        "writer.on_train_end(ctx, None)\n"
        "print('torch' in sys.modules, 'tensorboardX' in sys.modules)\n"
        "import torch\n"  # the hidden import left nothing behind: torch imports again
        "print(torch.Tensor is object)\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(tmp_path / "path"), os.environ.get("PYTHONPATH", "")]))
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                            timeout=120, check=True, env=env)
    assert result.stdout.split() == ["False", "True", "True"]
    assert imports.read_text().splitlines() == ["imported"]  # only the script's own import
    assert [event.file_version for event in read_events(tmp_path / "tensorboard")] == [
        "brain.Event:2"]


# ----------------------------------------------------------------------- spikes


def test_a_spike_beyond_the_factor_of_the_running_average_is_an_event(tmp_path: Path,
                                                                      caplog) -> None:
    """Losses 4.0 then a 13.0 (over 3 x 4.0): an event after its step line, naming the
    value and the average; a skipped step and the spike itself stay out of the average."""
    from mf_train.monitor.spikes import WARMUP, SpikeMonitor

    ctx = context(tmp_path, total_steps=12)
    spikes, writer = SpikeMonitor(3.0), MetricsWriter()
    losses = [4.0] * WARMUP + [1e9, 13.0, 11.0, 12.5]  # 11.0 <= 3 x 4: not a spike
    records = [record(step, 12, loss=loss, grad_norm=1.0, skipped=loss == 1e9)
               for step, loss in enumerate(losses, 1)]
    writer.on_train_begin(ctx)
    for rec in records:
        spikes.on_step_end(ctx, rec)
        writer.on_step_end(ctx, rec)
    writer.on_train_end(ctx, None)
    events = [line for line in read_jsonl(tmp_path / "metrics.jsonl")
              if line.get("event") == "spike"]
    assert [{key: event[key] for key in ("step", "metric", "value", "average", "factor")}
            for event in events] == [
        {"step": WARMUP + 2, "metric": "loss", "value": 13.0, "average": 4.0, "factor": 3.0}]
    # 11.0 joined the average (4 x 5 + 11) / 6 = 5.17: 12.5 is below 3 x that
    assert "step 7: loss 13 is 3.25 times its running average 4" in caplog.text
    assert [line.get("event") for line in read_jsonl(tmp_path / "metrics.jsonl")][7:10] == [
        None, "spike", None]
    quiet = SpikeMonitor(0.0)
    quiet.on_step_end(ctx, rec := record(1, 12, loss=1e9))
    assert rec.events == []
