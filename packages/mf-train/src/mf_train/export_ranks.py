"""Which rank files of a checkpoint the Hugging Face export reads, and what each one holds,
worked out from the run's parallel plan (never from the files' contents).

A rank saved what it built in training (`Trainer`):
- its pipeline stage's part of the model (`layouts.pipelined.stage_part`, the training code:
  the stage's layers, all its virtual chunks' when interleaved; the embedding on the first
  stage; the final norm and head on the last, with a copy of a tied embedding there too);
  the stage's model is built here to read its names off its `weight_maps()`;
- under expert parallelism only its share of the routed experts (`RankMesh.experts_of`: by
  its place in its expert group, the rule `ExpertGroup.local_experts` trains with);
- under tensor parallelism the slice of each split weight at its place in its tensor group.
Data-parallel ranks (ZeRO and FSDP included: FSDP gathers before a save) and context-parallel
ranks hold what their peers hold. Routed experts are never sliced by FSDP or ZeRO under
expert parallelism (each rank keeps its experts whole), so no expert sharding is undone here.

`source_ranks` takes, in rank order, each rank that holds a (weight, tensor place) no earlier
one does: one rank per stage, expert share and tensor place. `tensor_places` merges their
arrays into one mapping per tensor place for `gather_hf_state`; a weight two of them hold
(a tied embedding on the first and last stage, a norm on two tensor ranks) must be equal in
both.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs
import numpy as np

from mf_config import TrainConfig
from mf_parallel import Plan

from .hf_export import ExportError
from .layouts.expert_parallel import expert_index
from .layouts.pipelined import stage_part
from .models import ModelPart, PipelineModel, build_model
from .models.hf_weights import WeightMap


@attrs.frozen
class Holding:
    """What one rank's model file holds under the plan."""

    rank: int
    names: frozenset[str]
    """Our names of the parameters it saved."""
    tensor: int
    """Its place in its tensor group (the slice of each split weight it holds)."""


def holdings(config: TrainConfig, plan: Plan, model: Any) -> list[Holding]:
    """What every rank of the plan's world saved.

    Args:
        config: the run's configuration.
        plan: its parallel plan on the checkpoint's world size.
        model: the whole model (one process), built from `config.model`.

    Raises:
        ExportError: the plan splits a model that training cannot split that way.
    """
    whole = [entry.ours for entry in model.weight_maps()]
    experts = _routed_experts(model, plan)
    stages: dict[ModelPart | None, list[str]] = {}
    found = []
    for rank in range(plan.dims.world_size):
        part = stage_part(plan, rank)
        if part not in stages:
            stages[part] = whole if part is None else _stage_names(config, model, part)
        held = plan.mesh.experts_of(rank, experts) if plan.dims.expert > 1 else None
        names = frozenset(name for name in stages[part]
                          if held is None or expert_index(name) in (None, *held))
        found.append(Holding(rank, names, plan.mesh.coordinates(rank)["tensor"]))
    return found


def source_ranks(found: list[Holding], entries: list[WeightMap], tensor: int) -> list[Holding]:
    """The ranks to read: in rank order, each that holds a (weight, tensor place) no earlier
    one holds. Weights that tensor parallelism does not split count once, at any place."""
    split = {entry.ours for entry in entries if entry.axis is not None and tensor > 1}
    covered: set[tuple[str, int | None]] = set()
    chosen = []
    for holding in found:
        keys = {(name, holding.tensor if name in split else None) for name in holding.names}
        if keys - covered:
            chosen.append(holding)
            covered |= keys
    return chosen


def check_files(directory: Path, chosen: list[Holding],
                arrays: Mapping[int, Mapping[str, np.ndarray]], config_file: str) -> None:
    """Each chosen rank's file holds exactly what the plan says it saved.

    Raises:
        ExportError: listing, per rank, the parameters missing and those the plan puts on
            other ranks (the configuration does not give the run's parallelism).
    """
    problems = []
    for holding in chosen:
        saved = set(arrays[holding.rank])
        for name in sorted(holding.names - saved):
            problems.append(f"rank {holding.rank}: {name} missing")
        for name in sorted(saved - holding.names):
            problems.append(f"rank {holding.rank}: {name} saved, but the plan puts it on "
                            "other ranks")
    if problems:
        raise ExportError(f"{directory}: the rank files do not hold what {config_file}'s "
                          "parallelism says they hold (does it give the run's parallelism?):"
                          "\n  " + "\n  ".join(problems))


def tensor_places(chosen: list[Holding], arrays: Mapping[int, Mapping[str, np.ndarray]],
                  entries: list[WeightMap], tensor: int) -> list[dict[str, np.ndarray]]:
    """One mapping (our name -> array) per tensor place, in place order, merged from the
    chosen ranks; a weight tensor parallelism does not split is in every place.

    Raises:
        ExportError: two chosen files hold different values for the same weight and place.
    """
    split = {entry.ours for entry in entries if entry.axis is not None and tensor > 1}
    places: list[dict[str, np.ndarray]] = [{} for _ in range(tensor)]
    first: dict[tuple[str, int | None], int] = {}
    for holding in chosen:
        for name in sorted(holding.names):
            key = (name, holding.tensor if name in split else None)
            value = arrays[holding.rank][name]
            if key in first:
                _check_copy(name, value, places[holding.tensor][name], holding.rank, first[key])
                continue
            first[key] = holding.rank
            for place in ([holding.tensor] if name in split else range(tensor)):
                places[place][name] = value
    return places


def _check_copy(name: str, value: np.ndarray, kept: np.ndarray, rank: int, kept_rank: int) -> None:
    if not np.array_equal(np.asarray(value), np.asarray(kept)):
        raise ExportError(f"{name}: rank {rank}'s copy differs from rank {kept_rank}'s (the run "
                          "keeps its copies equal; the checkpoint is not one run's)")


def _stage_names(config: TrainConfig, model: Any, part: ModelPart) -> list[str]:
    """Our names of the parameters a pipeline stage builds (its model built as training
    builds it)."""
    if not isinstance(model, PipelineModel):
        raise ExportError(f"{type(model).__name__} is not cut into pipeline stages by mf-train "
                          "(no run of it saves a pipeline_parallel > 1 checkpoint); set "
                          "parallelism.pipeline_parallel to the run's value")
    stage = build_model(config.model, seed=0, part=part)
    return [entry.ours for entry in stage.weight_maps()]


def _routed_experts(model: Any, plan: Plan) -> int:
    """The number of routed experts expert parallelism splits (0 without it)."""
    if plan.dims.expert == 1:
        return 0
    count = getattr(model.settings, "n_routed_experts", 0) or 0
    if not count:
        raise ExportError(f"parallelism.expert_parallel is {plan.dims.expert}, but "
                          f"{type(model).__name__} has no routed experts to split (no run of "
                          "it saves an expert-parallel checkpoint); set it to the run's value")
    return count
