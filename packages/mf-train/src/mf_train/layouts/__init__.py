"""Step layouts: how each parallel layout reduces gradients and updates, chosen in one place.

`LAYOUTS` lists every layout; exactly one `selects` a plan's degrees. `check_layout` runs the
chosen layout's pre-launch refusals (`mf-train` calls it before any rank starts);
`build_layout` builds it, with its optimizer, on every rank. A new layout (a pipeline
schedule, an expert-parallel dispatch) is one `StepLayout` subclass added with
`register_layout`; the others' `selects` must leave its plans alone. `Pipelined` takes the
plans with pipeline parallelism and composes the layout that selects one stage's degrees
(`without_pipeline`); `ExpertParallel` takes the one-stage plans with expert parallelism and
composes the layout of the other degrees (`without_experts`); `ContextParallel` takes the
one-stage plans with context parallelism and composes the layout that selects them with context
counted as data (`without_context`); the others take plans without pipeline, context or expert
parallelism. A composing layout's inner layout is chosen by one stage's degrees
(`inner_layout`), so under pipeline parallelism the context and expert layouts compose on each
stage as they do alone.
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
from .sharded import FSDP, ZeRO

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
    "register_layout",
    "stage_part",
]

LAYOUTS: list[type[StepLayout]] = [SingleRank, DataParallel, TensorParallel, ZeRO, FSDP,
                                   Pipelined, ExpertParallel, ContextParallel]


def register_layout(cls: type[StepLayout]) -> type[StepLayout]:
    """Add a layout to `LAYOUTS` (usable as a class decorator)."""
    LAYOUTS.append(cls)
    return cls


def layout_for(dims: ParallelDims, parallelism: ParallelismConfig) -> type[StepLayout] | None:
    """The one layout that runs these degrees, or None when none does (what no layout runs,
    `mf_train.support` or the layouts' `problems` refuse before launch).

    Raises:
        RuntimeError: more than one layout selects the degrees (a registration mistake).
    """
    chosen = [cls for cls in LAYOUTS if cls.selects(dims, parallelism)]
    if len(chosen) > 1:
        raise RuntimeError(f"step layouts {[cls.__name__ for cls in chosen]} all select "
                           f"{dims.describe()}; exactly one may")
    return chosen[0] if chosen else None


def inner_layout(dims: ParallelDims, parallelism: ParallelismConfig,
                 whole: ParallelDims) -> type[StepLayout]:
    """The layout a composing layout (pipeline, expert, context) runs inside: the one that
    selects `dims`, its other degrees, on one pipeline stage (the pipeline layout composes
    the others, never the reverse; the layout is built with the pipeline degree kept).

    Raises:
        RuntimeError: none does (the pre-launch checks should have refused `whole`).
    """
    cls = layout_for(without_pipeline(dims), parallelism)
    if cls is None:
        raise RuntimeError(f"no step layout runs the other degrees of {whole.describe()}")
    return cls


def inner_layer_built(dims: ParallelDims, parallelism: ParallelismConfig,
                      collectives: Collectives) -> Callable[[nn.Cell], object] | None:
    """The `layer_built` hook of the layout that selects `dims` (a composing layout's other
    degrees, on one stage), or None when none does or it keeps layers as built."""
    stage = without_pipeline(dims)
    cls = layout_for(stage, parallelism)
    return None if cls is None else cls.layer_built(stage, parallelism, collectives)


def inner_problems(dims: ParallelDims, sections: LayoutSections,
                   checked: ParallelDims | None = None) -> list[Problem]:
    """What the layout inside a composing layout refuses: the one that selects `dims` (on
    one stage), asked about `checked` (default `dims`); none when no layout selects them (what
    no layout runs is refused by `mf_train.support`)."""
    cls = layout_for(without_pipeline(dims), sections.parallelism)
    return [] if cls is None else cls.problems(checked or dims, sections)


def check_layout(dims: ParallelDims, sections: LayoutSections) -> None:
    """Refuse, before any rank starts, what the chosen layout cannot run.

    Raises:
        ConfigError: every setting the layout refuses, with its path and line.
    """
    cls = layout_for(dims, sections.parallelism)
    problems = [] if cls is None else cls.problems(dims, sections)
    if problems:
        raise settings_error(problems, sections.source)


def build_layout(parts: LayoutParts) -> StepLayout:
    """The layout of `parts.dims`, built with its optimizer over `parts.model`."""
    cls = layout_for(parts.dims, parts.parallelism)
    if cls is None:
        raise RuntimeError(f"no step layout runs {parts.dims.describe()} (the pre-launch "
                           "checks should have refused it)")
    return cls.build(parts)
