"""Which decoder layers each pipeline stage holds.

With `pipeline_parallel` = p stages and `pipeline_parallel_interleave_num` = v model chunks per
stage, the model is cut into p * v *virtual stages* of consecutive layers. Virtual stage k runs
on stage k % p as its chunk k // p (Megatron's interleaved order): with p = 2 and v = 2, stage 0
holds virtual stages 0 and 2, stage 1 holds 1 and 3, so a micro-batch visits stage 0, 1, 0, 1.
Without interleaving (v = 1) a virtual stage is simply a stage.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import accumulate

import attrs


class PipelineError(ValueError):
    """A pipeline layout or schedule that cannot be built from the numbers given."""


def virtual_stage(stage: int, chunk: int, num_stages: int) -> int:
    """The virtual stage that `chunk` of `stage` is: chunk * num_stages + stage."""
    return chunk * num_stages + stage


def placement(virtual: int, num_stages: int) -> tuple[int, int]:
    """(stage, chunk) that runs virtual stage `virtual`: the inverse of `virtual_stage`."""
    chunk, stage = divmod(virtual, num_stages)
    return stage, chunk


def balanced_split(num_layers: int, num_parts: int) -> tuple[int, ...]:
    """`num_layers` in `num_parts` consecutive parts, the first ones one layer larger.

    The remainder goes to the first parts because the last stage also runs the output layer
    and the loss (and the first only a cheap embedding lookup): leaving the last stage the
    fewest decoder layers keeps the stages closest to equal in time and memory.
    """
    base, extra = divmod(num_layers, num_parts)
    return tuple(base + 1 if part < extra else base for part in range(num_parts))


@attrs.frozen
class StageLayout:
    """Decoder layers of every (stage, chunk); `stage_layout` builds one from config numbers.

    `layers_per_virtual_stage` has p * v entries in virtual-stage order; the layers are dealt
    to the virtual stages consecutively, so virtual stage k holds the k-th run of layers.
    """

    num_stages: int
    num_chunks: int
    layers_per_virtual_stage: tuple[int, ...] = attrs.field(converter=tuple)

    def __attrs_post_init__(self) -> None:
        _check(sum(self.layers_per_virtual_stage), self.num_stages, self.num_chunks,
               self.layers_per_virtual_stage)

    @property
    def num_layers(self) -> int:
        """Decoder layers in the whole model."""
        return sum(self.layers_per_virtual_stage)

    def layers(self, stage: int, chunk: int = 0) -> range:
        """The layer ids that `chunk` of `stage` holds."""
        self._check_position(stage, chunk)
        virtual = virtual_stage(stage, chunk, self.num_stages)
        start = sum(self.layers_per_virtual_stage[:virtual])
        return range(start, start + self.layers_per_virtual_stage[virtual])

    def stage_of_layer(self, layer: int) -> tuple[int, int]:
        """(stage, chunk) holding decoder layer `layer`."""
        if not 0 <= layer < self.num_layers:
            raise PipelineError(
                f"layer {layer} does not exist: the model has {self.num_layers} layers "
                f"(0-{self.num_layers - 1})")
        ends = accumulate(self.layers_per_virtual_stage)
        virtual = next(k for k, end in enumerate(ends) if layer < end)
        return placement(virtual, self.num_stages)

    def as_lists(self) -> list[list[list[int]]]:
        """Layer ids as plain data: `as_lists()[stage][chunk]` lists the layers of that chunk."""
        return [[list(self.layers(stage, chunk)) for chunk in range(self.num_chunks)]
                for stage in range(self.num_stages)]

    def describe(self) -> str:
        """One line per stage: `stage 0: layers 0-5`, or per chunk when interleaved."""
        lines = []
        for stage in range(self.num_stages):
            if self.num_chunks == 1:
                layers = self.layers(stage)
                noun = "layer" if len(layers) == 1 else "layers"
                lines.append(f"stage {stage}: {noun} {_span(layers)}")
                continue
            chunks = ", ".join(f"chunk {chunk}: {_span(self.layers(stage, chunk))}"
                               for chunk in range(self.num_chunks))
            lines.append(f"stage {stage}: {chunks}")
        return "\n".join(lines)

    def _check_position(self, stage: int, chunk: int) -> None:
        if not 0 <= stage < self.num_stages:
            raise PipelineError(f"stage {stage} does not exist: there are {self.num_stages} "
                                f"stages (0-{self.num_stages - 1})")
        if not 0 <= chunk < self.num_chunks:
            raise PipelineError(f"chunk {chunk} does not exist: each stage has "
                                f"{self.num_chunks} chunks (0-{self.num_chunks - 1})")


def stage_layout(num_layers: int, num_stages: int, num_chunks: int = 1,
                 layers_per_stage: Sequence[int] | None = None) -> StageLayout:
    """Which decoder layers each pipeline stage (and chunk) holds; balanced unless told.

    Args:
        num_layers: decoder layers of the model.
        num_stages: the pipeline degree.
        num_chunks: model chunks per stage (interleaving).
        layers_per_stage: the config's `pipeline_parallel_layers_per_stage` as a list: one
            count per virtual stage (num_stages * num_chunks of them), in virtual-stage order.

    Returns:
        The layout.

    Raises:
        PipelineError: names the numbers that do not fit.
    """
    _check(num_layers, num_stages, num_chunks, layers_per_stage)
    if layers_per_stage is None:
        layers_per_stage = balanced_split(num_layers, num_stages * num_chunks)
    return StageLayout(num_stages, num_chunks, tuple(layers_per_stage))


def _span(layers: range) -> str:
    """`0-5`, or `3` for a single layer: the layer-spec grammar of mf-config."""
    if len(layers) == 1:
        return str(layers.start)
    return f"{layers.start}-{layers[-1]}"


def _check(num_layers: int, num_stages: int, num_chunks: int,
           counts: Sequence[int] | None) -> None:
    """Raise `PipelineError` for the first of the numbers that cannot make a layout."""
    if num_stages < 1:
        raise PipelineError(f"pipeline_parallel must be >= 1, got {num_stages}")
    if num_chunks < 1:
        raise PipelineError(f"pipeline_parallel_interleave_num must be >= 1, got {num_chunks}")
    parts = num_stages * num_chunks
    if num_layers < parts:
        raise PipelineError(
            f"{num_layers} layers cannot fill {parts} pipeline chunks (pipeline_parallel "
            f"{num_stages} x interleave_num {num_chunks}): every chunk needs at least one layer")
    if counts is None:
        return
    if len(counts) != parts:
        raise PipelineError(
            f"pipeline_parallel_layers_per_stage has {len(counts)} entries, expected {parts} "
            f"(pipeline_parallel {num_stages} x interleave_num {num_chunks})")
    for index, count in enumerate(counts):
        if count < 1:
            raise PipelineError(
                f"pipeline_parallel_layers_per_stage[{index}] is {count}: every chunk needs at "
                f"least one layer")
    if sum(counts) != num_layers:
        raise PipelineError(
            f"pipeline_parallel_layers_per_stage sums to {sum(counts)} layers, but the model "
            f"has {num_layers}")
