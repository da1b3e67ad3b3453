"""The trainer's micro-batches: one rank's endless stream, resumable from consumed samples.

The loader `train_dataset.dataloader.type` selects comes from the `DATALOADERS` registry; the
built-in `BlendedMegatronDatasetDataLoader` builds mf-data's Megatron GPT datasets and reads
them with mf-data's `BatchLoader` in Megatron's sampler order. When a pass over the training
split ends, the next pass starts from its beginning (as MindFormers recreates its iterator),
so `consumed_samples` keeps counting across passes and a resumed run lands on the same sample.
With `shuffle: true` each pass has its own order (the loader's seed plus the pass number).

Each micro-batch reaches the model as (tokens, labels, loss_mask), taken from the samples by
field whatever `column_names` says: the loss mask the data settings ask for (`eod_mask_loss`,
padding) always applies. Further columns (`position_ids`, attention masks) are not built for
the trainer: the models do not take them yet (`support` warns when `column_names` asks).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import numpy as np

from mf_config import TrainDatasetConfig
from mf_config.yaml_source import Source
from mf_data.builder import build_datasets
from mf_data.loader import BatchLoader
from mf_parallel import Plan

from .registry import DATALOADERS

LOG = logging.getLogger(__name__)
TRAINER_COLUMNS = ("input_ids", "labels", "loss_mask")
"""The fields each micro-batch gives the model (the loader's first three sample fields)."""


class MicroBatchStream:
    """Micro-batches of one rank from `consumed_samples` on, pass after pass."""

    def __init__(self, dataset: Any, train_dataset: TrainDatasetConfig, plan: Plan, rank: int,
                 *, consumed_samples: int, seed: int):
        self._make = lambda consumed, epoch: BatchLoader.for_rank(
            dataset, train_dataset, plan, rank, consumed_samples=consumed, seed=seed,
            epoch=epoch, column_names=TRAINER_COLUMNS)
        step = self.step_samples = plan.batch.samples_per_micro_step
        """Samples one micro-batch consumes over all data-parallel ranks."""
        self.samples_per_pass = (len(dataset) // step) * step if train_dataset.drop_remainder \
            else -(-len(dataset) // step) * step
        if self.samples_per_pass == 0:
            raise ValueError(f"the training split has {len(dataset)} samples, fewer than one "
                             f"global micro-batch ({step}): raise train_dataset.dataloader."
                             "sizes[0] or lower training.local_batch_size")
        self.consumed_samples = consumed_samples
        self._iterator: Iterator[dict[str, np.ndarray]] = iter(())
        self._open()

    def _open(self) -> None:
        epoch, within = divmod(self.consumed_samples, self.samples_per_pass)
        self._iterator = iter(self._make(within, epoch))

    def __iter__(self) -> MicroBatchStream:
        return self

    def __next__(self) -> tuple[np.ndarray, ...]:
        try:
            batch = next(self._iterator)
        except StopIteration:
            LOG.info("end of a pass over the training data after %d samples; starting the "
                     "next pass", self.consumed_samples)
            self._open()
            batch = next(self._iterator)
        self.consumed_samples += self.step_samples
        return tuple(batch[name] for name in TRAINER_COLUMNS)


@DATALOADERS.register("BlendedMegatronDatasetDataLoader")
def megatron_stream(train_dataset: TrainDatasetConfig, plan: Plan, rank: int, *,
                    consumed_samples: int, seed: int,
                    source: Source | None = None) -> MicroBatchStream:
    """mf-data's Megatron GPT datasets (the training split) as this rank's stream."""
    train, _valid, _test = build_datasets(train_dataset.dataloader)
    if train is None:
        raise ValueError("train_dataset.dataloader.sizes[0]: the training split is empty")
    return MicroBatchStream(train, train_dataset, plan, rank,
                            consumed_samples=consumed_samples, seed=seed)


def build_stream(train_dataset: TrainDatasetConfig, plan: Plan, rank: int, *,
                 consumed_samples: int, seed: int, source: Source | None = None) -> Any:
    """This rank's micro-batch stream, from the loader `train_dataset.dataloader.type` names.

    Args:
        train_dataset: the `train_dataset` section.
        plan: the parallel plan (batch sizes, this rank's data-parallel place).
        rank: this rank.
        consumed_samples: samples already consumed over all ranks (where a resumed run is).
        seed: the loader's seed when `shuffle` (plus the pass number).
        source: the YAML source, for error lines.

    Returns:
        An iterator of (tokens, labels, loss mask) with a `consumed_samples` count.
    """
    make = DATALOADERS.get(train_dataset.dataloader.type,
                           ("train_dataset", "dataloader", "type"), source)
    return make(train_dataset, plan, rank, consumed_samples=consumed_samples, seed=seed,
                source=source)
