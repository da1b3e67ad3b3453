"""build_datasets: the three splits of a train_dataset.dataloader section, and `mf-data sample`."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from mf_config.converter import converter
from mf_config.sections import DataloaderConfig, declared_fields
from mf_data.blended_dataset import BlendedDataset
from mf_data.builder import SAMPLE_SETTINGS, build_datasets, gpt_config
from mf_data.errors import DataError
from mf_data.gpt_dataset import GPTDataset, GPTDatasetConfig
from mf_data.indexed import IndexedDataset, write_indexed
from mf_data.loader import BatchLoader
from mf_data.loader_config import MegatronDatasetSettings
from mf_data.split import split_indices

EOD = 0


@pytest.fixture(scope="module")
def corpora(tmp_path_factory) -> Path:
    """Two corpora of short documents (ids 1..200, each ending with EOD)."""
    root = tmp_path_factory.mktemp("corpora")
    rng = np.random.default_rng(3)
    for name, count in (("a", 60), ("b", 40)):
        documents = [[*rng.integers(1, 200, rng.integers(1, 30)).tolist(), EOD]
                     for _ in range(count)]
        write_indexed(root / name, documents, dtype=np.uint16)
    return root


def dataloader(config: dict, sizes=(50, 10, 5)) -> DataloaderConfig:
    return converter.structure({
        "type": "BlendedMegatronDatasetDataLoader", "sizes": list(sizes),
        "column_names": ["input_ids", "labels", "loss_mask", "position_ids"],
        "config": {"seq_length": 16, "eod": EOD, "create_attention_mask": False,
                   "path_to_cache": "", **config}}, DataloaderConfig)


def test_one_prefix_gives_a_gpt_dataset_per_split(corpora) -> None:
    train, valid, test = build_datasets(dataloader({"data_path": [str(corpora / "a")],
                                                    "split": "80, 15, 5"}))
    assert all(isinstance(d, GPTDataset) for d in (train, valid, test))
    indexed = IndexedDataset(corpora / "a")
    direct = GPTDataset(indexed, str(corpora / "a"),
                        split_indices((0.0, 0.8), len(indexed)), 50, "train",
                        GPTDatasetConfig(sequence_length=16, eod=EOD, split="80, 15, 5",
                                         create_attention_mask=False))
    assert len(train) == len(direct) >= 50
    for i in (0, 7, len(train) - 1):
        for key, value in direct[i].items():
            np.testing.assert_array_equal(train[i][key], value)


def test_gpt_config_feeds_every_sample_field_from_the_settings() -> None:
    settings = MegatronDatasetSettings(
        seq_length=32, seed=7, split="9, 1, 0", path_to_cache="/cache", eod=3, pad=2,
        reset_position_ids=True, reset_attention_mask=True, eod_mask_loss=True,
        create_attention_mask=False, create_compressed_eod_mask=True,
        compressed_eod_mask_length=64, allow_ambiguous_pad_tokens=True,
        add_extra_token_to_sequence=False, drop_last_partial_validation_sequence=False)
    config = gpt_config(settings)
    assert (config.sequence_length, config.random_seed, config.eod_pad_length) == (32, 7, 64)
    for name, field in SAMPLE_SETTINGS.items():
        assert getattr(config, field) == getattr(settings, name), name
    assert set(SAMPLE_SETTINGS) <= set(declared_fields(MegatronDatasetSettings))
    fed = {*SAMPLE_SETTINGS.values(), "eod_pad_length", "tokenizer_identifiers", "vocab_size"}
    assert fed == set(GPTDatasetConfig.__dataclass_fields__)
    assert config.tokenizer_identifiers is None
    assert config.vocab_size is None  # the model's, given by the trainer
    assert gpt_config(settings, vocab_size=300).vocab_size == 300


def test_a_split_without_share_is_none(corpora) -> None:
    train, valid, test = build_datasets(dataloader({"data_path": [str(corpora / "a")],
                                                    "split": "1, 0, 0"}, sizes=(20, 0, 0)))
    assert isinstance(train, GPTDataset) and valid is None and test is None


def test_weights_give_a_blend_of_the_requested_size(corpora) -> None:
    train, _, _ = build_datasets(dataloader({
        "data_path": ["0.7", str(corpora / "a"), "0.3", str(corpora / "b")],
        "split": "90, 10, 0"}, sizes=(100, 10, 0)))
    assert isinstance(train, BlendedDataset) and len(train) == 100  # ceil(70) + ceil(30)
    counts = np.bincount(np.asarray(train.dataset_index), minlength=2)
    assert counts.tolist() == [70, 30]
    assert set(train[0]) >= {"tokens", "labels", "loss_mask", "position_ids", "dataset_id"}


def test_keeping_the_remainder_of_a_weighted_blend_pads_the_last_batch(corpora) -> None:
    """`drop_remainder: false` over a weighted `data_path`: the last global batch is kept,
    padded with padding samples (no loss), as over a single dataset."""
    train, _, _ = build_datasets(dataloader({
        "data_path": ["0.7", str(corpora / "a"), "0.3", str(corpora / "b")]},
        sizes=(21, 0, 0)))
    assert isinstance(train, BlendedDataset) and len(train) == 22  # ceil(14.7) + ceil(6.3)
    columns = ["input_ids", "labels", "loss_mask"]
    ranks = [list(BatchLoader(train, micro_batch_size=4, data_parallel=2, rank=rank,
                              column_names=columns, drop_remainder=False))
             for rank in range(2)]
    assert [len(batches) for batches in ranks] == [3, 3]  # 22 samples in global batches of 8
    last = np.concatenate([ranks[0][-1]["loss_mask"], ranks[1][-1]["loss_mask"]])
    assert last.any(axis=1).tolist() == [True] * 6 + [False] * 2  # samples 16-21, 2 paddings
    real = [row for batches in ranks for batch in batches
            for row, mask in zip(batch["input_ids"], batch["loss_mask"], strict=True)
            if mask.any()]
    assert len(real) == 22


def test_a_blend_cache_that_does_not_fit_is_refused(corpora, tmp_path) -> None:
    config = {"data_path": ["0.7", str(corpora / "a"), "0.3", str(corpora / "b")],
              "path_to_cache": str(tmp_path)}
    train, _, _ = build_datasets(dataloader(config, sizes=(30, 0, 0)))
    path = train.cache_path("dataset_sample_index.npy")
    np.save(path, np.load(path) + 1000)
    with pytest.raises(DataError) as caught:
        build_datasets(dataloader(config, sizes=(30, 0, 0)))
    assert str(caught.value) == (
        f"{path}: names sample 1000 of dataset 0, which has {len(train.datasets[0])} samples: "
        "this blend's index cache does not fit its datasets (written for other data under the "
        "same prefixes, or damaged); delete its files "
        f"({train.cache_path('*')}) to rebuild it")


def test_blend_per_split_draws_each_split_from_its_own_files(corpora) -> None:
    train, valid, test = build_datasets(dataloader({
        "train_data_path": [str(corpora / "a")], "valid_data_path": [str(corpora / "b")]},
        sizes=(30, 5, 0)))
    assert test is None
    assert len(train.indices) == len(IndexedDataset(corpora / "a"))  # the whole file
    assert len(valid.indices) == len(IndexedDataset(corpora / "b"))


def test_null_sizes_reach_the_datasets_as_one_epoch(corpora) -> None:
    train, valid, test = build_datasets(dataloader({"data_path": [str(corpora / "a")],
                                                    "split": "80, 15, 5"}, sizes=(None, 3, None)))
    assert (train.num_samples, valid.num_samples, test.num_samples) == (None, 3, None)
    assert '"num_samples": null' in train.unique_description
    blend, _, _ = build_datasets(dataloader({
        "data_path": [str(corpora / "a"), str(corpora / "b")], "split": "80, 15, 5"},
        sizes=(None, 3, None)))
    assert blend.size is None  # exhaustive: every sample of both constituents once
    assert len(blend) == sum(len(part) for part in blend.datasets)


def test_blend_per_split_follows_megatrons_own_rules(corpora) -> None:
    a, b = str(corpora / "a"), str(corpora / "b")
    train, valid, test = build_datasets(dataloader({
        "train_data_path": ["1", a], "valid_data_path": ["0.5", a, "0.5", b],
        "test_data_path": [a, b]}, sizes=(20, 10, None)))
    # One weighted prefix: a GPTDataset of the size asked (no surplus, no blend).
    assert isinstance(train, GPTDataset) and train.num_samples == 20
    assert isinstance(valid, BlendedDataset) and len(valid) == 10
    assert isinstance(test, BlendedDataset) and test.size is None
    # Megatron's config has no split with a blend per split: the descriptions say null.
    for dataset in (train, *valid.datasets, *test.datasets):
        assert '"split": null,\n    "split_matrix": null' in dataset.unique_description
    # Null is allowed where the split has no path, even next to weights elsewhere.
    train, valid, test = build_datasets(dataloader({"train_data_path": ["0.5", a, "0.5", b]},
                                                   sizes=(10, None, None)))
    assert len(train) == 10 and valid is None and test is None


NULL_WITH_WEIGHTS = (r"sizes\[{index}\]: null \(one epoch\) is not allowed with weights in "
                     r"{field} \(Megatron refuses it: weights share out a sample count\); give "
                     r"the number of {name} samples \(0 for none\), or list the prefixes "
                     r"without weights to blend one epoch of each by their lengths")


@pytest.mark.parametrize(("config", "sizes", "message"), [
    ({"data_path": ["0.5", "PREFIX", "0.5", "PREFIX"], "split": "9, 1, 0"}, (10, None, 0),
     NULL_WITH_WEIGHTS.format(index=1, field="data_path", name="valid")),
    # Megatron refuses it even for a split the split string leaves empty.
    ({"data_path": ["0.5", "PREFIX", "0.5", "PREFIX"], "split": "1, 0, 0"}, (10, 0, None),
     NULL_WITH_WEIGHTS.format(index=2, field="data_path", name="test")),
    ({"data_path": ["1", "PREFIX"], "split": "1, 0, 0"}, (None, 0, 0),
     NULL_WITH_WEIGHTS.format(index=0, field="data_path", name="train")),
    ({"train_data_path": ["1", "PREFIX"]}, (None, 0, 0),
     NULL_WITH_WEIGHTS.format(index=0, field="train_data_path", name="train")),
    ({"train_data_path": ["PREFIX"], "valid_data_path": ["0.5", "PREFIX", "0.5", "PREFIX"]},
     (None, None, 0), NULL_WITH_WEIGHTS.format(index=1, field="valid_data_path", name="valid")),
])
def test_null_sizes_are_refused_with_weights(corpora, config, sizes, message) -> None:
    config = {key: [str(corpora / "a") if v == "PREFIX" else v for v in value]
              if isinstance(value, list) else value for key, value in config.items()}
    with pytest.raises(DataError, match=message):
        build_datasets(dataloader(config, sizes=sizes))


@pytest.mark.parametrize(("config", "sizes", "message"), [
    ({}, (10, 0, 0), r"config\.data_path: required"),
    ({"data_path": ["x"], "train_data_path": ["y"]}, (10, 0, 0), r"either data_path .* not both"),
    ({"data_path": ["PREFIX"], "split": "1, 0, 0"}, (10, 5, 0),
     r"sizes\[1\]: asks for 5 valid samples, but split '1, 0, 0' gives valid no data"),
    ({"train_data_path": ["PREFIX"]}, (10, 5, 0),
     r"sizes\[1\]: asks for 5 valid samples but no valid_data_path is given"),
    ({"data_path": ["0.5", "PREFIX", "-1", "PREFIX"]}, (10, 0, 0), r"data_path\[2\]"),
    ({"data_path": ["/no/such/corpus"]}, (10, 0, 0), r"/no/such/corpus"),
])
def test_bad_data_configurations(corpora, config, sizes, message) -> None:
    config = {key: [str(corpora / "a") if v == "PREFIX" else v for v in value]
              if isinstance(value, list) else value for key, value in config.items()}
    with pytest.raises(DataError, match=message):
        build_datasets(dataloader(config, sizes=sizes))


TRAIN_YAML = """\
training:
  global_batch_size: 4
  local_batch_size: 2
model:
  model_type: qwen3
  vocab_size: 512
  hidden_size: 16
  intermediate_size: 32
  num_hidden_layers: 1
  num_attention_heads: 2
train_dataset:
  dataloader:
    type: BlendedMegatronDatasetDataLoader
    sizes: [20, 0, 0]
    column_names: ["input_ids", "labels", "loss_mask"]
    config:
      seq_length: 8
      eod: 0
      split: "1, 0, 0"
      create_attention_mask: false
      path_to_cache: ""
      data_path: ["{prefix}"]
"""


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mf_data", *args], capture_output=True,
                          text=True, timeout=120)


def test_sample_prints_what_the_trainer_sees(tmp_path) -> None:
    text = "hello world, hello mf"
    write_indexed(tmp_path / "corpus", [[*text.encode(), 256]], dtype=np.uint16)
    config = tmp_path / "train.yaml"
    config.write_text(TRAIN_YAML.format(prefix=tmp_path / "corpus").replace("eod: 0",
                                                                             "eod: 256"))
    result = run_cli("sample", str(config), "0", "--tokenizer", "bytes")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "train sample 0"
    assert lines[1].startswith("  input_ids [8] int32: [")
    assert lines[2].startswith("  labels [8] int32: [")
    assert lines[3].startswith("  loss_mask [8] int32: [1, 1, 1, 1, 1, 1, 1, 1]")
    ids = [int(v) for v in lines[1].split(": ", 1)[1].strip("[]").split(", ")]
    decoded = "".join(chr(i) if i < 256 else "<|eod|>" for i in ids)
    assert decoded in (text + "<|eod|>") * 3
    assert lines[4] == "  text of input_ids (documents end at <|eod|>):"
    assert lines[5] == "    " + repr(decoded)


def test_sample_shows_the_dense_mask_as_bool(tmp_path) -> None:
    write_indexed(tmp_path / "corpus", [[5, 6, 0], [7, 0]] * 10, dtype=np.uint16)
    config = tmp_path / "train.yaml"
    config.write_text(TRAIN_YAML.format(prefix=tmp_path / "corpus").replace(
        '"loss_mask"]', '"loss_mask", "position_ids", "attention_mask"]').replace(
        "create_attention_mask: false", "reset_attention_mask: true"))
    result = run_cli("sample", str(config), "0")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[3].startswith("  loss_mask [8] int32: ")
    # documents of 2 and 3 tokens: more than the 28 entries above the diagonal are masked
    assert lines[5].startswith("  attention_mask [1, 8, 8] bool: ")
    masked = int(lines[5].split(": ")[1].split(" of ")[0])
    assert 28 < masked < 64


def test_sample_errors(tmp_path) -> None:
    write_indexed(tmp_path / "corpus", [[1, 2, 3, 0]] * 10, dtype=np.uint16)
    config = tmp_path / "train.yaml"
    config.write_text(TRAIN_YAML.format(prefix=tmp_path / "corpus"))
    result = run_cli("sample", str(config), "999")
    assert result.returncode == 1
    assert "sample 999 is outside the train split's" in result.stderr
    result = run_cli("sample", str(config), "0", "--split", "valid")
    assert result.returncode == 1 and "the valid split has no data" in result.stderr
    result = run_cli("sample", str(config), "0", "--set", "training.global_batch_size=0")
    assert result.returncode == 1 and "training.global_batch_size" in result.stderr
    assert "Traceback" not in result.stderr
