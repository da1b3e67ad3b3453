"""The split string -> weights -> bookends -> exposed sequence ids, as Megatron computes them."""

from __future__ import annotations

import functools
from itertools import pairwise

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from mf_data.errors import DataError
from mf_data.split import parse_split, split_indices, split_matrix


def test_parse_split_normalises_and_pads_to_three() -> None:
    assert parse_split("969, 30, 1") == [0.969, 0.03, 0.001]
    assert parse_split("1") == [1.0, 0.0, 0.0]
    assert parse_split("1,1") == [0.5, 0.5, 0.0]
    assert parse_split("98/2/0") == [0.98, 0.02, 0.0]
    assert parse_split("0.5 0.25 .25") == [0.5, 0.25, 0.25]


def test_parse_split_normalises_in_float64_like_numpy() -> None:
    weights = parse_split("1, 1, 1")
    expected = (np.array([1.0, 1.0, 1.0]) / 3.0).tolist()
    assert weights == expected
    assert all(type(weight) is float for weight in weights)


@pytest.mark.parametrize("text, fragment", [
    ("", "no numbers"),
    ("train", "no numbers"),
    ("1, 2, 3, 4", "at most three"),
    ("0, 0, 0", "sums to 0.0"),
    ("1.2.3", "malformed"),
    (".", "malformed"),
    ("-1, 2", "negative"),
])
def test_parse_split_rejects_bad_text_naming_the_field(text: str, fragment: str) -> None:
    with pytest.raises(DataError, match=fragment) as caught:
        parse_split(text)
    assert str(caught.value).startswith("split:")


def test_parse_split_rejects_non_strings() -> None:
    with pytest.raises(DataError, match="split:"):
        parse_split([1, 2, 3])  # type: ignore[arg-type]


def _megatron_matrix(weights: list[float]) -> list[tuple[float, float] | None]:
    """Megatron's convert_split_vector_to_split_matrix with vector_b = vector_a, spelled out."""
    expansion = functools.reduce(lambda a, b: [*a, a[len(a) - 1] + b], [[0], *weights])
    bookends = list(pairwise(expansion))
    return [None if high <= low else (low, high) for low, high in bookends]


def test_split_matrix_starts_from_integer_zero() -> None:
    matrix = split_matrix([0.969, 0.03, 0.001])
    assert matrix == [(0, 0.969), (0.969, 0.999), (0.999, 1.0)]
    assert type(matrix[0][0]) is int


def test_split_matrix_marks_empty_splits_none() -> None:
    assert split_matrix([1.0, 0.0, 0.0]) == [(0, 1.0), None, None]
    matrix = split_matrix([0.0, 1.0, 0.0])
    assert matrix == [None, (0.0, 1.0), None]
    assert type(matrix[1][0]) is float  # 0 + 0.0 is a float, as in Megatron's JSON ("0.0")


@given(st.lists(st.integers(0, 1000), min_size=1, max_size=3).filter(lambda w: sum(w) > 0))
def test_split_matrix_equals_megatron_reduce(raw: list[int]) -> None:
    weights = parse_split(",".join(map(str, raw)))
    assert split_matrix(weights) == _megatron_matrix(weights)


def test_split_indices_round_half_to_even() -> None:
    np.testing.assert_array_equal(split_indices((0, 0.5), 5), [0, 1])  # round(2.5) == 2
    np.testing.assert_array_equal(split_indices((0.5, 1.0), 5), [2, 3, 4])
    np.testing.assert_array_equal(split_indices((0, 0.5), 7), [0, 1, 2, 3])  # round(3.5) == 4
    assert split_indices(None, 5) is None


def test_split_indices_for_the_default_split() -> None:
    matrix = split_matrix(parse_split("969, 30, 1"))
    train, valid, test = (split_indices(bookends, 1000) for bookends in matrix)
    assert train.dtype == np.int32
    assert (len(train), len(valid), len(test)) == (969, 30, 1)
    assert train[0] == 0 and valid[0] == 969 and test[0] == 999
    # 133,456 sequences (the big_u16 corpus of the reference) -> 129,319 train sequences.
    assert len(split_indices(matrix[0], 133_456)) == 129_319
    assert len(split_indices(matrix[0], 2_000_000)) == 1_938_000
