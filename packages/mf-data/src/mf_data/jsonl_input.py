"""Reading preprocessing input: JSON Lines, plain or gzip (``.jsonl.gz``), in chunks of lines.

The main process only reads raw lines and counts them; decoding the JSON and tokenizing happen
where the chunk is encoded (in a worker process with ``--workers``), so a bad line is reported
from there with its file and line number.
"""

from __future__ import annotations

import gzip
import json
import os
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import BinaryIO

from mf_data.errors import DataError


@dataclass(frozen=True)
class LineChunk:
    """Consecutive input lines: the number of the first (1-based), the lines themselves, and
    how far into the file (bytes of the file on disk) reading had got after the last."""

    first_line: int
    lines: list[bytes]
    bytes_read: int


def is_gzip(path: str) -> bool:
    return path.endswith(".gz")


def read_chunks(path: str, lines_per_chunk: int) -> Iterator[LineChunk]:
    """The input's lines, ``lines_per_chunk`` at a time (the last chunk may be shorter).

    Raises:
        DataError: the file is missing, or a ``.gz`` file is not gzip or is truncated.
    """
    if not os.path.isfile(path):
        raise DataError(f"{path}: input file not found")
    with open(path, "rb") as raw:
        stream: BinaryIO = gzip.GzipFile(fileobj=raw, mode="rb") if is_gzip(path) else raw
        try:
            yield from _chunks(stream, raw, lines_per_chunk, is_gzip(path))
        except (gzip.BadGzipFile, EOFError, zlib.error) as error:
            raise DataError(f"{path}: cannot decompress the gzip input ({error}); a .gz input "
                            "must be a complete gzip file of JSON Lines") from None


def _chunks(stream: BinaryIO, raw: BinaryIO, size: int, compressed: bool
            ) -> Iterator[LineChunk]:
    """Chunks of ``stream``'s lines; progress is the position in ``raw``, the file on disk."""
    first, lines, plain_bytes = 1, [], 0
    for line in stream:
        lines.append(line)
        plain_bytes += len(line)
        if len(lines) >= size:
            yield LineChunk(first, lines, raw.tell() if compressed else plain_bytes)
            first, lines = first + len(lines), []
    if lines:
        yield LineChunk(first, lines, raw.tell() if compressed else plain_bytes)


def parse_record(path: str, line_number: int, line: bytes,
                 json_keys: Sequence[str]) -> list[list[str]] | None:
    """The text parts under each key of one JSON Lines record (None for a blank line), or a
    DataError naming file:line. A string is one part; a list of strings is one part each
    (Megatron's ``--split-sentences`` output)."""
    if not line.strip():
        return None
    where = f"{path}:{line_number}"
    try:
        record = json.loads(line.rstrip(b"\r\n"))
    except UnicodeDecodeError as error:
        if line_number == 1 and line.startswith(b"\x1f\x8b"):
            raise DataError(f"{where}: not UTF-8 text: the file is gzip-compressed; a gzip "
                            "input must be named .gz (e.g. .jsonl.gz)") from None
        raise DataError(f"{where}: not UTF-8 text ({error.reason})") from None
    except json.JSONDecodeError as error:
        raise DataError(f"{where}: not valid JSON: {error.msg} at column {error.colno}") from None
    if not isinstance(record, dict):
        raise DataError(f"{where}: expected a JSON object with key {json_keys[0]!r}, got "
                        f"{type(record).__name__}")
    return [_parts(where, record, key) for key in json_keys]


def _parts(where: str, record: dict, key: str) -> list[str]:
    if key not in record:
        keys = ", ".join(repr(k) for k in list(record)[:10]) or "none"
        raise DataError(f"{where}: no key {key!r} (keys present: {keys}); choose the key "
                        f"with --json-keys")
    text = record[key]
    if isinstance(text, str):
        return [text]
    if isinstance(text, list) and all(isinstance(part, str) for part in text):
        return text
    raise DataError(f"{where}: {key!r} must be a string or a list of strings, got "
                    f"{type(text).__name__}")
