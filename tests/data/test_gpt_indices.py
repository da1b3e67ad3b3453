"""The vectorised GPT indices against plain-Python references of Megatron's algorithms.

The references below are deliberately naive transcriptions of the reference notes
(megatron-datasets.md section 3): the C++ sample-index walk as a Python loop, the document index
via ``numpy.mgrid`` + shuffle + concatenate, the epoch count as a counting loop.
"""

from __future__ import annotations

from unittest import mock

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

import mf_data.gpt_indices as gpt_indices
from mf_data.compiled_walk import walker
from mf_data.errors import DataError
from mf_data.gpt_indices import (
    build_document_index,
    build_gpt_indices,
    build_sample_index,
    build_shuffle_index,
    num_epochs,
    sample_count,
    sample_index_dtype,
    samples_before_final_epoch,
    separate_final_epoch,
    shuffle_index_dtype,
    tokens_per_epoch,
)

# --------------------------------------------------------------------------- references


def reference_count(epochs: int, tokens: int, seq_length: int, drop_last: bool,
                    extra: int) -> int:
    total = epochs * tokens - extra
    if drop_last:
        quotient = abs(total) // seq_length  # C++ division truncates toward zero
        return quotient if total >= 0 else -quotient
    return int(np.ceil(np.float32(total) / np.float32(seq_length)))  # float, as helpers.cpp


def reference_sample_index(sizes, doc_idx, seq_length, epochs, tokens, drop_last, extra):
    """helpers.cpp build_sample_idx, line by line, in Python."""
    count = reference_count(epochs, tokens, seq_length, drop_last, extra)
    rows = [(0, 0)]
    position, offset = 0, 0
    while len(rows) <= count:
        remaining = seq_length + extra
        while remaining != 0:
            length = int(sizes[doc_idx[position]]) - offset
            remaining -= length
            if remaining <= 0:
                offset += remaining + length - extra
                remaining = 0
            else:
                if position == len(doc_idx) - 1:
                    offset = int(sizes[doc_idx[position]]) - extra
                    break
                position += 1
                offset = 0
        rows.append((position, offset))
    return np.array(rows, dtype=np.int64).reshape(-1, 2)


def reference_num_epochs(tokens: int, seq_length: int, num_samples: int | None,
                         extra: int) -> int:
    epochs, total = 1, tokens
    if num_samples is None:
        return 1
    while total < num_samples * seq_length + extra:
        epochs += 1
        total += tokens
    return epochs


def reference_document_index(indices, epochs, rs, separate):
    if not separate or epochs == 1:
        grid = np.mgrid[0:epochs, 0:len(indices)][1]
        grid[:] = indices
        flat = grid.reshape(-1).astype(np.int32)
        rs.shuffle(flat)
        return flat
    first = reference_document_index(indices, epochs - 1, rs, False)
    last = reference_document_index(indices, 1, rs, False)
    return np.concatenate((first, last))


def reference_shuffle_index(num_samples, total, rs):
    first = np.arange(0, num_samples, dtype=np.uint32)
    rs.shuffle(first)
    if num_samples == total:
        return first
    last = np.arange(num_samples, total, dtype=np.uint32)
    rs.shuffle(last)
    return np.concatenate((first, last))


def reference_indices(sizes, indices, num_samples, seq_length, seed, extra, drop_last):
    """gpt_dataset.py _build_document_sample_shuffle_indices, with the references above."""
    tokens = int(np.sum(sizes[indices]))
    epochs = reference_num_epochs(tokens, seq_length, num_samples, extra)
    separate = False
    if epochs > 1:
        before = ((epochs - 1) * tokens - extra) // seq_length
        per_epoch = (tokens - extra) // seq_length
        separate = (num_samples - before) < int(0.80 * per_epoch)
    rs = np.random.RandomState(seed)
    document_index = reference_document_index(indices, epochs, rs, separate)
    sample_index = reference_sample_index(sizes, document_index, seq_length, epochs, tokens,
                                          drop_last, extra)
    total = len(sample_index) - 1
    first = ((epochs - 1) * tokens - extra) // seq_length if separate else total
    return document_index, sample_index, reference_shuffle_index(first, total, rs)


# --------------------------------------------------------------------------- sample index

# (chunk entries, search cost): the default, and small chunks forcing each row strategy.
STRATEGIES = [(gpt_indices._CHUNK, gpt_indices._SEARCH_COST), (3, 0), (3, 10**9), (7, 2)]


@st.composite
def walk_cases(draw):
    count = draw(st.integers(1, 20))
    sizes = np.array(draw(st.lists(st.integers(0, 60), min_size=count, max_size=count)),
                     dtype=np.int32)
    assume(sizes.sum() > 0)
    epochs = draw(st.integers(1, 4))
    seed = draw(st.integers(0, 2**32 - 1))
    document_index = np.tile(np.arange(count, dtype=np.int32), epochs)
    np.random.RandomState(seed).shuffle(document_index)
    return (sizes, document_index, draw(st.integers(1, 50)), epochs, int(sizes.sum()),
            draw(st.booleans()), draw(st.integers(0, 1)))


@settings(max_examples=300, deadline=None)
@given(walk_cases())
def test_sample_index_equals_the_cpp_walk(case) -> None:
    """The numpy path under each chunking strategy, and the compiled walk, against a line by
    line Python copy of helpers.cpp."""
    expected = reference_sample_index(*case)
    paths = [{"walker": lambda: None, "_CHUNK": chunk, "_SEARCH_COST": cost}
             for chunk, cost in STRATEGIES]
    if walker() is not None:
        paths.append({"walker": walker})
    for patches in paths:
        with mock.patch.multiple(gpt_indices, **patches):
            if expected[:, 1].min() < 0:  # Megatron's helpers.py asserts offsets >= 0
                with pytest.raises(DataError, match="empty"):
                    build_sample_index(*case)
                continue
            actual = build_sample_index(*case)
        assert actual.dtype == np.int32
        np.testing.assert_array_equal(actual, expected)


def test_sample_index_on_a_hand_worked_example() -> None:
    # Sequences of 3, 5, 2 tokens in order; S = 4 with the extra token: each sample reads 5
    # tokens and the next starts on the last of them (global token 4, then 8).
    sizes = np.array([3, 5, 2], dtype=np.int32)
    document_index = np.array([0, 1, 2], dtype=np.int32)
    actual = build_sample_index(sizes, document_index, 4, 1, 10, drop_last=True, extra=1)
    np.testing.assert_array_equal(actual, [[0, 0], [1, 1], [2, 0]])
    # Keeping the partial sample adds a row at (last position, its length - 1).
    partial = build_sample_index(sizes, document_index, 4, 1, 10, drop_last=False, extra=1)
    np.testing.assert_array_equal(partial, [[0, 0], [1, 1], [2, 0], [2, 1]])
    # Without the extra token samples do not overlap: starts at global 4 and 8.
    plain = build_sample_index(sizes, document_index, 4, 1, 10, drop_last=True, extra=0)
    np.testing.assert_array_equal(plain, [[0, 0], [1, 1], [1, 5]])


def test_sample_index_on_a_larger_corpus_across_many_chunks() -> None:
    rng = np.random.default_rng(5)
    sizes = rng.integers(0, 300, 2000).astype(np.int32)
    indices = np.arange(100, 1900, dtype=np.int32)
    document_index = build_document_index(indices, 5, np.random.RandomState(3), False)
    tokens = tokens_per_epoch(sizes, indices)
    for seq_length, extra, drop_last in [(128, 1, True), (37, 0, False), (1000, 1, False)]:
        expected = reference_sample_index(sizes, document_index, seq_length, 5, tokens,
                                          drop_last, extra)
        with mock.patch.object(gpt_indices, "_CHUNK", 1000):
            actual = build_sample_index(sizes, document_index, seq_length, 5, tokens,
                                        drop_last, extra)
        np.testing.assert_array_equal(actual, expected)


def test_sample_count_uses_float32_ceiling() -> None:
    # 16777217 tokens / 2**24 is just above 1, but float32(16777217) == 2**24: Megatron's C++
    # computes one sample where the exact ceiling is two.
    assert sample_count(1, 16_777_218, 2**24, drop_last=False, extra=1) == 1
    assert sample_count(1, 16_777_218, 2**24, drop_last=True, extra=1) == 1
    assert sample_count(1, 10, 4, drop_last=False, extra=1) == 3  # ceil(9 / 4)
    sizes = np.array([16_777_218], dtype=np.int32)
    index = build_sample_index(sizes, np.zeros(1, np.int32), 2**24, 1, 16_777_218,
                               drop_last=False, extra=1)
    np.testing.assert_array_equal(index, [[0, 0], [0, 2**24]])


def test_float32_overshoot_adds_a_row_at_the_end_like_the_cpp() -> None:
    # 3 * S tokens with S = 2**24 + 1: float32 rounds the tokens up and S down, so the float
    # ceiling asks for 4 samples where 3 fit exactly; the 4th row stays at the end.
    seq_length = 2**24 + 1
    tokens = 3 * seq_length
    assert sample_count(1, tokens, seq_length, drop_last=False, extra=0) == 4
    sizes = np.array([tokens], dtype=np.int32)
    case = (sizes, np.zeros(1, np.int32), seq_length, 1, tokens, False, 0)
    index = build_sample_index(*case)
    expected = [[0, 0], [0, seq_length], [0, 2 * seq_length], [0, tokens], [0, tokens]]
    np.testing.assert_array_equal(index, expected)
    np.testing.assert_array_equal(reference_sample_index(*case), expected)


def test_sample_index_dtype_rule() -> None:
    sizes = np.array([5, 2**31 - 1], dtype=np.int64)
    assert sample_index_dtype(sizes, np.zeros(3, np.int32)) == np.int32
    assert sample_index_dtype(sizes + 1, np.zeros(3, np.int32)) == np.int64


def test_empty_epoch_gives_an_empty_sample_index() -> None:
    sizes = np.array([0, 0], dtype=np.int32)
    index = build_sample_index(sizes, np.array([0, 1], np.int32), 8, 1, 0, True, 1)
    np.testing.assert_array_equal(index, [[0, 0]])


def test_sample_index_rejects_out_of_range_sequence_ids() -> None:
    with pytest.raises(DataError, match="document_index: sequence id 7"):
        build_sample_index(np.array([4, 4], np.int32), np.array([0, 7], np.int32), 2, 1, 8)


# --------------------------------------------------------------------------- epochs


@given(st.integers(1, 10_000), st.integers(1, 512), st.one_of(st.none(), st.integers(0, 500)),
       st.integers(0, 1))
def test_num_epochs_equals_the_counting_loop(tokens, seq_length, num_samples, extra) -> None:
    assert (num_epochs(tokens, seq_length, num_samples, extra)
            == reference_num_epochs(tokens, seq_length, num_samples, extra))


def test_num_epochs_rejects_an_empty_epoch_instead_of_looping_forever() -> None:
    with pytest.raises(DataError, match="num_samples"):
        num_epochs(0, 8, 10, 1)


def test_separate_final_epoch_threshold() -> None:
    # 1000 tokens per epoch, S=10, x=1: 99 samples per epoch; 3 epochs for 250 samples leave
    # 250 - 199 = 51 for the final epoch, below int(0.8 * 99) = 79 -> separate.
    assert num_epochs(1000, 10, 250, 1) == 3
    assert samples_before_final_epoch(3, 1000, 10, 1) == 199
    assert separate_final_epoch(3, 1000, 10, 250, 1)
    assert not separate_final_epoch(3, 1000, 10, 290, 1)  # 91 >= 79
    assert not separate_final_epoch(1, 1000, 10, 50, 1)


def test_separate_final_epoch_turns_megatron_asserts_into_data_errors() -> None:
    with pytest.raises(DataError, match="between 0 and 100"):
        separate_final_epoch(3, 1000, 10, 150, 1)  # 150 - 199 < 0
    with pytest.raises(DataError, match="num_samples"):
        separate_final_epoch(2, 1000, 10, 500, 1)  # 500 - 99 > 100


# --------------------------------------------------------------------------- shuffles


@pytest.mark.parametrize("epochs, separate", [(1, False), (1, True), (4, False), (4, True)])
def test_document_index_equals_megatron_draws(epochs: int, separate: bool) -> None:
    indices = np.arange(10, 47, dtype=np.int32)
    actual = build_document_index(indices, epochs, np.random.RandomState(1234), separate)
    expected = reference_document_index(indices, epochs, np.random.RandomState(1234), separate)
    assert actual.dtype == np.int32
    np.testing.assert_array_equal(actual, expected)
    if separate and epochs > 1:  # the final epoch holds every sequence exactly once
        np.testing.assert_array_equal(np.sort(actual[-len(indices):]), indices)


def test_shuffle_index_equals_megatron_draws() -> None:
    for first, total in [(50, 50), (30, 50), (0, 5), (1, 1)]:
        actual = build_shuffle_index(first, total, np.random.RandomState(7))
        expected = reference_shuffle_index(first, total, np.random.RandomState(7))
        assert actual.dtype == np.uint32
        np.testing.assert_array_equal(actual, expected)
    assert shuffle_index_dtype(2**32 - 3) == np.uint32
    assert shuffle_index_dtype(2**32 - 2) == np.int64


@pytest.mark.parametrize("num_samples, seq_length, extra, drop_last, epochs, separate", [
    (None, 16, 1, True, 1, False),
    (140, 16, 1, True, 2, True),
    (230, 16, 1, True, 2, False),
    (400, 16, 1, True, 4, True),
    (420, 9, 0, False, 2, False),
    (300, 9, 0, False, 2, True),
])
def test_one_random_state_in_megatron_order(num_samples, seq_length, extra, drop_last, epochs,
                                            separate) -> None:
    sizes = np.random.default_rng(0).integers(1, 40, 120).astype(np.int32)
    indices = np.arange(5, 105, dtype=np.int32)  # 2032 tokens
    tokens = tokens_per_epoch(sizes, indices)
    assert num_epochs(tokens, seq_length, num_samples, extra) == epochs
    assert separate_final_epoch(epochs, tokens, seq_length, num_samples, extra) == separate
    actual = build_gpt_indices(sizes, indices, num_samples, seq_length, 99, extra, drop_last)
    expected = reference_indices(sizes, indices, num_samples, seq_length, 99, extra, drop_last)
    for got, want in zip(actual, expected, strict=True):
        np.testing.assert_array_equal(got, want)
    assert actual.shuffle_index.dtype == np.uint32


def test_shuffle_draws_come_after_the_document_draws() -> None:
    """The shuffle index continues the document index's RandomState: it is not what a fresh
    RandomState(seed) would give."""
    sizes = np.full(50, 10, dtype=np.int32)
    indices = np.arange(50, dtype=np.int32)
    built = build_gpt_indices(sizes, indices, None, 8, 4321, 1, True)
    state = np.random.RandomState(4321)
    state.shuffle(np.arange(50, dtype=np.int32))
    continued = np.arange(len(built.shuffle_index), dtype=np.uint32)
    state.shuffle(continued)
    fresh = np.arange(len(built.shuffle_index), dtype=np.uint32)
    np.random.RandomState(4321).shuffle(fresh)
    np.testing.assert_array_equal(built.shuffle_index, continued)
    assert not np.array_equal(built.shuffle_index, fresh)


@pytest.mark.parametrize("num_samples, drop_last, extra", [
    (None, True, 1), (9000, True, 1), (9000, False, 0)])
def test_large_corpora_build_the_sample_index_beside_the_shuffle(num_samples, drop_last,
                                                                 extra) -> None:
    """From 16,384 document-index entries the sample index is built in a second thread
    while the shuffle index is drawn: the result is still Megatron's order."""
    sizes = np.random.default_rng(1).integers(1, 60, 20_000).astype(np.int32)
    indices = np.arange(20_000, dtype=np.int32)
    assert len(indices) >= gpt_indices._OVERLAP_FROM
    actual = build_gpt_indices(sizes, indices, num_samples, 64, 7, extra, drop_last)
    expected = reference_indices(sizes, indices, num_samples, 64, 7, extra, drop_last)
    for got, want in zip(actual, expected, strict=True):
        np.testing.assert_array_equal(got, want)
