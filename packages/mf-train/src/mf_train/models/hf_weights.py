"""Our parameter names <-> Hugging Face weight names, and loading a model from HF weights.

A model describes itself by `weight_maps()`: one `WeightMap` per parameter, naming the HF
weights it holds (several when fused, such as `qkv` = q_proj, k_proj, v_proj stacked by rows),
their full HF shapes, and the axis tensor parallelism splits the full arrays along (0 for a
column-parallel or vocabulary-parallel weight, 1 for a row-parallel one, None when every rank
holds the whole array). Fused column-parallel weights are stacked by `blocks.fuse_rows`, so each
rank's shard holds its own rows of every part. The model also has `tensor_group` (None or a
TensorGroup) and may list `hf_ignored` names (HF weights it accepts and does not use, such as
`lm_head.weight` when the head is tied to the embedding) and, through `hf_skipped(names)`,
whole groups of HF weights it recognises and does not train (DeepSeek-V3's multi-token
prediction layers): those are left out with one log line saying how many and why.

Loading reads from a `WeightSource` (a checkpoint opened by `mf_train.checkpoint.HFCheckpoint`,
or arrays in memory): the names and shapes are checked first, then each parameter's HF parts
are read one parameter at a time, and only this rank's slice of each (`local_value`), so a
rank never holds the whole model in float32 beside its own parameters.

Export runs the other way on the same table: `gather_hf_state` concatenates the tensor-parallel
ranks' shards along each entry's axis and splits fused parameters back into their HF parts.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import mindspore as ms
import numpy as np
from mindspore import Tensor

from .blocks import split_rows, tensor_size

LOG = logging.getLogger(__name__)


class HFWeightsError(ValueError):
    """HF weights that do not fit the model: missing, mis-shaped or unknown names."""


@dataclass(frozen=True)
class WeightMap:
    """One parameter of ours and the HF weights it holds."""

    ours: str
    hf: tuple[str, ...]
    shapes: tuple[tuple[int, ...], ...]
    axis: int | None = None

    def rows(self) -> list[int]:
        return [shape[0] for shape in self.shapes]


def held_elsewhere(maps: Iterable[WeightMap], model: Any) -> tuple[str, ...]:
    """The Hugging Face names of the whole model's weights (`maps`) that `model` does not
    hold: other pipeline stages' and other expert-parallel ranks' (a rank loading a whole
    checkpoint takes its own and leaves these)."""
    held = {name for name, _ in model.parameters_and_names()}
    return tuple(name for entry in maps if entry.ours not in held for name in entry.hf)


def hf_names(model: Any) -> dict[str, tuple[str, ...]]:
    """Our parameter name -> the HF names it holds (one, or the fused parts in row order)."""
    return {entry.ours: entry.hf for entry in model.weight_maps()}


class WeightSource(Protocol):
    """HF-named weights to load from: their names and shapes known up front, each read
    whole or one region at a time (`mf_train.checkpoint.HFCheckpoint` reads them from a
    checkpoint's files; `ArraysSource` wraps arrays already in memory)."""

    @property
    def names(self) -> Collection[str]: ...

    def shape(self, name: str) -> tuple[int, ...]: ...

    def read(self, name: str, region: tuple[slice, ...] | None = None) -> np.ndarray: ...


class ArraysSource:
    """Whole arrays in memory, by HF name, as a `WeightSource`."""

    def __init__(self, arrays: Mapping[str, np.ndarray]):
        self.arrays = arrays

    @property
    def names(self) -> Collection[str]:
        return self.arrays.keys()

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(np.shape(self.arrays[name]))

    def read(self, name: str, region: tuple[slice, ...] | None = None) -> np.ndarray:
        """A copy: a parameter loaded from it must not share the caller's array."""
        value = np.asarray(self.arrays[name])
        return np.array(value if region is None else value[region])


def load_hf_state(model: Any, weights: WeightSource | Mapping[str, np.ndarray],
                  strict: bool = True,
                  read_ahead: Callable[[Callable, Iterable], Iterable] = map) -> None:
    """Fill `model`'s parameters from HF-named weights, reading only this rank's part of
    each: its tensor-parallel slice of the parameters it holds (its pipeline stage's layers,
    its experts); weights it does not hold are not read. Every problem is reported at once,
    from the names and shapes alone, before anything is read (`checked_entries`). One
    parameter's slice is in memory at a time (`read_ahead`, such as
    `checkpoint.reading.read_ahead` with workers, may read a few ahead); values are cast to
    each parameter's dtype. (The trainer loads through `HFPieces` instead, which also reads
    only the ranges of a parameter a ZeRO or FSDP slice holds.)

    Args:
        model: a model with `weight_maps()` and `tensor_group`.
        weights: a `WeightSource`, or whole arrays by HF name.
        strict: refuse HF names the model does not use.
        read_ahead: maps a read over the parameters in order (`map`: one after another).

    Raises:
        HFWeightsError: the weights do not fit the model (every problem listed).
    """
    source = ArraysSource(weights) if isinstance(weights, Mapping) else weights
    entries = checked_entries(model, source, strict)
    params = dict(model.parameters_and_names())
    group = model.tensor_group
    values = read_ahead(lambda entry: local_value(entry, source, group), entries)
    for entry, value in zip(entries, values, strict=True):
        param = params[entry.ours]  # `value` is this read's own array: shared, not copied
        param.set_data(Tensor.from_numpy(value).astype(param.dtype))


def checked_entries(model: Any, source: WeightSource, strict: bool = True) -> list[WeightMap]:
    """`model.weight_maps()`, once the names and shapes of `source` are checked against it:
    missing names, wrong shapes and (when `strict`) names the model does not use, all at
    once, before anything is read; the names the model's `hf_skipped` leaves out are logged.

    Raises:
        HFWeightsError: the weights do not fit the model (every problem listed).
    """
    names = set(source.names) - _skipped(model, source.names)
    entries = model.weight_maps()
    problems = _shape_problems(entries, names, source.shape)
    if strict:
        known = {name for entry in entries for name in entry.hf}
        known |= set(getattr(model, "hf_ignored", ()))
        problems += [f"{name}: not a weight of {type(model).__name__}"
                     for name in sorted(names - known)]
    if problems:
        raise HFWeightsError("Hugging Face weights do not fit the model:\n  "
                             + "\n  ".join(problems))
    return entries


@dataclass(frozen=True)
class TensorPlace:
    """A tensor group as `local_value` reads it: this place and the degree."""

    rank: int
    size: int


Place = tuple[int, int] | None
"""`(place, degree)` of a tensor-parallel shard, or None for the whole tensor."""


class HFPieces:
    """HF-named weights seen as a sharded checkpoint of our parameters: the part of
    `checkpoint.pieces.PieceIndex` that `layouts.saved_model.load_model_pieces` reads, so
    that a Hugging Face checkpoint loads the way an mf checkpoint does, each rank reading
    only what it holds. A parameter is answered at any tensor place (`(place, degree)`),
    whole (`local_value`) or as a flat range of it, for which only the rows of the HF parts
    the range covers are read (a ZeRO or FSDP slice reads its own rows, not the tensor).

    Args:
        source: the weights (`checkpoint.HFCheckpoint`, or `ArraysSource`).
        entries: the model's weight table, checked against `source` (`checked_entries`).
        directory: where the weights are, for messages.
    """

    def __init__(self, source: WeightSource, entries: Iterable[WeightMap], directory: Any):
        self.source, self.directory = source, directory
        self.entries = {entry.ours: entry for entry in entries}

    @property
    def bytes_read(self) -> int:
        return getattr(self.source, "bytes_read", 0)

    def has(self, name: str, tensor: Place = None) -> bool:
        return name in self.entries

    def shape(self, name: str, tensor: Place = None) -> tuple[int, ...]:
        """Parameter `name`'s shape at place `tensor` (its share along the split axis)."""
        return local_shape(self.entries[name], tensor)

    def read_whole(self, name: str, tensor: Place = None) -> np.ndarray:
        return local_value(self.entries[name], self.source, _group(tensor))

    def read_range(self, name: str, start: int, stop: int, tensor: Place = None,
                   ) -> np.ndarray:
        """Elements `[start, stop)` of `read_whole(name, tensor)`, flat, read from the rows
        that hold them."""
        entry = self.entries[name]
        width = math.prod(local_shape(entry, tensor)[1:])
        first, last = start // width, -(-stop // width)
        rows = local_value(entry, self.source, _group(tensor), (first, last)).reshape(-1)
        return rows[start - first * width:stop - first * width]


def local_shape(entry: WeightMap, tensor: Place) -> tuple[int, ...]:
    """The shape of `entry`'s parameter at tensor place `tensor` (None: whole)."""
    shape = [sum(entry.rows()), *entry.shapes[0][1:]]
    if tensor is not None and entry.axis is not None:
        shape[entry.axis] //= tensor[1]
    return tuple(shape)


def _group(tensor: Place) -> TensorPlace | None:
    return None if tensor is None else TensorPlace(*tensor)


def hf_state(model: Any) -> dict[str, np.ndarray]:
    """The model's weights under their HF names, as float32 arrays (fused parameters split
    back into their parts). Single-process models only: a tensor-parallel rank holds shards."""
    if tensor_size(model.tensor_group) > 1:
        raise HFWeightsError("hf_state needs the whole weights; this model holds a "
                             "tensor-parallel shard (gather the shards first)")
    params = dict(model.parameters_and_names())
    state = {}
    for entry in model.weight_maps():
        state.update(hf_parts(entry, params[entry.ours].astype(ms.float32).asnumpy()))
    return state


def hf_parts(entry: WeightMap, full: np.ndarray, shards: int = 1) -> dict[str, np.ndarray]:
    """The HF weights of `entry` from its parameter's whole value (the inverse of the fusing
    in `local_value`): fused parts split back, rank-interleaved when the value was gathered
    from `shards` column-parallel ranks."""
    if len(entry.hf) == 1:
        return {entry.hf[0]: full}
    parts = split_rows(full, entry.rows(), shards if entry.axis == 0 else 1)
    return dict(zip(entry.hf, parts, strict=True))


def gather_hf_state(entries: list[WeightMap],
                    ranks: Sequence[Mapping[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """Whole HF-named arrays from the arrays (under our names) of each place of a
    tensor-parallel group, in place order (a rank's file, or several ranks' merged: pipeline
    stages, expert shares); one mapping when there is no tensor parallelism. The inverse of
    `load_hf_state`: the shards are concatenated along each entry's split axis, then fused
    parts split back. `HFWeightsError` lists every parameter missing from a place and every
    weight whose gathered shape is not the HF one."""
    problems = [f"{entry.ours}: missing from tensor rank {rank}'s arrays"
                for entry in entries for rank, arrays in enumerate(ranks)
                if entry.ours not in arrays]
    if problems:
        raise HFWeightsError("the arrays do not hold the model:\n  " + "\n  ".join(problems))
    state, problems = {}, []
    for entry in entries:
        pieces = [np.asarray(arrays[entry.ours]) for arrays in ranks]
        split = entry.axis is not None and len(pieces) > 1
        full = np.concatenate(pieces, axis=entry.axis) if split else pieces[0]
        whole = (sum(entry.rows()), *entry.shapes[0][1:])
        if full.shape != whole:
            problems.append(f"{entry.ours}: shape {full.shape}, expected {whole} (for "
                            f"{', '.join(entry.hf)})")
            continue
        state.update(hf_parts(entry, full, len(pieces) if split else 1))
    problems += (_shape_problems(entries, state.keys(), lambda name: state[name].shape)
                 if not problems else [])
    if problems:
        raise HFWeightsError("the gathered weights do not have Hugging Face's shapes:\n  "
                             + "\n  ".join(problems))
    return state


def _skipped(model: Any, names: Collection[str]) -> set[str]:
    """The names among `names` the model's `hf_skipped` leaves out, logged once with its
    reason."""
    skip = getattr(model, "hf_skipped", None)
    if skip is None:
        return set()
    skipped, reason = skip(names)
    if skipped:
        LOG.info("Hugging Face weights: skipped %d tensors: %s", len(skipped), reason)
    return set(skipped)


def _shape_problems(entries: list[WeightMap], names: Collection[str],
                    shape_of: Callable[[str], tuple[int, ...]]) -> list[str]:
    problems = []
    for entry in entries:
        for name, shape in zip(entry.hf, entry.shapes, strict=True):
            if name not in names:
                problems.append(f"{name}: missing (needed for {entry.ours}, shape {shape})")
            elif shape_of(name) != shape:
                problems.append(f"{name}: shape {shape_of(name)}, expected {shape} (for "
                                f"{entry.ours})")
    return problems


def local_value(entry: WeightMap, source: WeightSource, group: Any,
                rows: tuple[int, int] | None = None) -> np.ndarray:
    """This rank's value of `entry`'s parameter, as float32: each HF part's slice along the
    split axis (the whole part without tensor parallelism), read alone and stacked by rows,
    which is this rank's block of the rank-interleaved fusing (`blocks.fuse_rows`). With
    `rows` (`start, stop`), only those rows of that value: each part is read only where it
    overlaps them."""
    parts, offset = [], 0
    for name, shape in zip(entry.hf, entry.shapes, strict=True):
        region = _region(name, shape, entry.axis, group)
        count = shape[0] // tensor_size(group) if region is not None and entry.axis == 0 \
            else shape[0]
        low, high = (0, count) if rows is None else \
            (max(rows[0] - offset, 0), min(rows[1] - offset, count))
        offset += count
        if rows is not None and low < high:
            region = _rows_of(region, low, high)
        if low < high:
            parts.append(np.ascontiguousarray(source.read(name, region), np.float32))
    return parts[0] if len(parts) == 1 else np.concatenate(parts, axis=0)


def _rows_of(region: tuple[slice, ...] | None, low: int, high: int) -> tuple[slice, ...]:
    """Rows `[low, high)` of what `region` (None: the whole tensor) reads."""
    if region is None:
        return (slice(low, high),)
    first = region[0].start or 0
    return (slice(first + low, first + high), *region[1:])


def _region(name: str, shape: tuple[int, ...], axis: int | None,
            group: Any) -> tuple[slice, ...] | None:
    """This tensor rank's slice of an HF weight: an equal block along `axis`."""
    shards = tensor_size(group)
    if shards == 1 or axis is None:
        return None
    if shape[axis] % shards:
        raise HFWeightsError(f"{name}: dimension {axis} of shape {shape} is not divisible by "
                             f"tensor_parallel ({shards})")
    size = shape[axis] // shards
    return (slice(None),) * axis + (slice(group.rank * size, (group.rank + 1) * size),)
