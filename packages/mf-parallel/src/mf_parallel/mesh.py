"""Rank coordinates and the exact rank lists of every communication group.

Dimension order, outermost first: pipeline, replicate, shard, context, tensor (torchtitan's
order). The tensor coordinate varies fastest, so tensor-parallel groups are runs of consecutive
ranks (on one host, where the fast links are), and pipeline stages are the largest blocks:

    rank = (((pipeline * R + replicate) * S + shard) * C + context) * T + tensor

Group kinds: each named dimension alone; `data` (replicate x shard, the gradient-reduction
group of plain data parallelism); `loss` (replicate x shard x context: every rank that sees a
different part of the global batch, so the loss is averaged over it); `shard_context` (shard x
context: what FSDP and ZeRO shard over under context parallelism, as torchtitan's
`dp_shard_cp`, since context ranks hold the same parameters); `world` (every rank: the
gradient norm adds the squares each rank owns over it); `expert` (ranks that
split the experts between them: they exchange tokens; member r holds the r-th run of
consecutive experts, `experts_of`) and `expert_data` (every rank of the
pipeline stage holding the same experts: the expert-data-parallel group over which the experts'
gradients are reduced, world / (pipeline x expert) ranks, as Megatron-LM's expert-data-parallel
group with expert tensor parallelism 1: experts are not split by tensor parallelism, so the
tensor ranks of a stage that hold the same experts count as data-parallel for them);
`expert_node` (consecutive members of an expert group that share a device, `expert_node` of
them: the deredundant dispatcher fans tokens out inside it) and `expert_peer` (the members of
an expert group at the same place in their devices: it sends each token once per device
between them). Without a deredundant dispatcher `expert_node` groups are single ranks and
`expert_peer` is the expert group. `context_ulysses` (consecutive `context_ulysses` ranks of a
context group: they swap attention heads all-to-all) and `context_ring` (the context ranks at
one place in every such block: they all-gather keys and values); with `colossal` attention the
first are single ranks and the second the context group, with `ulysses` the other way round.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Sequence

import attrs

from .dims import ParallelDims
from .errors import PlanError

DIMENSIONS = ("pipeline", "replicate", "shard", "context", "tensor")
COMPOSITE = {"data": ("replicate", "shard"), "loss": ("replicate", "shard", "context"),
             "shard_context": ("shard", "context"), "world": DIMENSIONS}
GROUP_KINDS = (*DIMENSIONS, *COMPOSITE, "expert", "expert_data", "expert_node", "expert_peer",
               "context_ulysses", "context_ring")


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
        if kind in ("expert_node", "expert_peer"):
            return self._device_groups(kind == "expert_node")
        if kind in ("context_ulysses", "context_ring"):
            return self._context_subgroups(kind == "context_ulysses")
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

    def experts_of(self, rank: int, n_experts: int) -> range:
        """The global indices of the routed experts `rank` holds: its share by its place in
        its `expert` group (`expert_share`; every expert without expert parallelism).

        Raises:
            PlanError: the rank is not in the world, or the experts do not divide evenly.
        """
        group = self.groups_of(rank)["expert"]
        return expert_share(n_experts, len(group), group.index(rank))

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
        chunks = [block[start:start + ep] for block in self._groups_over(span)
                  for start in range(0, len(block), ep)]
        if experts:
            return sorted(chunks)
        holders: dict[tuple[int, int], list[int]] = {}  # (stage, expert index) -> ranks
        for chunk in chunks:
            stage = self.coordinates(chunk[0])["pipeline"]
            for index, rank in enumerate(chunk):
                holders.setdefault((stage, index), []).append(rank)
        return sorted(sorted(ranks) for ranks in holders.values())

    def _device_groups(self, node: bool) -> list[list[int]]:
        size = self.dims.expert_node
        groups = []
        for expert_group in self._expert_groups(True):
            nodes = [expert_group[start:start + size]
                     for start in range(0, len(expert_group), size)]
            groups += nodes if node else [list(g) for g in zip(*nodes, strict=True)]
        return sorted(groups)

    def _context_subgroups(self, ulysses: bool) -> list[list[int]]:
        """Consecutive blocks of `context_ulysses` ranks of each context group (they swap
        heads), or the ranks at one place in every block (they gather keys and values)."""
        size = self.dims.context_ulysses
        groups = []
        for context in self._groups_over(("context",)):
            blocks = [context[start:start + size] for start in range(0, len(context), size)]
            groups += blocks if ulysses else [list(g) for g in zip(*blocks, strict=True)]
        return sorted(groups)

    def _check_rank(self, rank: int) -> None:
        if not 0 <= rank < self.dims.world_size:
            raise PlanError(f"rank {rank} is outside the world (0..{self.dims.world_size - 1})")


def expert_share(n_experts: int, size: int, position: int) -> range:
    """The routed experts held by member `position` of an expert group of `size` ranks:
    `n_experts / size` consecutive global indices (member r: `r * local .. (r + 1) * local - 1`).

    Raises:
        PlanError: the experts do not divide evenly over the group.
    """
    if n_experts % size:
        raise PlanError(f"{n_experts} routed experts cannot be split evenly over "
                        f"expert_parallel {size} ranks")
    local = n_experts // size
    return range(position * local, (position + 1) * local)


@functools.cache
def _group_index(mesh: RankMesh, kind: str) -> dict[int, list[int]]:
    """rank -> its group of `kind`, built once per layout and kind."""
    return {rank: group for group in mesh.groups(kind) for rank in group}
