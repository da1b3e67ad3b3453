"""The GPT index cache: Megatron's description, hash and file names; atomic writes; reuse."""

from __future__ import annotations

import hashlib
import logging
import os
from pathlib import Path
from unittest import mock

import numpy as np
import pytest

import mf_data.index_cache as index_cache
from mf_data.errors import DataError
from mf_data.gpt_indices import GPTIndices
from mf_data.index_cache import (
    cache_paths,
    default_cache_dir,
    describe,
    description_hash,
    load_or_build,
)
from mf_data.split import parse_split, split_matrix

# What megatron-core writes for this dataset (json.dumps(..., indent=4)), typed out by hand.
EXPECTED_DESCRIPTION = """{
    "class": "GPTDataset",
    "dataset_path": "/data/corpus_text_document",
    "num_samples": 1000,
    "index_split": "train",
    "random_seed": 1234,
    "sequence_length": 4096,
    "split": "969, 30, 1",
    "split_matrix": [
        [
            0,
            0.969
        ],
        [
            0.969,
            0.999
        ],
        [
            0.999,
            1.0
        ]
    ],
    "tokenizer": null
}"""


def _description(**changes) -> str:
    fields = dict(dataset_path="/data/corpus_text_document", num_samples=1000,
                  index_split="train", random_seed=1234, sequence_length=4096,
                  split="969, 30, 1", split_matrix=split_matrix(parse_split("969, 30, 1")))
    fields.update(changes)
    return describe(**fields)


def _indices(seed: int = 0) -> GPTIndices:
    rng = np.random.default_rng(seed)
    return GPTIndices(rng.integers(0, 50, 40).astype(np.int32),
                      rng.integers(0, 50, (11, 2)).astype(np.int32),
                      rng.permutation(10).astype(np.uint32))


class Builder:
    """Counts builds and returns the same indices every time."""

    def __init__(self, seed: int = 0) -> None:
        self.calls = 0
        self.indices = _indices(seed)

    def __call__(self) -> GPTIndices:
        self.calls += 1
        return self.indices


def _assert_same(actual: GPTIndices, expected: GPTIndices) -> None:
    for got, want in zip(actual, expected, strict=True):
        assert got.dtype == want.dtype
        np.testing.assert_array_equal(got, want)


def test_description_is_megatrons_json() -> None:
    assert _description() == EXPECTED_DESCRIPTION
    assert description_hash(EXPECTED_DESCRIPTION) == hashlib.md5(
        EXPECTED_DESCRIPTION.encode("utf-8")).hexdigest()


def test_description_serialises_a_tokenizer_through_unique_identifiers() -> None:
    class Tokenizer:
        def __init__(self) -> None:
            self.unique_identifiers = {"class": "HuggingFaceTokenizer",
                                       "tokenizer_path": ["gpt2"]}

    text = _description(tokenizer=Tokenizer(), num_samples=None)
    assert '"num_samples": null' in text
    assert text.endswith('"tokenizer": {\n        "class": "HuggingFaceTokenizer",\n'
                         '        "tokenizer_path": [\n            "gpt2"\n        ]\n    }\n}')


def test_file_names_follow_megatron(tmp_path: Path) -> None:
    paths = cache_paths(tmp_path, EXPECTED_DESCRIPTION, "valid")
    digest = description_hash(EXPECTED_DESCRIPTION)
    assert [os.path.basename(path) for path in paths] == [
        f"{digest}-GPTDataset-valid-description.txt",
        f"{digest}-GPTDataset-valid-document_index.npy",
        f"{digest}-GPTDataset-valid-sample_index.npy",
        f"{digest}-GPTDataset-valid-shuffle_index.npy",
    ]
    assert default_cache_dir("/data/c") == os.path.join("/data/c", "cache",
                                                         "GPTDataset_indices")


def test_miss_builds_and_saves_plain_npy_files_then_hit_reuses_them(tmp_path: Path) -> None:
    build = Builder()
    _, built = load_or_build(tmp_path, EXPECTED_DESCRIPTION, "train", build)
    assert built and build.calls == 1
    paths = cache_paths(tmp_path, EXPECTED_DESCRIPTION, "train")
    assert Path(paths.description).read_text(encoding="utf-8") == EXPECTED_DESCRIPTION
    _assert_same(GPTIndices(*(np.load(path) for path in paths[1:])), build.indices)
    second, built = load_or_build(tmp_path, EXPECTED_DESCRIPTION, "train", build)
    assert not built and build.calls == 1
    assert isinstance(second.sample_index, np.memmap)  # loaded with mmap_mode="r"
    _assert_same(second, build.indices)


def test_changed_description_is_a_miss(tmp_path: Path) -> None:
    build = Builder()
    load_or_build(tmp_path, _description(), "train", build)
    load_or_build(tmp_path, _description(random_seed=1), "train", build)
    load_or_build(tmp_path, _description(), "valid", build)
    assert build.calls == 3
    assert len(list(tmp_path.glob("*-description.txt"))) == 3


def test_description_file_that_disagrees_is_rebuilt(tmp_path: Path, caplog) -> None:
    build = Builder()
    load_or_build(tmp_path, EXPECTED_DESCRIPTION, "train", build)
    paths = cache_paths(tmp_path, EXPECTED_DESCRIPTION, "train")
    Path(paths.description).write_text("something else", encoding="utf-8")
    with caplog.at_level(logging.WARNING, logger=index_cache.__name__):
        _, built = load_or_build(tmp_path, EXPECTED_DESCRIPTION, "train", build)
    assert built and build.calls == 2
    assert "describes different indices" in caplog.text
    assert Path(paths.description).read_text(encoding="utf-8") == EXPECTED_DESCRIPTION


def test_missing_file_is_rebuilt(tmp_path: Path, caplog) -> None:
    build = Builder()
    load_or_build(tmp_path, EXPECTED_DESCRIPTION, "train", build)
    paths = cache_paths(tmp_path, EXPECTED_DESCRIPTION, "train")
    os.remove(paths.sample_index)
    with caplog.at_level(logging.INFO, logger=index_cache.__name__):
        indices, built = load_or_build(tmp_path, EXPECTED_DESCRIPTION, "train", build)
    assert built and build.calls == 2
    stem = os.path.basename(paths.description).removesuffix("description.txt")
    assert [record.getMessage() for record in caplog.records
            if "cache miss" in record.getMessage()] == [
        f"GPT index cache miss: building {tmp_path} ({stem}*, 1 of 4 files missing)"]
    assert os.path.isfile(paths.sample_index)
    _assert_same(indices, build.indices)


@pytest.mark.parametrize("damage", ["garbage", "wrong_shape"])
def test_corrupt_file_is_rebuilt(tmp_path: Path, caplog, damage: str) -> None:
    build = Builder()
    load_or_build(tmp_path, EXPECTED_DESCRIPTION, "train", build)
    paths = cache_paths(tmp_path, EXPECTED_DESCRIPTION, "train")
    if damage == "garbage":
        Path(paths.shuffle_index).write_bytes(b"\x93NUMPY not really")
    else:
        np.save(paths.shuffle_index, np.arange(3, dtype=np.uint32))
    with caplog.at_level(logging.WARNING, logger=index_cache.__name__):
        indices, built = load_or_build(tmp_path, EXPECTED_DESCRIPTION, "train", build)
    assert built and build.calls == 2
    assert "rebuilding" in caplog.text
    _assert_same(indices, build.indices)
    _, built = load_or_build(tmp_path, EXPECTED_DESCRIPTION, "train", build)
    assert not built


def test_writes_go_through_temporary_names_and_the_description_comes_last(
        tmp_path: Path) -> None:
    paths = cache_paths(tmp_path, EXPECTED_DESCRIPTION, "train")
    real_save, real_replace = np.save, os.replace
    replaced: list[str] = []

    def checking_save(stream, array, **kwargs):
        assert not os.path.exists(paths.description)
        return real_save(stream, array, **kwargs)

    def recording_replace(source, target):
        assert os.path.dirname(source) == str(tmp_path)  # a temporary beside the target
        assert os.path.basename(source).startswith(".") and source.endswith(".tmp")
        replaced.append(target)
        return real_replace(source, target)

    with mock.patch.object(index_cache.np, "save", checking_save), \
            mock.patch.object(index_cache.os, "replace", recording_replace):
        load_or_build(tmp_path, EXPECTED_DESCRIPTION, "train", Builder())
    assert replaced == [paths.document_index, paths.sample_index, paths.shuffle_index,
                        paths.description]


def test_a_failed_write_leaves_no_complete_cache_and_no_temporaries(tmp_path: Path) -> None:
    paths = cache_paths(tmp_path, EXPECTED_DESCRIPTION, "train")
    real_save = np.save

    def failing_save(stream, array, **kwargs):
        if array.ndim == 2:  # the sample index
            stream.write(b"half")
            raise OSError("disk full")
        return real_save(stream, array, **kwargs)

    with mock.patch.object(index_cache.np, "save", failing_save), \
            pytest.raises(DataError, match="path_to_cache: cannot write"):
        load_or_build(tmp_path, EXPECTED_DESCRIPTION, "train", Builder())
    assert sorted(os.listdir(tmp_path)) == [os.path.basename(paths.document_index)]
    build = Builder()
    _, built = load_or_build(tmp_path, EXPECTED_DESCRIPTION, "train", build)
    assert built and build.calls == 1


def test_no_cache_directory_means_build_every_time(tmp_path: Path) -> None:
    build = Builder()
    for _ in range(2):
        _, built = load_or_build("", EXPECTED_DESCRIPTION, "train", build)
        assert built
    assert build.calls == 2
    assert list(tmp_path.iterdir()) == []
