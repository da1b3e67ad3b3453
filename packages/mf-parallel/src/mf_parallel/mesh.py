"""Rank coordinates and the exact rank lists of every communication group.

Dimension order, outermost first: pipeline, replicate, shard, context, tensor (torchtitan's
order). The tensor coordinate varies fastest, so tensor-parallel groups are runs of consecutive
ranks (on one host, where the fast links are), and pipeline stages are the largest blocks:

    rank = (((pipeline * R + replicate) * S + shard) * C + context) * T + tensor

Group kinds: each named dimension alone; `data` (replicate x shard, the gradient-reduction
group of plain data parallelism); `loss` (replicate x shard x context: every rank that sees a
different part of the global batch, so the loss is averaged over it); `expert` (ranks that
split the experts between them) and `expert_data` (ranks holding the same experts).
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Sequence

import attrs

from .dims import ParallelDims
from .errors import PlanError

DIMENSIONS = ("pipeline", "replicate", "shard", "context", "tensor")
COMPOSITE = {"data": ("replicate", "shard"), "loss": ("replicate", "shard", "context")}
GROUP_KINDS = (*DIMENSIONS, *COMPOSITE, "expert", "expert_data")


@attrs.frozen
class RankMesh:
    """Coordinates and communication groups of every rank of a `ParallelDims` layout."""

    dims: ParallelDims

    @property
    def shape(self) -> tuple[int, ...]:
        d = self.dims
        return (d.pipeline, d.data_replicate, d.data_shard, d.context, d.tensor)

    def coordinates(self, rank: int) -> dict[str, int]:
        """Where `rank` sits on each dimension.

        Args:
            rank: a rank of the world.

        Returns:
            `{"pipeline": 0, "replicate": 0, "shard": 1, "context": 0, "tensor": 1}`.

        Raises:
            PlanError: the rank is not in the world.
        """
        self._check_rank(rank)
        coords = {}
        for name, size in reversed(list(zip(DIMENSIONS, self.shape, strict=True))):
            rank, coords[name] = divmod(rank, size)
        return {name: coords[name] for name in DIMENSIONS}

    def rank(self, coordinates: dict[str, int]) -> int:
        """The rank at these coordinates (the inverse of `coordinates`)."""
        rank = 0
        for name, size in zip(DIMENSIONS, self.shape, strict=True):
            value = coordinates[name]
            if not 0 <= value < size:
                raise PlanError(f"{name} coordinate {value} is outside 0..{size - 1}")
            rank = rank * size + value
        return rank

    def groups(self, kind: str) -> list[list[int]]:
        """Every group of one kind; together they cover the world.

        Args:
            kind: a group kind, one of `GROUP_KINDS`.

        Returns:
            Each group as a sorted list of ranks.

        Raises:
            PlanError: an unknown kind.
        """
        if kind in ("expert", "expert_data"):
            return self._expert_groups(kind == "expert")
        varying = COMPOSITE.get(kind, (kind,))
        if not set(varying) <= set(DIMENSIONS):
            raise PlanError(f"unknown group kind {kind!r}; known: {', '.join(GROUP_KINDS)}")
        return self._groups_over(varying)

    def groups_of(self, rank: int) -> dict[str, list[int]]:
        """The group of every kind that `rank` belongs to.

        Args:
            rank: a rank of the world.

        Returns:
            `{kind: sorted ranks}` for every kind of `GROUP_KINDS`.
        """
        self._check_rank(rank)
        return {kind: _group_index(self, kind)[rank] for kind in GROUP_KINDS}

    def _groups_over(self, varying: Sequence[str]) -> list[list[int]]:
        sizes = dict(zip(DIMENSIONS, self.shape, strict=True))
        fixed = [name for name in DIMENSIONS if name not in varying]
        groups = []
        for fixed_values in itertools.product(*(range(sizes[n]) for n in fixed)):
            base = dict(zip(fixed, fixed_values, strict=True))
            groups.append(sorted(
                self.rank({**base, **dict(zip(varying, values, strict=True))})
                for values in itertools.product(*(range(sizes[n]) for n in varying))))
        return groups

    def _expert_groups(self, experts: bool) -> list[list[int]]:
        span = ("shard", "context") if self.dims.expert_span == "shard_context" else (
            "shard", "context", "tensor")
        ep = self.dims.expert
        groups = []
        for block in self._groups_over(span):
            chunks = [block[start:start + ep] for start in range(0, len(block), ep)]
            groups += chunks if experts else [list(g) for g in zip(*chunks, strict=True)]
        return sorted(groups)

    def _check_rank(self, rank: int) -> None:
        if not 0 <= rank < self.dims.world_size:
            raise PlanError(f"rank {rank} is outside the world (0..{self.dims.world_size - 1})")


@functools.cache
def _group_index(mesh: RankMesh, kind: str) -> dict[int, list[int]]:
    """rank -> its group of `kind`, built once per layout and kind."""
    return {rank: group for group in mesh.groups(kind) for rank in group}
