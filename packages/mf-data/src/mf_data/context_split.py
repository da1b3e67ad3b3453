"""The part of every sample one context-parallel rank reads, and stacking columns into batches.

Context parallelism splits each sequence over the ranks of a context group: a rank holds the
token ranges `mf_parallel.sequence.context_spans` gives it (with a causal mask 2 x CP chunks,
rank r holding chunks r and 2 x CP - 1 - r, so the attention work is balanced; otherwise the
r-th contiguous chunk). The loader therefore keeps, of each sample:

- the per-token fields (tokens, labels, loss_mask, position_ids) at those positions, in span
  order: `[S / CP]` each;
- the dense attention mask's query rows at those positions, every key column in order:
  `[1, S / CP, S]` (a rank's queries attend over keys of the whole sequence);
- `actual_seq_len` whole: document ends are global positions every rank reads whole.

The split is taken from the samples' own length, so a dataset whose sequence does not divide is
refused by the first batch, naming the settings that fix it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from mf_parallel.sequence import context_spans, sequence_divisor

from .errors import DataError

SEQUENCE_AXIS = {"tokens": 0, "labels": 0, "loss_mask": 0, "position_ids": 0,
                 "attention_mask": 1}
"""The sample axis that runs over the sequence's tokens, per field a context rank splits (the
dense mask `[1, S, S]` by its query rows); fields absent here are read whole."""


@dataclass(frozen=True)
class ContextSplit:
    """One rank's place in its context group: which tokens of every sample it reads.

    Args:
        size: ranks in the context group (`parallelism.context_parallel`).
        rank: this rank's index in its context group.
        causal: `context_parallel_mask_type` is causal (load-balanced 2 x size chunks).
    """

    size: int
    rank: int
    causal: bool = True

    def __post_init__(self) -> None:
        if self.size < 1:
            raise DataError(f"context-parallel size must be >= 1, got {self.size}")
        if not 0 <= self.rank < self.size:
            raise DataError(f"context rank {self.rank} is outside the context-parallel size "
                            f"{self.size}")

    def spans(self, seq_length: int) -> list[range]:
        """The token ranges of a `seq_length` sample this rank reads, in the order it holds them.

        Args:
            seq_length: tokens per sample (the samples' own length).

        Returns:
            `seq_length / size` tokens in all, as ranges of sample positions.

        Raises:
            DataError: `seq_length` is not a multiple of the split's chunks; names the settings.
        """
        divisor = sequence_divisor(1, self.size, self.causal)
        if seq_length % divisor:
            how = f"{self.size} x 2 chunks (causal load balancing)" if self.causal \
                else f"{self.size} chunks"
            raise DataError(
                f"the samples' sequence length {seq_length} does not split over "
                f"context_parallel {self.size} into {how}: model.seq_length and "
                f"train_dataset.dataloader.config.seq_length must be a multiple of {divisor}")
        return context_spans(seq_length, self.size, self.rank, self.causal)


def stack_column(arrays: Sequence[np.ndarray], axis: int | None = None,
                 spans: Sequence[range] | None = None) -> np.ndarray:
    """Stack one field of a micro-batch's samples, keeping only `spans` along `axis`.

    Written into one preallocated array, cast on the way (a bool column stays bool: a dense
    `[b, 1, S, S]` mask as int32 is four times the bytes, 256 MiB per sample at S = 8192; every
    other column becomes int32, MindFormers' convention), so each byte is copied once.

    Args:
        arrays: the field of each sample, all of one shape.
        axis: the sample axis `spans` select on (None: the field is taken whole).
        spans: ranges of positions along `axis`, concatenated in order (None: all of them).

    Returns:
        `[len(arrays), ...]`, bool or int32.

    Raises:
        DataError: the samples' shapes differ.
    """
    first = np.asarray(arrays[0])
    if any(np.shape(array) != first.shape for array in arrays):
        raise DataError(f"samples of one micro-batch have different shapes: "
                        f"{sorted({np.shape(array) for array in arrays})}")
    dtype = column_dtype(first)
    if axis is None or spans is None:
        out = np.empty((len(arrays), *first.shape), dtype=dtype)
        for row, array in zip(out, arrays, strict=True):
            row[...] = array
        return out
    shape = list(first.shape)
    shape[axis] = sum(len(span) for span in spans)
    out = np.empty((len(arrays), *shape), dtype=dtype)
    lead = (slice(None),) * axis
    offset = 0
    for span in spans:
        target = (*lead, slice(offset, offset + len(span)))
        source = (*lead, slice(span.start, span.stop))
        for row, array in zip(out, arrays, strict=True):
            row[target] = array[source]
        offset += len(span)
    return out


def column_dtype(array: np.ndarray) -> type:
    """bool for a bool field (the attention mask), int32 for every other."""
    return np.bool_ if array.dtype == np.bool_ else np.int32
