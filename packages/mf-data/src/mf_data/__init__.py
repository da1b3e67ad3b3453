"""mf-data: Megatron indexed datasets, GPT samples, blending and the loader.

    from mf_data import build_datasets, BatchLoader
    train, valid, test = build_datasets(config.train_dataset.dataloader)
    loader = BatchLoader.for_rank(train, config.train_dataset, plan, rank)

Samples are Megatron-LM's (megatron-core 0.16.1), bit for bit. Importing this package is cheap:
the names below load their modules (and numpy) on first use.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "BatchLoader": "loader",
    "BlendedDataset": "blended_dataset",
    "ContextSplit": "context_split",
    "DataError": "errors",
    "GPTDataset": "gpt_dataset",
    "GPTDatasetConfig": "gpt_dataset",
    "IndexedDataset": "indexed",
    "IndexedDatasetBuilder": "indexed",
    "build_datasets": "builder",
    "write_indexed": "indexed",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'mf_data' has no attribute {name!r}")
    return getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
