"""JSON Lines to a Megatron ``.bin``/``.idx`` pair, as Megatron's ``preprocess_data.py
--append-eod`` does: each document's tokens followed by EOD.

A text may be a string (one sequence) or a list of strings (one sequence each, as Megatron's
``--split-sentences`` output; EOD ends the last). Parts that tokenize to nothing are dropped and
a document with no tokens gets no sequence and no EOD, exactly as in Megatron.

Unlike Megatron, an input with no tokens at all (an empty file, only blank lines, or documents
that are all empty) is an error naming the file, and nothing is written: Megatron writes an
empty dataset there, which only fails later, when training samples from it.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, TextIO

import numpy as np

from mf_data.errors import DataError
from mf_data.indexed import DType, IndexedDatasetBuilder, data_path, index_path
from mf_data.text_tokenizer import TextTokenizer

_BATCH = 256  # documents encoded together (Hugging Face tokenizers encode a batch in parallel)


@dataclass(frozen=True)
class PreprocessSummary:
    input: str
    prefix: str
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


def _parts_of(path: str, line_number: int, line: bytes, json_key: str) -> list[str]:
    """The text parts of one JSON Lines record, or a DataError naming file:line."""
    where = f"{path}:{line_number}"
    try:
        record = json.loads(line.rstrip(b"\r\n"))
    except UnicodeDecodeError as error:
        raise DataError(f"{where}: not UTF-8 text ({error.reason})") from None
    except json.JSONDecodeError as error:
        raise DataError(f"{where}: not valid JSON: {error.msg} at column {error.colno}") from None
    if not isinstance(record, dict):
        raise DataError(f"{where}: expected a JSON object with key {json_key!r}, got "
                        f"{type(record).__name__}")
    if json_key not in record:
        keys = ", ".join(repr(k) for k in list(record)[:10]) or "none"
        raise DataError(f"{where}: no key {json_key!r} (keys present: {keys}); choose the key "
                        f"with --json-key")
    text = record[json_key]
    if isinstance(text, str):
        return [text]
    if isinstance(text, list) and all(isinstance(part, str) for part in text):
        return text
    raise DataError(f"{where}: {json_key!r} must be a string or a list of strings, got "
                    f"{type(text).__name__}")


def _records(path: str, json_key: str) -> Iterator[tuple[int, list[str]]]:
    """(bytes read so far, text parts) for each non-blank line."""
    bytes_read = 0
    with open(path, "rb") as stream:
        for line_number, line in enumerate(stream, start=1):
            bytes_read += len(line)
            if line.strip():
                yield bytes_read, _parts_of(path, line_number, line, json_key)


def _encode_all(tokenizer: TextTokenizer, texts: list[str]) -> list[list[int]]:
    encode_batch = getattr(tokenizer, "encode_batch", None)
    if encode_batch is not None:
        return encode_batch(texts)
    return [tokenizer.encode(text) for text in texts]


def _token_dtype(dtype: Any, tokenizer: TextTokenizer) -> np.dtype:
    """The dtype asked for, or Megatron's optimal one; either must hold every id."""
    chosen = DType.optimal(tokenizer.vocab_size) if dtype is None else \
        DType.dtype_of(DType.code_of(dtype))
    _check_dtype(chosen, tokenizer)
    return chosen


def _check_dtype(dtype: np.dtype, tokenizer: TextTokenizer) -> None:
    if dtype.kind in "iu" and tokenizer.vocab_size - 1 > np.iinfo(dtype).max:
        raise DataError(f"--dtype {dtype.name}: holds ids up to {np.iinfo(dtype).max} but the "
                        f"tokenizer's ids reach {tokenizer.vocab_size - 1}; choose a wider dtype")


class _DocumentWriter:
    """Adds encoded documents to the builder, appending EOD, and counts what it wrote."""

    def __init__(self, builder: IndexedDatasetBuilder, eod: int) -> None:
        self._builder, self._eod = builder, eod
        self.documents = self.empty = self.sequences = self.tokens = 0

    def add(self, parts: list[list[int]]) -> None:
        parts = [part for part in parts if len(part) > 0]
        self.documents += 1
        if not parts:
            self.empty += 1
            self._builder.end_document()
            return
        lengths = [len(part) for part in parts]
        lengths[-1] += 1
        tokens = [token for part in parts for token in part]
        tokens.append(self._eod)
        self._builder.add_document(tokens, lengths)
        self.sequences += len(lengths)
        self.tokens += len(tokens)

    def summary(self, path: str, prefix: str, dtype: np.dtype,
                seconds: float) -> PreprocessSummary:
        return PreprocessSummary(input=path, prefix=prefix, documents=self.documents,
                                 empty_documents=self.empty, sequences=self.sequences,
                                 tokens=self.tokens, dtype=dtype, seconds=seconds)


def preprocess_jsonl(input_path: str | os.PathLike, output_prefix: str | os.PathLike,
                     tokenizer: TextTokenizer, json_key: str = "text", dtype: Any = None,
                     progress: TextIO | None = sys.stderr,
                     progress_seconds: float = 5.0) -> PreprocessSummary:
    """Tokenize a JSON-lines corpus into a Megatron indexed dataset, a document per record.

    Output appears only when complete; on any error nothing is left behind, not even the
    directories made for it.

    Args:
        input_path: the ``.jsonl`` file.
        output_prefix: where ``.bin``/``.idx`` go.
        tokenizer: encodes the text; its EOD id ends each document.
        json_key: the record's field holding the text (a string or a list of strings).
        dtype: the token dtype; None: Megatron's optimal one (uint16 below a 65500-token
            vocabulary, else int32).
        progress: where a status line goes, at most every ``progress_seconds``; None: nowhere.

    Returns:
        What was written: documents (empty ones too), sequences, tokens, dtype and time.

    Raises:
        DataError: the input is missing, a record cannot be read, or the dtype is too narrow.
    """
    path, prefix = os.fspath(input_path), os.fspath(output_prefix)
    if not os.path.isfile(path):
        raise DataError(f"{path}: input file not found")
    token_dtype = _token_dtype(dtype, tokenizer)
    made = _make_parent_directories(prefix)
    printer = ProgressPrinter(progress, os.path.getsize(path), progress_seconds)
    started = time.monotonic()
    try:
        writer, bytes_read = _write_dataset(path, prefix, tokenizer, json_key, token_dtype,
                                            printer)
    except BaseException:
        _remove_empty_directories(made)
        raise
    printer.update(writer.documents, writer.tokens, bytes_read, final=True)
    return writer.summary(path, prefix, token_dtype, time.monotonic() - started)


def _write_dataset(path: str, prefix: str, tokenizer: TextTokenizer, json_key: str,
                   token_dtype: np.dtype, printer: ProgressPrinter
                   ) -> tuple[_DocumentWriter, int]:
    """Encode the records in batches into the builder; (what was written, bytes read).

    The builder's ``.bin`` has a temporary name until ``finalize``, and an error raised inside
    the ``with`` deletes it, so a failure leaves no file behind.
    """
    bytes_read = 0
    with IndexedDatasetBuilder(data_path(prefix), token_dtype) as builder:
        writer = _DocumentWriter(builder, tokenizer.eod)
        batch: list[list[str]] = []

        def flush(bytes_read: int) -> None:
            texts = [text for parts in batch for text in parts]
            encoded = iter(_encode_all(tokenizer, texts))
            for parts in batch:
                writer.add([next(encoded) for _ in parts])
            batch.clear()
            printer.update(writer.documents, writer.tokens, bytes_read)

        for bytes_read, parts in _records(path, json_key):
            batch.append(parts)
            if len(batch) >= _BATCH:
                flush(bytes_read)
        flush(bytes_read)
        if writer.tokens == 0:
            raise _no_tokens(path, json_key, writer.documents)
        builder.finalize(index_path(prefix))
    return writer, bytes_read


def _no_tokens(path: str, json_key: str, documents: int) -> DataError:
    """The error for an input that would make a dataset with nothing to train on."""
    if documents == 0:
        what = "the file is empty" if os.path.getsize(path) == 0 else "only blank lines"
        return DataError(f"{path}: no documents ({what}); give one JSON object per line, its "
                         f"text under {json_key!r}; nothing was written")
    where = "its only document" if documents == 1 else f"all {documents:,} documents"
    return DataError(f"{path}: no tokens: {json_key!r} is empty or tokenizes to nothing in "
                     f"{where}; a dataset needs at least one token (is {json_key!r} the key "
                     "that holds the text? see --json-key); nothing was written")


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
