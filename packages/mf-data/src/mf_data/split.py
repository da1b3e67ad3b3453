"""The ``split`` string ("969, 30, 1") turned into the sequence ids each split exposes.

Megatron (blended_megatron_dataset_config.py, blended_megatron_dataset_builder.py) reads the
numbers with a regex, pads them to three, normalises them in float64, turns them into
cumulative bookends starting from the *integer* 0, and rounds ``bookend * N`` half-to-even. Every
step is reproduced here exactly: the bookends end up in the index cache description, so even
their Python types (``0`` versus ``0.0``) matter for the cache file names.
"""

from __future__ import annotations

import re
from itertools import pairwise

import numpy as np

from mf_data.errors import DataError

SPLIT_NAMES = ("train", "valid", "test")
_NUMBER = re.compile(r"[.0-9]+")
_NEGATIVE = re.compile(r"-\s*[.0-9]")


def parse_split(text: str) -> list[float]:
    """Weights of train, valid and test, normalised to sum to 1 (in float64, as Megatron).

    Megatron silently reads "-1, 2" as [1, 2] because its regex skips the sign; a minus sign is
    rejected here instead, since it can only be a mistake.
    """
    if not isinstance(text, str):
        raise DataError(f"split: expected a string like '969, 30, 1', got {text!r}")
    if _NEGATIVE.search(text):
        raise DataError(f"split: {text!r} has a negative weight; weights must be >= 0")
    pieces = _NUMBER.findall(text)
    if not pieces:
        raise DataError(f"split: {text!r} has no numbers; give up to three weights for "
                        f"train, valid and test, like '969, 30, 1'")
    if len(pieces) > len(SPLIT_NAMES):
        raise DataError(f"split: {text!r} has {len(pieces)} numbers; at most three are allowed "
                        f"(train, valid, test)")
    try:
        weights = [float(piece) for piece in pieces]
    except ValueError:
        raise DataError(f"split: {text!r} has a malformed number; give plain decimals like "
                        f"'969, 30, 1'") from None
    weights += [0.0] * (len(SPLIT_NAMES) - len(weights))
    as_array = np.array(weights, dtype=np.float64)
    total = np.sum(as_array)
    if not total > 0:
        raise DataError(f"split: {text!r} sums to {float(total)}; the weights must sum to more "
                        f"than zero")
    return (as_array / total).tolist()


def split_matrix(weights: list[float]) -> list[tuple[float, float] | None]:
    """Per split, its (low, high) bookends in [0, 1], or None when the split is empty.

    The running sum starts from the integer 0, exactly as Megatron's ``functools.reduce``, so
    the first bookend is ``0`` (an int) and prints as ``0`` in the cache description.
    """
    edges: list[float] = [0]
    for weight in weights:
        edges.append(edges[-1] + weight)
    matrix: list[tuple[float, float] | None] = []
    for low, high in pairwise(edges):
        matrix.append((low, high) if high > low else None)
    return matrix


def split_indices(bookends: tuple[float, float] | None, num_sequences: int) -> np.ndarray | None:
    """The int32 sequence ids a split exposes: ``arange(round(lo*N), round(hi*N))``.

    Python's ``round`` rounds half to even, as in Megatron; None stays None (no dataset).
    """
    if bookends is None:
        return None
    low, high = bookends
    begin = round(low * float(num_sequences))
    end = round(high * float(num_sequences))
    return np.arange(begin, end, dtype=np.int32)
