"""The record of where every parameter lives: one `Placement` per parameter, from the plan.

A model declares its parameters in a `ShardingTable` (pure data: names, global shapes, dtypes,
fused Hugging Face parts, the axis tensor parallelism splits, the decoder layer, the routed
expert). `place_parameters` reads the table with the plan (`make_plan`) and the data-parallel
shard strategy and returns each parameter's `Placement`, building nothing (after torchtitan's
DTensor placements):

- `stages`: the pipeline stages holding it (a decoder layer's by the plan's stage layout; the
  embedding on the first, the final norm and head on the last; a tied embedding on both);
- `expert`: a routed expert's index (held where `RankMesh.experts_of` says under expert
  parallelism, on every rank without it);
- `tensor`: `Shard(axis)` over the tensor group, or `Replicate`;
- `grad_partial`: the group kinds the local gradient is a partial sum over (`loss`: data x
  context; `expert_data` for a routed expert under expert parallelism; `tensor` for a
  tensor-replicated parameter under tensor parallelism, used on the rank's sequence slice or
  heads; `tied` for a tied embedding on the first and last stages);
- `param`, `grad`, `state`: the data placement of the parameter, of the gradient after the
  reduction and of the optimizer state: `Replicate(over)` or `FlatRange(shard, replicate)`
  (the rank's chunk of the tensor's row-major elements, `shard` ranks cutting each tensor
  into equal chunks, the last padded: `runtime.flat_shard`). Plain data parallelism
  (R, R, R); ZeRO-1 (R, R, F); ZeRO-2 (R, F, F); FSDP (F, F, F). The optimizer updates, the
  norm counts and a checkpoint writes what the `state` placement gives.

`region(placement, rank, plan)` is the part of the global tensor a rank holds (its tensor
shard as boxes of the global tensor, one per fused part, and its flat range of that shard),
or None; `owns` says whether the rank is the one that counts and writes it: it holds it and
is first in every group it is replicated over, so no copy is counted or written twice.
This module is pure Python like the plan: mf-memory and the command line read it without
MindSpore.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Literal

import attrs

from .errors import PlanError
from .plan import Plan

DataKind = Literal["param", "grad", "state"]
STRATEGIES = ("optim", "optim_grads", "optim_grads_params")
"""`parallelism.data_parallel_shard_strategy`: ZeRO-1, ZeRO-2, FSDP."""
TIED = "tied"
"""The `grad_partial` kind of a tied embedding's two stages (first and last)."""


# --------------------------------------------------------------------- a model's table

@attrs.frozen
class ParameterSpec:
    """One parameter as one process holds it: a row of a model's sharding table."""

    name: str
    shape: tuple[int, ...] = attrs.field(converter=tuple)
    dtype: str = "float32"
    parts: tuple[tuple[str, int], ...] = ()
    """The Hugging Face weights it holds, `(name, rows)`, stacked by rows in this order (one
    for an unfused weight)."""
    axis: int | None = None
    """The axis tensor parallelism splits it along (each fused part split alike); None when
    every tensor rank holds it whole."""
    layer: int | None = None
    """Its decoder layer; None for the embedding, the final norm and the head."""
    where: Literal["embedding", "layer", "head"] = "layer"
    """Outside the layers: with the embedding (first stage) or the head (last stage)."""
    expert: int | None = None
    """A routed expert's index within its layer."""
    experts: int = 0
    """The routed experts of its layer (with `expert`)."""
    trainable: bool = True


@attrs.frozen
class ShardingTable:
    """Every parameter of a model, in the model's order, and whether the head is tied to the
    embedding (`embedding.weight` is then also held by the last pipeline stage)."""

    params: tuple[ParameterSpec, ...] = attrs.field(converter=tuple)
    tied: bool = False
    embedding: str = "embedding.weight"


# --------------------------------------------------------------------- placements

@attrs.frozen
class Replicate:
    """Every rank of the group holds the whole (tensor-local) tensor."""

    over: str | None = None
    """The data group kind it is replicated over (None in the tensor placement)."""


@attrs.frozen
class Shard:
    """Tensor parallelism: each tensor rank holds its slice along `axis`."""

    axis: int


@attrs.frozen
class FlatRange:
    """Each `shard` rank holds its chunk of the tensor's row-major elements; the `replicate`
    ranks (HSDP) hold equal chunks."""

    shard: str
    replicate: str | None = None


DataPlacement = Replicate | FlatRange


@attrs.frozen
class Placement:
    """Where one parameter lives under a plan (see the module)."""

    name: str
    global_shape: tuple[int, ...]
    dtype: str
    parts: tuple[tuple[str, int], ...]
    stages: tuple[int, ...]
    expert: int | None
    experts: int
    """The routed experts of its layer (0 for anything but a routed expert)."""
    tensor: Shard | Replicate
    grad_partial: tuple[str, ...]
    param: DataPlacement
    grad: DataPlacement
    state: DataPlacement
    trainable: bool = True
    expert_parallel: bool = False
    """Its expert is held by some expert ranks only (a routed expert under expert
    parallelism)."""

    def data(self, kind: DataKind) -> DataPlacement:
        return {"param": self.param, "grad": self.grad, "state": self.state}[kind]

    def local_shape(self, degree: int) -> tuple[int, ...]:
        """Its tensor shard's shape with `degree` tensor ranks."""
        if isinstance(self.tensor, Replicate):
            return self.global_shape
        shape = list(self.global_shape)
        shape[self.tensor.axis] //= degree
        return tuple(shape)


@attrs.frozen
class Region:
    """What one rank holds of a parameter."""

    boxes: tuple[tuple[slice, ...], ...]
    """Its tensor shard as boxes of the global tensor, joined along the shard axis in order
    (one per fused part; one box covering the tensor when it is not split)."""
    shape: tuple[int, ...]
    """The tensor shard's shape."""
    flat: tuple[int, int]
    """Its range of the shard's row-major elements (the whole shard when not sliced)."""
    tensor: tuple[int, int] | None
    """`(place, degree)` of a tensor-split parameter; None when whole on every tensor rank."""

    @property
    def size(self) -> int:
        return self.flat[1] - self.flat[0]


def place_parameters(table: ShardingTable, plan: Plan, strategy: str | None = None,
                     ) -> dict[str, Placement]:
    """Each parameter's placement under the plan, by name, in the table's order.

    Args:
        table: the model's sharding table.
        plan: the parallel plan (`make_plan`, with the model's layer count).
        strategy: `parallelism.data_parallel_shard_strategy`; it applies when the plan's
            data-parallel shard degree is above one (None: replicated data parallelism).

    Raises:
        PlanError: a layer outside the plan's stage layout, an unknown strategy, or a split
            axis the tensor-parallel degree does not divide.
    """
    d = plan.dims
    sharded = strategy if d.data_shard > 1 else None
    if sharded is not None and sharded not in STRATEGIES:
        raise PlanError(f"data_parallel_shard_strategy {strategy!r} is not one of "
                        f"{', '.join(STRATEGIES)}")
    expert_data = len(plan.mesh.groups("expert_data")[0]) if d.expert > 1 else 1
    last = d.pipeline - 1
    stage_of = _layer_stages(plan)
    placed = {}
    for spec in table.params:
        if spec.layer is not None:
            if spec.layer not in stage_of:
                raise PlanError(f"{spec.name}: layer {spec.layer} is in no pipeline stage "
                                "of the plan")
            stages: tuple[int, ...] = (stage_of[spec.layer],)
        elif spec.where == "embedding":
            tied = table.tied and spec.name == table.embedding and last > 0
            stages = (0, last) if tied else (0,)
        else:
            stages = (last,)
        routed = spec.expert is not None and d.expert > 1
        tensor: Shard | Replicate = Replicate()
        if d.tensor > 1 and spec.axis is not None and not routed:
            _check_split(spec, d.tensor)
            tensor = Shard(spec.axis)
        partial = ["expert_data" if routed else "loss"]
        if d.tensor > 1 and isinstance(tensor, Replicate) and not routed:
            partial.append("tensor")
        if len(stages) > 1:
            partial.append(TIED)
        if not spec.trainable:  # no gradient, no optimizer state: kept whole (its own update)
            partial, flat = [], False
            whole = Replicate("expert_data" if routed else "loss")
        elif routed:
            flat = sharded is not None and expert_data > 1
            slice_ = FlatRange("expert_data")
            whole = Replicate("expert_data")
        else:
            flat = sharded is not None
            slice_ = FlatRange("shard_context" if d.context > 1 else "shard",
                               "replicate" if d.data_replicate > 1 else None)
            whole = Replicate("loss")
        param, grad, state = ((whole, whole, whole) if not flat else
                              {"optim": (whole, whole, slice_),
                               "optim_grads": (whole, slice_, slice_),
                               "optim_grads_params": (slice_, slice_, slice_)}[sharded])
        placed[spec.name] = Placement(
            name=spec.name, global_shape=spec.shape, dtype=spec.dtype, parts=spec.parts,
            stages=stages, expert=spec.expert, experts=spec.experts, tensor=tensor,
            grad_partial=tuple(partial), param=param, grad=grad, state=state,
            trainable=spec.trainable, expert_parallel=routed)
    return placed


def holds(placement: Placement, rank: int, plan: Plan) -> bool:
    """Whether `rank` holds any of the parameter (its stage, and its expert's share)."""
    mesh = plan.mesh
    if mesh.coordinates(rank)["pipeline"] not in placement.stages:
        return False
    if placement.expert_parallel:
        return placement.expert in mesh.experts_of(rank, placement.experts)
    return True


def region(placement: Placement, rank: int, plan: Plan, kind: DataKind = "state",
           ) -> Region | None:
    """The part of the global tensor `rank` holds under the `kind` data placement; None when
    it holds none of it (another stage's or expert share's, or an empty chunk)."""
    if not holds(placement, rank, plan):
        return None
    coords = plan.mesh.coordinates(rank)
    degree = plan.dims.tensor
    shape = placement.local_shape(degree)
    if isinstance(placement.tensor, Shard):
        place = coords["tensor"]
        boxes = _shard_boxes(placement, place, degree)
        tensor = (place, degree)
    else:
        boxes = (tuple(slice(0, n) for n in placement.global_shape),)
        tensor = None
    size = math.prod(shape)
    data = placement.data(kind)
    flat = (0, size)
    if isinstance(data, FlatRange):
        group = plan.mesh.groups_of(rank)[data.shard]
        chunk = -(-size // len(group))
        start = min(group.index(rank) * chunk, size)
        flat = (start, min(start + chunk, size))
        if flat[0] == flat[1]:
            return None
    return Region(boxes, shape, flat, tensor)


def replicated_over(placement: Placement, plan: Plan, kind: DataKind = "state") -> list[str]:
    """The group kinds whose ranks hold equal copies of what a rank holds of it."""
    data = placement.data(kind)
    groups = [data.over] if isinstance(data, Replicate) else [data.replicate]
    if isinstance(placement.tensor, Replicate) and not placement.expert_parallel \
            and plan.dims.tensor > 1:
        groups.append("tensor")
    return [group for group in groups if group is not None]


def owns(placement: Placement, rank: int, plan: Plan, kind: DataKind = "state") -> bool:
    """Whether `rank` is the one that counts (in the norm) and writes (in a checkpoint) what it
    holds of the parameter: it holds some, is first in every group that holds the same, and
    is on the first of the stages holding it."""
    if region(placement, rank, plan, kind) is None:
        return False
    if plan.mesh.coordinates(rank)["pipeline"] != placement.stages[0]:
        return False
    groups = plan.mesh.groups_of(rank)
    return all(groups[kind_][0] == rank for kind_ in replicated_over(placement, plan, kind))


def rank_view(placements: Iterable[Placement], rank: int, plan: Plan,
              kind: DataKind = "state") -> list[tuple[Placement, Region, bool]]:
    """What `rank` holds, in the table's order: (placement, region, owned)."""
    found = []
    for placement in placements:
        held = region(placement, rank, plan, kind)
        if held is not None:
            found.append((placement, held, owns(placement, rank, plan, kind)))
    return found


def _layer_stages(plan: Plan) -> dict[int, int]:
    if plan.layout is None:
        return {}
    return {layer: stage for stage in range(plan.dims.pipeline)
            for chunk in range(plan.interleave) for layer in plan.layout.layers(stage, chunk)}


def _shard_boxes(placement: Placement, place: int, degree: int) -> tuple[tuple[slice, ...], ...]:
    """Tensor place `place`'s shard: along axis 0 of a fused weight, its rows of every part
    (`blocks.fuse_rows`); else one slab along the axis."""
    axis = placement.tensor.axis
    shape = placement.global_shape
    whole = [slice(0, n) for n in shape]
    parts = [rows for _, rows in placement.parts] if axis == 0 and placement.parts \
        else [shape[axis]]
    boxes, offset = [], 0
    for rows in parts:
        step = rows // degree
        box = list(whole)
        box[axis] = slice(offset + place * step, offset + (place + 1) * step)
        boxes.append(tuple(box))
        offset += rows
    return tuple(boxes)


def _check_split(spec: ParameterSpec, degree: int) -> None:
    rows: Sequence[int] = [r for _, r in spec.parts] if spec.axis == 0 and spec.parts \
        else [spec.shape[spec.axis]]
    if any(r % degree for r in rows):
        raise PlanError(f"{spec.name}: axis {spec.axis} ({', '.join(map(str, rows))}) does "
                        f"not split over tensor_parallel {degree}")
