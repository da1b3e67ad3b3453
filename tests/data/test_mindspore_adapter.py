"""The MindSpore dataset adapter yields exactly the loader's batches."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("mindspore")

from mf_data.loader import BatchLoader
from mf_data.mindspore_adapter import to_mindspore_dataset


class Squares:
    def __len__(self) -> int:
        return 10

    def __getitem__(self, i):
        tokens = np.array([i, i * i, i + 1])
        return {"tokens": tokens, "labels": tokens + 1, "loss_mask": np.ones(3),
                "position_ids": np.arange(3)}


def loader(**kwargs) -> BatchLoader:
    return BatchLoader(Squares(), micro_batch_size=2, data_parallel=2, rank=1,
                       column_names=["input_ids", "labels", "loss_mask"], **kwargs)


def test_mindspore_rows_equal_the_loader_batches() -> None:
    expected = list(loader())
    dataset = to_mindspore_dataset(loader())
    rows = list(dataset.create_dict_iterator(output_numpy=True, num_epochs=1))
    assert len(rows) == len(expected) == 2
    for row, batch in zip(rows, expected, strict=True):
        assert list(row) == ["input_ids", "labels", "loss_mask"]
        for name in batch:
            assert row[name].dtype == np.int32
            np.testing.assert_array_equal(row[name], batch[name])


def test_mindspore_resumes_like_the_loader() -> None:
    rows = list(to_mindspore_dataset(loader(consumed_samples=4)).create_dict_iterator(
        output_numpy=True, num_epochs=1))
    np.testing.assert_array_equal(rows[0]["input_ids"], [[6, 36, 7], [7, 49, 8]])
    assert len(rows) == 1


class Masked(Squares):
    def __getitem__(self, i):
        tokens = np.arange(4) + i
        return {"tokens": tokens, "labels": tokens + 1, "loss_mask": np.ones(4),
                "position_ids": np.arange(4),
                "attention_mask": ~np.tril(np.ones((1, 4, 4), bool)) | (i % 2 == 1)}


def test_bool_mask_and_a_context_ranks_part_pass_through_mindspore() -> None:
    from mf_data.context_split import ContextSplit

    names = ["input_ids", "labels", "loss_mask", "position_ids", "attention_mask"]
    part = BatchLoader(Masked(), micro_batch_size=2, column_names=names,
                       context=ContextSplit(2, 1))
    expected = list(BatchLoader(Masked(), micro_batch_size=2, column_names=names,
                                context=ContextSplit(2, 1)))
    rows = list(to_mindspore_dataset(part).create_dict_iterator(output_numpy=True,
                                                                num_epochs=1))
    assert len(rows) == len(expected) == 5
    for row, batch in zip(rows, expected, strict=True):
        assert row["attention_mask"].dtype == np.bool_
        assert row["attention_mask"].shape == (2, 1, 2, 4)
        assert row["input_ids"].shape == (2, 2)
        for name in names:
            np.testing.assert_array_equal(row[name], batch[name])
