"""The one save and load path of a sharded checkpoint: each tensor a rank holds, by region.

A rank holds model parameters and optimizer state (moments, float32 masters) either whole
(its tensor-parallel shard of them) or as its chunk of them in a ZeRO or FSDP buffer. Each is
a `Held`: the key the checkpoint stores it under (`adam_m.<name>`, or the parameter's name),
its parameter's name, its shape on this rank, and where its values are (a whole tensor, or a
flat buffer from an offset). Which part of the tensor that is, and whether this rank writes
it, is the placement record's (`mf_parallel.placement`: `region` and `owns` of the parameter's
`state` placement), read through `RankRegions`:

- `pieces` is what a rank writes: the region of each held tensor it owns, as a `Piece`
  (nothing is gathered; a copy another rank owns is not written);
- `check` names what a checkpoint lacks for them, before anything changes;
- `read` gives each held tensor's region from the pieces overlapping it, whatever layout
  and world size saved them (`PieceIndex.read_range`), and `read_buffer` a buffer's slice
  from its tensors' regions.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import attrs
import numpy as np

from mf_parallel import Plan
from mf_parallel.placement import Placement, Region, owns, region

from .errors import CheckpointError
from .params import deferred_host_array, deferred_host_range
from .pieces import Deferred, Piece

_MAX_LISTED = 20


@attrs.frozen
class Held:
    """One tensor a rank holds, as a checkpoint stores it."""

    key: str
    """Its key in the checkpoint: the parameter's name, or a state's `<prefix>.<name>`."""
    name: str
    """Its parameter's model-wide name (the placement record's)."""
    shape: tuple[int, ...] = attrs.field(converter=lambda s: tuple(int(n) for n in s))
    """Its shape on this rank (its tensor-parallel shard's)."""
    values: Any
    """The tensor holding it: itself, or the flat buffer holding its region from `offset`."""
    offset: int | None = None
    """Where its region starts in `values` (a ZeRO or FSDP buffer); None when whole."""

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))


class RankRegions:
    """This rank's region of each parameter, and whether it writes it, from the placement
    record; without a record (one process) every tensor is whole and this rank's.

    Args:
        placements: every parameter's placement, by name (None on one process).
        plan: the job's plan (with `placements`).
        rank: this rank.
    """

    def __init__(self, placements: Mapping[str, Placement] | None = None,
                 plan: Plan | None = None, rank: int = 0):
        self.placements, self.plan, self.rank = placements, plan, rank

    @property
    def writes_scalars(self) -> bool:
        """Whether this rank writes what every rank holds the same (the update count)."""
        return self.rank == 0

    def of(self, held: Held) -> tuple[Region | None, bool]:
        """The region of `held`'s tensor this rank holds (None: none of it) and whether it
        writes it."""
        if self.placements is None:
            return Region((), held.shape, (0, held.size), None), True
        placement = self.placements.get(held.name)
        if placement is None:
            raise KeyError(f"{held.name}: not in the model's sharding table")
        found = region(placement, self.rank, self.plan)
        if found is not None and held.offset is None and found.flat != (0, held.size):
            raise RuntimeError(f"{held.key}: held whole on rank {self.rank}, but the placement "
                               f"record gives it elements {found.flat} of {held.size}")
        return found, owns(placement, self.rank, self.plan)


def pieces(held: Iterable[Held], regions: RankRegions) -> dict[Piece, np.ndarray | Deferred]:
    """What this rank writes of `held`: the region of each tensor it owns, its host copy
    made when the writer reaches it (`Deferred`)."""
    written: dict[Piece, np.ndarray | Deferred] = {}
    for item in held:
        place, owned = regions.of(item)
        if place is None or not owned:
            continue
        low, high = place.flat
        piece = Piece(item.key, item.shape, low, high, place.tensor)
        written[piece] = (deferred_host_array(item.values) if item.offset is None else
                          deferred_host_range(item.values, item.offset,
                                              item.offset + high - low))
    return written


def check(held: Iterable[Held], regions: RankRegions, index: Any,
          fallback: Any | None = None) -> list[str]:
    """What `index` (a `PieceIndex`, or one answering as it does) lacks of `held`: each
    tensor missing at this rank's tensor place (under its parameter's name in `fallback`
    too, when given), or saved with another shape."""
    problems = []
    for item in held:
        place, _ = regions.of(item)
        if place is None:
            continue
        tensor = place.tensor
        source, key = _source(item, tensor, index, fallback)
        if not source.has(key, tensor):
            problems.append(f"{item.key}: missing (of shape {item.shape})")
        elif tuple(source.shape(key, tensor)) != item.shape:
            problems.append(f"{item.key}: shape {tuple(source.shape(key, tensor))}, this "
                            f"run's is {item.shape}")
    return problems


def refuse(problems: Sequence[str], what: str,
           error: type[Exception] = CheckpointError) -> None:
    """Raise `error` listing `problems` (`check`'s) under `what`, when any."""
    if not problems:
        return
    listed = problems[:_MAX_LISTED]
    more = [f"... and {len(problems) - len(listed)} more"] if len(problems) > len(listed) \
        else []
    raise error(f"{what} ({len(problems)} problems):\n  "
                          + "\n  ".join(listed + more))


def read(item: Held, regions: RankRegions, index: Any,
         fallback: Any | None = None) -> np.ndarray:
    """The region of `item`'s tensor this rank holds, read from the saved pieces overlapping
    it (from `fallback` under the parameter's name where `index` lacks it): in `item`'s
    shape when whole, flat when a buffer's chunk (empty when it holds none)."""
    place, _ = regions.of(item)
    if place is None:
        return np.zeros(0, np.float32)
    source, key = _source(item, place.tensor, index, fallback)
    values = source.read_range(key, *place.flat, place.tensor)
    return values if item.offset is not None else values.reshape(item.shape)


def read_buffer(held: Iterable[Held], length: int, regions: RankRegions, index: Any,
                fallback: Any | None = None) -> np.ndarray:
    """A buffer's float32 slice of `length` elements from the regions of the tensors it
    holds (`held`, each at its offset); zeros in the padding."""
    out = np.zeros(length, np.float32)
    for item in held:
        values = read(item, regions, index, fallback)
        out[item.offset:item.offset + values.size] = values
    return out


def _source(item: Held, tensor: tuple[int, int] | None, index: Any,
            fallback: Any | None) -> tuple[Any, str]:
    if fallback is not None and not index.has(item.key, tensor):
        return fallback, item.name
    return index, item.key
