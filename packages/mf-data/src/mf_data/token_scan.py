"""Every token id of a dataset checked against the model's vocabulary, before training.

The trainer checks each sample's ids as it reads it (`gpt_dataset`), so an id outside the
vocabulary stops a run only when its sample comes, and every resume dies at that step again.
`first_outside` reads the whole `.bin` (memory-mapped, a chunk at a time: the pages come from
the file, nothing is copied but one chunk's comparison) and names the first sequence holding
such an id; `mf-train --scan-tokens` runs it on every dataset before launch, and `mf-data
preprocess --model-vocab-size` checks as it writes. Tokens of an unsigned dtype that cannot
reach the vocabulary's size (uint16 for a 151,936-token model) need no reading.
"""

from __future__ import annotations

import os

import numpy as np

from mf_data.indexed import IndexedDataset

CHUNK_TOKENS = 1 << 24
"""Tokens compared at a time (a 16 MiB boolean mask)."""


def first_outside(prefix: str | os.PathLike, vocab_size: int) -> tuple[int, int] | None:
    """(sequence, id) of the first token id outside `[0, vocab_size)` in the dataset at
    `prefix`, or None when every id is inside."""
    dataset = IndexedDataset(prefix)
    dtype = dataset.dtype
    if dtype.kind == "u" and int(np.iinfo(dtype).max) < vocab_size:
        return None
    tokens = np.memmap(dataset.data_file, dtype=dtype, mode="r")
    unsigned = np.dtype(f"<u{dtype.itemsize}")  # a negative id reads as a huge one
    for start in range(0, tokens.size, CHUNK_TOKENS):
        part = np.asarray(tokens[start:start + CHUNK_TOKENS]).view(unsigned)
        if not part.size or int(part.max()) < vocab_size:
            continue
        offset = start + int(np.argmax(part >= vocab_size))
        byte = offset * dtype.itemsize
        sequence = int(np.searchsorted(dataset.sequence_pointers, byte, side="right")) - 1
        return sequence, int(tokens[offset])
    return None
