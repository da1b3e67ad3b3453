"""A weighted blend of GPT datasets, equal sample for sample to megatron-core's BlendedDataset.

Sample ``i`` of the blend is sample ``dataset_sample_index[i]`` of constituent
``dataset_index[i]`` (mf_data.blending builds both). The two arrays can be cached in
Megatron's own file layout, ``{md5}-BlendedDataset-{split}-{suffix}``, where the md5 is of the
same JSON description Megatron writes, so either side can reuse the other's cache.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import numpy as np

from mf_data.atomic_files import save_array_atomically, write_atomically
from mf_data.blending import (
    MAX_DATASETS,
    build_blending_indices,
    build_exhaustive_blending_indices,
    normalise_weights,
)
from mf_data.errors import DataError

SPLIT_NAMES = ("train", "valid", "test")
CACHE_SUFFIXES = ("description.txt", "dataset_index.npy", "dataset_sample_index.npy")


class BlendOversampledError(DataError, IndexError):
    """The blend asks a constituent for more samples than it has (Megatron raises IndexError)."""


def _description_default(value: Any) -> Any:
    """JSON fallback Megatron uses: objects (datasets, tokenizers) describe themselves."""
    return value.unique_identifiers


def _identifiers_of(dataset: Any) -> Any:
    """A constituent's description as an ordered mapping: its ``unique_identifiers``, or its
    ``unique_description`` JSON read back (re-dumping it nested gives Megatron's text)."""
    identifiers = getattr(dataset, "unique_identifiers", None)
    if identifiers is not None:
        return identifiers
    description = getattr(dataset, "unique_description", None)
    if description is None:
        raise DataError(f"datasets: {type(dataset).__name__} has neither unique_identifiers nor "
                        "unique_description, which name the blend's cache files")
    return json.loads(description, object_pairs_hook=OrderedDict)


def blend_description(datasets: Sequence[Any], split_name: str, weights: Sequence[Any],
                      size: int | None) -> str:
    """The JSON text Megatron hashes to name the cache files (key order matters)."""
    identifiers: OrderedDict[str, Any] = OrderedDict()
    identifiers["class"] = "BlendedDataset"
    identifiers["datasets"] = [_identifiers_of(dataset) for dataset in datasets]
    identifiers["split"] = split_name
    identifiers["weights"] = list(weights)
    identifiers["size"] = size
    return json.dumps(identifiers, indent=4, default=_description_default)


class BlendedDataset:
    """``size`` samples drawn from ``datasets`` in proportion to ``weights``.

    With ``size`` None the blend is exhaustive: ``weights`` must be whole numbers (normally each
    constituent's length) and every constituent sample is drawn exactly once.

    Args:
        datasets: the constituents (each a `GPTDataset`, or anything with a length, samples
            and a ``unique_description``).
        weights: their shares (normalised here), or their lengths for an exhaustive blend.
        size: samples of the blend; None: exhaustive.
        split_name: one of "train", "valid", "test".
        cache_dir: where Megatron's blend caches are kept; None: not cached.

    Raises:
        DataError: the arguments do not describe a blend.
    """

    def __init__(self, datasets: Sequence[Any], weights: Sequence[float | int], size: int | None,
                 split_name: str, cache_dir: str | os.PathLike | None = None) -> None:
        self._check_arguments(datasets, weights, size, split_name)
        self.datasets = list(datasets)
        self.split_name = split_name
        self.weights = normalise_weights(weights) if size is not None else list(weights)
        self.size = size
        self.unique_description = blend_description(self.datasets, split_name, self.weights,
                                                    size)
        self.unique_description_hash = hashlib.md5(
            self.unique_description.encode("utf-8"), usedforsecurity=False).hexdigest()
        self.cache_dir = None if cache_dir is None else os.fspath(cache_dir)
        self.dataset_index, self.dataset_sample_index = self._load_or_build()

    @staticmethod
    def _check_arguments(datasets: Sequence[Any], weights: Sequence[float | int],
                         size: int | None, split_name: str) -> None:
        if split_name not in SPLIT_NAMES:
            raise DataError(f"split_name: {split_name!r} is not a split; use one of "
                            f"{', '.join(SPLIT_NAMES)}")
        if not datasets or len(datasets) >= MAX_DATASETS:
            raise DataError(f"datasets: {len(datasets)} datasets; a blend needs 1 to "
                            f"{MAX_DATASETS - 1}")
        if len(weights) != len(datasets):
            raise DataError(f"weights: {len(weights)} weights for {len(datasets)} datasets; "
                            "give one weight per dataset")
        if any(not weight > 0 for weight in weights):
            raise DataError(f"weights: {list(weights)} has a weight <= 0; all must be > 0")
        if size is None and any(weight != int(weight) for weight in weights):
            raise DataError(f"weights: {list(weights)} are not whole sample counts, which an "
                            "exhaustive blend (size None) needs")
        if size is not None and size < 0:
            raise DataError(f"size: {size} is negative; give a sample count >= 0, or None")

    def __len__(self) -> int:
        return int(self.dataset_index.shape[0])

    def __getitem__(self, index: int | None) -> dict[str, Any]:
        """Sample `index` of the blend; None is a batch-padding sample (the loader pads the
        last global batch with them under `drop_remainder: false`): the padding sample of the
        constituent of the blend's first sample, its loss mask all zeros."""
        if index is None:
            dataset_id = self.dataset_index[0]
            return {"dataset_id": dataset_id, **self.datasets[dataset_id][None]}
        dataset_id = self.dataset_index[index]
        sample = self.datasets[dataset_id][int(self.dataset_sample_index[index])]
        return {"dataset_id": dataset_id, **sample}

    def cache_path(self, suffix: str) -> str:
        """Where Megatron (and this class) keep one of the three cache files."""
        if self.cache_dir is None:
            raise DataError("cache_dir: not set, so the blend has no cache files")
        name = f"{self.unique_description_hash}-BlendedDataset-{self.split_name}-{suffix}"
        return os.path.join(self.cache_dir, name)

    def _load_or_build(self) -> tuple[np.ndarray, np.ndarray]:
        if self.cache_dir is not None and all(
                os.path.isfile(self.cache_path(suffix)) for suffix in CACHE_SUFFIXES):
            cached = (np.load(self.cache_path("dataset_index.npy"), mmap_mode="r"),
                      np.load(self.cache_path("dataset_sample_index.npy"), mmap_mode="r"))
            self._check_cached(*cached)
            return cached
        dataset_index, dataset_sample_index = self._build()
        self._check_not_oversampled(dataset_index)
        if self.cache_dir is not None:
            self._write_cache(dataset_index, dataset_sample_index)
        return dataset_index, dataset_sample_index

    def _check_cached(self, dataset_index: np.ndarray, dataset_sample_index: np.ndarray) -> None:
        """Cached arrays that could not be this blend's (a constituent or sample that does not
        exist, the wrong length) are refused, naming the file: the description matched, so
        they were written for other data under the same prefixes, or damaged."""
        size = self.size if self.size is not None else sum(int(w) for w in self.weights)
        found = _cache_problem(dataset_index, dataset_sample_index,
                               [len(dataset) for dataset in self.datasets], size)
        if found is None:
            return
        suffix, problem = found
        others = self.cache_path("*")
        raise DataError(f"{self.cache_path(suffix)}: {problem}: this blend's index cache does "
                        f"not fit its datasets (written for other data under the same "
                        f"prefixes, or damaged); delete its files ({others}) to rebuild it")

    def _build(self) -> tuple[np.ndarray, np.ndarray]:
        if self.size is None:
            return build_exhaustive_blending_indices([int(weight) for weight in self.weights])
        return build_blending_indices(self.weights, self.size)

    def _check_not_oversampled(self, dataset_index: np.ndarray) -> None:
        drawn = np.bincount(dataset_index, minlength=len(self.datasets))
        for number, (dataset, count) in enumerate(zip(self.datasets, drawn, strict=True)):
            if count > len(dataset):
                raise BlendOversampledError(
                    f"datasets[{number}] ({_dataset_name(dataset)}): the {self.split_name} blend "
                    f"draws {count} samples from it but it has only {len(dataset)}; build the "
                    "constituents with more samples (raise mid_level_dataset_surplus) or lower "
                    "its weight")

    def _write_cache(self, dataset_index: np.ndarray, dataset_sample_index: np.ndarray) -> None:
        os.makedirs(self.cache_dir, exist_ok=True)
        save_array_atomically(self.cache_path("dataset_index.npy"), dataset_index)
        save_array_atomically(self.cache_path("dataset_sample_index.npy"), dataset_sample_index)
        # The description goes last: a reader treats the cache as complete once it exists.
        description = self.unique_description.encode("utf-8")
        write_atomically(self.cache_path("description.txt"),
                         lambda stream: stream.write(description))


def _cache_problem(dataset_index: np.ndarray, dataset_sample_index: np.ndarray,
                   lengths: list[int], size: int) -> tuple[str, str] | None:
    """(the cache file's suffix, what is wrong) when the arrays cannot be a blend of `size`
    samples from constituents of `lengths` samples, else None. Bounds only, in a few
    vectorised passes."""
    if dataset_index.ndim != 1 or dataset_sample_index.shape != dataset_index.shape:
        return ("dataset_sample_index.npy", f"has shape {dataset_sample_index.shape}, but "
                                            f"the dataset index has {dataset_index.shape}")
    if len(dataset_index) != size:
        return ("dataset_index.npy", f"has {len(dataset_index):,} entries, but the blend has "
                                     f"{size:,} samples")
    if not len(dataset_index):
        return None
    low, high = int(dataset_index.min()), int(dataset_index.max())
    if low < 0 or high >= len(lengths):
        return ("dataset_index.npy", f"names dataset {low if low < 0 else high}, but the "
                                     f"blend has {len(lengths)} (0 to {len(lengths) - 1})")
    limits = np.asarray(lengths, dtype=np.int64)[dataset_index]
    outside = np.flatnonzero((dataset_sample_index < 0) | (dataset_sample_index >= limits))
    if outside.size:
        at = int(outside[0])
        return ("dataset_sample_index.npy", f"names sample {int(dataset_sample_index[at])} of "
                                            f"dataset {int(dataset_index[at])}, which has "
                                            f"{int(limits[at]):,} samples")
    return None


def _dataset_name(dataset: Any) -> str:
    path = getattr(dataset, "dataset_path", None)
    if path is None:
        identifiers = getattr(dataset, "unique_identifiers", None)
        if isinstance(identifiers, dict):
            path = identifiers.get("dataset_path")
    return type(dataset).__name__ if path is None else str(path)
