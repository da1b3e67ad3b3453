"""The megatron-core 0.16.1 side of benchmarks/data.py: its GPTDataset, index helpers and loader.

Imported by data.py only when it runs (it needs torch and megatron-core, which `nox -s
bench_data` installs). Megatron is driven the way tests/data/parity/generate_golden.py drives it:
a stand-in tokenizer with the attributes its GPT dataset reads, and its ``GPTDatasetConfig``
with a one-dataset blend and a split string. No process group: a bare ``GPTDataset`` builds and
saves its indices on a cache miss when ``torch.distributed`` is not initialised.
"""

from __future__ import annotations

import logging
import warnings
from collections import OrderedDict
from typing import Any

import numpy as np

with warnings.catch_warnings():  # "Transformer Engine and Apex are not installed" x4
    warnings.simplefilter("ignore")
    import torch
    from megatron.core.datasets import helpers
    from megatron.core.datasets.gpt_dataset import (
        GPTDataset,
        GPTDatasetConfig,
        _build_document_index,
    )
    from megatron.core.datasets.indexed_dataset import IndexedDataset
    from megatron.core.datasets.utils import Split, get_blend_from_list

logging.getLogger("megatron").setLevel(logging.WARNING)

VERSION = f"megatron-core {__import__('megatron.core').core.__version__}, torch {torch.__version__}"


class StandInTokenizer:
    """What Megatron's GPT dataset reads from a tokenizer: eod, no pad (so pad is -1),
    vocab_size None (no dtype hint) and the identifiers that go into the cache description."""

    def __init__(self, eod: int, identifiers: dict[str, Any]) -> None:
        self.eod = eod
        self.vocab_size = None
        self.unique_identifiers = OrderedDict(identifiers)


def torch_threads() -> int:
    return torch.get_num_threads()


def open_indexed(prefix: str) -> IndexedDataset:
    return IndexedDataset(prefix, multimodal=False, mmap=True)


def config(prefix: str, seq_length: int, eod: int, identifiers: dict[str, Any], split: str,
           cache_dir: str, **flags: bool) -> GPTDatasetConfig:
    """Megatron's config for one prefix (``flags``: reset_position_ids, reset_attention_mask,
    eod_mask_loss, create_attention_mask)."""
    return GPTDatasetConfig(
        random_seed=1234,
        sequence_length=seq_length,
        blend=get_blend_from_list([prefix]),
        split=split,
        path_to_cache=cache_dir,
        tokenizer=StandInTokenizer(eod, identifiers),
        reset_position_ids=flags.get("reset_position_ids", False),
        reset_attention_mask=flags.get("reset_attention_mask", False),
        eod_mask_loss=flags.get("eod_mask_loss", False),
        create_attention_mask=flags.get("create_attention_mask", True),
    )


def train_dataset(indexed: IndexedDataset, prefix: str, indices: np.ndarray,
                  num_samples: int | None, dataset_config: GPTDatasetConfig) -> GPTDataset:
    return GPTDataset(indexed, prefix, indices, num_samples, Split.train, dataset_config)


def build_sample_index(lengths: np.ndarray, document_index: np.ndarray, seq_length: int,
                       epochs: int, tokens: int) -> np.ndarray:
    """helpers.build_sample_idx (the C++ walk), train split: drop_last, extra token."""
    return helpers.build_sample_idx(lengths, document_index, seq_length, epochs, tokens, True,
                                    True)


def build_document_index(indices: np.ndarray, epochs: int, seed: int,
                         separate: bool) -> np.ndarray:
    return _build_document_index(indices, epochs, np.random.RandomState(seed), separate)


def sample_text(dataset: GPTDataset, index: int) -> np.ndarray:
    """The token ids of a sample, before tokens/labels/masks (Megatron's query step alone)."""
    return dataset._query_document_sample_shuffle_indices(index)[0]


def fresh_masks(dataset: GPTDataset) -> None:
    """Forget the masks cached from the first sample: the next ``__getitem__`` computes its
    masks and position ids as a new instance would (the parity harness does the same)."""
    dataset.masks_and_position_ids_are_cached = False


def as_numpy(sample: dict[str, Any]) -> dict[str, np.ndarray]:
    return {key: value.numpy() for key, value in sample.items()}


def data_loader(dataset: GPTDataset, micro_batch_size: int, batches: int, workers: int) -> Any:
    """torch's DataLoader over consecutive micro-batches, as Megatron's pretraining sampler
    (without shuffling) feeds it; ``workers`` forked worker processes, or 0 for in-process."""
    from torch.utils.data import DataLoader

    batch_sampler = [list(range(start, start + micro_batch_size))
                     for start in range(0, batches * micro_batch_size, micro_batch_size)]
    extra = {"prefetch_factor": 2} if workers else {}
    return DataLoader(dataset, batch_sampler=batch_sampler, num_workers=workers, **extra)
