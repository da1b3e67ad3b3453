"""Sharded checkpoints: each rank writes the pieces it owns, any layout reads what it needs.

A checkpoint of format version 3 stores every tensor (model parameter, optimizer state) as
*pieces*: a piece is a flat element range `[start, stop)` of one tensor, stored as a 1-D
array under its own key in the writing rank's safetensors file. The tensor is named as one
process names it (`model.layers.0.mlp.up_proj.weight`, `adam_m.model.layers.0...`) and has
the shape one process gives it, except under tensor parallelism, where a split weight is
stored per tensor place (`tensor = (place, degree)`, the shape of that place's shard).

Which rank writes what (the `remove_redundancy` behaviour): a rank writes the ranges it holds
and is the first holder of (`owns`): FSDP and ZeRO ranks write their slices, one replica of a
data-parallel, context-parallel or tensor-replicated tensor writes it once, a pipeline stage
writes its layers, an expert-parallel rank its experts. Nothing is gathered to be saved.

Each rank's `sums` file records, beside each file's size and SHA-256, the pieces it holds;
rank 0 copies them into `common.json` (`files[name]["pieces"]`), so a reader knows where every
range of every tensor lies without knowing the saving run's configuration (`PieceIndex`). A
rank loading onto any layout asks for the ranges it holds (`read_range`) and gets them from
every saved piece that overlaps them (safetensors `get_slice`: only those bytes are read), as
PyTorch's distributed checkpoint loads by overlap.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import attrs
import numpy as np

from .atomic import Streamed, file_digest
from .errors import CheckpointError, CorruptCheckpointError


@attrs.frozen
class Piece:
    """One saved range of one tensor.

    Attributes:
        name: the tensor's model-wide name.
        shape: the whole tensor's shape (its tensor-parallel shard's under `tensor`).
        start: the first element of the range, in the tensor's row-major flattening.
        stop: one past the last element.
        tensor: `(place, degree)` when the tensor is one place's shard of a weight tensor
            parallelism splits; None for a tensor every tensor place holds whole.
    """

    name: str
    shape: tuple[int, ...] = attrs.field(converter=lambda s: tuple(int(n) for n in s))
    start: int = 0
    stop: int = -1
    tensor: tuple[int, int] | None = attrs.field(
        default=None, converter=lambda t: None if t is None else (int(t[0]), int(t[1])))

    def __attrs_post_init__(self) -> None:
        if self.stop == -1:
            object.__setattr__(self, "stop", self.numel)
        if not 0 <= self.start < self.stop <= self.numel and not self.numel == self.stop == 0:
            raise ValueError(f"{self.name}: range [{self.start}, {self.stop}) is not inside "
                             f"its {self.numel} elements")

    @property
    def numel(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def whole(self) -> bool:
        return self.start == 0 and self.stop == self.numel

    @property
    def key(self) -> str:
        """The safetensors key: the name, with the place and range when not the whole
        tensor every place holds."""
        key = self.name
        if self.tensor is not None:
            key += f"@tp{self.tensor[0]}of{self.tensor[1]}"
        return key if self.whole else f"{key}@{self.start}:{self.stop}"

    def record(self) -> list[Any]:
        """The JSON form in a `sums` file and `common.json`."""
        return [self.name, list(self.shape), self.start, self.stop,
                None if self.tensor is None else list(self.tensor)]

    @classmethod
    def from_record(cls, record: list[Any]) -> Piece:
        name, shape, start, stop, tensor = record
        return cls(name, shape, start, stop, tensor)


def whole_piece(name: str, shape: Iterable[int], tensor: tuple[int, int] | None = None) -> Piece:
    return Piece(name, tuple(shape), 0, -1, tensor)


@attrs.frozen
class Deferred:
    """A piece's values produced when the writer reaches them (a host copy of one parameter
    made then, not when the save starts), so a synchronous save holds one tensor's copy at a
    time. `dtype` is the stored dtype `read` returns."""

    dtype: np.dtype = attrs.field(converter=np.dtype)
    read: Callable[[], np.ndarray]


def streamed(pieces: Mapping[Piece, np.ndarray | Deferred]) -> list[Streamed]:
    """The tensors to write, flat, under their pieces' keys (each read checked against its
    range by the writer)."""
    tensors, keys = [], set()
    for piece, value in pieces.items():
        if piece.key in keys:
            raise ValueError(f"{piece.key}: written twice by one rank")
        keys.add(piece.key)
        numel = piece.stop - piece.start
        if isinstance(value, Deferred):
            tensors.append(Streamed(piece.key, value.dtype, numel, value.read))
            continue
        array = np.asarray(value)
        if array.size != numel:
            raise ValueError(f"{piece.key}: {array.size} values for a range of {numel}")
        tensors.append(Streamed(piece.key, array.dtype, numel, lambda array=array: array))
    return tensors


@attrs.frozen
class Located:
    """A saved piece and the file that holds it."""

    piece: Piece
    file: str


class PieceIndex:
    """Where every saved range of every tensor of one kind ("model" or "opt") lies, from a
    checkpoint's `common.json`; reads ranges by overlap.

    Args:
        directory: the checkpoint directory.
        common: its `common.json`.
        kind: "model" or "opt".
        verify: check each file's SHA-256 when it is first read (off when the ranks have
            verified the files between them: `verify_share`).
    """

    def __init__(self, directory: Path, common: Mapping[str, Any], kind: str,
                 verify: bool = True):
        self.directory = directory
        self.verify = verify
        self.sums: dict[str, str | None] = {}
        self.by_tensor: dict[tuple[str, tuple[int, int] | None], list[Located]] = {}
        self.shapes: dict[tuple[str, tuple[int, int] | None], tuple[int, ...]] = {}
        self.degree: int | None = None
        marker = f"-{kind}-"
        for file, entry in common.get("files", {}).items():
            if marker not in file or not isinstance(entry, dict) or "pieces" not in entry:
                continue
            self.sums[file] = entry.get("sha256")
            for record in entry["pieces"]:
                piece = Piece.from_record(record)
                tensor_key = (piece.name, piece.tensor)
                self.by_tensor.setdefault(tensor_key, []).append(Located(piece, file))
                self.shapes.setdefault(tensor_key, piece.shape)
                if piece.tensor is not None:
                    self.degree = piece.tensor[1]
        self._files: dict[str, Any] = {}
        self._opening = threading.Lock()  # `checkpoint.load_worker_number` threads read
        self._stack = ExitStack()
        self.bytes_read = 0

    def __enter__(self) -> PieceIndex:
        return self

    def __exit__(self, *exc: object) -> None:
        self._stack.close()

    def names(self) -> set[str]:
        return {name for name, _ in self.by_tensor}

    def has(self, name: str, tensor: tuple[int, int] | None = None) -> bool:
        return (name, tensor) in self.by_tensor

    def shape(self, name: str, tensor: tuple[int, int] | None = None) -> tuple[int, ...]:
        return self.shapes[(name, tensor)]

    def read_range(self, name: str, start: int, stop: int,
                   tensor: tuple[int, int] | None = None) -> np.ndarray:
        """Elements `[start, stop)` of tensor `name` (at tensor place `tensor`), flat, from
        the saved pieces overlapping them (where two overlap, as copies of one tensor saved
        by several ranks do, the first by start is read).

        Raises:
            CheckpointError: the tensor is not in the checkpoint, or some of the range is in
                no saved piece.
        """
        located = self.by_tensor.get((name, tensor))
        if located is None:
            place = "" if tensor is None else f" at tensor place {tensor[0]} of {tensor[1]}"
            raise CheckpointError(f"{self.directory}: holds no {name}{place}")
        out: np.ndarray | None = None
        position = start  # everything before it is read
        for entry in sorted(located, key=lambda entry: entry.piece.start):
            if position >= stop:
                break
            if entry.piece.stop <= position or entry.piece.start >= stop:
                continue
            if entry.piece.start > position:
                break  # a gap: no piece holds `position`
            high = min(stop, entry.piece.stop)
            values = self._slice(entry, position - entry.piece.start, high - entry.piece.start)
            if out is None:
                out = np.empty(stop - start, values.dtype)
            out[position - start:high - start] = values
            position = high
        if position < stop or (out is None and stop > start):
            raise CheckpointError(f"{self.directory}: elements [{position}, {stop}) of {name} "
                                  "are in no saved piece")
        return out if out is not None else np.zeros(0, np.float32)

    def read_whole(self, name: str, tensor: tuple[int, int] | None = None) -> np.ndarray:
        """Tensor `name` whole, in its shape."""
        shape = self.shapes.get((name, tensor))
        if shape is None:
            self.read_range(name, 0, 0, tensor)  # raises, naming it
        numel = int(np.prod(shape, dtype=np.int64))
        if numel == 0:
            return np.zeros(shape, np.float32)
        return self.read_range(name, 0, numel, tensor).reshape(shape)

    def _slice(self, entry: Located, low: int, high: int) -> np.ndarray:
        handle = self._open(entry.file)
        values = handle.get_slice(entry.piece.key)[low:high]
        self.bytes_read += values.nbytes
        return values

    def _open(self, file: str) -> Any:
        with self._opening:
            return self._opened(file)

    def _opened(self, file: str) -> Any:
        if file not in self._files:
            from safetensors import safe_open

            path = self.directory / file
            if self.verify:
                _verify(path, self.sums.get(file))
            try:
                self._files[file] = self._stack.enter_context(safe_open(str(path), "numpy"))
            except Exception as exc:  # safetensors' own errors, re-raised naming the file
                raise CheckpointError(f"{path}: cannot read it as safetensors ({exc})") from None
        return self._files[file]


def verify_share(directory: Path, common: Mapping[str, Any], rank: int, ranks: int) -> None:
    """Check the SHA-256 of this rank's share of the checkpoint's files (every `ranks`-th,
    from the `rank`-th), so that the ranks together read each file once.

    Raises:
        CorruptCheckpointError: a file's bytes do not match.
    """
    for number, (file, entry) in enumerate(sorted(common.get("files", {}).items())):
        if number % ranks == rank and isinstance(entry, dict):
            _verify(directory / file, entry.get("sha256"))


def _verify(path: Path, sha256: str | None) -> None:
    """`path`'s bytes checked against the SHA-256 `common.json` records (read in blocks)."""
    if sha256 is None:
        return
    try:
        digest = file_digest(path)
    except FileNotFoundError:
        raise CheckpointError(f"{path}: missing") from None
    except OSError as exc:
        raise CheckpointError(f"{path}: cannot be read ({exc.strerror or exc})") from None
    if digest != sha256:
        raise CorruptCheckpointError(f"{path}: its bytes do not match the SHA-256 recorded in "
                                     "common.json (damaged after it was written)")
