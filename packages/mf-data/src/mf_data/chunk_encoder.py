"""Tokenizing chunks of input lines, in this process or in worker processes (``--workers``).

Each chunk becomes, per JSON key, its documents' tokens back to back in the output dtype, the
sequence lengths and how many sequences each document has. Chunks come back in input order
whatever the number of workers, so the written dataset is the same bytes with 1 or N workers.
Workers are started with ``spawn`` (not ``fork``): a Hugging Face tokenizer runs its own threads,
and forking a process that has threads can deadlock the child.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from mf_data.errors import DataError
from mf_data.jsonl_input import LineChunk, parse_record
from mf_data.text_tokenizer import TextTokenizer

_IN_FLIGHT_PER_WORKER = 2  # chunks queued per worker: keeps workers busy, memory bounded


@dataclass(frozen=True)
class EncodedDocuments:
    """The documents of one chunk under one key."""

    tokens: np.ndarray  # every sequence's tokens back to back, in the output dtype
    sequence_lengths: list[int]
    sequences_per_document: list[int]  # 0: a document that tokenized to nothing


@dataclass(frozen=True)
class EncodedChunk:
    keys: tuple[EncodedDocuments, ...]  # in the order of the json keys
    lines: int  # lines read, blank ones included
    bytes_read: int


class ChunkEncoder:
    """Turns a chunk of JSON Lines into encoded documents, one set per key, as Megatron's
    ``preprocess_data.py`` does: parts that tokenize to nothing are dropped, and with
    ``append_eod`` the EOD id ends every document that has tokens.

    Args:
        path: the input's name, for error messages.
        tokenizer: encodes the text (pickled into each worker process).
        json_keys: the record fields to tokenize, one dataset each.
        append_eod: end each non-empty document with ``tokenizer.eod``.
        dtype: the output token dtype; every id must fit it.
    """

    def __init__(self, path: str, tokenizer: TextTokenizer, json_keys: Sequence[str],
                 append_eod: bool, dtype: np.dtype) -> None:
        self.path, self.tokenizer, self.json_keys = path, tokenizer, tuple(json_keys)
        self.append_eod, self.dtype = append_eod, dtype

    def __call__(self, chunk: LineChunk) -> EncodedChunk:
        records = [parse_record(self.path, chunk.first_line + offset, line, self.json_keys)
                   for offset, line in enumerate(chunk.lines)]
        documents = [record for record in records if record is not None]
        keys = tuple(self._encode_key([record[k] for record in documents])
                     for k in range(len(self.json_keys)))
        return EncodedChunk(keys, len(chunk.lines), chunk.bytes_read)

    def _encode_key(self, documents: list[list[str]]) -> EncodedDocuments:
        encoded = iter(_encode_all(self.tokenizer, [text for parts in documents
                                                    for text in parts]))
        tokens: list[int] = []
        lengths: list[int] = []
        per_document: list[int] = []
        for parts in documents:
            sequences = 0
            for _ in parts:
                ids = next(encoded)
                if len(ids) > 0:
                    tokens.extend(ids)
                    lengths.append(len(ids))
                    sequences += 1
            if sequences and self.append_eod:
                tokens.append(self.tokenizer.eod)
                lengths[-1] += 1
            per_document.append(sequences)
        return EncodedDocuments(self._as_dtype(tokens), lengths, per_document)

    def _as_dtype(self, tokens: list[int]) -> np.ndarray:
        values = np.asarray(tokens, dtype=np.int64)
        if values.size and self.dtype.kind in "iu":
            info = np.iinfo(self.dtype)
            if int(values.min()) < info.min or int(values.max()) > info.max:
                raise DataError(f"{self.path}: token ids {int(values.min())}.."
                                f"{int(values.max())} do not fit {self.dtype.name}; choose a "
                                "wider --dtype")
        return values.astype(self.dtype)


def _encode_all(tokenizer: TextTokenizer, texts: list[str]) -> list[list[int]]:
    encode_batch = getattr(tokenizer, "encode_batch", None)
    if encode_batch is not None:
        return encode_batch(texts)
    return [tokenizer.encode(text) for text in texts]


_worker_encoder: ChunkEncoder | None = None


def _start_worker(encoder: ChunkEncoder) -> None:
    global _worker_encoder
    # One thread per worker: the workers share the cores, and a Hugging Face tokenizer's own
    # thread pool in each would only oversubscribe them. (In this process, with one worker,
    # encode_batch keeps its threads.)
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    # Ctrl-C reaches every process of the terminal's group: the main process answers it (one
    # line, the pool stopped); a worker's KeyboardInterrupt would only add a traceback.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _worker_encoder = encoder


def _encode_in_worker(chunk: LineChunk) -> EncodedChunk:
    assert _worker_encoder is not None, "worker started without _start_worker"
    return _worker_encoder(chunk)


def _pool_ignoring_sigint(workers: int, encoder: ChunkEncoder) -> Any:
    """The workers' pool, started with SIGINT ignored: an ignored signal stays ignored across
    the exec of a spawned worker, and Python then installs no KeyboardInterrupt handler, so a
    Ctrl-C during a worker's start-up (before `_start_worker` runs) prints no traceback."""
    context = multiprocessing.get_context("spawn")
    main = threading.current_thread() is threading.main_thread()  # signal.signal needs it
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN) if main else None
    try:
        return context.Pool(workers, initializer=_start_worker, initargs=(encoder,))
    finally:
        if main:
            signal.signal(signal.SIGINT, previous)


def encode_chunks(encoder: ChunkEncoder, chunks: Iterable[LineChunk],
                  workers: int) -> Iterator[EncodedChunk]:
    """The encoded chunks in input order, encoded here (``workers == 1``) or by ``workers``
    processes with at most two chunks each in flight. An error raised in a worker (a bad line's
    DataError) is raised here, and the workers are stopped."""
    if workers == 1:
        yield from map(encoder, chunks)
        return
    with _pool_ignoring_sigint(workers, encoder) as pool:
        pending: deque = deque()
        for chunk in chunks:
            pending.append(pool.apply_async(_encode_in_worker, (chunk,)))
            if len(pending) >= _IN_FLIGHT_PER_WORKER * workers:
                yield pending.popleft().get()
        while pending:
            yield pending.popleft().get()
