"""The model's part of a sharded checkpoint: what this rank writes, and loading what it holds.

Parameters the layout keeps whole on this rank (its tensor-parallel shard, its stage, its
experts, every parameter without ZeRO or FSDP) are written whole by their owner
(`Placement.owns`) and read whole. Parameters in ZeRO or FSDP buffers (`flat_buckets`) are
written as the ranges of them this rank's slice holds, straight from the slice (nothing is
gathered), and loaded the same way: each rank reads only the ranges of its slices, whatever
layout wrote them, and hands them to mf-parallel (`publish_slices`), which gathers them into
the parameters (ZeRO) or keeps them as the units' shards (FSDP).
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
from mindspore import Parameter, Tensor

from ..checkpoint import CheckpointError
from ..checkpoint.params import deferred_host_array, deferred_host_range
from ..checkpoint.pieces import Deferred, Piece, PieceIndex, bucket_slice, whole_piece
from ..checkpoint.reading import read_ahead
from ..placement import Placement
from .contract import StepLayout

_MAX_LISTED = 20


def model_pieces(layout: StepLayout, placement: Placement,
                 ) -> dict[Piece, np.ndarray | Deferred]:
    """What this rank writes of the model: the pieces it owns, each whole parameter's host
    copy deferred until the writer reaches it (`Deferred`), and so is each range of its
    slices."""
    pieces: dict[Piece, np.ndarray | Deferred] = {}
    sliced = _sliced_ids(layout)
    for name, param in layout.model.parameters_and_names():
        if id(param) not in sliced and placement.owns(name, param):
            pieces[whole_piece(name, param.shape, placement.tensor(param))] = \
                deferred_host_array(param)
    names = _names(layout)
    for bucket in layout.flat_buckets():
        owned = [(names[id(bucket.params[i])], i, low, high, offset)
                 for i, low, high, offset in bucket.flat.own_ranges()
                 if placement.owns(names[id(bucket.params[i])], bucket.params[i], sliced=True)]
        if not owned:
            continue
        for name, i, low, high, offset in owned:
            piece = Piece(name, bucket.flat.shapes[i], low, high,
                          placement.tensor(bucket.params[i]))
            pieces[piece] = deferred_host_range(bucket.master, offset, offset + high - low)
    return pieces


def load_model_pieces(layout: StepLayout, placement: Placement, index: PieceIndex,
                      workers: int = 1) -> None:
    """Set this rank's parameters (and ZeRO/FSDP slices) from a sharded checkpoint, the
    whole ones read `workers` at a time (`checkpoint.load_worker_number`). `index` is a
    `tensor_recut.RecutIndex` when the checkpoint may have another tensor-parallel degree.

    Every parameter is checked first (present at this rank's tensor place, same shape), and
    nothing changes on a mismatch.

    Raises:
        CheckpointError: naming every parameter the checkpoint does not hold as this layout
            needs it.
    """
    sliced = _sliced_ids(layout)
    whole, problems = [], []
    for name, param, shape in _needed(layout):
        tensor = placement.tensor(param)
        problem = _problem(index, name, tensor, shape)
        if problem:
            problems.append(problem)
        elif id(param) not in sliced:
            whole.append((name, param, tensor))
    if problems:
        listed = problems[:_MAX_LISTED]
        more = [f"... and {len(problems) - len(listed)} more"] if len(problems) > len(listed) \
            else []
        raise CheckpointError(f"{index.directory} does not fit the model ({len(problems)} "
                              "problems):\n  " + "\n  ".join(listed + more))
    read = read_ahead(lambda item: index.read_whole(item[0], item[2]), whole, workers)
    for (_, param, _), values in zip(whole, read, strict=True):
        param.set_data(Tensor(values).astype(param.dtype))
    names = _names(layout)
    slices = [Tensor(bucket_slice(bucket, index, placement, names, "")
                     ).astype(bucket.master.dtype) for bucket in layout.flat_buckets()]
    if slices:
        layout.publish_slices(slices)


def _needed(layout: StepLayout) -> Iterator[tuple[str, Parameter, tuple[int, ...]]]:
    """Each parameter of this rank with its true shape (FSDP's placeholders have another)."""
    shapes = {id(bucket.params[i]): bucket.flat.shapes[i]
              for bucket in layout.flat_buckets() for i in range(len(bucket.params))}
    for name, param in layout.model.parameters_and_names():
        yield name, param, tuple(shapes.get(id(param), param.shape))


def _problem(index: PieceIndex, name: str, tensor: tuple[int, int] | None,
             shape: tuple[int, ...]) -> str | None:
    if not index.has(name, tensor):
        return f"{name}: missing (parameter of shape {shape})"
    saved = index.shape(name, tensor)
    if tuple(saved) != tuple(shape):
        return f"{name}: shape {tuple(saved)}, the model's is {tuple(shape)}"
    return None


def _sliced_ids(layout: StepLayout) -> set[int]:
    return {id(param) for bucket in layout.flat_buckets() for param in bucket.params}


def _names(layout: StepLayout) -> dict[int, str]:
    return {id(param): name for name, param in layout.model.parameters_and_names()}
