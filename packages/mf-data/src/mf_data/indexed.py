"""Megatron's indexed dataset: the `.idx`/`.bin` pair, read and written byte for byte.

`.idx` (little-endian, no padding): magic ``MMIDIDX\\0\\0``, ``<Q`` version 1, ``<B`` dtype code,
``<Q`` sequence count N, ``<Q`` document count D, then N int32 sequence lengths, N int64 byte
pointers into `.bin`, D int64 document indices ``[0, ..., N]`` and, only in multimodal files, N
int8 sequence modes. `.bin` holds the tokens of every sequence back to back, no header.
Files written here are identical to megatron-core 0.16.1's ``IndexedDatasetBuilder`` output.
"""

from __future__ import annotations

import os
import struct
from array import array
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, BinaryIO, ClassVar

import numpy as np

from mf_data.atomic_files import temporary_beside, write_atomically
from mf_data.errors import DataError

INDEX_MAGIC = b"MMIDIDX\x00\x00"
INDEX_VERSION = 1
_HEADER = struct.Struct("<9sQBQQ")  # magic, version, dtype code, sequence count, document count
HEADER_SIZE = _HEADER.size  # 34
_INT32_MAX = np.iinfo(np.int32).max


class DType:
    """Megatron's token dtype codes (indexed_dataset.py ``DType``), little-endian numpy dtypes."""

    _BY_CODE: ClassVar[dict[int, np.dtype]] = {
        1: np.dtype("u1"),
        2: np.dtype("i1"),
        3: np.dtype("<i2"),
        4: np.dtype("<i4"),
        5: np.dtype("<i8"),
        6: np.dtype("<f8"),
        7: np.dtype("<f4"),
        8: np.dtype("<u2"),
    }
    _BY_DTYPE: ClassVar[dict[np.dtype, int]] = {dtype: code for code, dtype in _BY_CODE.items()}

    @classmethod
    def allowed(cls) -> str:
        return ", ".join(f"{code} {dtype.name}" for code, dtype in cls._BY_CODE.items())

    @classmethod
    def code_of(cls, dtype: Any) -> int:
        """The code of a numpy dtype, scalar type or name (``np.uint16``, ``"int32"``)."""
        try:
            normalised = np.dtype(dtype)
        except TypeError as error:
            raise DataError(f"token dtype {dtype!r}: not a numpy dtype; allowed: "
                            f"{cls.allowed()}") from error
        code = cls._BY_DTYPE.get(normalised)
        if code is None:
            raise DataError(f"token dtype {normalised}: not supported by the indexed format; "
                            f"allowed: {cls.allowed()}")
        return code

    @classmethod
    def dtype_of(cls, code: int) -> np.dtype:
        dtype = cls._BY_CODE.get(int(code))
        if dtype is None:
            raise DataError(f"token dtype code {code}: unknown; allowed: {cls.allowed()}")
        return dtype

    @staticmethod
    def optimal(vocab_size: int) -> np.dtype:
        """Megatron's ``optimal_dtype``: uint16 if the vocabulary is below 65500, else int32."""
        return np.dtype("<u2") if vocab_size < 65500 else np.dtype("<i4")


def index_path(prefix: str | os.PathLike) -> str:
    return os.fspath(prefix) + ".idx"


def data_path(prefix: str | os.PathLike) -> str:
    return os.fspath(prefix) + ".bin"


def _open_bytes(path: str, mmap: bool) -> np.ndarray:
    """The whole file as a uint8 array: memory-mapped, or read into memory.

    numpy cannot map an empty file, so an empty file is an empty in-memory array.
    """
    if not mmap or os.path.getsize(path) == 0:
        return np.fromfile(path, dtype=np.uint8)
    return np.memmap(path, dtype=np.uint8, mode="r")


class IndexedDataset:
    """A Megatron ``.idx``/``.bin`` pair. Validates the index against the data on open so a
    damaged corpus fails here, naming the file, rather than later inside a training step.

    Args:
        prefix: the path of both files without ``.idx``/``.bin``.
        mmap: memory-map the files (else read them into memory).

    Raises:
        DataError: naming the file, when one is missing, not a Megatron index, truncated, or
            does not match the other.
    """

    def __init__(self, prefix: str | os.PathLike, mmap: bool = True) -> None:
        self.prefix = os.fspath(prefix)
        self.index_file = index_path(prefix)
        self.data_file = data_path(prefix)
        for kind, path in (("index", self.index_file), ("data", self.data_file)):
            if not os.path.isfile(path):
                raise DataError(f"{path}: {kind} file missing for indexed dataset prefix "
                                f"{self.prefix!r}; both {self.prefix}.idx and "
                                f"{self.prefix}.bin must exist")
        index = _open_bytes(self.index_file, mmap)
        self._read_index(index)
        self._data = _open_bytes(self.data_file, mmap)
        self._check_data_size()

    def _read_index(self, index: np.ndarray) -> None:
        path = self.index_file
        if index.size < HEADER_SIZE:
            raise DataError(f"{path}: truncated index: {index.size} bytes, the header alone "
                            f"needs {HEADER_SIZE}")
        magic, version, code, count, doc_count = _HEADER.unpack(index[:HEADER_SIZE].tobytes())
        if magic != INDEX_MAGIC:
            raise DataError(f"{path}: not a Megatron index: magic {magic!r}, "
                            f"expected {INDEX_MAGIC!r}")
        if version != INDEX_VERSION:
            raise DataError(f"{path}: unsupported index version {version}; only version "
                            f"{INDEX_VERSION} is supported")
        try:
            self.dtype = DType.dtype_of(code)
        except DataError as error:
            raise DataError(f"{path}: {error}") from None
        needed = HEADER_SIZE + 12 * count + 8 * doc_count
        if index.size < needed:
            raise DataError(f"{path}: truncated index: {index.size} bytes, but {count} "
                            f"sequences and {doc_count} document indices need {needed}")
        offset = HEADER_SIZE
        self.sequence_lengths = np.frombuffer(index, "<i4", count, offset)
        offset += 4 * count
        self.sequence_pointers = np.frombuffer(index, "<i8", count, offset)
        offset += 8 * count
        self.document_indices = np.frombuffer(index, "<i8", doc_count, offset)
        offset += 8 * doc_count
        # Multimodal files append one int8 mode per sequence; nothing else may follow.
        self.sequence_modes: np.ndarray | None = None
        if count and index.size - offset == count:
            self.sequence_modes = np.frombuffer(index, "i1", count, offset)
        self._check_document_indices()

    def _check_document_indices(self) -> None:
        path, count, docs = self.index_file, len(self.sequence_lengths), self.document_indices
        if docs.size == 0:
            raise DataError(f"{path}: no document indices; expected [0, ..., {count}]")
        if docs[-1] != count or docs[0] != 0:
            raise DataError(f"{path}: sequence count {count} disagrees with the document "
                            f"indices, which run from {docs[0]} to {docs[-1]}; they must run "
                            f"from 0 to the sequence count")
        if docs.size > 1 and np.any(np.diff(docs) < 0):
            raise DataError(f"{path}: document indices decrease; they must be non-decreasing")

    def _check_data_size(self) -> None:
        """The `.bin` holds exactly the tokens the `.idx` describes, back to back, as Megatron
        writes them: a `.bin` of another size (a dtype byte changed, the pair from two
        different runs) would otherwise be read as other tokens, silently."""
        lengths, pointers = self.sequence_lengths, self.sequence_pointers
        if lengths.size and (lengths.min() < 0 or pointers.min() < 0):
            raise DataError(f"{self.index_file}: negative sequence length or pointer")
        itemsize = self.dtype.itemsize
        ends = pointers + lengths.astype(np.int64) * itemsize
        needed = int(ends.max()) if lengths.size else 0
        if needed > self._data.size:
            raise DataError(f"{self.data_file}: sizes disagree: the data file has "
                            f"{self._data.size} bytes but {self.index_file} points up to byte "
                            f"{needed}; the pair is truncated or mismatched")
        tokens = int(lengths.sum(dtype=np.int64))
        if self._data.size != tokens * itemsize:
            raise DataError(f"{self.data_file}: sizes disagree: the data file has "
                            f"{self._data.size:,} bytes but {self.index_file} describes "
                            f"{tokens:,} tokens of {self.dtype.name} ({itemsize} "
                            f"byte{'s' if itemsize > 1 else ''} each) = {tokens * itemsize:,} "
                            f"bytes{self._dtype_hint(tokens)}; the two files do not belong "
                            f"together: write both again (mf-data preprocess)")
        starts = np.zeros_like(ends)
        np.cumsum(ends[:-1] - pointers[:-1], out=starts[1:])
        wrong = np.flatnonzero(pointers != starts)
        if wrong.size:
            first = int(wrong[0])
            raise DataError(f"{self.index_file}: sequence {first} starts at byte "
                            f"{int(pointers[first])} of {self.data_file}, but the lengths "
                            f"before it put it at byte {int(starts[first])}; the index is "
                            f"damaged: write the pair again (mf-data preprocess)")

    def _dtype_hint(self, tokens: int) -> str:
        """Why the sizes disagree, when the data file holds a whole number of bytes per token
        that another dtype has: the index's dtype is not the data's."""
        if not tokens or self._data.size % tokens:
            return ""
        per_token = self._data.size // tokens
        others = [dtype.name for dtype in DType._BY_CODE.values() if dtype.itemsize == per_token]
        if per_token == self.dtype.itemsize or not others:
            return ""
        return (f" (the data holds {per_token} bytes per token, as {' or '.join(others)} "
                f"would: the index's dtype does not match the data's)")

    def __len__(self) -> int:
        return len(self.sequence_lengths)

    @property
    def document_count(self) -> int:
        """Documents (not sequences): one less than the number of document indices."""
        return len(self.document_indices) - 1

    def get(self, index: int, offset: int = 0, length: int | None = None) -> np.ndarray:
        """Part or all of one sequence, without copying it.

        Args:
            index: the sequence (negative counts from the end).
            offset: the first token.
            length: tokens to read; None reads to the end of the sequence.

        Returns:
            Tokens ``[offset, offset + length)`` in the file's dtype, a read-only view.

        Raises:
            DataError: the index or the token range is out of bounds.
        """
        count = len(self)
        if not -count <= index < count:
            raise DataError(f"{self.prefix}: sequence index {index} out of range; the dataset "
                            f"has {count} sequences")
        index = int(index) % count
        size = int(self.sequence_lengths[index])
        if length is None:
            length = size - offset
        if offset < 0 or length < 0 or offset + length > size:
            raise DataError(f"{self.prefix}: sequence {index} has {size} tokens; offset "
                            f"{offset} and length {length} reach outside it")
        start = int(self.sequence_pointers[index]) + offset * self.dtype.itemsize
        return np.frombuffer(self._data, self.dtype, length, start)

    def __getitem__(self, index: int) -> np.ndarray:
        return self.get(index)


def write_index_file(idx_path: str | os.PathLike, dtype: Any, sequence_lengths: np.ndarray,
                     document_indices: np.ndarray) -> None:
    """Write a `.idx` atomically. Pointers follow from the lengths: sequences are contiguous."""
    itemsize = np.dtype(dtype).itemsize
    lengths = np.asarray(sequence_lengths, dtype="<i4")
    pointers = np.zeros(len(lengths), dtype="<i8")
    if len(lengths) > 1:
        np.cumsum(lengths[:-1].astype("<i8") * itemsize, out=pointers[1:])
    documents = np.asarray(document_indices, dtype="<i8")
    header = _HEADER.pack(INDEX_MAGIC, INDEX_VERSION, DType.code_of(dtype), len(lengths),
                          len(documents))

    def write(stream: BinaryIO) -> None:
        for part in (header, lengths.tobytes(), pointers.tobytes(), documents.tobytes()):
            stream.write(part)

    write_atomically(idx_path, write)


class IndexedDatasetBuilder:
    """Streams sequences into a `.bin` (under a temporary name until ``finalize``) and records
    lengths and document boundaries for the `.idx`.

    Args:
        bin_path: where the `.bin` goes.
        dtype: the token dtype, one Megatron has a code for (`DType`).
    """

    def __init__(self, bin_path: str | os.PathLike, dtype: Any = np.int32) -> None:
        self.bin_path = os.fspath(bin_path)
        self.dtype = DType.dtype_of(DType.code_of(dtype))
        self._sequence_lengths = array("q")
        self._document_indices = array("q", [0])
        handle, self._temporary = temporary_beside(self.bin_path)
        self._stream = os.fdopen(handle, "wb")

    def _as_tokens(self, tokens: np.ndarray | Sequence[int]) -> np.ndarray:
        values = np.asarray(tokens)
        if values.ndim != 1:
            raise DataError(f"{self.bin_path}: a sequence must be 1-D, got shape {values.shape}")
        if values.size == 0:
            return values.astype(self.dtype)
        if self.dtype.kind in "iu":
            if values.dtype.kind not in "iub":
                raise DataError(f"{self.bin_path}: tokens of dtype {values.dtype} cannot be "
                                f"stored as {self.dtype.name}; give integers")
            info = np.iinfo(self.dtype)
            low, high = int(values.min()), int(values.max())
            if low < info.min or high > info.max:
                raise DataError(f"{self.bin_path}: token ids {low}..{high} do not fit "
                                f"{self.dtype.name} ({info.min}..{info.max}); choose a wider "
                                f"dtype")
        return values.astype(self.dtype, copy=False)

    def _write(self, values: np.ndarray) -> None:
        if self._stream.closed:
            raise DataError(f"{self.bin_path}: builder already finalized or discarded")
        if len(values) > _INT32_MAX:
            raise DataError(f"{self.bin_path}: a sequence of {len(values)} tokens exceeds the "
                            f"format's int32 length limit")
        self._stream.write(np.ascontiguousarray(values).tobytes())
        self._sequence_lengths.append(len(values))

    def add_item(self, tokens: np.ndarray | Sequence[int]) -> None:
        """Append one sequence (not yet ending a document)."""
        self._write(self._as_tokens(tokens))

    def end_document(self) -> None:
        """Close the current document at the current sequence count."""
        self._document_indices.append(len(self._sequence_lengths))

    def add_document(self, tokens: np.ndarray | Sequence[int], lengths: Sequence[int]) -> None:
        """Append one document made of several sequences of the given lengths, and end it."""
        values = self._as_tokens(tokens)
        if sum(lengths) != len(values) or any(length < 0 for length in lengths):
            raise DataError(f"{self.bin_path}: document lengths {list(lengths)} do not add up "
                            f"to its {len(values)} tokens")
        start = 0
        for length in lengths:
            self._write(values[start:start + length])
            start += length
        self.end_document()

    def add_documents(self, tokens: np.ndarray | Sequence[int], sequence_lengths: Sequence[int],
                      sequences_per_document: Sequence[int]) -> None:
        """Append many documents in one write: the same bytes as ``add_document`` per document.

        Args:
            tokens: every sequence's tokens back to back.
            sequence_lengths: the length of each sequence, in order.
            sequences_per_document: how many of those sequences each document has (0: a
                document without sequences).
        """
        values = self._as_tokens(tokens)
        if sum(sequence_lengths) != len(values) or any(n < 0 for n in sequence_lengths) or \
                sum(sequences_per_document) != len(sequence_lengths):
            raise DataError(f"{self.bin_path}: {len(sequence_lengths)} sequence lengths adding "
                            f"up to {sum(sequence_lengths)} do not match {len(values)} tokens "
                            f"in documents of {sum(sequences_per_document)} sequences")
        if self._stream.closed:
            raise DataError(f"{self.bin_path}: builder already finalized or discarded")
        if any(n > _INT32_MAX for n in sequence_lengths):
            raise DataError(f"{self.bin_path}: a sequence of {max(sequence_lengths)} tokens "
                            f"exceeds the format's int32 length limit")
        self._stream.write(np.ascontiguousarray(values).tobytes())
        start = len(self._sequence_lengths)
        self._sequence_lengths.extend(sequence_lengths)
        self._document_indices.extend(start + int(end) for end in
                                      np.cumsum(sequences_per_document, dtype=np.int64))

    def finalize(self, idx_path: str | os.PathLike) -> None:
        """Move the `.bin` into place and write the `.idx` (both atomically)."""
        if self._stream.closed:
            raise DataError(f"{self.bin_path}: builder already finalized or discarded")
        self._stream.close()
        try:
            os.replace(self._temporary, self.bin_path)
        except BaseException:
            self.discard()
            raise
        write_index_file(idx_path, self.dtype, np.frombuffer(self._sequence_lengths, np.int64),
                         np.frombuffer(self._document_indices, np.int64))

    def discard(self) -> None:
        """Abandon the build: close and delete the temporary `.bin`."""
        if not self._stream.closed:
            self._stream.close()
        Path(self._temporary).unlink(missing_ok=True)

    def __enter__(self) -> IndexedDatasetBuilder:
        return self

    def __exit__(self, exc_type: object, exc: object, traceback: object) -> None:
        if exc_type is not None:
            self.discard()


def write_indexed(prefix: str | os.PathLike, documents: Iterable[Sequence[int]],
                  dtype: Any = np.int32) -> None:
    """Write a Megatron indexed dataset with each document as one sequence, atomically.

    Args:
        prefix: the path of ``prefix.bin``/``prefix.idx``.
        documents: token ids, one sequence per document.
        dtype: the token dtype.
    """
    with IndexedDatasetBuilder(data_path(prefix), dtype) as builder:
        for document in documents:
            builder.add_item(document)
            builder.end_document()
        builder.finalize(index_path(prefix))
