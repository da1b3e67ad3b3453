"""GPTDataset samples against a plain reimplementation of Megatron's __getitem__ (reference
notes, megatron-datasets.md section 4), for every flag combination and pad choice."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest

from mf_data.errors import DataError
from mf_data.gpt_dataset import GPTDataset, GPTDatasetConfig, resolve_pad
from mf_data.index_cache import default_cache_dir
from mf_data.indexed import IndexedDataset, IndexedDatasetBuilder, write_indexed
from mf_data.split import parse_split, split_indices, split_matrix

EOD = 2
DATA_PAD = 7  # a pad id that also occurs as a real token


def _documents(seed: int = 0, count: int = 40) -> list[list[int]]:
    """Sequences of 1..25 tokens from 1..12 (so EOD=2 and 7 occur inside), most ending in EOD."""
    rng = np.random.default_rng(seed)
    documents = []
    for number in range(count):
        tokens = rng.integers(1, 13, int(rng.integers(1, 26))).tolist()
        if number % 4:
            tokens[-1] = EOD
        documents.append(tokens)
    return documents


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> tuple[str, list[list[int]]]:
    prefix = str(tmp_path_factory.mktemp("gpt") / "corpus")
    documents = _documents()
    write_indexed(prefix, documents, dtype=np.int32)
    return prefix, documents


# --------------------------------------------------------------------------- the reference


def reference_sample(dataset: GPTDataset, documents: list[list[int]], idx: int | None,
                     config: GPTDatasetConfig, pad: int) -> dict[str, np.ndarray]:
    """Megatron's __getitem__, transcribed with lists and per-token loops."""
    x, size, eod = int(config.add_extra_token_to_sequence), config.sequence_length, config.eod
    j = int(dataset.shuffle_index[0 if idx is None else idx])
    first, first_offset = (int(v) for v in dataset.sample_index[j])
    last, last_offset = (int(v) for v in dataset.sample_index[j + 1])
    text: list[int] = []
    for position in range(first, last + 1):
        sequence = documents[int(dataset.document_index[position])]
        start = first_offset if position == first else 0
        stop = last_offset + x if position == last else len(sequence)
        text += sequence[start:stop]
    text += [pad] * (size + x - len(text))
    if x:
        tokens, labels = text[:-1], text[1:]
    else:
        tokens, labels = list(text), [*text[1:], pad]

    loss_mask = [1.0] * size
    if config.eod_mask_loss:
        loss_mask = [0.0 if token == eod else 1.0 for token in tokens]
    position_ids = list(range(size))
    attention = np.tril(np.ones((size, size)))
    if config.reset_position_ids or config.reset_attention_mask:
        previous = 0
        for i in range(size):
            if tokens[i] != eod:
                continue
            if config.reset_attention_mask:
                attention[i + 1:, :i + 1] = 0
            if config.reset_position_ids:
                for k in range(i + 1, size):
                    position_ids[k] -= i + 1 - previous
                previous = i + 1
    ends = [i + 1 for i in range(size) if tokens[i] == eod and i != size - 1]

    loss_mask = [0.0 if label == pad else keep for label, keep in zip(labels, loss_mask,
                                                                       strict=True)]
    if idx is None:
        loss_mask = [0.0] * size
    sample = {"tokens": np.array([0 if t == pad else t for t in tokens], dtype=np.int64),
              "labels": np.array([0 if t == pad else t for t in labels], dtype=np.int64)}
    if config.create_attention_mask and not config.create_compressed_eod_mask:
        sample["attention_mask"] = (attention < 0.5)[None]
    sample["loss_mask"] = np.array(loss_mask, dtype=np.float32)
    sample["position_ids"] = np.array(position_ids, dtype=np.int64)
    if config.create_compressed_eod_mask:
        ends += [size] * (config.eod_pad_length - len(ends))
        sample["actual_seq_len"] = np.array(ends, dtype=np.int32)
    return sample


def assert_same_sample(actual: dict[str, np.ndarray], expected: dict[str, np.ndarray]) -> None:
    assert list(actual) == list(expected)
    for key, want in expected.items():
        got = actual[key]
        assert got.dtype == want.dtype, key
        assert got.shape == want.shape, key
        np.testing.assert_array_equal(got, want, err_msg=key)


def _dataset(prefix: str, split: str = "train", num_samples: int | None = None,
             **config_fields) -> GPTDataset:
    config_fields.setdefault("sequence_length", 16)
    config = GPTDatasetConfig(eod=EOD, path_to_cache="", split="80, 20, 0", **config_fields)
    indexed = IndexedDataset(prefix)
    matrix = split_matrix(parse_split(config.split))
    indices = split_indices(matrix[["train", "valid", "test"].index(split)], len(indexed))
    return GPTDataset(indexed, prefix, indices, num_samples, split, config)


# --------------------------------------------------------------------------- every flag

FLAGS = ("add_extra_token_to_sequence", "reset_position_ids", "reset_attention_mask",
         "eod_mask_loss", "create_attention_mask", "create_compressed_eod_mask")
PADS = [
    {"pad": -1},
    {"pad": DATA_PAD},
    {"pad": EOD},  # ambiguous: becomes -1
    {"pad": EOD, "allow_ambiguous_pad_tokens": True},
]


@pytest.mark.parametrize("pad_fields", PADS, ids=["no-pad", "pad-in-data", "pad-is-eod",
                                                  "pad-is-eod-allowed"])
@pytest.mark.parametrize("flags", list(itertools.product([False, True], repeat=len(FLAGS))),
                         ids=lambda flags: "".join("1" if f else "0" for f in flags))
def test_every_sample_equals_the_reference(corpus, flags, pad_fields) -> None:
    prefix, documents = corpus
    fields = dict(zip(FLAGS, flags, strict=True), **pad_fields)
    # valid with the partial last sample kept (padding) over more than one epoch.
    dataset = _dataset(prefix, "valid", num_samples=9,
                       drop_last_partial_validation_sequence=False, **fields)
    pad = resolve_pad(dataset.config)
    assert len(dataset) >= 9
    for idx in [*range(len(dataset)), None]:
        assert_same_sample(dataset[idx], reference_sample(dataset, documents, idx,
                                                          dataset.config, pad))


@pytest.mark.parametrize("extra", [True, False])
def test_train_samples_over_several_epochs_equal_the_reference(corpus, extra) -> None:
    prefix, documents = corpus
    dataset = _dataset(prefix, "train", num_samples=120, add_extra_token_to_sequence=extra,
                       reset_position_ids=True, reset_attention_mask=True, eod_mask_loss=True,
                       pad=DATA_PAD)
    assert len(dataset) >= 120
    for idx in range(0, len(dataset), 7):
        assert_same_sample(dataset[idx], reference_sample(dataset, documents, idx,
                                                          dataset.config, DATA_PAD))


def test_samples_with_many_short_documents(tmp_path: Path) -> None:
    """About 80 documents per sample: many blocks in the mask, many position resets."""
    prefix = str(tmp_path / "short")
    documents = [[5, 6, EOD] if i % 2 else [4, EOD] for i in range(400)]
    write_indexed(prefix, documents, dtype=np.uint16)
    dataset = _dataset(prefix, sequence_length=200, reset_attention_mask=True,
                       reset_position_ids=True)
    for idx in range(len(dataset)):
        assert_same_sample(dataset[idx], reference_sample(dataset, documents, idx,
                                                          dataset.config, -1))


def test_text_is_the_concatenated_shuffled_sequences(corpus) -> None:
    """Sample k reads tokens [k*S, k*S + S + 1) of the document index's concatenation."""
    prefix, documents = corpus
    dataset = _dataset(prefix, num_samples=30)
    stream = np.concatenate([documents[i] for i in dataset.document_index])
    order = np.argsort(dataset.shuffle_index)  # sample k is dataset[order[k]]
    for k in range(len(dataset)):
        np.testing.assert_array_equal(dataset.sample_text(int(order[k])),
                                      stream[16 * k:16 * k + 17])


# --------------------------------------------------------------------------- behaviour


def test_dtypes_and_shapes(corpus) -> None:
    prefix, _ = corpus
    sample = _dataset(prefix)[0]
    assert list(sample) == ["tokens", "labels", "attention_mask", "loss_mask", "position_ids"]
    assert sample["tokens"].dtype == np.int64 and sample["tokens"].shape == (16,)
    assert sample["labels"].dtype == np.int64
    assert sample["loss_mask"].dtype == np.float32
    assert sample["position_ids"].dtype == np.int64
    assert sample["attention_mask"].dtype == bool
    assert sample["attention_mask"].shape == (1, 16, 16)
    compressed = _dataset(prefix, create_compressed_eod_mask=True, eod_pad_length=10)[0]
    assert list(compressed) == ["tokens", "labels", "loss_mask", "position_ids",
                                "actual_seq_len"]
    assert compressed["actual_seq_len"].dtype == np.int32
    assert compressed["actual_seq_len"].shape == (10,)


def test_shared_causal_mask_is_read_only(corpus) -> None:
    prefix, _ = corpus
    dataset = _dataset(prefix)
    mask = dataset[0]["attention_mask"]
    assert mask is dataset[1]["attention_mask"]
    with pytest.raises(ValueError, match="read-only"):
        mask[0, 0, 0] = True


def test_tokens_and_labels_are_independent_arrays(corpus) -> None:
    prefix, _ = corpus
    sample = _dataset(prefix)[0]
    labels = sample["labels"].copy()
    sample["tokens"][:] = -5
    np.testing.assert_array_equal(sample["labels"], labels)


def test_padding_sample_is_sample_zero_with_no_loss(corpus) -> None:
    prefix, _ = corpus
    dataset = _dataset(prefix, pad=DATA_PAD, eod_mask_loss=True)
    padding, first = dataset[None], dataset[0]
    for key in ("tokens", "labels", "position_ids"):
        np.testing.assert_array_equal(padding[key], first[key])
    assert not padding["loss_mask"].any()
    assert first["loss_mask"].any()


def test_every_sample_gets_fresh_masks_unlike_megatrons_cache(tmp_path: Path) -> None:
    """Megatron reuses the first sample's pad-masked loss mask when no reset flag is set; here
    a later sample without pad ids keeps a loss mask of ones."""
    prefix = str(tmp_path / "pads")
    write_indexed(prefix, [[DATA_PAD] * 10, *([[3] * 10] * 9)], dtype=np.int32)
    config = GPTDatasetConfig(sequence_length=8, eod=EOD, pad=DATA_PAD, path_to_cache="",
                              split="1")
    dataset = GPTDataset(IndexedDataset(prefix), prefix, np.arange(10, dtype=np.int32), None,
                         "train", config)
    with_pad = [i for i in range(len(dataset)) if DATA_PAD in dataset.sample_text(i)]
    without_pad = [i for i in range(len(dataset)) if DATA_PAD not in dataset.sample_text(i)]
    assert with_pad and without_pad
    assert not dataset[with_pad[0]]["loss_mask"].all()
    assert dataset[without_pad[0]]["loss_mask"].all()


def test_pad_equal_to_eod_falls_back_to_minus_one(caplog) -> None:
    config = GPTDatasetConfig(sequence_length=8, eod=EOD, pad=EOD)
    assert resolve_pad(config) == -1
    assert "equals the eod id" in caplog.text
    allowed = GPTDatasetConfig(sequence_length=8, eod=EOD, pad=EOD,
                               allow_ambiguous_pad_tokens=True)
    assert resolve_pad(allowed) == EOD
    assert resolve_pad(GPTDatasetConfig(sequence_length=8, eod=EOD, pad=0)) == 0


@pytest.mark.parametrize("extra", [True, False])
def test_compressed_mask_ignores_an_eod_in_the_last_position(tmp_path: Path, extra) -> None:
    prefix = str(tmp_path / "fours")
    documents = [[1, 3, 4, EOD]] * 12
    write_indexed(prefix, documents, dtype=np.int32)
    dataset = _dataset(prefix, sequence_length=8, create_compressed_eod_mask=True,
                       eod_pad_length=1, add_extra_token_to_sequence=extra)
    for idx in range(len(dataset)):
        sample = dataset[idx]
        assert sample["tokens"][-1] == EOD  # two EODs, but the last one does not count
        np.testing.assert_array_equal(sample["actual_seq_len"], [4])
        assert_same_sample(sample, reference_sample(dataset, documents, idx, dataset.config, -1))


def test_too_many_eods_for_the_compressed_mask(corpus) -> None:
    prefix, _ = corpus
    dataset = _dataset(prefix, sequence_length=64, create_compressed_eod_mask=True,
                       eod_pad_length=1)
    with pytest.raises(DataError, match=r"eod_pad_length: Number of EOD tokens \(\d+\) "
                                        r"exceeds eod_pad_length \(1\)"):
        for idx in range(len(dataset)):
            dataset[idx]


def test_out_of_range_index(corpus) -> None:
    prefix, _ = corpus
    dataset = _dataset(prefix)
    with pytest.raises(IndexError):
        dataset[len(dataset)]
    assert_same_sample(dataset[-1], dataset[len(dataset) - 1])


def test_sequences_not_documents_are_shuffled(tmp_path: Path) -> None:
    """A document of several sequences: GPTDataset works on sequences (Megatron ignores the
    document boundaries of the .idx)."""
    prefix = str(tmp_path / "multi")
    builder = IndexedDatasetBuilder(prefix + ".bin", dtype=np.int32)
    builder.add_document(list(range(1, 31)), [10, 10, 10])
    builder.add_document(list(range(31, 41)), [10])
    builder.finalize(prefix + ".idx")
    config = GPTDatasetConfig(sequence_length=5, eod=EOD, path_to_cache="", split="1")
    dataset = GPTDataset(IndexedDataset(prefix), prefix, np.arange(4, dtype=np.int32), None,
                         "train", config)
    assert sorted(dataset.document_index.tolist()) == [0, 1, 2, 3]


# --------------------------------------------------------------------------- config and cache


def test_default_cache_directory_and_reuse(tmp_path: Path) -> None:
    prefix = str(tmp_path / "cached")
    write_indexed(prefix, _documents(3), dtype=np.int32)
    config = GPTDatasetConfig(sequence_length=16, eod=EOD, split="1")
    indices = np.arange(40, dtype=np.int32)
    first = GPTDataset(IndexedDataset(prefix), prefix, indices, 25, "train", config)
    assert first.built_anew_on_cache_miss
    cache = Path(default_cache_dir(prefix))
    names = sorted(path.name for path in cache.iterdir())
    assert names == sorted(f"{first.unique_description_hash}-GPTDataset-train-{affix}" for affix
                           in ("description.txt", "document_index.npy", "sample_index.npy",
                               "shuffle_index.npy"))
    second = GPTDataset(IndexedDataset(prefix), prefix, indices, 25, "train", config)
    assert not second.built_anew_on_cache_miss
    for name in ("document_index", "sample_index", "shuffle_index"):
        np.testing.assert_array_equal(getattr(second, name), getattr(first, name))
    assert_same_sample(second[3], first[3])


def _spoil_document_index(array: np.ndarray) -> np.ndarray:
    return array + 1000


def _spoil_sample_index(array: np.ndarray) -> np.ndarray:
    return array[::-1].copy()


def _spoil_shuffle_index(array: np.ndarray) -> np.ndarray:
    return array + len(array)


@pytest.mark.parametrize(("name", "spoil", "problem"), [
    ("document_index", _spoil_document_index, "holds sequence ids 1000 to 1039, but the "
                                              "split's sequences are 0 to 39"),
    ("sample_index", _spoil_sample_index, "starts at ("),
    ("shuffle_index", _spoil_shuffle_index, "names sample "),
])
def test_a_cache_of_the_right_shape_with_wrong_values_is_refused(
        tmp_path: Path, name: str, spoil, problem: str) -> None:
    """A cache that matches the description and the shapes but cannot be this dataset's
    indices (written for other data under the same prefix): one error naming the file and
    how to rebuild it, not `not enough values to unpack` from the first sample."""
    prefix = str(tmp_path / "cached")
    write_indexed(prefix, _documents(3), dtype=np.int32)
    config = GPTDatasetConfig(sequence_length=16, eod=EOD, split="1")
    indices = np.arange(40, dtype=np.int32)
    first = GPTDataset(IndexedDataset(prefix), prefix, indices, 25, "train", config)
    base = f"{default_cache_dir(prefix)}/{first.unique_description_hash}-GPTDataset-train-"
    np.save(f"{base}{name}.npy", spoil(np.load(f"{base}{name}.npy")))
    with pytest.raises(DataError) as caught:
        GPTDataset(IndexedDataset(prefix), prefix, indices, 25, "train", config)
    message = str(caught.value)
    assert message.startswith(f"{base}{name}.npy: {problem}")
    assert message.endswith(": this GPT index cache does not fit the dataset (written for "
                            "other data under the same prefix, or damaged); delete its files "
                            f"({base}*) to rebuild it")
    assert "\n" not in message


def test_a_token_id_outside_the_vocabulary_names_the_file(tmp_path: Path) -> None:
    """The model's embedding would fail on it inside a step, naming nothing."""
    prefix = str(tmp_path / "ids")
    documents = [[1, 2, 3, 4, 5, 6, 7, 8], [9, 10, 11, 300, 12, 13, 14, 15], [1, 2, 3, 4, 5]]
    write_indexed(prefix, documents, dtype=np.uint16)
    config = dict(sequence_length=4, split="1", path_to_cache="")
    samples = _dataset_of(prefix, len(documents), vocab_size=301, **config)
    assert max(int(samples[i]["tokens"].max()) for i in range(len(samples))) == 300
    dataset = _dataset_of(prefix, len(documents), vocab_size=300, **config)
    with pytest.raises(DataError) as caught:
        for i in range(len(dataset)):
            dataset[i]
    assert str(caught.value) == (
        f"{prefix}.bin: token id 300 (sequence 1, in sample {i} of the train split) is "
        "outside the model's vocabulary: model.vocab_size is 300 (ids 0 to 299); make the data "
        "with the model's tokenizer, or give the model a vocabulary of at least 301")


def test_ids_that_cannot_leave_the_vocabulary_are_not_checked(tmp_path: Path) -> None:
    prefix = str(tmp_path / "bytes")
    write_indexed(prefix, [[1, 255, 3, 4, 5, 6]], dtype=np.uint8)
    assert not _dataset_of(prefix, 1, vocab_size=256, sequence_length=2, split="1",
                           path_to_cache="")._check_ids
    assert _dataset_of(prefix, 1, vocab_size=255, sequence_length=2, split="1",
                       path_to_cache="")._check_ids


def _dataset_of(prefix: str, sequences: int, **config_fields) -> GPTDataset:
    config = GPTDatasetConfig(eod=EOD, **config_fields)
    return GPTDataset(IndexedDataset(prefix), prefix, np.arange(sequences, dtype=np.int32),
                      None, "train", config)


def test_description_names_the_configured_path(corpus) -> None:
    prefix, _ = corpus
    dataset = _dataset(prefix, num_samples=9)
    assert f'"dataset_path": "{prefix}"' in dataset.unique_description
    assert '"num_samples": 9' in dataset.unique_description
    assert '"split": "80, 20, 0"' in dataset.unique_description


@pytest.mark.parametrize("fields, fragment", [
    ({"sequence_length": 0}, "sequence_length"),
    ({"random_seed": -1}, "random_seed"),
    ({"eod_pad_length": 0}, "eod_pad_length"),
    ({"split": "a, b"}, "split"),
    ({"eod": 1.5}, "eod"),
])
def test_config_rejects_bad_values_naming_the_field(fields, fragment) -> None:
    values = {"sequence_length": 8, "eod": EOD, **fields}
    with pytest.raises(DataError, match=fragment) as caught:
        GPTDatasetConfig(**values)
    assert str(caught.value).startswith(fragment)


def test_unknown_split_name(corpus) -> None:
    prefix, _ = corpus
    with pytest.raises(DataError, match="index_split"):
        GPTDataset(IndexedDataset(prefix), prefix, np.arange(3, dtype=np.int32), None,
                   "training", GPTDatasetConfig(sequence_length=8, eod=EOD, path_to_cache=""))
