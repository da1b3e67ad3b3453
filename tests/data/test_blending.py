"""Blending: data_path parsing, sizes, the greedy blending indices and BlendedDataset.

The indices are checked against a reference written here independently of mf_data.blending
(numpy over the datasets at each step, with Megatron's expression and tie rule), on fixed cases
and on hypothesis-generated weights and sizes. Megatron's own output for real corpora is
checked by test_megatron_golden.py.
"""

from __future__ import annotations

import hashlib
import json
import math
import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mf_data.blended_dataset import BlendedDataset, BlendOversampledError
from mf_data.blending import (
    blend_sizes,
    build_blending_indices,
    build_exhaustive_blending_indices,
    normalise_weights,
    parse_blend,
)
from mf_data.errors import DataError


def reference_blend(weights: list[float], size: int) -> tuple[list[int], list[int]]:
    """helpers.cpp build_blending_indices: argmax of w*max(s,1) - count, first index on ties."""
    rates = np.asarray(weights, dtype=np.float64)
    counts = np.zeros(len(weights), dtype=np.int64)
    chosen, served = [], []
    for step in range(size):
        lag = rates * np.float64(max(step, 1)) - counts.astype(np.float64)
        best = int(np.argmax(lag))  # numpy's argmax returns the first maximum
        chosen.append(best)
        served.append(int(counts[best]))
        counts[best] += 1
    return chosen, served


def reference_exhaustive(sizes: list[int]) -> tuple[list[int], list[int]]:
    total = sum(sizes)
    rates = np.asarray(sizes, dtype=np.float64) / np.float64(total)
    counts = np.zeros(len(sizes), dtype=np.int64)
    chosen, served = [], []
    for step in range(total):
        lag = rates * np.float64(max(step, 1)) - counts.astype(np.float64)
        lag[counts == np.asarray(sizes)] = -np.inf
        best = int(np.argmax(lag))
        chosen.append(best)
        served.append(int(counts[best]))
        counts[best] += 1
    return chosen, served


# --- parse_blend -------------------------------------------------------------------------------

def test_parse_blend_pairs_and_prefixes() -> None:
    assert parse_blend(["0.3", "a", "0.7", " b "]) == (["a", "b"], [0.3, 0.7])
    assert parse_blend(["30", "x/y_text_document"]) == (["x/y_text_document"], [30.0])
    assert parse_blend(["a"]) == (["a"], None)
    assert parse_blend(["a", "b", "c"]) == (["a", "b", "c"], None)
    assert parse_blend(["a", "b"]) == (["a", "b"], None)


@pytest.mark.parametrize(("data_path", "message"), [
    ([], "data_path: the list is empty"),
    (["0.3", "a", "b"], r"data_path\[0\]: '0.3' looks like a weight"),
    (["a", "0.5", "b"], r"data_path\[1\]: '0.5' looks like a weight"),
    (["0.3", "a", "x", "b"], r"data_path\[2\]: 'x' is not a number"),
    (["0.3", "a", "0", "b"], r"data_path\[2\]: weight 0.0 is not allowed"),
    (["-1", "a"], r"data_path\[0\]: weight -1.0 is not allowed"),
    (["nan", "a"], r"data_path\[0\]: weight nan is not allowed"),
    (["inf", "a"], r"data_path\[0\]: weight inf is not allowed"),
    (["0.3", "0.7"], r"data_path\[1\]: '0.7' is a number where a dataset prefix"),
    (["0.3", " "], r"data_path\[1\]: empty entry"),
])
def test_parse_blend_errors(data_path: list[str], message: str) -> None:
    with pytest.raises(DataError, match=message):
        parse_blend(data_path)


# --- weights and sizes -------------------------------------------------------------------------

def test_normalise_weights_is_float64_division() -> None:
    assert normalise_weights([1, 3]) == [0.25, 0.75]
    weights = [0.1, 0.2, 0.3]
    assert normalise_weights(weights) == [w / sum(np.float64(x) for x in weights)
                                          for w in weights]
    with pytest.raises(DataError, match=r"weights\[1\]"):
        normalise_weights([1.0, 0.0])
    with pytest.raises(DataError, match="empty"):
        normalise_weights([])


def test_blend_sizes_values() -> None:
    # 1000 * 0.3 = 300 -> 300 * 1.005 = 301.5 -> 302; 1000 * 0.7 = 700 -> 703.5 -> 704
    sizes = blend_sizes(1000, normalise_weights([0.3, 0.7]))
    assert sizes == ([302, 704], 1000)
    targets = [math.ceil(1000 * w) for w in normalise_weights([0.3, 0.7])]
    assert sizes.total == sum(targets)
    assert sizes.per_dataset == [math.ceil(t * 1.005) for t in targets]
    assert blend_sizes(10, [0.5, 0.5], surplus=0.0) == ([5, 5], 10)
    assert blend_sizes(10, [0.25, 0.75], surplus=0.5) == ([5, 12], 11)
    with pytest.raises(DataError, match="normalise"):
        blend_sizes(10, [1.0, 1.0])
    with pytest.raises(DataError, match="size"):
        blend_sizes(-1, [1.0])


# --- blending indices --------------------------------------------------------------------------

def test_blending_indices_known_values() -> None:
    chosen, served = build_blending_indices([0.5, 0.5], 6)
    assert chosen.tolist() == [0, 1, 0, 1, 0, 1]
    assert served.tolist() == [0, 0, 1, 1, 2, 2]
    assert chosen.dtype == np.int16 and served.dtype == np.int64
    # s=0 and s=1 both use max(s, 1) = 1: dataset 1 (0.75) wins twice before dataset 0 gets one.
    chosen, _ = build_blending_indices([0.25, 0.75], 8)
    assert chosen.tolist() == [1, 0, 1, 1, 0, 1, 1, 1]
    assert reference_blend([0.25, 0.75], 8)[0] == chosen.tolist()


def test_blending_indices_empty_and_single() -> None:
    chosen, served = build_blending_indices([1.0], 4)
    assert chosen.tolist() == [0, 0, 0, 0] and served.tolist() == [0, 1, 2, 3]
    chosen, served = build_blending_indices([0.5, 0.5], 0)
    assert chosen.shape == (0,) and served.shape == (0,)


weight_lists = st.lists(st.floats(min_value=1e-3, max_value=1e3, allow_nan=False), min_size=1,
                        max_size=6)


@settings(max_examples=60, deadline=None)
@given(raw=weight_lists, size=st.integers(min_value=0, max_value=400))
def test_blending_indices_match_reference(raw: list[float], size: int) -> None:
    weights = normalise_weights(raw)
    chosen, served = build_blending_indices(weights, size)
    expected_chosen, expected_served = reference_blend(weights, size)
    assert chosen.tolist() == expected_chosen
    assert served.tolist() == expected_served
    # Every constituent's samples are drawn in order 0, 1, 2, ...
    for dataset in range(len(weights)):
        assert served[chosen == dataset].tolist() == list(range(int((chosen == dataset).sum())))


@settings(max_examples=30, deadline=None)
@given(parts=st.lists(st.integers(min_value=1, max_value=6), min_size=2, max_size=5),
       size=st.integers(min_value=0, max_value=300))
def test_blending_indices_ties_from_simple_ratios(parts: list[int], size: int) -> None:
    """Ratios like 1:2:1 make exact ties, where only the lower-index rule decides."""
    weights = normalise_weights(parts)
    assert build_blending_indices(weights, size)[0].tolist() == reference_blend(weights, size)[0]


@settings(max_examples=40, deadline=None)
@given(sizes=st.lists(st.integers(min_value=1, max_value=60), min_size=1, max_size=5))
def test_exhaustive_indices_match_reference(sizes: list[int]) -> None:
    chosen, served = build_exhaustive_blending_indices(sizes)
    expected_chosen, expected_served = reference_exhaustive(sizes)
    assert chosen.tolist() == expected_chosen
    assert served.tolist() == expected_served
    assert np.bincount(chosen, minlength=len(sizes)).tolist() == sizes


def test_blending_errors() -> None:
    with pytest.raises(DataError, match="weights: no datasets"):
        build_blending_indices([], 3)
    with pytest.raises(DataError, match="size"):
        build_blending_indices([1.0], -1)
    with pytest.raises(DataError, match=r"weights\[0\]"):
        build_blending_indices([math.nan], 3)
    with pytest.raises(DataError, match=r"sizes\[1\]: 0 samples"):
        build_exhaustive_blending_indices([3, 0])


# --- BlendedDataset ----------------------------------------------------------------------------

class FakeDataset:
    """A constituent: sample i is {'tokens': [tag, i]}; described like Megatron's GPTDataset."""

    def __init__(self, tag: int, length: int) -> None:
        self.tag = tag
        self.length = length
        self.unique_identifiers = {"class": "GPTDataset", "dataset_path": f"corpus{tag}",
                                   "num_samples": length, "index_split": "train"}

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> dict[str, np.ndarray]:
        if not 0 <= index < self.length:
            raise IndexError(index)
        return {"tokens": np.array([self.tag, index])}


def test_blended_dataset_samples() -> None:
    datasets = [FakeDataset(10, 50), FakeDataset(20, 50)]
    blend = BlendedDataset(datasets, [1, 3], 40, "train")
    assert len(blend) == 40
    assert blend.weights == [0.25, 0.75]
    chosen, served = reference_blend([0.25, 0.75], 40)
    for index in range(40):
        sample = blend[index]
        assert list(sample) == ["dataset_id", "tokens"]
        assert int(sample["dataset_id"]) == chosen[index]
        assert sample["tokens"].tolist() == [10 * (chosen[index] + 1), served[index]]
    with pytest.raises(IndexError):
        blend[40]


def test_blended_dataset_exhaustive() -> None:
    blend = BlendedDataset([FakeDataset(1, 3), FakeDataset(2, 5)], [3, 5], None, "valid")
    assert len(blend) == 8
    assert blend.weights == [3, 5]
    assert sorted((int(s["dataset_id"]), int(s["tokens"][1])) for s in
                  (blend[i] for i in range(8))) == [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1),
                                                    (1, 2), (1, 3), (1, 4)]


def test_blended_dataset_oversampling_is_an_error() -> None:
    with pytest.raises(BlendOversampledError, match=r"datasets\[1\] \(corpus2\)") as error:
        BlendedDataset([FakeDataset(1, 100), FakeDataset(2, 5)], [0.5, 0.5], 20, "train")
    assert isinstance(error.value, IndexError) and isinstance(error.value, DataError)


@pytest.mark.parametrize(("weights", "size", "message"), [
    ([1.0], 5, "weights: 1 weights for 2 datasets"),
    ([1.0, 0.0], 5, "weight <= 0"),
    ([1.5, 2.0], None, "not whole sample counts"),
])
def test_blended_dataset_argument_errors(weights: list[float], size: int | None,
                                         message: str) -> None:
    with pytest.raises(DataError, match=message):
        BlendedDataset([FakeDataset(1, 9), FakeDataset(2, 9)], weights, size, "train")


def test_blended_dataset_bad_split() -> None:
    with pytest.raises(DataError, match="split_name"):
        BlendedDataset([FakeDataset(1, 9)], [1.0], 3, "validation")


def test_blended_dataset_cache_files(tmp_path: os.PathLike) -> None:
    datasets = [FakeDataset(1, 30), FakeDataset(2, 30)]
    blend = BlendedDataset(datasets, [0.4, 0.6], 25, "test", cache_dir=tmp_path)
    description = json.dumps({"class": "BlendedDataset",
                              "datasets": [d.unique_identifiers for d in datasets],
                              "split": "test", "weights": normalise_weights([0.4, 0.6]),
                              "size": 25}, indent=4)
    digest = hashlib.md5(description.encode()).hexdigest()
    names = sorted(os.listdir(tmp_path))
    assert names == sorted(f"{digest}-BlendedDataset-test-{suffix}" for suffix in
                           ("dataset_index.npy", "dataset_sample_index.npy", "description.txt"))
    assert (tmp_path / f"{digest}-BlendedDataset-test-description.txt").read_text() == description
    saved = np.load(tmp_path / f"{digest}-BlendedDataset-test-dataset_index.npy")
    assert saved.dtype == np.int16 and saved.tolist() == blend.dataset_index.tolist()

    again = BlendedDataset(datasets, [0.4, 0.6], 25, "test", cache_dir=tmp_path)
    assert isinstance(again.dataset_index, np.memmap)  # loaded, not rebuilt
    assert again.dataset_sample_index.tolist() == blend.dataset_sample_index.tolist()


def test_blended_dataset_incomplete_cache_is_rebuilt(tmp_path: os.PathLike) -> None:
    datasets = [FakeDataset(1, 30)]
    first = BlendedDataset(datasets, [1.0], 10, "train", cache_dir=tmp_path)
    os.remove(first.cache_path("description.txt"))
    second = BlendedDataset(datasets, [1.0], 10, "train", cache_dir=tmp_path)
    assert not isinstance(second.dataset_index, np.memmap)
    assert os.path.isfile(first.cache_path("description.txt"))
    assert not [name for name in os.listdir(tmp_path) if name.endswith(".tmp")]
