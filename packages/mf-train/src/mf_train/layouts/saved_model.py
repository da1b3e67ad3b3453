"""The model's part of a sharded checkpoint: the parameters this rank holds, by region.

Parameters the layout keeps whole on this rank (its tensor-parallel shard, its stage, its
experts, every parameter without ZeRO or FSDP) are held whole; parameters in ZeRO or FSDP
buffers (`flat_buckets`) as their chunks in the buffer's slice, straight from the slice
(nothing is gathered). `checkpoint.regions` writes and reads them: each rank reads only the
regions it holds, whatever layout wrote them, and hands its slices to mf-parallel
(`publish_slices`), which gathers them into the parameters (ZeRO) or keeps them as the
units' shards (FSDP).
"""

from __future__ import annotations

import numpy as np
from mindspore import Tensor

from ..checkpoint.pieces import Deferred, Piece
from ..checkpoint.reading import read_ahead
from ..checkpoint.regions import Held, RankRegions, check, pieces, read, read_buffer, refuse
from .contract import StepLayout


def model_held(layout: StepLayout) -> tuple[list[Held], list[list[Held]]]:
    """The parameters this rank holds whole, and per ZeRO/FSDP buffer those it holds a
    chunk of (their true shapes: FSDP's placeholders have another)."""
    buckets = layout.flat_buckets()
    sliced = {id(param) for bucket in buckets for param in bucket.params}
    names = {id(param): name for name, param in layout.model.parameters_and_names()}
    whole = [Held(name, name, param.shape, param)
             for name, param in layout.model.parameters_and_names() if id(param) not in sliced]
    chunks = [[Held(names[id(param)], names[id(param)], bucket.flat.shapes[i], bucket.master,
                    bucket.flat.offsets[i]) for i, param in enumerate(bucket.params)]
              for bucket in buckets]
    return whole, chunks


def model_pieces(layout: StepLayout, regions: RankRegions) -> dict[Piece, np.ndarray | Deferred]:
    """What this rank writes of the model (`regions.pieces`)."""
    whole, chunks = model_held(layout)
    return pieces([*whole, *(item for bucket in chunks for item in bucket)], regions)


def load_model_pieces(layout: StepLayout, regions: RankRegions, index, workers: int = 1) -> None:
    """Set this rank's parameters (and ZeRO/FSDP slices) from a sharded checkpoint, the
    whole ones read `workers` at a time (`checkpoint.load_worker_number`). `index` is a
    `tensor_recut.RecutIndex` when the checkpoint may have another tensor-parallel degree.

    Raises:
        CheckpointError: naming every parameter the checkpoint does not hold as this layout
            needs it, before anything changes.
    """
    whole, chunks = model_held(layout)
    refuse(check([*whole, *(item for bucket in chunks for item in bucket)], regions, index),
           f"{index.directory} does not fit the model")
    values = read_ahead(lambda item: read(item, regions, index), whole, workers)
    for item, value in zip(whole, values, strict=True):
        item.values.set_data(Tensor(value).astype(item.values.dtype))
    slices = [Tensor(read_buffer(held, bucket.flat.length, regions, index)
                     ).astype(bucket.master.dtype)
              for held, bucket in zip(chunks, layout.flat_buckets(), strict=True)]
    if slices:
        layout.publish_slices(slices)
