"""The trainer's micro-batches: one rank's endless stream, resumable from consumed samples.

The loader `train_dataset.dataloader.type` selects comes from the `DATALOADERS` registry; the
built-in `BlendedMegatronDatasetDataLoader` builds mf-data's Megatron GPT datasets and reads
them with mf-data's `BatchLoader` in Megatron's sampler order. When a pass over the training
split ends, the next pass starts from its beginning (as MindFormers recreates its iterator),
so `consumed_samples` keeps counting across passes and a resumed run lands on the same sample.
With `shuffle: true` each pass has its own order (the loader's seed plus the pass number).

Each micro-batch reaches the model as a `MicroBatch`, taken from the samples by field whatever
`column_names` says: tokens, labels and the loss mask the data settings ask for
(`eod_mask_loss`, padding) always; `position_ids` with `reset_position_ids`; the document
structure with `create_compressed_eod_mask` (the compact document ends, `actual_seq_len`) or
else with `reset_attention_mask` and `create_attention_mask` (the dense bool mask). Without
them the model attends causally over the whole sequence, so the loader's shared causal mask is
not carried. Under context parallelism the loader gives each rank only its tokens.

Every sample's token ids are checked against the model's vocabulary as it is read (mf-data's
`GPTDataset`: one maximum per sample), so an id the embedding cannot look up stops the run
with one line naming the file, the sequence, the id and `model.vocab_size`, instead of failing
inside MindSpore's gather.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import attrs
import numpy as np

from mf_config import TrainDatasetConfig
from mf_config.yaml_source import Source
from mf_data.builder import build_datasets
from mf_data.loader import BatchLoader
from mf_data.loader_config import megatron_settings
from mf_parallel import Plan

from ..layouts.contract import MicroBatch
from ..registry import DATALOADERS
from .batch_fields import attention_fields

LOG = logging.getLogger(__name__)
SPLITS = ("training", "valid", "test")
TRAINER_COLUMNS = ("tokens", "labels", "loss_mask", "position_ids")
"""The sample fields every micro-batch is read with (mf-data's order)."""


class MicroBatchStream:
    """Micro-batches of one rank from `consumed_samples` on, pass after pass."""

    def __init__(self, dataset: Any, train_dataset: TrainDatasetConfig, plan: Plan, rank: int,
                 *, consumed_samples: int, seed: int, fields: tuple[str, ...] = (),
                 split: int = 0):
        extra = [name for name in fields if name not in TRAINER_COLUMNS]
        columns = (*TRAINER_COLUMNS, *extra[:1])
        self.fields = fields
        self.split = SPLITS[split]
        self._make = lambda consumed, epoch: BatchLoader.for_rank(
            dataset, train_dataset, plan, rank, consumed_samples=consumed, seed=seed,
            epoch=epoch, column_names=columns)
        step = self.step_samples = plan.batch.samples_per_micro_step
        """Samples one micro-batch consumes over all data-parallel ranks."""
        self.samples_per_pass = (len(dataset) // step) * step if train_dataset.drop_remainder \
            else -(-len(dataset) // step) * step
        if self.samples_per_pass == 0:
            raise ValueError(f"the {self.split} split has {len(dataset)} samples, fewer "
                             f"than one global micro-batch ({step}): raise "
                             f"train_dataset.dataloader.sizes[{split}] (or its share of "
                             "split) or lower training.local_batch_size")
        self.consumed_samples = consumed_samples
        self._iterator: Iterator[dict[str, np.ndarray]] = iter(())
        self._open()

    def _open(self) -> None:
        epoch, within = divmod(self.consumed_samples, self.samples_per_pass)
        self._iterator = iter(self._make(within, epoch))

    def __iter__(self) -> MicroBatchStream:
        return self

    def __next__(self) -> MicroBatch:
        try:
            batch = next(self._iterator)
        except StopIteration:
            LOG.info("end of a pass over the %s data after %d samples; starting the "
                     "next pass", self.split, self.consumed_samples)
            self._open()
            batch = next(self._iterator)
        self.consumed_samples += self.step_samples
        return MicroBatch(batch["tokens"], batch["labels"], batch["loss_mask"],
                          **{name: batch[name] for name in self.fields})


@DATALOADERS.register("BlendedMegatronDatasetDataLoader")
def megatron_stream(train_dataset: TrainDatasetConfig, plan: Plan, rank: int, *,
                    consumed_samples: int, seed: int, source: Source | None = None,
                    vocab_size: int | None = None) -> MicroBatchStream:
    """mf-data's Megatron GPT datasets (the training split) as this rank's stream, every
    token id checked against `vocab_size` (None: not checked)."""
    train, _valid, _test = build_datasets(train_dataset.dataloader, vocab_size=vocab_size)
    if train is None:
        raise ValueError("train_dataset.dataloader.sizes[0]: the training split is empty")
    data = megatron_settings(train_dataset.dataloader).config
    fields = attention_fields(data.reset_position_ids, data.reset_attention_mask,
                              data.create_attention_mask, data.create_compressed_eod_mask)
    return MicroBatchStream(train, train_dataset, plan, rank,
                            consumed_samples=consumed_samples, seed=seed, fields=fields)


def evaluation_stream(train_dataset: TrainDatasetConfig, plan: Plan, rank: int, *, split: int,
                      consumed_samples: int, vocab_size: int | None = None) -> MicroBatchStream:
    """This rank's micro-batches of the Megatron loader's split `split` (1 valid, 2 test),
    from `consumed_samples` (over all ranks) on, in the split's order whatever `shuffle` says
    (as Megatron's validation sampler), pass after pass.

    Raises:
        ValueError: the settings give the split no samples, or fewer than one global
            micro-batch.
    """
    dataset = build_datasets(train_dataset.dataloader, vocab_size=vocab_size)[split]
    if dataset is None or len(dataset) == 0:
        name, path = SPLITS[split], ("valid_data_path", "test_data_path")[split - 1]
        raise ValueError(f"train_dataset.dataloader: the {name} split is empty, and the "
                         f"Evaluate callback reads it: give it samples (sizes[{split}] and a "
                         f"share of split, or {path})")
    data = megatron_settings(train_dataset.dataloader).config
    fields = attention_fields(data.reset_position_ids, data.reset_attention_mask,
                              data.create_attention_mask, data.create_compressed_eod_mask)
    in_order = attrs.evolve(train_dataset, dataloader=attrs.evolve(train_dataset.dataloader,
                                                                   shuffle=False))
    return MicroBatchStream(dataset, in_order, plan, rank, consumed_samples=consumed_samples,
                            seed=0, fields=fields, split=split)


def build_stream(train_dataset: TrainDatasetConfig, plan: Plan, rank: int, *,
                 consumed_samples: int, seed: int, source: Source | None = None,
                 vocab_size: int | None = None) -> Any:
    """This rank's micro-batch stream, from the loader `train_dataset.dataloader.type` names.

    Args:
        train_dataset: the `train_dataset` section.
        plan: the parallel plan (batch sizes, this rank's data-parallel place).
        rank: this rank.
        consumed_samples: samples already consumed over all ranks (where a resumed run is).
        seed: the loader's seed when `shuffle` (plus the pass number).
        source: the YAML source, for error lines.
        vocab_size: the model's vocabulary: a token id outside it stops the stream with one
            line naming the file (None: ids are not checked).

    Returns:
        An iterator of `MicroBatch` with a `consumed_samples` count.
    """
    make = DATALOADERS.get(train_dataset.dataloader.type,
                           ("train_dataset", "dataloader", "type"), source)
    return make(train_dataset, plan, rank, consumed_samples=consumed_samples, seed=seed,
                source=source, vocab_size=vocab_size)
