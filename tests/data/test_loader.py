"""The loader: Megatron's micro-batch order per data-parallel rank, resuming, columns, prefetch."""

from __future__ import annotations

import concurrent.futures.thread as futures_thread
import os
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from mf_data.errors import DataError
from mf_data.loader import PREFETCH_STOP_WAIT, BatchLoader, _prefetched, micro_batch_indices


def megatron_sampler(total: int, consumed: int, micro: int, dp: int, rank: int,
                     drop_last: bool) -> list[list[int]]:
    """Megatron-LM's MegatronPretrainingSampler, written out plainly (the reference)."""
    out, batch = [], []
    for idx in range(consumed, total):
        batch.append(idx)
        if len(batch) == micro * dp:
            out.append(batch[rank * micro:(rank + 1) * micro])
            batch = []
    if batch and not drop_last:
        out.append(batch[rank * micro:(rank + 1) * micro])
    return out


@pytest.mark.parametrize(("total", "micro", "dp"), [(20, 2, 2), (23, 2, 3), (7, 1, 1), (5, 4, 2)])
def test_order_is_megatrons_sampler(total, micro, dp) -> None:
    for rank in range(dp):
        got = list(micro_batch_indices(total, 0, micro, dp, rank))
        assert got == megatron_sampler(total, 0, micro, dp, rank, drop_last=True)


def test_ranks_split_each_global_micro_batch_contiguously() -> None:
    per_rank = [list(micro_batch_indices(24, 0, 2, 3, r)) for r in range(3)]
    for step in range(4):
        together = [i for r in range(3) for i in per_rank[r][step]]
        assert together == list(range(6 * step, 6 * step + 6))


@pytest.mark.parametrize("shuffle", [False, True])
def test_resuming_gives_exactly_the_rest_of_an_uninterrupted_run(shuffle) -> None:
    for rank in range(2):
        whole = list(micro_batch_indices(40, 0, 3, 2, rank, shuffle=shuffle, seed=5))
        for consumed_steps in range(len(whole) + 1):
            resumed = list(micro_batch_indices(40, consumed_steps * 6, 3, 2, rank,
                                               shuffle=shuffle, seed=5))
            assert resumed == whole[consumed_steps:]


def flat(rank: int, seed: int) -> list[int]:
    return [i for batch in micro_batch_indices(30, 0, 5, 2, rank, shuffle=True, seed=seed)
            for i in batch]


def test_shuffle_is_a_seeded_permutation() -> None:
    a, b = flat(0, 1), flat(1, 1)
    assert sorted(a + b) == list(range(30))
    assert a != list(range(15))
    assert a == flat(0, 1)
    assert a != flat(0, 2)


def test_keeping_the_remainder_pads_with_padding_samples() -> None:
    got = [list(micro_batch_indices(7, 0, 2, 2, r, drop_remainder=False)) for r in range(2)]
    assert got == [[[0, 1], [4, 5]], [[2, 3], [6, None]]]


def test_consumed_samples_must_fit_the_global_micro_batch() -> None:
    with pytest.raises(DataError, match=r"consumed_samples 5 is not a multiple of the global "
                                        r"micro-batch 2 x 2 = 4"):
        list(micro_batch_indices(20, 5, 2, 2, 0))
    with pytest.raises(DataError, match=r"consumed_samples 24 is past the end of the dataset "
                                        r"\(20 samples\)"):
        list(micro_batch_indices(20, 24, 2, 2, 0))


class CountingSamples:
    """A tiny dataset: sample i is tokens [i, i+1, i+2] (float64, to check the int32 cast);
    a padding sample has loss_mask zeros."""

    def __init__(self, n: int, fail_at: int | None = None):
        self.n, self.fail_at = n, fail_at
        self.threads: set[str] = set()

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i):
        self.threads.add(threading.current_thread().name)
        if i is not None and i == self.fail_at:
            raise DataError(f"sample {i} is broken")
        base = 0 if i is None else i
        tokens = np.arange(base, base + 3, dtype=np.float64)
        return {"tokens": tokens, "labels": tokens + 1,
                "loss_mask": np.zeros(3) if i is None else np.ones(3),
                "position_ids": np.arange(3), "attention_mask": np.zeros((1, 3, 3), bool)}


def test_batches_are_named_int32_columns_in_order() -> None:
    loader = BatchLoader(CountingSamples(8), micro_batch_size=2, data_parallel=2, rank=1,
                         column_names=["input_ids", "labels", "loss_mask"])
    batches = list(loader)
    assert len(batches) == 2 == len(BatchLoader(CountingSamples(8), micro_batch_size=2,
                                                data_parallel=2, rank=1))
    first = batches[0]
    assert list(first) == ["input_ids", "labels", "loss_mask"]
    assert all(v.dtype == np.int32 for v in first.values())
    np.testing.assert_array_equal(first["input_ids"], [[2, 3, 4], [3, 4, 5]])
    np.testing.assert_array_equal(first["labels"], [[3, 4, 5], [4, 5, 6]])
    assert loader.consumed_samples == 8


def test_attention_mask_is_the_fifth_column() -> None:
    loader = BatchLoader(CountingSamples(2), micro_batch_size=2, column_names=[
        "input_ids", "labels", "loss_mask", "position_ids", "attention_mask"])
    batch = next(iter(loader))
    assert batch["attention_mask"].shape == (2, 1, 3, 3)


def test_too_many_column_names_is_an_error() -> None:
    loader = BatchLoader(CountingSamples(2), micro_batch_size=2,
                         column_names=["a", "b", "c", "d", "e", "f"])
    with pytest.raises(DataError, match=r"column_names has 6 names .* but the samples have 5"):
        next(iter(loader))


def test_resumed_loader_continues_where_the_first_stopped() -> None:
    first = BatchLoader(CountingSamples(12), micro_batch_size=2, data_parallel=2, rank=0)
    seen = []
    for batch in first:
        seen.append(batch["input_ids"][:, 0].tolist())
        if len(seen) == 1:
            break
    resumed = BatchLoader(CountingSamples(12), micro_batch_size=2, data_parallel=2, rank=0,
                          consumed_samples=first.consumed_samples)
    rest = [b["input_ids"][:, 0].tolist() for b in resumed]
    whole = [b["input_ids"][:, 0].tolist() for b in BatchLoader(
        CountingSamples(12), micro_batch_size=2, data_parallel=2, rank=0)]
    assert seen + rest == whole == [[0, 1], [4, 5], [8, 9]]


def test_errors_in_the_background_reach_the_consumer() -> None:
    loader = BatchLoader(CountingSamples(8, fail_at=5), micro_batch_size=2, prefetch_size=2)
    got = []
    with pytest.raises(DataError, match="sample 5 is broken"):
        for batch in loader:
            got.append(batch["input_ids"][0, 0])
    assert got == [0, 2]


def test_samples_are_built_by_worker_threads() -> None:
    data = CountingSamples(16)
    list(BatchLoader(data, micro_batch_size=4, num_parallel_workers=3))
    assert "MainThread" not in data.threads
    assert 1 <= len(data.threads) <= 3


class ProcessIds:
    """Sample i: tokens [i, pid, pid] where pid is the process that built it."""

    def __len__(self) -> int:
        return 16

    def __getitem__(self, i):
        tokens = np.array([i, os.getpid(), os.getpid()])
        return {"tokens": tokens, "labels": tokens, "loss_mask": np.ones(3),
                "position_ids": np.arange(3)}


def test_python_multiprocessing_builds_samples_in_worker_processes() -> None:
    """Each sample is built in one of `num_parallel_workers` forked processes, none of them
    this one; the batches are in order (the same batches as threads build:
    test_loader_context.py)."""
    batches = list(BatchLoader(ProcessIds(), micro_batch_size=4, num_parallel_workers=2,
                               python_multiprocessing=True))
    tokens = np.concatenate([batch["input_ids"] for batch in batches])
    assert tokens[:, 0].tolist() == list(range(16))
    assert os.getpid() not in set(tokens[:, 1].tolist())
    assert 1 <= len(set(tokens[:, 1].tolist())) <= 2


def test_invalid_rank_and_batch() -> None:
    with pytest.raises(DataError, match="rank 2 is outside the data-parallel size 2"):
        BatchLoader(CountingSamples(4), micro_batch_size=1, data_parallel=2, rank=2)
    with pytest.raises(DataError, match="micro_batch_size must be >= 1, got 0"):
        BatchLoader(CountingSamples(4), micro_batch_size=0)


def test_for_rank_takes_the_data_parallel_position_from_the_plan() -> None:
    """world 4 = data 2 x tensor 2: ranks 0 and 1 (one tensor group) read data rank 0's
    batches, ranks 2 and 3 data rank 1's; settings come from train_dataset."""
    from mf_config import ParallelismConfig, TrainDatasetConfig, TrainingConfig
    from mf_config.converter import converter
    from mf_parallel import make_plan

    plan = make_plan(ParallelismConfig(tensor_parallel=2),
                     TrainingConfig(global_batch_size=8, local_batch_size=2), 4)
    section = converter.structure({"dataloader": {"column_names": ["input_ids"],
                                                  "python_multiprocessing": True},
                                   "num_parallel_workers": 2, "prefetch_size": 3},
                                  TrainDatasetConfig)
    firsts = []
    for rank in range(4):
        loader = BatchLoader.for_rank(CountingSamples(16), section, plan, rank)
        assert (loader.micro_batch_size, loader.data_parallel) == (2, 2)
        assert (loader.num_parallel_workers, loader.prefetch_size) == (2, 3)
        assert loader.python_multiprocessing
        firsts.append(next(iter(loader))["input_ids"][:, 0].tolist())
    assert firsts == [[0, 1], [0, 1], [2, 3], [2, 3]]


def test_a_prefetching_loader_closed_under_the_executor_lock_does_not_hang() -> None:
    """The garbage collector may close a loader's prefetching iterator inside a call that
    holds concurrent.futures' global lock (any executor's `submit` on that thread), while the
    producer thread needs that lock for its next batch: closing returns (within the bounded
    wait) instead of waiting for the producer forever."""
    def batches():
        while True:
            with ThreadPoolExecutor(1) as pool:
                yield pool.submit(int).result()

    prefetched = _prefetched(batches(), depth=1)
    assert next(prefetched) == 0

    def close_holding_the_lock() -> None:
        with futures_thread._global_shutdown_lock:
            prefetched.close()

    closer = threading.Thread(target=close_holding_the_lock, daemon=True)
    closer.start()
    closer.join(timeout=PREFETCH_STOP_WAIT + 10)
    assert not closer.is_alive()
