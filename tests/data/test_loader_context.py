"""The loader's columns on real GPT samples: the dense mask kept bool, and each context-parallel
rank's part of the batch against numpy slicing of the one-process batch."""

from __future__ import annotations

import numpy as np
import pytest

from mf_config import ParallelismConfig, TrainDatasetConfig, TrainingConfig
from mf_config.converter import converter
from mf_data.context_split import ContextSplit
from mf_data.errors import DataError
from mf_data.gpt_dataset import GPTDataset, GPTDatasetConfig
from mf_data.indexed import IndexedDataset, write_indexed
from mf_data.loader import BatchLoader, named_columns
from mf_parallel import make_plan

EOD = 2
SEQ = 16
ALL_COLUMNS = ["input_ids", "labels", "loss_mask", "position_ids", "mask"]
PER_TOKEN = ["input_ids", "labels", "loss_mask", "position_ids"]
DENSE = {"reset_attention_mask": True, "reset_position_ids": True, "eod_mask_loss": True}
COMPACT = {**DENSE, "create_compressed_eod_mask": True, "eod_pad_length": 16}


@pytest.fixture(scope="module")
def prefix(tmp_path_factory) -> str:
    """Short documents (1..6 tokens, ending in EOD) so every sample holds several."""
    rng = np.random.default_rng(3)
    documents = []
    for _ in range(120):
        tokens = rng.integers(3, 50, int(rng.integers(1, 7))).tolist()
        documents.append([*tokens, EOD])
    path = str(tmp_path_factory.mktemp("context") / "corpus")
    write_indexed(path, documents, dtype=np.int32)
    return path


def dataset(prefix: str, seq_length: int = SEQ, **flags: object) -> GPTDataset:
    config = GPTDatasetConfig(eod=EOD, path_to_cache="", split="100,0,0",
                              sequence_length=seq_length, **flags)
    indexed = IndexedDataset(prefix)
    return GPTDataset(indexed, prefix, np.arange(len(indexed), dtype=np.int32), None, "train",
                      config)


def batches(data: GPTDataset, context: ContextSplit | None = None,
            columns: list[str] = ALL_COLUMNS) -> list[dict[str, np.ndarray]]:
    return list(BatchLoader(data, micro_batch_size=3, column_names=columns, context=context))


def positions(cp: int, rank: int, causal: bool, seq: int = SEQ) -> np.ndarray:
    """The reference split, written out: 2 x CP chunks, rank r takes r and 2CP-1-r (causal),
    else the r-th of CP chunks."""
    if not causal:
        size = seq // cp
        return np.arange(rank * size, (rank + 1) * size)
    size = seq // (2 * cp)
    late = 2 * cp - 1 - rank
    return np.r_[rank * size:(rank + 1) * size, late * size:(late + 1) * size]


def test_dense_mask_stays_bool_and_other_columns_are_int32(prefix) -> None:
    data = dataset(prefix, **DENSE)
    first = batches(data)[0]
    samples = [data[i] for i in range(3)]
    assert first["mask"].dtype == np.bool_
    assert first["mask"].shape == (3, 1, SEQ, SEQ)
    np.testing.assert_array_equal(first["mask"], np.stack([s["attention_mask"] for s in samples]))
    assert first["mask"].any() and not first["mask"].all()
    for name, key in zip(PER_TOKEN, ["tokens", "labels", "loss_mask", "position_ids"],
                         strict=True):
        assert first[name].dtype == np.int32, name
        np.testing.assert_array_equal(first[name], np.stack([s[key] for s in samples]))
    row = named_columns(samples[1], ALL_COLUMNS)
    assert row["mask"].dtype == np.bool_ and row["loss_mask"].dtype == np.int32
    np.testing.assert_array_equal(row["mask"], samples[1]["attention_mask"])


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
@pytest.mark.parametrize("cp", [2, 4])
@pytest.mark.parametrize("flags", [DENSE, COMPACT], ids=["dense", "compact"])
def test_each_context_rank_gets_its_slice_of_the_batch(prefix, flags, cp, causal) -> None:
    data = dataset(prefix, **flags)
    whole = batches(data)
    mask_key = "mask"
    assert whole[0][mask_key].shape == ((3, 1, SEQ, SEQ) if flags is DENSE else (3, 16))
    rebuilt = [{name: np.full_like(column, -1) for name, column in batch.items()}
               for batch in whole]
    for rank in range(cp):
        mine = positions(cp, rank, causal)
        got = batches(data, ContextSplit(cp, rank, causal))
        assert len(got) == len(whole)
        for part, full, union in zip(got, whole, rebuilt, strict=True):
            for name in PER_TOKEN:
                assert part[name].shape == (3, SEQ // cp)
                np.testing.assert_array_equal(part[name], full[name][:, mine], err_msg=name)
                union[name][:, mine] = part[name]
            if flags is DENSE:
                assert part[mask_key].dtype == np.bool_
                np.testing.assert_array_equal(part[mask_key], full[mask_key][:, :, mine, :])
                union[mask_key][:, :, mine, :] = part[mask_key]
            else:  # global document ends: every rank reads them whole
                np.testing.assert_array_equal(part[mask_key], full[mask_key])
                union[mask_key][...] = part[mask_key]
    for union, full in zip(rebuilt, whole, strict=True):
        for name in full:
            np.testing.assert_array_equal(union[name], full[name], err_msg=name)


def test_a_sequence_the_split_does_not_divide_is_refused(prefix) -> None:
    data = dataset(prefix, seq_length=12, **DENSE)
    with pytest.raises(DataError, match=r"sequence length 12 does not split over "
                                        r"context_parallel 4 into 4 x 2 chunks .*model\."
                                        r"seq_length and train_dataset\.dataloader\.config\."
                                        r"seq_length must be a multiple of 8"):
        batches(data, ContextSplit(4, 1))
    assert batches(data, ContextSplit(4, 1, causal=False))[0]["input_ids"].shape == (3, 3)
    with pytest.raises(DataError, match="context rank 2 is outside the context-parallel size 2"):
        ContextSplit(2, 2)


@pytest.mark.parametrize("mask_type", ["causal", "full"])
def test_for_rank_splits_over_the_plans_context_group(prefix, mask_type) -> None:
    """world 4 = data 2 x context 2: ranks 0 and 1 (one context group) read data rank 0's
    samples, each its own tokens; ranks 2 and 3 data rank 1's."""
    plan = make_plan(ParallelismConfig(context_parallel=2, context_parallel_mask_type=mask_type),
                     TrainingConfig(global_batch_size=6, local_batch_size=3), 4)
    section = converter.structure({"dataloader": {"column_names": ALL_COLUMNS}},
                                  TrainDatasetConfig)
    data = dataset(prefix, **DENSE)
    whole = [next(iter(BatchLoader(data, micro_batch_size=3, data_parallel=2, rank=r,
                                   column_names=ALL_COLUMNS))) for r in range(2)]
    for rank in range(4):
        loader = BatchLoader.for_rank(data, section, plan, rank)
        assert loader.context == ContextSplit(2, rank % 2, mask_type == "causal")
        first = next(iter(loader))
        mine = positions(2, rank % 2, mask_type == "causal")
        full = whole[rank // 2]
        np.testing.assert_array_equal(first["input_ids"], full["input_ids"][:, mine])
        np.testing.assert_array_equal(first["mask"], full["mask"][:, :, mine, :])


def test_worker_processes_give_the_batches_threads_give(prefix) -> None:
    """`python_multiprocessing`: the samples of the real GPT dataset (memory-mapped) built in
    forked worker processes make the same batches, dense masks included, as threads."""
    data = dataset(prefix, **DENSE)
    threads = batches(data)
    processes = list(BatchLoader(data, micro_batch_size=3, column_names=ALL_COLUMNS,
                                 num_parallel_workers=2, python_multiprocessing=True))
    assert len(processes) == len(threads) > 1
    for got, want in zip(processes, threads, strict=True):
        assert list(got) == list(want)
        for name in want:
            assert got[name].dtype == want[name].dtype
            np.testing.assert_array_equal(got[name], want[name])
