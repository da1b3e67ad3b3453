"""Batches of samples for one data-parallel rank, resumable from a count of consumed samples.

The order is Megatron-LM's `MegatronPretrainingSampler`: the dataset is read in order (its
shuffle index already shuffles), in global micro-batches of `micro_batch_size x data_parallel`
samples, of which rank r takes the r-th contiguous `micro_batch_size`. Resuming from
`consumed_samples` (a multiple of the global micro-batch, counted over all ranks, as the
trainer's checkpoint records it) yields exactly the batches an uninterrupted run would have
yielded from there.

With `shuffle: true` the order within each pass over the dataset is additionally permuted by
a numpy generator seeded with `seed + epoch`, `epoch` counting the passes from 0, so every
pass has its own order (Megatron's random sampler reseeds with the epoch too, with torch's
generator, so that order is not Megatron's). A loader reads one pass; the caller starts the
next with `epoch + 1` (mf-train's `MicroBatchStream` does). With `drop_remainder: false` the last
incomplete global micro-batch is padded with padding samples (index None: loss mask all
zeros), as Megatron pads, so every rank still gets a full batch.

Columns are renamed by position from `column_names` (MindFormers' convention: the first name
is the tokens, then labels, loss_mask, position_ids, then attention_mask or actual_seq_len) and
cast to int32, except the dense attention mask, which stays bool (`[b, 1, S, S]`, True =
masked): as int32 it would be four times the bytes, 256 MiB per sample at S = 8192. Batches
are built ahead in a background thread (`prefetch_size` of them), with `num_parallel_workers`
threads building the samples of a batch, or, with `python_multiprocessing`, that many worker
processes: forked when the loader starts iterating, so each inherits the dataset (its
memory-mapped files included) without pickling it, and only the indices go out and the
samples come back. The batches are the same either way; processes pay a fork and a pickle
per sample, and let sample building run beside the training process's own threads.

Under context parallelism (`context`, a `ContextSplit`; `for_rank` takes it from the plan)
each rank of a context group reads the same samples (they share the data-parallel rank) but
keeps only its own tokens, the spans `mf_parallel.sequence.context_spans` gives it for the
samples' length (causal: chunks r and 2 x CP - 1 - r of 2 x CP; full: the r-th of CP), in span
order: tokens, labels, loss_mask and position_ids are `[b, S / CP]`, the dense attention mask
keeps its query rows at those positions and every key column (`[b, 1, S / CP, S]`), and
`actual_seq_len` stays whole (global document ends, the compact mask every rank reads whole).
A sequence length the split does not divide is refused with the first batch.
"""

from __future__ import annotations

import multiprocessing
import queue
import threading
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import Executor, ProcessPoolExecutor, ThreadPoolExecutor
from typing import Any, Protocol

import numpy as np

from mf_config import TrainDatasetConfig
from mf_parallel import Plan

from .context_split import SEQUENCE_AXIS, ContextSplit, column_dtype, stack_column
from .errors import DataError

SAMPLE_KEYS = ("tokens", "labels", "loss_mask", "position_ids")
"""The fields every GPT sample has, in MindFormers' column order."""


class SampleSource(Protocol):
    """A dataset: `len()` samples, `[i]` a dict of numpy arrays (`[None]`: a padding sample)."""

    def __len__(self) -> int: ...

    def __getitem__(self, index: int | None) -> dict[str, np.ndarray]: ...


def micro_batch_indices(num_samples: int, consumed_samples: int, micro_batch_size: int,
                        data_parallel: int, rank: int, *, drop_remainder: bool = True,
                        shuffle: bool = False, seed: int = 0,
                        epoch: int = 0) -> Iterator[list[int | None]]:
    """The order `BatchLoader` reads in, apart from the samples (Megatron's sampler).

    Args:
        num_samples: samples in the dataset.
        consumed_samples: where to resume in the pass, counted over all ranks.
        micro_batch_size: samples per micro-batch of one rank.
        data_parallel: data-parallel ranks.
        rank: this rank's data-parallel index.
        drop_remainder: drop the last incomplete global micro-batch (else pad it with None).
        shuffle: permute the pass with a generator seeded with `seed + epoch`.
        seed: the shuffle's seed.
        epoch: the pass, counted from 0.

    Yields:
        The sample indices of each of `rank`'s micro-batches (None: a padding sample).

    Raises:
        DataError: `consumed_samples` is not a multiple of the global micro-batch, or too big.
    """
    step = micro_batch_size * data_parallel
    if consumed_samples % step:
        raise DataError(f"consumed_samples {consumed_samples} is not a multiple of the global "
                        f"micro-batch {micro_batch_size} x {data_parallel} = {step}")
    if consumed_samples > num_samples:
        raise DataError(f"consumed_samples {consumed_samples} is past the end of the dataset "
                        f"({num_samples} samples)")
    order = _pass_order(num_samples, shuffle, seed + epoch)
    mine = slice(rank * micro_batch_size, (rank + 1) * micro_batch_size)
    for start in range(consumed_samples, num_samples, step):
        batch: list[int | None] = [int(i) for i in order[start:start + step]]
        if len(batch) < step:
            if drop_remainder:
                return
            batch += [None] * (step - len(batch))
        yield batch[mine]


def _pass_order(num_samples: int, shuffle: bool, seed: int) -> np.ndarray:
    order = np.arange(num_samples, dtype=np.int64)
    if shuffle:
        np.random.default_rng(seed).shuffle(order)
    return order


class BatchLoader:
    """Micro-batches of `dataset` for one data-parallel rank, as dicts of int32 arrays (the
    dense attention mask bool), only this rank's tokens under context parallelism.

    Iterating resumes from `consumed_samples` and advances it (what a checkpoint records).

    Args:
        dataset: the samples (a `GPTDataset`, `BlendedDataset`, or any `SampleSource`).
        micro_batch_size: samples per micro-batch of this rank.
        data_parallel: data-parallel ranks.
        rank: this rank's data-parallel index.
        column_names: the batch's keys, naming the sample's fields by position.
        consumed_samples: where to start, counted over all ranks.
        drop_remainder: drop the last incomplete global micro-batch (else pad it).
        shuffle: permute each pass, seeded with `seed + epoch`.
        seed: the shuffle's seed.
        epoch: the pass over the dataset, counted from 0.
        num_parallel_workers: threads (or processes) building the samples of a batch.
        python_multiprocessing: build the samples in forked worker processes, not threads.
        prefetch_size: batches built ahead in a background thread.
        context: this rank's place in its context-parallel group (None: the whole sequence);
            the tokens it keeps follow from the samples' own length (`ContextSplit.spans`).

    Raises:
        DataError: `rank` is outside `data_parallel`, or `micro_batch_size` is below 1.
    """

    def __init__(self, dataset: SampleSource, *, micro_batch_size: int, data_parallel: int = 1,
                 rank: int = 0, column_names: Sequence[str] = ("input_ids", "labels"),
                 consumed_samples: int = 0, drop_remainder: bool = True, shuffle: bool = False,
                 seed: int = 0, epoch: int = 0, num_parallel_workers: int = 1,
                 python_multiprocessing: bool = False, prefetch_size: int = 1,
                 context: ContextSplit | None = None):
        if not 0 <= rank < data_parallel:
            raise DataError(f"rank {rank} is outside the data-parallel size {data_parallel}")
        if micro_batch_size < 1:
            raise DataError(f"micro_batch_size must be >= 1, got {micro_batch_size}")
        self.dataset = dataset
        self.micro_batch_size = micro_batch_size
        self.data_parallel = data_parallel
        self.rank = rank
        self.column_names = list(column_names)
        self.consumed_samples = consumed_samples
        self.drop_remainder = drop_remainder
        self.shuffle = shuffle
        self.seed = seed
        self.epoch = epoch
        self.num_parallel_workers = num_parallel_workers
        self.python_multiprocessing = python_multiprocessing
        self.prefetch_size = prefetch_size
        self.context = context
        self._indices = micro_batch_indices(len(dataset), consumed_samples, micro_batch_size,
                                            data_parallel, rank, drop_remainder=drop_remainder,
                                            shuffle=shuffle, seed=seed, epoch=epoch)

    @classmethod
    def for_rank(cls, dataset: SampleSource, train_dataset: TrainDatasetConfig, plan: Plan,
                 rank: int, *, consumed_samples: int = 0, seed: int = 0, epoch: int = 0,
                 column_names: Sequence[str] | None = None) -> BatchLoader:
        """The loader of one global rank, as the configuration and the parallel plan say.

        Ranks that differ only in tensor, context or pipeline position read the same samples;
        with `plan.dims.context` > 1 each context rank keeps only its tokens (its place in the
        plan's context group, split causally when `plan.dims.context_causal`).

        Args:
            dataset: the samples.
            train_dataset: the `train_dataset` section (columns, remainder, shuffle, workers).
            plan: the parallel plan; its micro-batch size and data-parallel groups are used.
            rank: the global rank.
            consumed_samples: where to resume, counted over all ranks.
            seed: the shuffle's seed.
            epoch: the pass over the dataset, counted from 0.
            column_names: replaces `train_dataset.dataloader.column_names` (a trainer that
                takes particular fields asks for them).

        Returns:
            The loader of `rank`'s micro-batches.
        """
        groups = plan.mesh.groups_of(rank)
        data_group, context_group = groups["data"], groups["context"]
        context = None
        if len(context_group) > 1:
            context = ContextSplit(len(context_group), context_group.index(rank),
                                   plan.dims.context_causal)
        return cls(dataset, micro_batch_size=plan.batch.micro_batch_size,
                   data_parallel=len(data_group), rank=data_group.index(rank),
                   column_names=column_names or train_dataset.dataloader.column_names,
                   consumed_samples=consumed_samples,
                   drop_remainder=train_dataset.drop_remainder,
                   shuffle=train_dataset.dataloader.shuffle, seed=seed, epoch=epoch,
                   num_parallel_workers=train_dataset.num_parallel_workers,
                   python_multiprocessing=train_dataset.dataloader.python_multiprocessing,
                   prefetch_size=train_dataset.prefetch_size, context=context)

    def __len__(self) -> int:
        """Micro-batches left for this rank."""
        step = self.micro_batch_size * self.data_parallel
        left = len(self.dataset) - self.consumed_samples
        return left // step if self.drop_remainder else -(-left // step)

    def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
        """Batches from the current position; each advances `consumed_samples` by one global
        micro-batch (what a checkpoint should record)."""
        with self._workers() as pool:
            for batch in _prefetched(self._batches(pool), self.prefetch_size):
                self.consumed_samples += self.micro_batch_size * self.data_parallel
                yield batch

    def _workers(self) -> Executor:
        """The threads, or the forked processes (`python_multiprocessing`), that build
        samples."""
        if not self.python_multiprocessing:
            return ThreadPoolExecutor(self.num_parallel_workers)
        return ProcessPoolExecutor(self.num_parallel_workers,
                                   mp_context=multiprocessing.get_context("fork"),
                                   initializer=_hold_dataset, initargs=(self.dataset,))

    def _batches(self, pool: Executor) -> Iterator[dict[str, np.ndarray]]:
        build = _held_sample if self.python_multiprocessing else self.dataset.__getitem__
        for indices in self._indices:
            samples = list(pool.map(build, indices))
            yield self.collate(samples)

    def collate(self, samples: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
        """Stack samples into named columns in `column_names` order: int32, the dense
        attention mask bool; under context parallelism only this rank's tokens (each field
        copied once, straight from the samples into the batch)."""
        keys = _checked_keys(samples[0], self.column_names)
        spans = None
        if self.context is not None:
            spans = self.context.spans(len(samples[0]["tokens"]))
        return {name: stack_column([sample[key] for sample in samples],
                                   SEQUENCE_AXIS.get(key), spans)
                for name, key in zip(self.column_names, keys, strict=False)}


def sample_columns(sample: dict[str, Any]) -> list[str]:
    """A sample's fields in column order: tokens, labels, loss_mask, position_ids, then
    actual_seq_len or attention_mask when present."""
    extra = [key for key in ("actual_seq_len", "attention_mask") if key in sample]
    return [*SAMPLE_KEYS, *extra[:1]]


def named_columns(sample: dict[str, np.ndarray],
                  column_names: Sequence[str]) -> dict[str, np.ndarray]:
    """The sample's fields named by `column_names` by position, as int32 (MindFormers'
    convention), the dense attention mask bool: the columns of one batch row."""
    keys = _checked_keys(sample, column_names)
    return {name: np.asarray(sample[key]).astype(column_dtype(np.asarray(sample[key])))
            for name, key in zip(column_names, keys, strict=False)}


def _checked_keys(sample: dict[str, Any], column_names: Sequence[str]) -> list[str]:
    keys = sample_columns(sample)
    if len(column_names) > len(keys):
        raise DataError(f"train_dataset.dataloader.column_names has {len(column_names)} names "
                        f"{list(column_names)}, but the samples have {len(keys)} columns {keys}")
    return keys


_WORKER_DATASET: list[SampleSource] = []
"""The dataset of a forked worker process (inherited from the loader, never pickled)."""


def _hold_dataset(dataset: SampleSource) -> None:
    _WORKER_DATASET[:] = [dataset]


def _held_sample(index: int | None) -> dict[str, np.ndarray]:
    return _WORKER_DATASET[0][index]


_DONE = object()
PREFETCH_STOP_WAIT = 2.0
"""Seconds a closed prefetching iterator waits for its producer thread to end."""


def _prefetched(batches: Iterator[Any], depth: int) -> Iterator[Any]:
    """`batches`, computed up to `depth` ahead in a background thread (errors re-raised)."""
    buffer: queue.Queue[Any] = queue.Queue(maxsize=max(1, depth))
    stop = threading.Event()

    def produce() -> None:
        try:
            for batch in batches:
                if stop.is_set():
                    return
                buffer.put(batch)
            buffer.put(_DONE)
        except BaseException as exc:  # handed to the consumer, raised there
            buffer.put(exc)

    worker = threading.Thread(target=produce, name="mf-data-prefetch", daemon=True)
    worker.start()
    try:
        while True:
            item = buffer.get()
            if item is _DONE:
                return
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        stop.set()
        # Unblock a producer waiting on a full buffer and wait for it to end, for a bounded
        # time: when the garbage collector closes this generator inside a call holding a lock
        # the producer needs (concurrent.futures' global lock, taken by any executor's
        # `submit` on this thread), the producer cannot end until this returns. It then ends
        # at its next batch (a daemon thread, `stop` set).
        deadline = time.monotonic() + PREFETCH_STOP_WAIT
        while worker.is_alive() and time.monotonic() < deadline:
            try:
                buffer.get_nowait()
            except queue.Empty:
                worker.join(timeout=0.05)
