"""The train, valid and test datasets of a configuration, built as Megatron's builder builds them.

`build_datasets(dataloader)` reads `train_dataset.dataloader` (type
`BlendedMegatronDatasetDataLoader`) and returns `(train, valid, test)`, None for a split
that gets no data. It follows megatron-core's `BlendedMegatronDatasetBuilder`:

- one prefix without a weight: one `GPTDataset` per split, over that split's share of the
  sequences (`split` bookends), with `sizes[i]` samples (None: one epoch of the split);
- prefixes with weights: per split, each prefix's dataset sized `ceil(ceil(size * w) * 1.005)`
  and a `BlendedDataset` of `sum(ceil(size * w))` samples over them. A None size is refused,
  for every split, even one the `split` string leaves empty (Megatron asserts
  `size_is_none => weights_are_none` before building anything);
- several prefixes without weights: each prefix's split for one epoch, blended by their
  lengths, `min(size, total)` samples, or every sample once (exhaustive) for a None size;
- `train_data_path` / `valid_data_path` / `test_data_path` instead of `data_path` and
  `split` (Megatron's blend per split): each split draws from all of its own files, by the
  rules above with two differences of Megatron's: a single prefix gives a `GPTDataset` even
  with a weight (not a one-dataset blend), and the datasets' cache descriptions have `split`
  and `split_matrix` null (Megatron's config has no split then). A None size is refused only
  for a split whose own blend has weights.

The tests compare what this builds with Megatron's own builder (tests/data/parity).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any

from mf_config import DataloaderConfig

from .blended_dataset import BlendedDataset
from .blending import blend_sizes, normalise_weights, parse_blend
from .errors import DataError
from .gpt_dataset import GPTDataset, GPTDatasetConfig
from .indexed import IndexedDataset
from .loader_config import MegatronDatasetSettings, megatron_settings
from .split import SPLIT_NAMES, parse_split, split_indices, split_matrix

Dataset = GPTDataset | BlendedDataset
WHOLE = (0.0, 1.0)
"""The bookends of a split that draws from a whole file (blend per split)."""


def build_datasets(dataloader: DataloaderConfig, *,
                   vocab_size: int | None = None) -> tuple[Dataset | None, ...]:
    """The three split datasets of a configuration, built as Megatron's builder builds them.

    Args:
        dataloader: the `train_dataset.dataloader` section (type
            `BlendedMegatronDatasetDataLoader`).
        vocab_size: the model's vocabulary: reading a sample with a token id outside
            `[0, vocab_size)` is an error naming the file (None: ids are not checked).

    Returns:
        `(train, valid, test)`: each a `GPTDataset` or `BlendedDataset`, or None for a split
        that gets no data.

    Raises:
        DataError: the settings are wrong (every problem, with its path), or a file is
            missing or damaged.
    """
    settings = megatron_settings(dataloader)
    config = settings.config
    builder = SplitBuilder(gpt_config(config, vocab_size), mmap=config.mmap_bin_files,
                           threads=config.num_dataset_builder_threads)
    per_split = [config.train_data_path, config.valid_data_path, config.test_data_path]
    if any(per_split):
        if config.data_path:
            raise DataError("train_dataset.dataloader.config: give either data_path (with "
                            "split) or train_data_path/valid_data_path/test_data_path, not both")
        return builder.build_per_split(per_split, settings.sizes)
    if not config.data_path:
        raise DataError("train_dataset.dataloader.config.data_path: required: the .bin/.idx "
                        "prefixes to train on, e.g. ['/data/corpus_text_document'] or "
                        "['0.7', '/data/a', '0.3', '/data/b']")
    return builder.build(config.data_path, config.split, settings.sizes)


SAMPLE_SETTINGS = {
    "seq_length": "sequence_length", "seed": "random_seed", "split": "split", "eod": "eod",
    "pad": "pad", "add_extra_token_to_sequence": "add_extra_token_to_sequence",
    "reset_position_ids": "reset_position_ids", "reset_attention_mask": "reset_attention_mask",
    "eod_mask_loss": "eod_mask_loss", "create_attention_mask": "create_attention_mask",
    "create_compressed_eod_mask": "create_compressed_eod_mask",
    "allow_ambiguous_pad_tokens": "allow_ambiguous_pad_tokens",
    "drop_last_partial_validation_sequence": "drop_last_partial_validation_sequence",
    "path_to_cache": "path_to_cache",
}
"""The loader settings that shape the samples (MindFormers' names) -> their `GPTDatasetConfig`
fields (Megatron's names). Written out, not matched by name, so that a setting nobody reads
stays visible (mf-train's test_support looks for every key by name)."""


def gpt_config(settings: MegatronDatasetSettings,
               vocab_size: int | None = None) -> GPTDatasetConfig:
    """mf-data's sample settings from the loader's config block.

    Args:
        settings: the checked `train_dataset.dataloader.config`.
        vocab_size: the model's vocabulary, to check token ids against (None: unchecked).

    Returns:
        The `GPTDatasetConfig` of the same values, under Megatron's names; `eod_pad_length` is
        resolved from either of its names.
    """
    return GPTDatasetConfig(eod_pad_length=settings.pad_length(), vocab_size=vocab_size,
                            **{field: getattr(settings, name)
                               for name, field in SAMPLE_SETTINGS.items()})


def split_requested(dataloader: DataloaderConfig, index: int) -> bool:
    """Whether the Megatron loader's settings ask for samples of split `index` (0 train,
    1 valid, 2 test), from the settings alone (no file is read): its own blend
    (`train_data_path` / `valid_data_path` / `test_data_path`), or a share of `split`, and a
    size other than 0 (null: one epoch of it).

    Raises:
        DataError: the settings are not the Megatron loader's, or are wrong.
    """
    settings = megatron_settings(dataloader)
    config = settings.config
    if config is None or len(settings.sizes) != 3 or settings.sizes[index] == 0:
        return False
    per_split = (config.train_data_path, config.valid_data_path, config.test_data_path)
    if any(per_split):
        return bool(per_split[index])
    return parse_split(config.split)[index] > 0


class SplitBuilder:
    """Builds the datasets of the three splits from indexed files, as Megatron does."""

    def __init__(self, config: GPTDatasetConfig, *, mmap: bool = True, threads: int = 1,
                 root: str | os.PathLike | None = None):
        """`root`: where relative prefixes are (the working directory by default); the
        prefix as written stays the dataset's path in cache descriptions, as in Megatron."""
        self.config = config
        self.root = root
        self.mmap = mmap
        self.threads = threads
        self._indexed: dict[str, IndexedDataset] = {}

    def build(self, data_path: Sequence[str], split: str,
              sizes: Sequence[int | None]) -> tuple[Dataset | None, ...]:
        """Every split of one blend (`data_path`) cut by `split`."""
        prefixes, weights = parse_blend(list(data_path))
        for i in range(3):
            _refuse_null_with_weights(weights, sizes, i, "data_path")
        matrix = split_matrix(parse_split(split))
        _check_empty_splits(matrix, sizes, split)
        return tuple(None if matrix[i] is None else
                     self._split(prefixes, weights, i, [matrix[i]] * len(prefixes), sizes[i],
                                 self.config)
                     for i in range(3))

    def build_per_split(self, data_paths: Sequence[Sequence[str]],
                        sizes: Sequence[int | None]) -> tuple[Dataset | None, ...]:
        """Each split from its own blend of whole files (None where none is given)."""
        blends = [parse_blend(list(data_path)) if data_path else None
                  for data_path in data_paths]
        for i, blend in enumerate(blends):
            if blend is None and sizes[i]:
                raise DataError(f"train_dataset.dataloader.sizes[{i}]: asks for {sizes[i]} "
                                f"{SPLIT_NAMES[i]} samples but no {SPLIT_NAMES[i]}_data_path "
                                "is given")
            if blend is not None:
                _refuse_null_with_weights(blend[1], sizes, i, f"{SPLIT_NAMES[i]}_data_path")
        config = replace(self.config, split=None)  # Megatron's config has no split here
        out: list[Dataset | None] = []
        for i, blend in enumerate(blends):
            if blend is None:
                out.append(None)
            elif len(blend[0]) == 1:  # a GPTDataset even with a weight, as in Megatron
                out.append(self._gpt(blend[0][0], WHOLE, sizes[i], SPLIT_NAMES[i], config))
            else:
                out.append(self._split(*blend, i, [WHOLE] * len(blend[0]), sizes[i], config))
        return tuple(out)

    def _split(self, prefixes: list[str], weights: list[float] | None, split: int,
               bookends: list[tuple[float, float]], size: int | None,
               config: GPTDatasetConfig) -> Dataset:
        name = SPLIT_NAMES[split]
        if len(prefixes) == 1 and weights is None:
            return self._gpt(prefixes[0], bookends[0], size, name, config)
        if weights is not None:
            assert size is not None  # refused with the user's path before building
            normalised = normalise_weights(weights)
            planned = blend_sizes(size, normalised)
            parts = self._gpts(prefixes, bookends, list(planned.per_dataset), name, config)
            return BlendedDataset(parts, normalised, planned.total, name,
                                  cache_dir=self._blend_cache)
        parts = self._gpts(prefixes, bookends, [None] * len(prefixes), name, config)
        counts = [len(part) for part in parts]
        total = None if size is None else min(size, sum(counts))
        return BlendedDataset(parts, counts, total, name, cache_dir=self._blend_cache)

    @property
    def _blend_cache(self) -> str | None:
        """Blends are cached only in an explicit `path_to_cache`, as in Megatron."""
        return self.config.path_to_cache or None

    def _gpts(self, prefixes: list[str], bookends: list[tuple[float, float]],
              sizes: list[int | None], name: str, config: GPTDatasetConfig) -> list[GPTDataset]:
        jobs = list(zip(prefixes, bookends, sizes, strict=True))
        if self.threads == 1 or len(jobs) == 1:
            return [self._gpt(*job, name, config) for job in jobs]
        with ThreadPoolExecutor(self.threads) as pool:
            return list(pool.map(lambda job: self._gpt(*job, name, config), jobs))

    def _gpt(self, prefix: str, bookends: tuple[float, float], size: int | None,
             name: str, config: GPTDatasetConfig) -> GPTDataset:
        indexed = self._open(prefix)
        indices = split_indices(bookends, len(indexed))
        return GPTDataset(indexed, prefix, indices, size, name, config)

    def _open(self, prefix: str) -> IndexedDataset:
        if prefix not in self._indexed:
            path = os.path.join(self.root or "", os.path.expanduser(prefix))
            self._indexed[prefix] = IndexedDataset(path, mmap=self.mmap)
        return self._indexed[prefix]


def _refuse_null_with_weights(weights: list[float] | None, sizes: Sequence[int | None],
                              split: int, field: str) -> None:
    """Megatron asserts `size_is_none => weights_are_none` per split: weights divide a sample
    count among the datasets, and one epoch of a blend is only defined by their lengths."""
    if weights is None or sizes[split] is not None:
        return
    name = SPLIT_NAMES[split]
    raise DataError(f"train_dataset.dataloader.sizes[{split}]: null (one epoch) is not allowed "
                    f"with weights in {field} (Megatron refuses it: weights share out a sample "
                    f"count); give the number of {name} samples (0 for none), or list the "
                    "prefixes without weights to blend one epoch of each by their lengths")


def _check_empty_splits(matrix: list[Any], sizes: Sequence[int | None], split: str) -> None:
    for i, bookends in enumerate(matrix):
        if bookends is None and sizes[i]:
            raise DataError(f"train_dataset.dataloader.sizes[{i}]: asks for {sizes[i]} "
                            f"{SPLIT_NAMES[i]} samples, but split {split!r} gives "
                            f"{SPLIT_NAMES[i]} no data; give it a share or set the size to 0")
