"""A sharded checkpoint read at another tensor-parallel degree than the one that saved it.

A checkpoint keeps each weight tensor parallelism splits per tensor place: the shard each
place held at the saving run's degree (`checkpoint.pieces`). `RecutIndex` is a `PieceIndex`
seen from a run with another degree (one process included): asked for a tensor at a place the
checkpoint does not hold, it reads the tensor at the degree it was saved with (every place's
shard, or the whole tensor), gathers the one-process value through the model's Hugging Face
weight table (`gather_hf_state`: shards concatenated along the split axis, fused parameters
such as `qkv` and `gate_up` split back into their parts) and cuts this place's shard out the
way the Hugging Face import does (`local_value`). One tensor is whole at a time. Optimizer
state (moments, float32 masters) has its parameter's shape and is cut the same way; its key
is the parameter's name behind a prefix (`adam_m.<name>`).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from typing import Any

import numpy as np

from ..checkpoint.pieces import PieceIndex
from ..models.hf_weights import (
    ArraysSource,
    Place,
    TensorPlace,
    WeightMap,
    gather_hf_state,
    local_shape,
    local_value,
)


class RecutIndex:
    """`index` answering for tensors at any tensor place (see the module).

    Args:
        index: the checkpoint's pieces of one kind (model or optimizer state).
        entries: the model's weight table (`weight_maps()`): how each parameter is split.
    """

    def __init__(self, index: PieceIndex, entries: Iterable[WeightMap]):
        self.index = index
        self.entries = {entry.ours: entry for entry in entries}
        self._lock = threading.Lock()
        self._last: tuple[str, Place, np.ndarray] | None = None

    def __getattr__(self, name: str) -> Any:  # directory, degree, bytes_read, names, ...
        return getattr(self.index, name)

    def __enter__(self) -> RecutIndex:
        return self

    def __exit__(self, *exc: object) -> None:
        self.index.__exit__(*exc)

    def has(self, name: str, tensor: Place = None) -> bool:
        return self.index.has(name, tensor) or (
            self._entry(name) is not None and self._saved(name) is not None)

    def shape(self, name: str, tensor: Place = None) -> tuple[int, ...]:
        if self.index.has(name, tensor):
            return self.index.shape(name, tensor)
        entry = self._entry(name)
        if entry is None:
            return self.index.shape(name, tensor)  # raises KeyError, as the index does
        return local_shape(entry, tensor)

    def read_whole(self, name: str, tensor: Place = None) -> np.ndarray:
        """Tensor `name` at place `tensor`, cut from what was saved when it is not there."""
        if self.index.has(name, tensor) or self._entry(name) is None:
            return self.index.read_whole(name, tensor)
        return self._recut(name, tensor)

    def read_range(self, name: str, start: int, stop: int, tensor: Place = None,
                   ) -> np.ndarray:
        """Elements `[start, stop)` of `read_whole(name, tensor)`, flat (the last tensor cut
        is kept, for the next range of it)."""
        if self.index.has(name, tensor) or self._entry(name) is None:
            return self.index.read_range(name, start, stop, tensor)
        with self._lock:
            if self._last is None or self._last[:2] != (name, tensor):
                self._last = (name, tensor, self._recut(name, tensor).reshape(-1))
            return self._last[2][start:stop].copy()

    def _entry(self, name: str) -> WeightMap | None:
        """The weight-table entry of parameter `name`, or of the parameter a state key
        `<prefix>.<name>` belongs to."""
        position = -1
        while True:
            entry = self.entries.get(name[position + 1:])
            if entry is not None:
                return entry
            position = name.find(".", position + 1)
            if position < 0:
                return None

    def _saved(self, name: str) -> list[Place] | None:
        """The places `name` was saved at: whole, or every place of the saved degree."""
        if self.index.has(name):
            return [None]
        degree = self.index.degree
        places = [(place, degree) for place in range(degree or 0)]
        if places and all(self.index.has(name, place) for place in places):
            return places
        return None

    def _recut(self, name: str, tensor: Place) -> np.ndarray:
        entry, saved = self._entry(name), self._saved(name)
        if entry is None or saved is None:
            return self.index.read_whole(name, tensor)  # raises, naming what is missing
        shards = [{entry.ours: self.index.read_whole(name, place)} for place in saved]
        whole = ArraysSource(gather_hf_state([entry], shards))
        group = None if tensor is None else TensorPlace(*tensor)
        return local_value(entry, whole, group)
