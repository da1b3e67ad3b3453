"""Blending several datasets into one: which constituent serves each blended sample.

Everything here reproduces megatron-core 0.16.1 bit for bit (the reference is
shared/reference/megatron-datasets.md, section 5), because a run that switches between Megatron
and mf on the same data must see the same samples in the same order:

- `parse_blend` reads MindFormers' ``data_path`` list (weight/prefix pairs, or prefixes only);
- `normalise_weights` divides by the sum in float64, as Megatron's ``normalize`` does;
- `blend_sizes` says how many samples to build per constituent and for the blend;
- `build_blending_indices` / `build_exhaustive_blending_indices` are the greedy choice of
  Megatron's C++ helpers, evaluated with the same float64 operations in the same order.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from mf_data.errors import DataError

DEFAULT_SURPLUS = 0.005
"""Megatron's ``mid_level_dataset_surplus``: build this fraction more per constituent than the
blend is expected to draw, so the greedy choice never runs a constituent dry."""

MAX_DATASETS = 32767
"""The dataset index is int16 (Megatron asserts fewer than 32767 constituents)."""


def _as_number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def _checked_weight(value: float, where: str) -> float:
    if not math.isfinite(value) or value <= 0:
        raise DataError(f"{where}: weight {value!r} is not allowed; weights must be finite "
                        "and greater than 0")
    return value


def parse_blend(data_path: Sequence[str]) -> tuple[list[str], list[float] | None]:
    """Split MindFormers' ``data_path`` into dataset prefixes and (raw, unnormalised) weights.

    ``['0.3', 'a', '0.7', 'b']`` gives ``(['a', 'b'], [0.3, 0.7])``; a list of prefixes only
    (``['a']``, ``['a', 'b', 'c']``, ``['a', 'b']``) gives weights None, as Megatron's
    ``get_blend_from_list`` does. Unlike Megatron, a list that mixes the two forms is an error
    here rather than being silently read as prefixes.
    """
    entries = [str(entry).strip() for entry in data_path]
    if not entries:
        raise DataError("data_path: the list is empty; give one or more dataset prefixes, or "
                        "weight/prefix pairs such as ['0.3', 'a', '0.7', 'b']")
    for index, entry in enumerate(entries):
        if not entry:
            raise DataError(f"data_path[{index}]: empty entry; every entry must be a dataset "
                            "prefix or a weight")
    numbers = [_as_number(entry) for entry in entries]
    weight_slots = numbers[0::2]
    if len(entries) % 2 == 1 or all(number is None for number in weight_slots):
        _reject_weights_among_prefixes(entries, numbers)
        return entries, None
    weights = []
    for pair, number in enumerate(weight_slots):
        index = 2 * pair
        if number is None:
            raise DataError(f"data_path[{index}]: {entries[index]!r} is not a number, but the "
                            "list has weights; use weight/prefix pairs throughout, e.g. "
                            "['0.3', 'a', '0.7', 'b'], or prefixes only")
        weights.append(_checked_weight(number, f"data_path[{index}]"))
    prefixes = entries[1::2]
    for pair, prefix in enumerate(prefixes):
        if numbers[2 * pair + 1] is not None:
            raise DataError(f"data_path[{2 * pair + 1}]: {prefix!r} is a number where a dataset "
                            "prefix is expected; use weight/prefix pairs, e.g. "
                            "['0.3', 'a', '0.7', 'b']")
    return prefixes, weights


def _reject_weights_among_prefixes(entries: list[str], numbers: list[float | None]) -> None:
    for index, number in enumerate(numbers):
        if number is not None:
            raise DataError(f"data_path[{index}]: {entries[index]!r} looks like a weight in a "
                            f"list of {len(entries)} entries; weights come in weight/prefix "
                            "pairs (an even number of entries), or give prefixes only")


def normalise_weights(weights: Sequence[float]) -> list[float]:
    """Weights divided by their sum in float64, as Python floats (Megatron's ``normalize``)."""
    if len(weights) == 0:
        raise DataError("weights: the list is empty; give one positive weight per dataset")
    for index, weight in enumerate(weights):
        _checked_weight(float(weight), f"weights[{index}]")
    array = np.asarray(weights, dtype=np.float64)
    return (array / np.sum(array)).tolist()


class BlendSizes(NamedTuple):
    """How many samples to build per constituent (with the surplus) and for the blend."""

    per_dataset: list[int]
    total: int


def blend_sizes(size: int, weights: Sequence[float],
                surplus: float = DEFAULT_SURPLUS) -> BlendSizes:
    """Sample counts for a weighted blend of ``size`` samples; ``weights`` already normalised.

    Each constituent is expected to serve ``ceil(size * w)`` samples, and is built with
    ``ceil(ceil(size * w) * (1 + surplus))``; the blend's own size is the sum of the expected
    counts (so it may exceed ``size`` by up to one per constituent).
    """
    if size < 0:
        raise DataError(f"size: {size} samples is negative; the blend size must be >= 0")
    if surplus < 0:
        raise DataError(f"mid_level_dataset_surplus: {surplus} is negative; must be >= 0")
    if not np.isclose(sum(weights), 1.0):
        raise DataError(f"weights: {list(weights)} sum to {sum(weights)}, not 1; normalise "
                        "them first (normalise_weights)")
    targets = [math.ceil(size * weight) for weight in weights]
    built = [math.ceil(target * (1 + surplus)) for target in targets]
    return BlendSizes(per_dataset=built, total=sum(targets))


def _check_dataset_count(count: int, field: str) -> None:
    if count == 0:
        raise DataError(f"{field}: no datasets; a blend needs at least one")
    if count >= MAX_DATASETS:
        raise DataError(f"{field}: {count} datasets; a blend allows at most {MAX_DATASETS - 1}")


def build_blending_indices(weights: Sequence[float],
                           size: int) -> tuple[np.ndarray, np.ndarray]:
    """For each of ``size`` blended samples: the constituent (int16) and its sample (int64).

    Greedy, as Megatron's helpers.cpp: at step s the constituent whose count lags furthest
    behind its share, ``w[d] * max(s, 1) - count[d]`` in float64, wins; ties go to the lower
    index. ``weights`` are used as given (the caller normalises). Python floats are IEEE
    doubles, so the plain loop below evaluates exactly the C++ expression.
    """
    _check_dataset_count(len(weights), "weights")
    if size < 0:
        raise DataError(f"size: {size} samples is negative; the blend size must be >= 0")
    rates = [float(weight) for weight in weights]
    for index, rate in enumerate(rates):
        if not math.isfinite(rate):
            raise DataError(f"weights[{index}]: {rate} is not finite")
    chosen, served = _greedy(rates, size)
    return np.array(chosen, dtype=np.int16), np.array(served, dtype=np.int64)


def _greedy(rates: list[float], size: int,
            limits: list[int] | None = None) -> tuple[list[int], list[int]]:
    """Megatron's greedy choice: at step s, the first constituent (lowest index) with the
    largest `rates[d] * max(s, 1) - count[d]`. With `limits`, a constituent drops out once
    its count reaches its limit (the exhaustive variant)."""
    counts = [0] * len(rates)
    candidates = list(range(len(rates)))
    chosen = [0] * size
    served = [0] * size
    for step in range(size):
        scale = float(step) if step > 1 else 1.0
        best = -1
        best_lag = -math.inf
        for index in candidates:
            lag = rates[index] * scale - counts[index]
            if lag > best_lag:
                best_lag = lag
                best = index
        count = counts[best]
        chosen[step] = best
        served[step] = count
        counts[best] = count + 1
        if limits is not None and count + 1 == limits[best]:
            candidates.remove(best)
    return chosen, served


def build_exhaustive_blending_indices(sizes: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
    """Draw every sample of every constituent exactly once, in the greedy blended order.

    As Megatron's ``build_exhaustive_blending_indices``: weights are ``size / total`` and a
    constituent drops out of the choice once all its samples are used.
    """
    _check_dataset_count(len(sizes), "sizes")
    totals = [int(size) for size in sizes]
    for index, size in enumerate(totals):
        if size <= 0:
            raise DataError(f"sizes[{index}]: {size} samples; every constituent of an "
                            "exhaustive blend needs at least one sample")
    total = sum(totals)
    rates = [size / float(total) for size in totals]
    chosen, served = _greedy(rates, total, limits=totals)
    return np.array(chosen, dtype=np.int16), np.array(served, dtype=np.int64)
