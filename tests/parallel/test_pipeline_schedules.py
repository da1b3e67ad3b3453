"""Pipeline schedules: the per-stage action lists of GPipe, 1F1B, interleaved 1F1B and 1F1B
with the backward split (ZB-H1)."""

from __future__ import annotations

import typing

import attrs
import pytest

from mf_config import ParallelismConfig
from mf_parallel.pipeline_layout import PipelineError
from mf_parallel.pipeline_schedules import SCHEDULES, Action, Kind, build_schedule


def compute(actions: list[Action]) -> str:
    """The computations of one stage, compactly: `F0 B0`, or `F0.1` for chunk 1."""
    words = []
    for action in actions:
        if action.kind in (Kind.F, Kind.B, Kind.W):
            chunk = f".{action.chunk}" if action.chunk else ""
            words.append(f"{action.kind.value}{action.microbatch}{chunk}")
    return " ".join(words)


def test_schedule_names_are_the_configs() -> None:
    field = attrs.fields(ParallelismConfig).pipeline_parallel_schedule
    assert list(SCHEDULES) == list(typing.get_args(field.type))
    assert list(SCHEDULES) == ["gpipe", "1f1b", "interleaved_1f1b"]


def test_gpipe_with_its_messages() -> None:
    stage0, stage1 = (list(map(str, actions)) for actions in build_schedule("gpipe", 2, 2))
    assert stage0 == ["F(mb 0, chunk 0)", "SEND_F(mb 0, chunk 0, to stage 1)",
                      "F(mb 1, chunk 0)", "SEND_F(mb 1, chunk 0, to stage 1)",
                      "RECV_B(mb 0, chunk 0, from stage 1)", "B(mb 0, chunk 0)",
                      "RECV_B(mb 1, chunk 0, from stage 1)", "B(mb 1, chunk 0)"]
    assert stage1 == ["RECV_F(mb 0, chunk 0, from stage 0)", "F(mb 0, chunk 0)",
                      "RECV_F(mb 1, chunk 0, from stage 0)", "F(mb 1, chunk 0)",
                      "B(mb 0, chunk 0)", "SEND_B(mb 0, chunk 0, to stage 0)",
                      "B(mb 1, chunk 0)", "SEND_B(mb 1, chunk 0, to stage 0)"]


def test_gpipe_runs_all_forwards_then_all_backwards() -> None:
    assert [compute(stage) for stage in build_schedule("gpipe", 3, 4)] == [
        "F0 F1 F2 F3 B0 B1 B2 B3"] * 3


def test_1f1b_warms_up_p_minus_stage_minus_1_forwards() -> None:
    assert [compute(stage) for stage in build_schedule("1f1b", 3, 4)] == [
        "F0 F1 F2 B0 F3 B1 B2 B3",
        "F0 F1 B0 F2 B1 F3 B2 B3",
        "F0 B0 F1 B1 F2 B2 F3 B3",
    ]


def test_1f1b_with_fewer_micro_batches_than_stages() -> None:
    assert [compute(stage) for stage in build_schedule("1f1b", 4, 2)] == [
        "F0 F1 B0 B1",   # warm-up min(3, m) = 2: all forwards first
        "F0 F1 B0 B1",   # warm-up 2
        "F0 F1 B0 B1",   # warm-up 1, then F1 B0, then B1
        "F0 B0 F1 B1"]   # the last stage: no warm-up


def test_the_split_1f1b_is_zb_h1() -> None:
    """1F1B's Fs and Bs; stage s keeps up to s Ws waiting (oldest first out) for its end."""
    assert [compute(stage) for stage in build_schedule("1f1b", 3, 4, split_backward=True)] == [
        "F0 F1 F2 B0 W0 F3 B1 W1 B2 W2 B3 W3",
        "F0 F1 B0 F2 B1 W0 F3 B2 W1 B3 W2 W3",
        "F0 B0 F1 B1 F2 B2 W0 F3 B3 W1 W2 W3",
    ]
    _, stage1 = build_schedule("1f1b", 2, 1, split_backward=True)
    assert [str(a) for a in stage1] == ["RECV_F(mb 0, chunk 0, from stage 0)",
                                        "F(mb 0, chunk 0)", "B(mb 0, chunk 0)",
                                        "SEND_B(mb 0, chunk 0, to stage 0)", "W(mb 0, chunk 0)"]


def test_interleaved_follows_megatrons_order() -> None:
    # p = 2, v = 2, m = 4. Forwards in groups of p micro-batches per chunk:
    # (0,c0) (1,c0) (0,c1) (1,c1) (2,c0) (3,c0) (2,c1) (3,c1); backwards the same with the
    # chunks reversed. Warm-up 2 (p - s - 1) + (v - 1) p: 4 on stage 0, 2 on stage 1.
    stage0, stage1 = (compute(stage) for stage in build_schedule("interleaved_1f1b", 2, 4, 2))
    assert stage0 == ("F0 F1 F0.1 F1.1 "
                      "F2 B0.1 F3 B1.1 F2.1 B0 F3.1 B1 "
                      "B2.1 B3.1 B2 B3")
    assert stage1 == ("F0 F1 "
                      "F0.1 B0.1 F1.1 B1.1 F2 B0 F3 B1 F2.1 B2.1 F3.1 B3.1 "
                      "B2 B3")


def test_interleaved_messages_wrap_from_the_last_stage_to_the_first() -> None:
    stage0, stage1 = build_schedule("interleaved_1f1b", 2, 2, 2)
    # Virtual stage 1 (stage 1, chunk 0) feeds virtual stage 2 (stage 0, chunk 1).
    assert stage1[:3] == [Action(Kind.RECV_F, 0, 0, 0), Action(Kind.F, 0, 0),
                          Action(Kind.SEND_F, 0, 0, 0)]
    f01 = stage0.index(Action(Kind.F, 0, 1))
    assert stage0[f01 - 1:f01 + 2] == [Action(Kind.RECV_F, 0, 1, 1), Action(Kind.F, 0, 1),
                                       Action(Kind.SEND_F, 0, 1, 1)]
    # The first virtual stage receives no input and sends no gradient back; the last
    # virtual stage (stage 1, chunk 1) sends no output and receives no gradient.
    assert Action(Kind.RECV_F, 0, 0, 1) not in stage0
    assert Action(Kind.SEND_B, 0, 0, 1) not in stage0
    assert Action(Kind.SEND_F, 0, 1, 0) not in stage1
    assert Action(Kind.RECV_B, 0, 1, 0) not in stage1


@pytest.mark.parametrize(("name", "chunks"), [("gpipe", 1), ("1f1b", 1),
                                              ("interleaved_1f1b", 3)])
def test_one_stage_sends_nothing(name, chunks) -> None:
    (stage,) = build_schedule(name, 1, 3, chunks)
    assert all(action.kind in (Kind.F, Kind.B) for action in stage)
    assert len(stage) == 2 * 3 * chunks


@pytest.mark.parametrize(("args", "message"), [
    (("zero_bubble", 2, 4), "unknown pipeline schedule 'zero_bubble'; known: gpipe, 1f1b, "
                            "interleaved_1f1b"),
    (("1F1B", 2, 4), "unknown pipeline schedule '1F1B'; known: gpipe, 1f1b, interleaved_1f1b"),
    (("1f1b", 0, 4), "the number of pipeline stages must be >= 1, got 0"),
    (("gpipe", 2, 0), "the number of micro-batches must be >= 1, got 0"),
    (("interleaved_1f1b", 2, 4, 0), "the number of chunks per stage must be >= 1, got 0"),
    (("1f1b", 2, 4, 2), "1f1b runs one model chunk per stage, got 2; use interleaved_1f1b for "
                        "pipeline_parallel_interleave_num > 1"),
    (("gpipe", 2, 4, 3), "gpipe runs one model chunk per stage, got 3; use interleaved_1f1b for "
                         "pipeline_parallel_interleave_num > 1"),
    (("interleaved_1f1b", 4, 6, 2), "interleaved_1f1b needs the number of micro-batches (6) to "
                                    "be a multiple of pipeline_parallel (4), as Megatron's "
                                    "interleaved schedule does"),
    (("interleaved_1f1b", 3, 2, 1), "interleaved_1f1b needs the number of micro-batches (2) to "
                                    "be a multiple of pipeline_parallel (3), as Megatron's "
                                    "interleaved schedule does"),
])
def test_schedules_that_cannot_be_built(args, message) -> None:
    with pytest.raises(PipelineError) as exc:
        build_schedule(*args)
    assert str(exc.value) == message


@pytest.mark.parametrize("name", ["gpipe", "interleaved_1f1b"])
def test_only_1f1b_has_a_split_form(name) -> None:
    with pytest.raises(PipelineError) as exc:
        build_schedule(name, 2, 4, split_backward=True)
    assert str(exc.value) == (
        f"{name} has no form with the backward split into input and weight gradients "
        "(pipeline_parallel_enable_dxdw_split); the schedules that have one: 1f1b; set "
        "pipeline_parallel_schedule to one of them or pipeline_parallel_enable_dxdw_split to "
        "false")



def test_actions_say_what_they_are() -> None:
    assert str(Action(Kind.B, 3, 1)) == "B(mb 3, chunk 1)"
    assert str(Action(Kind.SEND_B, 3, 1, 0)) == "SEND_B(mb 3, chunk 1, to stage 0)"
    assert str(Action(Kind.RECV_F, 0, 2, 5)) == "RECV_F(mb 0, chunk 2, from stage 5)"


@pytest.mark.parametrize(("args", "message"), [
    ((Kind.F, 0, 0, 1), "F takes no peer stage, got peer=1"),
    ((Kind.B, 0, 0, 0), "B takes no peer stage, got peer=0"),
    ((Kind.SEND_F, 0, 0), "SEND_F needs a peer stage, got peer=None"),
    ((Kind.RECV_B, 0, 0), "RECV_B needs a peer stage, got peer=None"),
])
def test_computations_take_no_peer_and_messages_need_one(args, message) -> None:
    with pytest.raises(ValueError) as exc:
        Action(*args)
    assert str(exc.value) == message
