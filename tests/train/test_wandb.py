"""The `wandb` callback (`pip install 'mf-train[wandb]'`): a short run in offline mode writes a
W&B run directory whose history holds each step's loss, equal to metrics.jsonl's; only rank 0
logs; a missing wandb package is one clear error before anything starts."""

from __future__ import annotations

import json
import struct
import sys
from pathlib import Path

import pytest

pytest.importorskip("mindspore")

from runs import QWEN3, QWEN3_4_LAYERS, steps
from runs import arguments as train_arguments

from mf_train.launch.cli import run
from mf_train.observe.callbacks import StepRecord, TrainContext

SETS = (*QWEN3_4_LAYERS, "training.steps=3", "checkpoint.enable_save=false")


def arguments(prefix: str, output: Path, callback: str) -> list[str]:
    return train_arguments(QWEN3, output, prefix, [*SETS, f"callbacks=[{callback}]"])


@pytest.fixture
def offline_wandb(tmp_path, monkeypatch):
    """wandb offline, its settings and caches in tmp_path (WANDB_DIR too: the callback must
    put the run under the run's output directory instead); its service process is ended.
    A test ends the service itself (`wandb.teardown()`) before reading a run's .wandb file:
    `run.finish()` may return before the service has written the last records."""
    wandb = pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    for name in ("DIR", "CONFIG_DIR", "CACHE_DIR", "DATA_DIR", "ARTIFACT_DIR"):
        monkeypatch.setenv(f"WANDB_{name}", str(tmp_path / "wandb-home" / name.lower()))
    yield wandb
    wandb.teardown()


def run_records(output: Path) -> list:
    """Every record of the one offline run under `output`, from its .wandb file: a LevelDB-style
    log (a 7-byte header `:W&B`, magic 0xBEE1, version 0; 32 KiB blocks of chunks, each with a
    7-byte header: CRC, length, type 1 full / 2 first / 3 middle / 4 last) of wandb's own
    `Record` protobufs."""
    from wandb.proto import wandb_internal_pb2

    [path] = list((output / "wandb").glob("offline-run-*/run-*.wandb"))
    data = path.read_bytes()
    assert struct.unpack("<4sHB", data[:7]) == (b":W&B", 0xBEE1, 0)
    records, pending, pos = [], b"", 7
    while pos + 7 <= len(data):
        room = 32768 - pos % 32768
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7]) if room >= 7 else (0, 0, 0)
        if kind == 0:  # the end of a block, padded
            pos += room
            continue
        pending += data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):
            records.append(wandb_internal_pb2.Record.FromString(pending))
            pending = b""
    return records


def history(output: Path) -> dict[int, dict[str, float]]:
    rows = {}
    for record in run_records(output):
        if record.WhichOneof("record_type") == "history":
            row = {item.key or ".".join(item.nested_key): json.loads(item.value_json)
                   for item in record.history.item}
            rows[record.history.step.num] = {k: v for k, v in row.items()
                                            if not k.startswith("_")}
    return rows


def test_a_short_run_logs_each_step_to_an_offline_wandb_run(data_prefix, tmp_path,
                                                            offline_wandb) -> None:
    callback = "{type: wandb, project: mf-test, name: tiny, group: g1, tags: [a, b]}"
    assert run(arguments(data_prefix, tmp_path / "out", callback)) == 0
    offline_wandb.teardown()
    logged = steps(tmp_path / "out")
    rows = history(tmp_path / "out")
    assert sorted(rows) == [1, 2, 3]
    for line in logged:
        row = rows[line["step"]]
        assert {key: row[key] for key in ("loss", "lr", "grad_norm", "consumed_samples")} == \
            {key: line[key] for key in ("loss", "lr", "grad_norm", "consumed_samples")}
        assert row["tokens_per_s"] > 0 and row["step_time"] > 0
    [started] = [r.run for r in run_records(tmp_path / "out") if r.WhichOneof("record_type")
                 == "run"]
    assert (started.project, started.display_name, started.run_group, list(started.tags)) == \
        ("mf-test", "tiny", "g1", ["a", "b"])
    assert not (tmp_path / "wandb-home" / "dir" / "wandb").exists()


def context(tmp_path: Path, rank: int) -> TrainContext:
    return TrainContext(output_dir=tmp_path / "out", total_steps=4, rank=rank, world_size=2)


def record(step: int) -> StepRecord:
    return StepRecord(step=step, total_steps=4, loss=5.0 - step, lr=1e-3, grad_norm=0.5,
                      step_time=0.1, tokens=64, consumed_samples=2 * step,
                      extra={"local_loss/micro1": 1.5})


def test_only_rank_0_logs_every_log_interval_steps_into_dir(tmp_path, offline_wandb) -> None:
    from mf_train.monitor.wandb import WandbWriter
    from mf_train.settings.wandb import WandbSettings

    settings = WandbSettings(mode="offline", log_interval=2, dir=str(tmp_path / "chosen"))
    for rank in (1, 0):
        writer = WandbWriter(settings)
        writer.on_train_begin(context(tmp_path, rank))
        for step in range(1, 5):
            writer.on_step_end(context(tmp_path, rank), record(step))
        writer.on_train_end(context(tmp_path, rank), record(4))
        if rank == 1:
            assert writer.run is None and not (tmp_path / "chosen").exists()
    offline_wandb.teardown()
    assert history(tmp_path / "chosen") == {
        step: {"loss": 5.0 - step, "lr": 1e-3, "grad_norm": 0.5, "tokens_per_s": 640.0,
               "step_time": 0.1, "local_loss/micro1": 1.5, "consumed_samples": 2 * step}
        for step in (2, 4)}
    assert not (tmp_path / "out").exists()


def test_a_missing_wandb_package_is_one_error_before_anything_starts(data_prefix, tmp_path,
                                                                     monkeypatch,
                                                                     capsys) -> None:
    """`sys.modules["wandb"] = None` is Python's own mark of a module that cannot be imported:
    to this process, wandb is not installed."""
    monkeypatch.setitem(sys.modules, "wandb", None)
    assert run(arguments(data_prefix, tmp_path / "out", "{type: wandb}")) == 2
    assert capsys.readouterr().err == (
        f"mf-train: 1 problem in the configuration:\n  {QWEN3} (--set callbacks=[{{type: "
        "wandb}]): callbacks[0].type: the wandb callback needs the wandb package, which is not "
        "installed in this environment: pip install 'mf-train[wandb]'\n")
    assert not (tmp_path / "out").exists()


def test_an_unknown_key_is_refused_with_its_path(data_prefix, tmp_path, capsys) -> None:
    assert run(arguments(data_prefix, tmp_path / "out", "{type: wandb, projet: x}")) == 2
    assert capsys.readouterr().err.endswith(
        "callbacks[0].projet: Unknown configuration keys for callback type 'wandb': ['projet']; "
        "did you mean 'project'?\n")
    assert not (tmp_path / "out").exists()
