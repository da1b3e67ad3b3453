"""JSON Lines (plain or ``.gz``) to Megatron ``.bin``/``.idx`` pairs, one per JSON key, as
Megatron's ``preprocess_data.py`` writes them: each document's tokens, followed by EOD with
``append_eod``.

A text may be a string (one sequence) or a list of strings (one sequence each, as Megatron's
``--split-sentences`` output; EOD ends the last). Parts that tokenize to nothing are dropped and
a document with no tokens gets no sequence and no EOD, exactly as in Megatron. Tokenizing may
run in worker processes (``workers``); the output is the same bytes for any number of them.

Unlike Megatron, an input with no tokens at all under some key (an empty file, only blank
lines, or documents that are all empty) is an error naming the file and the key, and nothing is
written: Megatron writes an empty dataset there, which only fails later, when training samples
from it.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any, TextIO

import numpy as np

from mf_data.chunk_encoder import ChunkEncoder, EncodedDocuments, encode_chunks
from mf_data.errors import DataError
from mf_data.indexed import DType, IndexedDatasetBuilder, data_path, index_path
from mf_data.jsonl_input import is_gzip, read_chunks
from mf_data.text_tokenizer import TextTokenizer

_BATCH = 256  # lines encoded together (Hugging Face tokenizers encode a batch in parallel)


def megatron_prefixes(output_prefix: str | os.PathLike,
                      json_keys: Sequence[str]) -> dict[str, str]:
    """Megatron's output names: ``{output_prefix}_{key}_document`` for each key."""
    return {key: f"{os.fspath(output_prefix)}_{key}_document" for key in json_keys}


@dataclass(frozen=True)
class PreprocessSummary:
    input: str
    prefix: str
    json_key: str
    documents: int
    empty_documents: int  # documents whose text produced no tokens (no sequence written)
    sequences: int
    tokens: int  # including the EOD tokens
    dtype: np.dtype
    seconds: float


class ProgressPrinter:
    """One status line on a text stream at most every ``every_seconds``, and a last one at the
    end: enough to see that a long run is alive and how far it is, with no dependency."""

    def __init__(self, stream: TextIO | None, total_bytes: int, every_seconds: float = 5.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._stream, self._total, self._every, self._clock = (stream, total_bytes,
                                                               every_seconds, clock)
        self._start = self._last = clock()

    def update(self, documents: int, tokens: int, bytes_read: int, final: bool = False) -> None:
        now = self._clock()
        if self._stream is None or (not final and now - self._last < self._every):
            return
        self._last = now
        elapsed = max(now - self._start, 1e-9)
        percent = 100.0 * bytes_read / self._total if self._total else 100.0
        print(f"preprocess: {documents:,} documents, {tokens:,} tokens, {percent:.1f}% of "
              f"input, {documents / elapsed:,.0f} docs/s", file=self._stream, flush=True)


def preprocess_jsonl(input_path: str | os.PathLike, output_prefix: str | os.PathLike,
                     tokenizer: TextTokenizer, json_key: str = "text", dtype: Any = None,
                     progress: TextIO | None = sys.stderr, progress_seconds: float = 5.0,
                     append_eod: bool = True, workers: int = 1,
                     vocab_size: int | None = None) -> PreprocessSummary:
    """Tokenize the text under one key into ``output_prefix.bin``/``.idx`` (that name
    exactly); see ``preprocess`` for everything else."""
    return preprocess(input_path, {json_key: os.fspath(output_prefix)}, tokenizer, dtype=dtype,
                      progress=progress, progress_seconds=progress_seconds,
                      append_eod=append_eod, workers=workers, vocab_size=vocab_size)[0]


def preprocess(input_path: str | os.PathLike, outputs: Mapping[str, str],
               tokenizer: TextTokenizer, dtype: Any = None,
               progress: TextIO | None = sys.stderr, progress_seconds: float = 5.0,
               append_eod: bool = True, workers: int = 1,
               vocab_size: int | None = None) -> list[PreprocessSummary]:
    """Tokenize a JSON-lines corpus into Megatron indexed datasets, one per JSON key, a document
    per record.

    Output appears only when every dataset is complete; on any error nothing is left behind,
    not even the directories made for it.

    Args:
        input_path: the ``.jsonl`` file, or a gzip ``.jsonl.gz``.
        outputs: the JSON key of each dataset and its prefix (``megatron_prefixes`` gives
            Megatron's names).
        tokenizer: encodes the text; its EOD id ends each document with ``append_eod``.
        dtype: the token dtype; None: Megatron's optimal one (uint16 below a 65500-token
            vocabulary, else int32).
        progress: where a status line goes, at most every ``progress_seconds``; None: nowhere.
        append_eod: end every document that has tokens with EOD (Megatron's ``--append-eod``).
        workers: processes that tokenize (1: this one); the output does not depend on it.
        vocab_size: the model's vocabulary: a token id at or beyond it (the tokenizer's added
            tokens, an EOD id past the model's) is an error naming the document, before any
            output exists; None: not checked (the trainer checks each sample it reads).

    Returns:
        What was written per key: documents (empty ones too), sequences, tokens, dtype, time.

    Raises:
        DataError: the input is missing or empty, a record cannot be read, a key has no
            tokens at all, or the dtype is too narrow.
    """
    path = os.fspath(input_path)
    if not os.path.isfile(path):
        raise DataError(f"{path}: input file not found")
    if workers < 1:
        raise DataError(f"--workers {workers}: needs at least one worker process")
    if not outputs:
        raise DataError("no JSON keys to read; give at least one with --json-keys")
    if vocab_size is not None and vocab_size < 1:
        raise DataError(f"--model-vocab-size {vocab_size}: a vocabulary has at least one token")
    token_dtype = _token_dtype(dtype, tokenizer)
    made = [d for prefix in outputs.values() for d in _make_parent_directories(prefix)]
    printer = ProgressPrinter(progress, os.path.getsize(path), progress_seconds)
    started = time.monotonic()
    encoder = ChunkEncoder(path, tokenizer, list(outputs), append_eod, token_dtype)
    try:
        counts, bytes_read = _write_datasets(path, outputs, encoder, workers, printer,
                                             vocab_size)
    except BaseException:
        _remove_empty_directories(made)
        raise
    seconds = time.monotonic() - started
    printer.update(counts[0].documents, sum(c.tokens for c in counts), bytes_read, final=True)
    return [count.summary(path, key, prefix, token_dtype, seconds)
            for count, (key, prefix) in zip(counts, outputs.items(), strict=True)]


def _token_dtype(dtype: Any, tokenizer: TextTokenizer) -> np.dtype:
    """The dtype asked for, or Megatron's optimal one; either must hold every id."""
    chosen = DType.optimal(tokenizer.vocab_size) if dtype is None else \
        DType.dtype_of(DType.code_of(dtype))
    if chosen.kind in "iu" and tokenizer.vocab_size - 1 > np.iinfo(chosen).max:
        raise DataError(f"--dtype {chosen.name}: holds ids up to {np.iinfo(chosen).max} but the "
                        f"tokenizer's ids reach {tokenizer.vocab_size - 1}; choose a wider dtype")
    return chosen


def _write_datasets(path: str, outputs: Mapping[str, str], encoder: ChunkEncoder,
                    workers: int, printer: ProgressPrinter,
                    vocab_size: int | None = None) -> tuple[list[_Counts], int]:
    """Encode the input chunk by chunk into one builder per key; (counts per key, bytes read).

    The builders' ``.bin`` files have temporary names until ``finalize``, and an error raised
    inside the ``with`` deletes them, so a failure leaves no file behind.
    """
    bytes_read = lines = 0
    counts = [_Counts() for _ in outputs]
    with ExitStack() as stack:
        builders = [stack.enter_context(IndexedDatasetBuilder(data_path(prefix), encoder.dtype))
                    for prefix in outputs.values()]
        for chunk in encode_chunks(encoder, read_chunks(path, _BATCH), workers):
            for key, builder, count, documents in zip(outputs, builders, counts, chunk.keys,
                                                      strict=True):
                if vocab_size is not None:
                    _check_vocabulary(path, key, documents, count.documents, vocab_size)
                builder.add_documents(documents.tokens, documents.sequence_lengths,
                                      documents.sequences_per_document)
                count.add(documents)
            lines += chunk.lines
            bytes_read = chunk.bytes_read
            printer.update(counts[0].documents, sum(c.tokens for c in counts), bytes_read)
        for key, count in zip(outputs, counts, strict=True):
            if count.tokens == 0:
                raise _no_tokens(path, key, count.documents, lines)
        for builder, prefix in zip(builders, outputs.values(), strict=True):
            builder.finalize(index_path(prefix))
    return counts, bytes_read


def _check_vocabulary(path: str, key: str, documents: EncodedDocuments, before: int,
                      vocab_size: int) -> None:
    """Every id of a chunk's documents is below `vocab_size`, else a `DataError` naming the
    first document (`before`: documents of the key written before this chunk) and id."""
    tokens = documents.tokens
    if not tokens.size or int(tokens.max()) < vocab_size:
        return
    first = int(np.argmax(tokens >= vocab_size))
    sequence = int(np.searchsorted(np.cumsum(documents.sequence_lengths), first, side="right"))
    document = int(np.searchsorted(np.cumsum(documents.sequences_per_document), sequence,
                                   side="right"))
    raise DataError(f"{path}: document {before + document + 1} ({key!r}) has token id "
                    f"{int(tokens[first])}, outside the model's vocabulary (--model-vocab-size "
                    f"{vocab_size}: ids 0 to {vocab_size - 1}); use the model's tokenizer, or "
                    "give the model a larger vocabulary")


class _Counts:
    """What has been written to one dataset."""

    def __init__(self) -> None:
        self.documents = self.empty = self.sequences = self.tokens = 0

    def add(self, documents: EncodedDocuments) -> None:
        self.documents += len(documents.sequences_per_document)
        self.empty += documents.sequences_per_document.count(0)
        self.sequences += len(documents.sequence_lengths)
        self.tokens += len(documents.tokens)

    def summary(self, path: str, key: str, prefix: str, dtype: np.dtype,
                seconds: float) -> PreprocessSummary:
        return PreprocessSummary(input=path, prefix=prefix, json_key=key,
                                 documents=self.documents, empty_documents=self.empty,
                                 sequences=self.sequences, tokens=self.tokens, dtype=dtype,
                                 seconds=seconds)


def _no_tokens(path: str, json_key: str, documents: int, lines: int) -> DataError:
    """The error for an input that would make a dataset with nothing to train on."""
    if documents == 0:
        what = "the file is empty" if lines == 0 else "only blank lines"
        if lines == 0 and is_gzip(path):
            what = "the file decompresses to nothing"
        return DataError(f"{path}: no documents ({what}); give one JSON object per line, its "
                         f"text under {json_key!r}; nothing was written")
    where = "its only document" if documents == 1 else f"all {documents:,} documents"
    return DataError(f"{path}: no tokens: {json_key!r} is empty or tokenizes to nothing in "
                     f"{where}; a dataset needs at least one token (is {json_key!r} the key "
                     "that holds the text? see --json-keys); nothing was written")


def _make_parent_directories(prefix: str) -> list[str]:
    """Create the directory of ``prefix`` and the missing ones above it; those made, deepest
    first."""
    directory = os.path.dirname(os.path.abspath(prefix))
    missing = []
    while not os.path.exists(directory):
        missing.append(directory)
        directory = os.path.dirname(directory)
    if missing:
        os.makedirs(missing[0])
    return missing


def _remove_empty_directories(made: list[str]) -> None:
    """Undo ``_make_parent_directories`` after a failed run, leaving any that are not empty."""
    for directory in made:
        try:
            os.rmdir(directory)
        except OSError:
            return
