"""Pipeline stage layout: which decoder layers each (stage, chunk) holds."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mf_parallel.pipeline_layout import (
    PipelineError,
    StageLayout,
    balanced_split,
    placement,
    stage_layout,
    virtual_stage,
)


@pytest.mark.parametrize(("layers", "stages", "chunks", "expected"), [
    (12, 2, 1, (6, 6)),
    (13, 4, 1, (4, 3, 3, 3)),
    (5, 5, 1, (1, 1, 1, 1, 1)),
    (10, 2, 2, (3, 3, 2, 2)),
    (7, 3, 2, (2, 1, 1, 1, 1, 1)),
    (61, 4, 2, (8, 8, 8, 8, 8, 7, 7, 7)),
    (1, 1, 1, (1,)),
])
def test_balanced_split_gives_the_remainder_to_the_first_chunks(layers, stages, chunks,
                                                                expected) -> None:
    layout = stage_layout(layers, stages, chunks)
    assert layout.layers_per_virtual_stage == expected
    assert layout.num_layers == layers


def test_without_interleaving_each_stage_holds_one_run_of_layers() -> None:
    layout = stage_layout(13, 4)
    assert [layout.layers(stage) for stage in range(4)] == [
        range(0, 4), range(4, 7), range(7, 10), range(10, 13)]
    assert layout.describe() == ("stage 0: layers 0-3\n"
                                 "stage 1: layers 4-6\n"
                                 "stage 2: layers 7-9\n"
                                 "stage 3: layers 10-12")


def test_interleaved_virtual_stages_go_round_the_stages() -> None:
    # Virtual stage k runs on stage k % p as chunk k // p: 0-2 | 3-5 | 6-8 | 9-11.
    layout = stage_layout(12, 2, 2)
    assert layout.as_lists() == [[[0, 1, 2], [6, 7, 8]],
                                 [[3, 4, 5], [9, 10, 11]]]
    assert layout.describe() == ("stage 0: chunk 0: 0-2, chunk 1: 6-8\n"
                                 "stage 1: chunk 0: 3-5, chunk 1: 9-11")
    assert [layout.stage_of_layer(layer) for layer in (0, 2, 3, 5, 6, 8, 9, 11)] == [
        (0, 0), (0, 0), (1, 0), (1, 0), (0, 1), (0, 1), (1, 1), (1, 1)]


def test_explicit_layers_per_virtual_stage() -> None:
    layout = stage_layout(10, 2, 2, [3, 2, 4, 1])
    assert layout.as_lists() == [[[0, 1, 2], [5, 6, 7, 8]],
                                 [[3, 4], [9]]]
    assert layout.layers(1, 1) == range(9, 10)
    assert layout.stage_of_layer(9) == (1, 1)
    assert layout.stage_of_layer(4) == (1, 0)
    assert layout.describe() == ("stage 0: chunk 0: 0-2, chunk 1: 5-8\n"
                                 "stage 1: chunk 0: 3-4, chunk 1: 9")


def test_explicit_uneven_stages_and_a_single_layer_stage() -> None:
    layout = stage_layout(8, 3, 1, (4, 3, 1))
    assert layout.describe() == "stage 0: layers 0-3\nstage 1: layers 4-6\nstage 2: layer 7"
    assert layout.as_lists() == [[[0, 1, 2, 3]], [[4, 5, 6]], [[7]]]


def test_virtual_stage_and_placement_are_inverse() -> None:
    assert [placement(k, 3) for k in range(6)] == [(0, 0), (1, 0), (2, 0),
                                                   (0, 1), (1, 1), (2, 1)]
    assert [virtual_stage(*placement(k, 3), 3) for k in range(9)] == list(range(9))


@given(st.integers(1, 6), st.integers(1, 4), st.data())
def test_every_layer_is_in_exactly_one_stage_and_chunk(stages, chunks, data) -> None:
    parts = stages * chunks
    counts = data.draw(st.none() | st.lists(st.integers(1, 5), min_size=parts, max_size=parts))
    layers = sum(counts) if counts else data.draw(st.integers(parts, 80))
    layout = stage_layout(layers, stages, chunks, counts)
    held = [(layer, stage, chunk) for stage in range(stages) for chunk in range(chunks)
            for layer in layout.layers(stage, chunk)]
    assert sorted(layer for layer, _, _ in held) == list(range(layers))
    for layer, stage, chunk in held:
        assert layout.stage_of_layer(layer) == (stage, chunk)
    # Consecutive layers in virtual-stage order: the k-th run belongs to virtual stage k.
    runs = [layout.layers(*placement(k, stages)) for k in range(parts)]
    assert [run.start for run in runs] == [0] + [run.stop for run in runs[:-1]]
    if counts is None:
        sizes = layout.layers_per_virtual_stage
        assert max(sizes) - min(sizes) <= 1
        assert list(sizes) == sorted(sizes, reverse=True)


@pytest.mark.parametrize(("args", "message"), [
    ((8, 0, 1, None), "pipeline_parallel must be >= 1, got 0"),
    ((8, -2, 1, None), "pipeline_parallel must be >= 1, got -2"),
    ((8, 2, 0, None), "pipeline_parallel_interleave_num must be >= 1, got 0"),
    ((3, 2, 2, None), "3 layers cannot fill 4 pipeline chunks (pipeline_parallel 2 x "
                      "interleave_num 2): every chunk needs at least one layer"),
    ((0, 1, 1, None), "0 layers cannot fill 1 pipeline chunks (pipeline_parallel 1 x "
                      "interleave_num 1): every chunk needs at least one layer"),
    ((8, 2, 2, [4, 4]), "pipeline_parallel_layers_per_stage has 2 entries, expected 4 "
                        "(pipeline_parallel 2 x interleave_num 2)"),
    ((8, 2, 1, [8, 0]), "pipeline_parallel_layers_per_stage[1] is 0: every chunk needs at "
                        "least one layer"),
    ((8, 2, 1, [9, -1]), "pipeline_parallel_layers_per_stage[1] is -1: every chunk needs at "
                         "least one layer"),
    ((8, 2, 1, [4, 5]), "pipeline_parallel_layers_per_stage sums to 9 layers, but the model "
                        "has 8"),
])
def test_layouts_that_cannot_be_built(args, message) -> None:
    with pytest.raises(PipelineError) as exc:
        stage_layout(*args)
    assert str(exc.value) == message
    assert isinstance(exc.value, ValueError)


def test_direct_construction_is_checked_too() -> None:
    with pytest.raises(PipelineError) as exc:
        StageLayout(2, 1, (3, 0))
    assert str(exc.value) == ("pipeline_parallel_layers_per_stage[1] is 0: every chunk needs "
                              "at least one layer")


@pytest.mark.parametrize(("call", "message"), [
    (lambda layout: layout.stage_of_layer(12),
     "layer 12 does not exist: the model has 12 layers (0-11)"),
    (lambda layout: layout.stage_of_layer(-1),
     "layer -1 does not exist: the model has 12 layers (0-11)"),
    (lambda layout: layout.layers(2, 0), "stage 2 does not exist: there are 2 stages (0-1)"),
    (lambda layout: layout.layers(0, 3), "chunk 3 does not exist: each stage has 2 chunks (0-1)"),
])
def test_positions_outside_the_layout(call, message) -> None:
    with pytest.raises(PipelineError) as exc:
        call(stage_layout(12, 2, 2))
    assert str(exc.value) == message


def test_balanced_split_alone() -> None:
    assert balanced_split(10, 4) == (3, 3, 2, 2)
    assert balanced_split(8, 4) == (2, 2, 2, 2)
