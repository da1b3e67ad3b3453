"""What ``mf-data inspect`` reports about an indexed dataset: counts, lengths, a histogram.

Everything comes from the `.idx` alone (the token data is never read), so inspecting a corpus
of any size takes as long as reading its index.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from mf_data.indexed import IndexedDataset

_BAR_WIDTH = 40


@dataclass(frozen=True)
class LengthBucket:
    """Sequences whose length (in tokens) lies in ``[low, high]``: 0, 1, 2-3, 4-7, 8-15, ..."""

    low: int
    high: int
    count: int


@dataclass(frozen=True)
class CorpusStats:
    prefix: str
    dtype: str
    documents: int
    sequences: int
    tokens: int
    min_length: int
    mean_length: float
    max_length: int
    histogram: tuple[LengthBucket, ...]  # from the shortest to the longest non-empty bucket
    index_bytes: int
    data_bytes: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _log2_histogram(lengths: np.ndarray) -> tuple[LengthBucket, ...]:
    if lengths.size == 0:
        return ()
    # frexp gives x = m * 2**e with m in [0.5, 1): e is 0 for 0, 1 for 1, 2 for 2-3, 3 for 4-7.
    _, exponents = np.frexp(lengths.astype(np.float64))
    counts = np.bincount(exponents)
    buckets = []
    for exponent in range(int(exponents.min()), len(counts)):
        low = 0 if exponent == 0 else 1 << (exponent - 1)
        high = 0 if exponent == 0 else (1 << exponent) - 1
        buckets.append(LengthBucket(low, high, int(counts[exponent])))
    return tuple(buckets)


def corpus_stats(dataset: IndexedDataset) -> CorpusStats:
    """Counts and sequence-length statistics of ``dataset``."""
    lengths = np.asarray(dataset.sequence_lengths, dtype=np.int64)
    empty = lengths.size == 0
    return CorpusStats(
        prefix=dataset.prefix,
        dtype=dataset.dtype.name,
        documents=dataset.document_count,
        sequences=int(lengths.size),
        tokens=int(lengths.sum()),
        min_length=0 if empty else int(lengths.min()),
        mean_length=0.0 if empty else float(lengths.mean()),
        max_length=0 if empty else int(lengths.max()),
        histogram=_log2_histogram(lengths),
        index_bytes=os.path.getsize(dataset.index_file),
        data_bytes=os.path.getsize(dataset.data_file),
    )


def _histogram_lines(histogram: tuple[LengthBucket, ...]) -> list[str]:
    largest = max((bucket.count for bucket in histogram), default=0)
    lines = []
    for bucket in histogram:
        bar = "#" * (round(_BAR_WIDTH * bucket.count / largest) if largest else 0)
        if bucket.count and not bar:
            bar = "."  # a non-empty bucket too small for one full mark
        span = f"{bucket.low:>10,} - {bucket.high:<10,}"
        lines.append(f"  {span} {bucket.count:>12,}  {bar}".rstrip())
    return lines


def format_stats(stats: CorpusStats) -> str:
    """A human-readable report, one fact per line, then the length histogram."""
    lines = [
        f"prefix     {stats.prefix}",
        f"files      .idx {stats.index_bytes:,} bytes, .bin {stats.data_bytes:,} bytes",
        f"dtype      {stats.dtype}",
        f"documents  {stats.documents:,}",
        f"sequences  {stats.sequences:,}",
        f"tokens     {stats.tokens:,}",
        f"length     min {stats.min_length:,}, mean {stats.mean_length:,.1f}, "
        f"max {stats.max_length:,} tokens per sequence",
    ]
    if stats.histogram:
        lines.append("sequence lengths (log2 buckets)")
        lines.append(f"  {'tokens':^23} {'sequences':>12}")
        lines.extend(_histogram_lines(stats.histogram))
    return "\n".join(lines)
