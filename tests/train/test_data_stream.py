"""The trainer's data stream: the loss mask the data settings ask for, whatever `column_names`
says, and a new order on every pass over shuffled data (seed + pass), also after a resume."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("mindspore")

from mf_config.validate import config_from_source, load_source
from mf_data import build_datasets
from mf_train.job import make_job_plan
from mf_train.micro_batches import build_stream

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "qwen3_tiny.yaml"
EOD = 256


def stream_of(prefix: str, *sets: str, consumed: int = 0):
    source = load_source(EXAMPLE, [f"train_dataset.dataloader.config.data_path=['1','{prefix}']",
                                   "train_dataset.dataloader.config.seq_length=32",
                                   "model.max_position_embeddings=32", *sets])
    config = config_from_source(source)
    plan = make_job_plan(config, 1, source)
    stream = build_stream(config.train_dataset, plan, 0, consumed_samples=consumed,
                          seed=config.training.seed, source=source)
    return config, stream


@pytest.mark.parametrize("columns", [["input_ids", "labels"],
                                     ["input_ids", "labels", "loss_mask"]])
def test_the_loss_mask_follows_eod_mask_loss_whatever_the_columns(data_prefix, columns) -> None:
    """Megatron's eod_mask_loss: no loss where the input token is the end of a document."""
    _, stream = stream_of(data_prefix, "train_dataset.dataloader.config.eod_mask_loss=true",
                          f"train_dataset.dataloader.column_names={json.dumps(columns)}")
    batches = [next(stream) for _ in range(6)]
    tokens = np.concatenate([batch.tokens for batch in batches])
    masks = np.concatenate([batch.loss_mask for batch in batches])
    assert (tokens == EOD).any()
    np.testing.assert_array_equal(masks, (tokens != EOD).astype(masks.dtype))
    _, plain = stream_of(data_prefix, "train_dataset.dataloader.column_names=['input_ids']")
    assert all(next(plain).loss_mask.all() for _ in range(6))  # without it, every token counts


def test_every_pass_over_shuffled_data_has_its_own_order(data_prefix) -> None:
    sets = ("train_dataset.dataloader.shuffle=true", "train_dataset.dataloader.sizes=[16,0,0]")
    config, stream = stream_of(data_prefix, *sets)
    train, _, _ = build_datasets(config.train_dataset.dataloader)
    assert len(train) == 16 and stream.step_samples == 2  # 8 micro-batches of 2 a pass
    seen = [next(stream).tokens for _ in range(16)]
    for epoch, batches in enumerate((seen[:8], seen[8:])):
        order = np.random.default_rng(config.training.seed + epoch).permutation(16)
        expected = [train[int(index)]["tokens"] for index in order]
        np.testing.assert_array_equal(np.concatenate(batches), np.stack(expected))
    assert not np.array_equal(np.concatenate(seen[:8]), np.concatenate(seen[8:]))
    _, resumed = stream_of(data_prefix, *sets, consumed=20)  # pass 2, third micro-batch
    np.testing.assert_array_equal(next(resumed).tokens, seen[10])
