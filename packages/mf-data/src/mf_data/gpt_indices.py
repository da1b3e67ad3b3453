"""The three GPT indices (document, sample, shuffle), equal to megatron-core 0.16.1's.

Megatron (gpt_dataset.py ``_build_document_sample_shuffle_indices`` and helpers.cpp
``build_sample_idx``) walks the shuffled sequences in a C++ loop. The sample index has a closed
form that numpy can evaluate in bulk: sample ``k`` starts ``k * seq_length`` tokens into the
concatenation of the document index, so its row is found by a binary search of ``k * S + x`` in
the running token count. ``build_sample_index`` does that in cache-sized chunks, which keeps
memory flat, but it is about half as fast as the C++ walk. So where a C compiler is available
the walk itself is compiled at first use (`compiled_walk`) and the numpy path is the fallback;
both give the same arrays (tested). Either way the sample index is built beside the shuffle
index, in a second thread.

One ``numpy.random.RandomState(seed)`` is consumed in Megatron's order: the document index
shuffle(s), then the shuffle index shuffle(s). Same seed, same draws, same arrays.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import NamedTuple

import numpy as np

from mf_data.compiled_walk import walker
from mf_data.errors import DataError

_INT32_MAX = int(np.iinfo(np.int32).max)
# Megatron switches the shuffle index to int64 at this size (gpt_dataset.py _build_shuffle_index).
_UINT32_SHUFFLE_LIMIT = int(np.iinfo(np.uint32).max) - 1
# Entries of the document index handled per step of the sample index build: 128 KB of int64,
# so the several passes over a chunk stay in the L2 cache. Measured on 129k and 5.5M entries:
# 1.3 ms and 49 ms at 2**14, against 1.9 ms and 48 ms at 2**16 and 2.0 ms and 55 ms at 2**18.
_CHUNK = 1 << 14
# A binary search per sample costs about this many passes-per-position of the dense method.
_SEARCH_COST = 40


class GPTIndices(NamedTuple):
    document_index: np.ndarray  # int32, (E * len(indices),): shuffled sequence ids
    sample_index: np.ndarray  # int32 or int64, (num_samples + 1, 2): (position, offset)
    shuffle_index: np.ndarray  # uint32 or int64, (num_samples,)


def tokens_per_epoch(sequence_lengths: np.ndarray, indices: np.ndarray) -> int:
    """Tokens in one pass over the exposed sequences."""
    return int(np.sum(sequence_lengths[indices], dtype=np.int64))


def num_epochs(tokens_per_epoch: int, seq_length: int, num_samples: int | None,
               extra: int) -> int:
    """Smallest number of epochs (>= 1) whose tokens cover ``num_samples * S + x``.

    One epoch when ``num_samples`` is None. Megatron counts up in a loop; this is its closed
    form.
    """
    if num_samples is None:
        return 1
    if tokens_per_epoch <= 0:
        raise DataError(f"num_samples: {num_samples} samples requested but the exposed "
                        f"sequences hold no tokens; the split must expose a non-empty corpus")
    requested = num_samples * seq_length + extra
    return max(1, -(-requested // tokens_per_epoch))


def samples_before_final_epoch(num_epochs: int, tokens_per_epoch: int, seq_length: int,
                               extra: int) -> int:
    """Samples that the first ``num_epochs - 1`` epochs fill completely."""
    return ((num_epochs - 1) * tokens_per_epoch - extra) // seq_length


def separate_final_epoch(num_epochs: int, tokens_per_epoch: int, seq_length: int,
                         num_samples: int | None, extra: int) -> bool:
    """Whether the final epoch is shuffled on its own: when it contributes fewer than 80 % of
    an epoch's samples, so that a partial epoch is not smeared over the whole run."""
    if num_epochs == 1 or num_samples is None:
        return False
    before = samples_before_final_epoch(num_epochs, tokens_per_epoch, seq_length, extra)
    from_final = num_samples - before
    per_epoch = (tokens_per_epoch - extra) // seq_length
    if from_final < 0 or from_final > per_epoch + 1:
        raise DataError(f"num_samples: {num_samples} samples over {num_epochs} epochs of "
                        f"{tokens_per_epoch} tokens leaves {from_final} samples for the final "
                        f"epoch; it must be between 0 and {per_epoch + 1} (Megatron asserts "
                        f"this)")
    return from_final < int(0.80 * per_epoch)


def build_document_index(indices: np.ndarray, num_epochs: int, rng: np.random.RandomState,
                         separate: bool) -> np.ndarray:
    """``indices`` repeated ``num_epochs`` times (epoch-major) as int32, shuffled by ``rng``.

    One shuffle over all epochs; with ``separate`` the first ``E - 1`` epochs and the final
    epoch are shuffled on their own, in that order. Shuffling views in place consumes exactly
    the draws of Megatron's shuffle-then-concatenate.
    """
    indices = np.asarray(indices)
    count = len(indices)
    document_index = np.empty(num_epochs * count, dtype=np.int32)
    document_index.reshape(num_epochs, count)[:] = indices
    if not separate or num_epochs == 1:
        rng.shuffle(document_index)
        return document_index
    boundary = (num_epochs - 1) * count
    rng.shuffle(document_index[:boundary])
    rng.shuffle(document_index[boundary:])
    return document_index


def sample_count(num_epochs: int, tokens_per_epoch: int, seq_length: int, drop_last: bool,
                 extra: int) -> int:
    """Megatron's sample count: floor division, or a ceiling computed in 32-bit float.

    helpers.cpp computes ``ceil(float(E*T - x) / S)`` in single precision, which can be one
    short of (or beyond) the exact ceiling for token counts above 2**24; that is reproduced.
    """
    tokens = num_epochs * tokens_per_epoch - extra
    if drop_last:
        # C++ integer division truncates toward zero (only matters for an empty epoch).
        return tokens // seq_length if tokens >= 0 else -(-tokens // seq_length)
    quotient = np.float32(tokens) / np.float32(seq_length)
    return int(np.ceil(quotient))


def sample_index_dtype(sequence_lengths: np.ndarray, document_index: np.ndarray) -> np.dtype:
    """int32 unless the document index length or the longest sequence exceeds int32."""
    largest = max(len(document_index), int(sequence_lengths.max()) if len(sequence_lengths) else 0)
    return np.dtype(np.int32) if largest <= _INT32_MAX else np.dtype(np.int64)


def build_sample_index(sequence_lengths: np.ndarray, document_index: np.ndarray,
                       seq_length: int, num_epochs: int, tokens_per_epoch: int,
                       drop_last: bool = True, extra: int = 1) -> np.ndarray:
    """Rows ``(position in document_index, token offset)`` where each sample starts, plus the
    end of the last one: shape ``(num_samples + 1, 2)``. Equal to helpers.cpp
    ``build_sample_idx``.

    Sample ``k`` ends at global token ``k * S`` of the concatenated document index, and its
    row is the first position whose cumulative end reaches ``k * S + x`` (the extra token means
    the next sample re-reads the last token of this one). A row past the end of the tokens (the
    final partial sample, when not dropping it) is ``(last position, its length - x)``, as the
    C++ loop leaves it.
    """
    _check_sample_index_arguments(seq_length, num_epochs, extra)
    extra = int(extra)
    lengths = np.asarray(sequence_lengths)
    document_index = np.asarray(document_index)
    count = sample_count(num_epochs, tokens_per_epoch, seq_length, drop_last, extra)
    dtype = sample_index_dtype(lengths, document_index)
    sample_index = np.zeros((max(count, 0) + 1, 2), dtype=dtype)
    if count <= 0:
        return sample_index
    if len(document_index) == 0:
        raise DataError(f"document_index: empty, but {count} samples were asked for; the "
                        f"split exposes no sequences")
    walk = walker()
    if walk is not None:
        _check_sequence_ids(document_index, len(lengths))
        walk(lengths, document_index, seq_length, extra, sample_index[1:])
        if sample_index[-1, 1] < 0:
            _raise_empty_last_sequence(document_index, int(sample_index[-1, 1]))
        return sample_index
    placed = _place_sample_ends(lengths, document_index, seq_length, extra, count, sample_index)
    if placed < count:
        _place_overflow_rows(lengths, document_index, extra, placed, sample_index)
    return sample_index


def _check_sample_index_arguments(seq_length: int, num_epochs: int, extra: int) -> None:
    if seq_length < 1:
        raise DataError(f"sequence_length: {seq_length}; it must be at least 1")
    if num_epochs < 1:
        raise DataError(f"num_epochs: {num_epochs}; it must be at least 1")
    if extra not in (0, 1):
        raise DataError(f"add_extra_token_to_sequence: {extra!r}; it must be 0 or 1")


def _place_sample_ends(lengths: np.ndarray, document_index: np.ndarray, seq_length: int,
                       extra: int, count: int, out: np.ndarray) -> int:
    """Fill rows 1.. of ``out`` whose target ``k * S + x`` lies within the tokens, chunk by
    chunk of the document index; returns the number of rows placed.

    Per chunk, ``running[p]`` is the token count before position ``p`` minus ``x``, so
    ``running[p + 1]`` is the end of position ``p`` minus ``x``, and row ``k`` belongs to the
    first position whose shifted end reaches ``k * S``.
    """
    lengths64 = lengths.astype(np.int64)
    done = 0  # rows 1..done are placed
    running_buffer = np.empty(min(_CHUNK, len(document_index)) + 1, dtype=np.int64)
    shifted_end = -extra  # tokens before the current chunk, minus x
    for chunk_start in range(0, len(document_index), _CHUNK):
        chunk = document_index[chunk_start:chunk_start + _CHUNK]
        running = running_buffer[:len(chunk) + 1]
        running[0] = shifted_end
        _check_sequence_ids(chunk, len(lengths64))
        np.take(lengths64, chunk, out=running[1:], mode="clip")  # ids were just checked
        np.cumsum(running, out=running)
        shifted_end = int(running[-1])
        last = min(count, shifted_end // seq_length)
        if last > done:
            positions = _row_positions(running, seq_length, done, last)
            # Offset = k*S - (start of the position) = k*S - (running[position] + x).
            offsets = np.arange((done + 1) * seq_length - extra, (last + 1) * seq_length - extra,
                                seq_length, dtype=np.int64)
            offsets -= np.take(running, positions)
            positions += chunk_start
            out[done + 1:last + 1, 0] = positions
            out[done + 1:last + 1, 1] = offsets
            done = last
        if done == count:
            break
    return done


def _check_sequence_ids(chunk: np.ndarray, num_sequences: int) -> None:
    low, high = int(chunk.min()), int(chunk.max())
    if low < 0 or high >= num_sequences:
        raise DataError(f"document_index: sequence id {low if low < 0 else high} is out of "
                        f"range; the indexed dataset has {num_sequences} sequences")


def _row_positions(running: np.ndarray, seq_length: int, done: int, last: int) -> np.ndarray:
    """Positions (within the chunk) of rows ``done + 1 .. last``: row ``k`` sits at the first
    position whose shifted end reaches ``k * S``, i.e. after all positions that end earlier.

    Dense rows (documents not much shorter than a sample): one integer division per position
    says how many rows its end reaches; counting positions per value gives every row's position
    at once. Sparse rows (many short documents per sample): a binary search per row is cheaper.
    """
    ends = running[1:]
    rows = last - done
    if rows * _SEARCH_COST < len(ends):
        targets = np.arange(done + 1, last + 1, dtype=np.int64) * seq_length
        return np.searchsorted(ends, targets, side="left")
    reached = ends // seq_length  # rows this position's end reaches
    reached -= done
    # `reached` is non-decreasing, so only its first and last values can leave [0, rows].
    if reached[0] < 0:  # empty sequences before the first token
        np.maximum(reached, 0, out=reached)
    if reached[-1] > rows:  # the chunk holds more tokens than the samples asked for
        np.minimum(reached, rows, out=reached)
    per_value = np.bincount(reached, minlength=rows + 1)[:rows]
    return np.cumsum(per_value, out=per_value)


def _place_overflow_rows(lengths: np.ndarray, document_index: np.ndarray, extra: int,
                         placed: int, out: np.ndarray) -> None:
    """Rows whose target lies past the last token: the C++ loop stops at the last position with
    offset ``length - x``. More than one such row only happens when the float32 sample count
    overshoots; the unchecked C++ (built with NDEBUG) repeats the same row."""
    last_position = len(document_index) - 1
    offset = int(lengths[document_index[last_position]]) - extra
    if offset < 0:
        _raise_empty_last_sequence(document_index, offset)
    out[placed + 1:, 0] = last_position
    out[placed + 1:, 1] = offset


def _raise_empty_last_sequence(document_index: np.ndarray, offset: int) -> None:
    raise DataError(f"document_index: the last sequence (id {int(document_index[-1])}) is "
                    f"empty, so the final partial sample would start at offset {offset}; "
                    f"Megatron rejects this (helpers.py asserts offsets >= 0). Drop the "
                    f"partial sample or remove empty sequences")


def shuffle_index_dtype(total_size: int) -> np.dtype:
    return np.dtype(np.uint32) if total_size < _UINT32_SHUFFLE_LIMIT else np.dtype(np.int64)


def build_shuffle_index(num_samples: int, total_size: int,
                        rng: np.random.RandomState) -> np.ndarray:
    """A permutation of ``range(total_size)``: ``[0, num_samples)`` shuffled, then (if
    ``total_size`` is larger) ``[num_samples, total_size)`` shuffled on its own.

    uint32, or int64 once ``total_size`` reaches 2**32 - 2 (Megatron's threshold).
    """
    shuffle_index = np.arange(total_size, dtype=shuffle_index_dtype(total_size))
    rng.shuffle(shuffle_index[:num_samples])
    if num_samples < total_size:
        rng.shuffle(shuffle_index[num_samples:])
    return shuffle_index


def build_gpt_indices(sequence_lengths: np.ndarray, indices: np.ndarray,
                      num_samples: int | None, seq_length: int, random_seed: int,
                      extra: int = 1, drop_last: bool = True) -> GPTIndices:
    """All three indices, built in Megatron's order from one RandomState.

    ``sequence_lengths`` are all the sequences of the indexed dataset, ``indices`` the ids the
    split exposes, ``num_samples`` the requested count (None: one epoch), ``extra`` is
    ``add_extra_token_to_sequence`` (0/1) and ``drop_last`` whether a final partial sample is
    dropped (always for train/test, configurable for valid).
    """
    if seq_length < 1:
        raise DataError(f"sequence_length: {seq_length}; it must be at least 1")
    if num_samples is not None and num_samples < 0:
        raise DataError(f"num_samples: {num_samples}; it must be >= 0 or None")
    tokens = tokens_per_epoch(sequence_lengths, indices)
    epochs = num_epochs(tokens, seq_length, num_samples, extra)
    separate = separate_final_epoch(epochs, tokens, seq_length, num_samples, extra)
    rng = np.random.RandomState(random_seed)
    document_index = build_document_index(indices, epochs, rng, separate)
    # The shuffle index needs only the sample count, so it is drawn (holding the GIL, in
    # numpy's RandomState) while another thread builds the sample index (whose numpy
    # passes release it): the two take about equally long on large corpora.
    arguments = (sequence_lengths, document_index, seq_length, epochs, tokens, drop_last, extra)
    overlap = len(document_index) >= _OVERLAP_FROM
    pending = _background().submit(build_sample_index, *arguments) if overlap else None
    total = max(sample_count(epochs, tokens, seq_length, drop_last, extra), 0)
    first = samples_before_final_epoch(epochs, tokens, seq_length, extra) if separate else total
    shuffle_index = build_shuffle_index(first, total, rng)
    sample_index = pending.result() if pending else build_sample_index(*arguments)
    if len(sample_index) - 1 != total:
        raise AssertionError("the sample index disagrees with the sample count")
    return GPTIndices(document_index, sample_index, shuffle_index)


def index_problem(indices: GPTIndices, sequence_lengths: np.ndarray,
                  exposed: np.ndarray) -> tuple[str, str] | None:
    """What in `indices` cannot be Megatron's indices over the `exposed` sequence ids (of an
    indexed dataset with `sequence_lengths`): `(the array's name, what is wrong)`, or None.

    Only what Megatron guarantees is checked, in a few vectorised passes (no sort, nothing
    the size of the corpus): the document index holds whole epochs of the exposed ids; the
    sample index starts at (0, 0), never moves backwards, and points into the document index
    at offsets inside their sequences; the shuffle index names existing samples. Arrays that
    pass can still be another build's, but every sample read from them is inside the data.
    """
    document_index, sample_index, shuffle_index = indices
    documents, count = len(document_index), len(exposed)
    if (documents == 0) != (count == 0) or (count and documents % count):
        return ("document_index", f"has {documents:,} entries, not a whole number of epochs "
                                  f"of the split's {count:,} sequences")
    if documents:
        low, high = int(document_index.min()), int(document_index.max())
        first, last = int(exposed.min()), int(exposed.max())
        if low < first or high > last:
            return ("document_index", f"holds sequence ids {low} to {high}, but the split's "
                                      f"sequences are {first} to {last}")
    problem = _sample_index_problem(sample_index, document_index, sequence_lengths)
    if problem is not None:
        return ("sample_index", problem)
    samples = len(sample_index) - 1
    if len(shuffle_index) and (int(shuffle_index.min()) < 0
                               or int(shuffle_index.max()) >= samples):
        bad = int(shuffle_index.min()) if int(shuffle_index.min()) < 0 else \
            int(shuffle_index.max())
        return ("shuffle_index", f"names sample {bad}, but there are {samples:,} samples "
                                 f"(0 to {samples - 1})")
    return None


def _sample_index_problem(sample_index: np.ndarray, document_index: np.ndarray,
                          sequence_lengths: np.ndarray) -> str | None:
    if len(sample_index) == 0 or tuple(int(v) for v in sample_index[0]) != (0, 0):
        start = tuple(int(v) for v in sample_index[0]) if len(sample_index) else None
        return f"starts at {start}, but every sample index starts at (0, 0)"
    if len(sample_index) == 1:
        return None
    positions = np.asarray(sample_index[:, 0], dtype=np.int64)
    offsets = np.asarray(sample_index[:, 1], dtype=np.int64)
    low, high = int(positions.min()), int(positions.max())
    if low < 0 or high >= len(document_index):
        return (f"points to document-index position {low if low < 0 else high}, but the "
                f"document index has {len(document_index):,} entries")
    steps = np.diff(positions)
    backwards = np.flatnonzero((steps < 0) | ((steps == 0) & (np.diff(offsets) < 0)))
    if backwards.size:
        row = int(backwards[0]) + 1
        return (f"row {row} ({int(positions[row])}, {int(offsets[row])}) lies before row "
                f"{row - 1} ({int(positions[row - 1])}, {int(offsets[row - 1])}); the rows "
                f"of a sample index never move backwards")
    lengths = np.asarray(sequence_lengths)[np.asarray(document_index)[positions]]
    outside = np.flatnonzero((offsets < 0) | (offsets > lengths))
    if outside.size:
        row = int(outside[0])
        return (f"row {row} starts at token {int(offsets[row])} of a sequence of "
                f"{int(lengths[row])} tokens")
    return None


_OVERLAP_FROM = 16_384
"""Document-index length from which building the sample index in a thread pays off."""
_EXECUTOR: list[ThreadPoolExecutor] = []


def _background() -> ThreadPoolExecutor:
    if not _EXECUTOR:
        _EXECUTOR.append(ThreadPoolExecutor(1, thread_name_prefix="mf-data-indices"))
    return _EXECUTOR[0]
