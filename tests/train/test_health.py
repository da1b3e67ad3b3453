"""`monitor.health_checkpoint.embedding_local_norm_threshold`: the embedding's local gradient
norm each step, a warning above the threshold; and `checkpoint.load_worker_number`: files are
read that many at a time."""

from __future__ import annotations

import logging
import threading
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("mindspore")

from mf_config import HealthCheckpointConfig
from mf_train.checkpoint import load_hf_weights
from mf_train.checkpoint.reading import read_files
from mf_train.monitor.health import EmbeddingHealthMonitor
from mf_train.observe.callbacks import StepRecord, TrainContext


def step(monitor: EmbeddingHealthMonitor, tmp_path: Path, grads: dict[str, np.ndarray]
         ) -> StepRecord:
    ctx = TrainContext(output_dir=tmp_path, total_steps=5)
    record = StepRecord(step=3, total_steps=5, loss=1.0, lr=1e-3, grad_norm=1.0,
                        step_time=1.0, tokens=8, consumed_samples=8)
    monitor.on_step_begin(ctx, 3)
    monitor.record(list(grads), list(grads.values()))
    monitor.on_step_end(ctx, record)
    return record


def test_the_embedding_norm_is_recorded_and_warned_about(tmp_path: Path, caplog) -> None:
    caplog.set_level(logging.WARNING)
    grads = {"embedding.weight": np.full((2, 2), 1.5), "decoder_layers.0.mlp.down.weight":
             np.full((4,), 100.0), "head.weight": np.ones(3)}
    quiet = step(EmbeddingHealthMonitor(HealthCheckpointConfig()), tmp_path, grads)
    assert quiet.extra == {"embedding_local_norm": 3.0}  # sqrt(4 x 1.5^2); the rest not
    assert caplog.records == []
    loud = step(EmbeddingHealthMonitor(
        HealthCheckpointConfig(embedding_local_norm_threshold=2.5)), tmp_path, grads)
    assert loud.extra["embedding_local_norm"] == 3.0
    assert [r.getMessage() for r in caplog.records] == [
        "step 3 rank 0: the embedding's local gradient norm 3 exceeds "
        "monitor.health_checkpoint.embedding_local_norm_threshold (2.5)"]


def test_files_are_read_workers_at_a_time() -> None:
    """Two reads that each wait for the other finish only when they run at once."""
    meeting = threading.Barrier(2, timeout=10)

    def read(path: Path) -> str:
        meeting.wait()
        return path.name

    paths = [Path("a"), Path("b")]
    assert read_files(read, paths, workers=2) == ["a", "b"]
    alone = threading.Barrier(2, timeout=0.5)
    with pytest.raises(threading.BrokenBarrierError):
        read_files(lambda path: alone.wait(), paths, workers=1)


def test_a_sharded_hugging_face_checkpoint_reads_the_same_with_more_workers(
        tmp_path: Path) -> None:
    from safetensors.numpy import save_file

    rng = np.random.default_rng(0)
    for shard in range(3):
        save_file({f"w{shard}": rng.standard_normal((4, 5)).astype(np.float32)},
                  str(tmp_path / f"model-0000{shard}.safetensors"))
    one, three = load_hf_weights(tmp_path, workers=1), load_hf_weights(tmp_path, workers=3)
    assert sorted(one) == ["w0", "w1", "w2"]
    for name in one:
        np.testing.assert_array_equal(one[name], three[name])
