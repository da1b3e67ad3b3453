"""`mindspore.dataset` for users who want MindSpore's pipeline on top of mf-data's loader.

The batches are exactly `BatchLoader`'s (same order, same resume point, same int32 columns);
MindSpore only drives the iteration, so `map`, `repeat` or device sinking can follow. This is
the one module of mf-data that imports MindSpore (the optional extra `mf-data[mindspore]`).
"""

from __future__ import annotations

from collections.abc import Iterator

import mindspore.dataset as msds
import numpy as np

from .loader import BatchLoader


class _Batches:
    """A re-iterable source of tuples in column order (what GeneratorDataset consumes)."""

    def __init__(self, loader: BatchLoader):
        self.loader = loader

    def __iter__(self) -> Iterator[tuple[np.ndarray, ...]]:
        for batch in self.loader:
            yield tuple(batch[name] for name in self.loader.column_names)

    def __len__(self) -> int:
        return len(self.loader)


def to_mindspore_dataset(loader: BatchLoader) -> msds.GeneratorDataset:
    """The loader's micro-batches for MindSpore's data pipeline.

    Args:
        loader: the rank's loader; its order is kept (not shuffled again).

    Returns:
        A `mindspore.dataset.GeneratorDataset`, one row per micro-batch, columns named by
        the loader's `column_names`.
    """
    return msds.GeneratorDataset(_Batches(loader), column_names=list(loader.column_names),
                                 shuffle=False, num_parallel_workers=1)
