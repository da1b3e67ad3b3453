"""The trainer's data stream: the loss mask the data settings ask for, whatever `column_names`
says, and a new order on every pass over shuffled data (seed + pass), also after a resume."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("mindspore")

from mf_config.components import model_shape
from mf_config.validate import config_from_source, load_source
from mf_data import build_datasets
from mf_data.errors import DataError
from mf_train.preflight.job import make_job_plan
from mf_train.step.micro_batches import build_stream

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
                          seed=config.training.seed, source=source,
                          vocab_size=model_shape(config.model).vocab_size)
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


def test_the_last_pass_of_a_weighted_blend_is_kept_whole(data_prefix) -> None:
    """`drop_remainder: false` with a weighted `data_path`: the last micro-batch of a pass is
    padded (no loss on the padding) instead of failing in the blend."""
    blend = f"['0.7','{data_prefix}','0.3','{data_prefix}']"
    _, stream = stream_of(data_prefix, "train_dataset.drop_remainder=false",
                          f"train_dataset.dataloader.config.data_path={blend}",
                          "train_dataset.dataloader.sizes=[12,0,0]")  # ceil(8.4) + ceil(3.6)
    assert stream.step_samples == 2 and stream.samples_per_pass == 14  # 13 samples + 1 padding
    batches = [next(stream) for _ in range(8)]  # one pass, and the next one's first batch
    assert [bool(mask.any()) for mask in batches[6].loss_mask] == [True, False]
    assert all(batch.loss_mask.any(axis=1).all() for batch in batches[:6] + batches[7:])


def test_a_token_outside_the_vocabulary_names_the_file(data_prefix) -> None:
    """The byte-level corpus (ids up to 256, the EOD) for a model of 200 ids: the stream
    stops at the sample with one line naming the .bin, instead of MindSpore's gather failing
    inside the step."""
    _, stream = stream_of(data_prefix, "model.vocab_size=200")
    with pytest.raises(DataError) as caught:
        for _ in range(20):
            next(stream)
    message = str(caught.value)
    assert message.startswith(f"{data_prefix}.bin: token id ")
    assert "is outside the model's vocabulary: model.vocab_size is 200 (ids 0 to 199)" in message
    _, stream = stream_of(data_prefix)  # 512 ids: every byte and the EOD fit
    assert next(stream).tokens.max() < 512


def test_mf_train_says_it_in_one_line(data_prefix, tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "mf_train.launch.cli", "--config", str(EXAMPLE), "--output-dir",
         str(tmp_path / "out"), "--set", "model.vocab_size=200", "--set",
         f"train_dataset.dataloader.config.data_path=['1','{data_prefix}']"],
        capture_output=True, text=True, timeout=300)
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith(f"mf-train: {data_prefix}.bin: token id ")
    assert last.endswith("model.vocab_size is 200 (ids 0 to 199); make the data with the "
                         "model's tokenizer, or give the model a vocabulary of at least 257")
