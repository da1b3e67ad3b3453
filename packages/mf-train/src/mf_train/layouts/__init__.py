"""Step layouts: how each parallel layout reduces gradients and updates, chosen in one place.

`layout_for` picks a plan's layout in one fixed order, the order its parallelisms wrap each
other: pipeline stages (`Pipelined`), then context (`ContextParallel`), then experts
(`ExpertParallel`), then the data layout of what is left (ZeRO or FSDP when the data-parallel
ranks shard, else tensor parallelism, replicas, one rank). `LAYOUTS` holds the class of each
of those roles: replacing one changes how its plans run. A wrapping layout builds the layout
of its remaining degrees (`inner_layout`, through the same function: `without_pipeline`,
`without_context`, `without_experts` drop the degree it took), so under `Pipelined` the
context and expert layouts wrap as they do alone. `check_layout` runs the chosen layout's
pre-launch refusals (`mf-train` calls it before any rank starts); `build_layout` builds it,
with its optimizer, on every rank.
"""

from __future__ import annotations

from collections.abc import Callable

from mindspore import nn

from mf_config import ParallelismConfig
from mf_config.component_settings import settings_error
from mf_parallel.dims import ParallelDims
from mf_parallel.runtime import Collectives

from .context_parallel import ContextParallel
from .contract import (
    LayoutParts,
    LayoutRecord,
    LayoutSections,
    LocalGradients,
    MicroBatch,
    Observers,
    Problem,
    ReducedGradients,
    StepLayout,
    StepObserver,
    Unobserved,
)
from .expert_parallel import ExpertParallel
from .pipelined import Pipelined, stage_part, without_pipeline
from .replicated import DataParallel, SingleRank, TensorParallel
from .sharded import FSDP, FSDP_STRATEGY, ZeRO

__all__ = [
    "FSDP",
    "LAYOUTS",
    "ContextParallel",
    "DataParallel",
    "ExpertParallel",
    "LayoutParts",
    "LayoutRecord",
    "LayoutSections",
    "LocalGradients",
    "MicroBatch",
    "Observers",
    "Pipelined",
    "ReducedGradients",
    "SingleRank",
    "StepLayout",
    "StepObserver",
    "TensorParallel",
    "Unobserved",
    "ZeRO",
    "build_layout",
    "check_layout",
    "layout_for",
    "stage_part",
]

LAYOUTS: dict[str, type[StepLayout]] = {
    "pipeline": Pipelined, "context": ContextParallel, "experts": ExpertParallel,
    "FSDP": FSDP, "ZeRO": ZeRO, "tensor": TensorParallel, "data": DataParallel,
    "single": SingleRank}
"""The layout of each role, in the order `layout_for` tries them."""


def layout_for(dims: ParallelDims, parallelism: ParallelismConfig) -> type[StepLayout]:
    """The layout that runs these degrees: the first of, in order, pipeline stages, context,
    experts (each wrapping the layout of the rest), sharded data parallelism (FSDP or ZeRO by
    `data_parallel_shard_strategy`), tensor parallelism, replicas, one rank."""
    if dims.pipeline > 1:
        role = "pipeline"
    elif dims.context > 1:
        role = "context"
    elif dims.expert > 1:
        role = "experts"
    elif dims.data_shard > 1:
        role = "FSDP" if parallelism.data_parallel_shard_strategy == FSDP_STRATEGY else "ZeRO"
    elif dims.tensor > 1:
        role = "tensor"
    else:
        role = "data" if dims.data > 1 else "single"
    return LAYOUTS[role]


def inner_layout(dims: ParallelDims, parallelism: ParallelismConfig) -> type[StepLayout]:
    """The layout a composing layout (pipeline, expert, context) runs inside: the one of
    `dims`, its other degrees, on one pipeline stage (the pipeline layout composes the
    others, never the reverse; the layout is built with the pipeline degree kept)."""
    return layout_for(without_pipeline(dims), parallelism)


def inner_layer_built(dims: ParallelDims, parallelism: ParallelismConfig,
                      collectives: Collectives) -> Callable[[nn.Cell], object] | None:
    """The `layer_built` hook of the layout of `dims` (a composing layout's other degrees, on
    one stage), or None when it keeps layers as built."""
    stage = without_pipeline(dims)
    return layout_for(stage, parallelism).layer_built(stage, parallelism, collectives)


def inner_problems(dims: ParallelDims, sections: LayoutSections,
                   checked: ParallelDims | None = None) -> list[Problem]:
    """What the layout inside a composing layout refuses: the one of `dims` (on one stage),
    asked about `checked` (default `dims`)."""
    return layout_for(without_pipeline(dims), sections.parallelism).problems(checked or dims,
                                                                            sections)


def check_layout(dims: ParallelDims, sections: LayoutSections) -> None:
    """Refuse, before any rank starts, what the chosen layout cannot run.

    Raises:
        ConfigError: every setting the layout refuses, with its path and line.
    """
    problems = layout_for(dims, sections.parallelism).problems(dims, sections)
    if problems:
        raise settings_error(problems, sections.source)


def build_layout(parts: LayoutParts) -> StepLayout:
    """The layout of `parts.dims`, built with its optimizer over `parts.model`."""
    return layout_for(parts.dims, parts.parallelism).build(parts)
