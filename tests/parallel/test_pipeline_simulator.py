"""The pipeline simulator: built schedules pass with the textbook bubble; broken ones fail."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mf_parallel.pipeline_schedules import Action, Kind, build_schedule
from mf_parallel.pipeline_simulator import ScheduleError, SimulationResult, simulate


def F(mb: int, chunk: int = 0) -> Action:
    return Action(Kind.F, mb, chunk)


def B(mb: int, chunk: int = 0) -> Action:
    return Action(Kind.B, mb, chunk)


def send_f(mb: int, to: int, chunk: int = 0) -> Action:
    return Action(Kind.SEND_F, mb, chunk, to)


def recv_f(mb: int, source: int, chunk: int = 0) -> Action:
    return Action(Kind.RECV_F, mb, chunk, source)


def send_b(mb: int, to: int, chunk: int = 0) -> Action:
    return Action(Kind.SEND_B, mb, chunk, to)


def recv_b(mb: int, source: int, chunk: int = 0) -> Action:
    return Action(Kind.RECV_B, mb, chunk, source)


def interleaved_peak(stages: int, stage: int, microbatches: int, chunks: int) -> int:
    """Megatron's warm-up plus the one forward of the first 1F1B step, at most all of them."""
    return min(2 * (stages - stage - 1) + (chunks - 1) * stages + 1, microbatches * chunks)


MICROBATCHES = (1, 2, 3, 4, 7, 12)  # below, at and above every p in 1..6


@pytest.mark.parametrize("backward", [1, 2])
@pytest.mark.parametrize("stages", range(1, 7))
@pytest.mark.parametrize("name", ["gpipe", "1f1b"])
def test_gpipe_and_1f1b_bubble_is_the_textbook_one(name, stages, backward) -> None:
    p = stages
    for m in MICROBATCHES:
        result = simulate(build_schedule(name, p, m), m, backward_time=backward)
        assert result.makespan == (m + p - 1) * (1 + backward)
        assert result.busy == (m * (1 + backward),) * p
        # Exact: the ratio is the same whatever t_b / t_f is.
        assert result.bubble_fraction == (p - 1) / (m + p - 1)
        if name == "gpipe":
            assert result.peak_in_flight == (m,) * p
        else:
            assert result.peak_in_flight == tuple(min(p - stage, m) for stage in range(p))


@pytest.mark.parametrize("backward", [1, 2])
@pytest.mark.parametrize("chunks", range(1, 4))
@pytest.mark.parametrize("stages", range(1, 7))
def test_interleaved_bubble_is_megatrons(stages, chunks, backward) -> None:
    p, v = stages, chunks
    for m in (p, 2 * p, 3 * p, 4 * p):
        result = simulate(build_schedule("interleaved_1f1b", p, m, v), m, v,
                          backward_time=backward)
        # (p - 1)(t_f + t_b) idle per stage: (p - 1) / (v m) of the ideal time v m (t_f + t_b).
        assert result.makespan == (v * m + p - 1) * (1 + backward)
        assert result.busy == (v * m * (1 + backward),) * p
        assert result.bubble_fraction == (p - 1) / (v * m + p - 1)
        assert result.peak_in_flight == tuple(interleaved_peak(p, stage, m, v)
                                              for stage in range(p))


@pytest.mark.parametrize("stages", range(2, 7))
def test_the_split_backward_leaves_zb_h1s_bubble(stages) -> None:
    """t_f = t_b = t_w (1F1B's backward is B + W): the makespan is the ideal m (t_f + t_b +
    t_w) plus (p - 1)(t_f + t_b - t_w), a third of 1F1B's (p - 1)(t_f + t_b + t_w) (Qi et al.,
    2024); each stage then holds p micro-batches' inputs until their W."""
    p = stages
    for m in (p, 2 * p, 3 * p + 1):
        result = simulate(build_schedule("1f1b", p, m, split_backward=True), m,
                          backward_time=1, weight_time=1)
        assert result.makespan == 3 * m + (p - 1)
        assert result.busy == (3 * m,) * p
        plain = simulate(build_schedule("1f1b", p, m), m, backward_time=2)
        assert (result.makespan - 3 * m) * 3 == plain.makespan - 3 * m
        assert result.peak_in_flight == (p,) * p


def test_a_weight_gradient_before_its_input_gradient() -> None:
    stage0, stage1 = build_schedule("1f1b", 2, 1, split_backward=True)
    stage1 = [a for a in stage1 if a.kind is not Kind.W] + [Action(Kind.W, 0)]
    broken = [stage0, [stage1[0], stage1[1], Action(Kind.W, 0), *stage1[2:-1]]]
    with pytest.raises(ScheduleError, match=r"stage 1, action 2 W\(mb 0, chunk 0\): runs before "
                                            r"its input gradient B\(mb 0, chunk 0\)"):
        simulate(broken)
    with pytest.raises(ScheduleError, match="1 computations never run: stage 1: W"):
        simulate([stage0, [a for a in stage1 if a.kind is not Kind.W]])


def test_interleaving_shrinks_the_bubble_by_the_number_of_chunks() -> None:
    plain = simulate(build_schedule("1f1b", 4, 8), 8)
    interleaved = simulate(build_schedule("interleaved_1f1b", 4, 8, 2), 8, 2)
    assert plain.bubble_fraction == 3 / 11
    assert interleaved.bubble_fraction == 3 / 19
    # In units of one full stage's forward + backward (two chunks' worth when interleaved):
    assert plain.makespan / 2 - 8 == 3
    assert interleaved.makespan / 4 - 8 == 1.5


def test_a_small_1f1b_timeline_by_hand() -> None:
    # t_f = 1, t_b = 2. Stage 1 (no warm-up): F0 [1,2] B0 [2,4] F1 [4,5] B1 [5,7].
    # Stage 0 (warm-up 1): F0 [0,1] F1 [1,2], waits for B0's gradient: B0 [4,6]; waits again:
    # B1 [7,9]. Each stage is busy 6 of 9; stage 0 holds both micro-batches at once.
    result = simulate(build_schedule("1f1b", 2, 2), 2, forward_time=1, backward_time=2)
    assert result == SimulationResult(busy=(6, 6), makespan=9, peak_in_flight=(2, 1))
    assert result.bubble_fraction == 1 / 3


def test_float_times_and_inferred_micro_batches() -> None:
    result = simulate(build_schedule("1f1b", 2, 8), forward_time=1.0, backward_time=2.0)
    assert result.makespan == 27.0
    assert result.bubble_fraction == 1 / 9


@settings(max_examples=150, deadline=None)
@given(st.sampled_from(["gpipe", "1f1b", "interleaved_1f1b"]), st.integers(1, 8),
       st.integers(1, 16), st.integers(1, 4), st.integers(1, 3), st.integers(1, 3))
def test_every_built_schedule_passes(name, stages, groups, chunks, forward, backward) -> None:
    if name == "interleaved_1f1b":
        m = groups * stages
    else:
        m, chunks = groups, 1
    result = simulate(build_schedule(name, stages, m, chunks), m, chunks,
                      forward_time=forward, backward_time=backward)
    assert result.busy == (m * chunks * (forward + backward),) * stages
    assert result.makespan == (m * chunks + stages - 1) * (forward + backward)
    assert max(result.peak_in_flight) <= m * chunks


@settings(max_examples=100, deadline=None)
@given(st.sampled_from(["gpipe", "1f1b", "interleaved_1f1b"]), st.integers(1, 5),
       st.integers(1, 3), st.integers(1, 3), st.data())
def test_dropping_any_action_is_caught(name, stages, groups, chunks, data) -> None:
    if name != "interleaved_1f1b":
        chunks = 1
    m = groups * stages
    schedule = build_schedule(name, stages, m, chunks)
    stage = data.draw(st.integers(0, stages - 1))
    index = data.draw(st.integers(0, len(schedule[stage]) - 1))
    del schedule[stage][index]
    with pytest.raises(ScheduleError):
        simulate(schedule, m, chunks)


def test_a_missing_receive_of_activations() -> None:
    schedule = [[F(0), send_f(0, 1), recv_b(0, 1), B(0)],
                [F(0), B(0), send_b(0, 0)]]
    with pytest.raises(ScheduleError) as exc:
        simulate(schedule, 1)
    assert str(exc.value) == ("stage 1, action 0 F(mb 0, chunk 0): runs before its input from "
                              "F(mb 0, chunk 0) on stage 0 is received")


def test_a_missing_receive_of_gradients() -> None:
    schedule = [[F(0), send_f(0, 1), B(0)],
                [recv_f(0, 0), F(0), B(0), send_b(0, 0)]]
    with pytest.raises(ScheduleError) as exc:
        simulate(schedule, 1)
    assert str(exc.value) == ("stage 0, action 2 B(mb 0, chunk 0): runs before its gradient "
                              "from B(mb 0, chunk 0) on stage 1 is received")


def test_a_send_never_received() -> None:
    schedule = [[F(0), send_f(0, 1), F(1), send_f(1, 1), recv_b(0, 1), B(0)],
                [recv_f(0, 0), F(0), B(0), send_b(0, 0)]]
    with pytest.raises(ScheduleError) as exc:
        simulate(schedule)
    assert str(exc.value) == "stage 0: SEND_F(mb 1, chunk 0, to stage 1) is never received"


def test_a_backward_before_its_forward() -> None:
    with pytest.raises(ScheduleError) as exc:
        simulate([[B(0), F(0)]], 1)
    assert str(exc.value) == ("stage 0, action 0 B(mb 0, chunk 0): runs before its forward "
                              "F(mb 0, chunk 0)")


def test_two_stages_waiting_on_each_other_deadlock() -> None:
    schedule = [[F(0), recv_b(0, 1), send_f(0, 1), B(0)],
                [recv_f(0, 0), F(0), B(0), send_b(0, 0)]]
    with pytest.raises(ScheduleError) as exc:
        simulate(schedule, 1)
    assert str(exc.value) == (
        "deadlock: no stage can progress; "
        "stage 0 waits on RECV_B(mb 0, chunk 0, from stage 1) (action 1); "
        "stage 1 waits on RECV_F(mb 0, chunk 0, from stage 0) (action 0)")


def test_waiting_on_a_stage_that_never_sends() -> None:
    schedule = [[F(0), send_f(0, 1), recv_b(0, 1), B(0)],
                [recv_f(0, 0), F(0), B(0)]]
    with pytest.raises(ScheduleError) as exc:
        simulate(schedule, 1)
    assert str(exc.value) == (
        "deadlock: no stage can progress; stage 0 waits on RECV_B(mb 0, chunk 0, from stage 1) "
        "(action 2), but stage 1 has finished without sending it")


def test_a_duplicated_forward() -> None:
    with pytest.raises(ScheduleError) as exc:
        simulate([[F(0), F(0), B(0)]], 1)
    assert str(exc.value) == "stage 0, action 1 F(mb 0, chunk 0): runs twice"


def test_a_duplicated_forward_inside_a_built_schedule() -> None:
    schedule = build_schedule("1f1b", 2, 2)
    schedule[1].insert(2, F(0))  # stage 1: RECV_F(0) F(0) F(0) ...
    with pytest.raises(ScheduleError) as exc:
        simulate(schedule, 2)
    assert str(exc.value) == "stage 1, action 2 F(mb 0, chunk 0): runs twice"


def test_computations_left_out() -> None:
    with pytest.raises(ScheduleError) as exc:
        simulate([[F(0), B(0)]], 2)
    assert str(exc.value) == ("2 computations never run: stage 0: F(mb 1, chunk 0); "
                              "stage 0: B(mb 1, chunk 0)")
    with pytest.raises(ScheduleError) as exc:
        simulate([[F(0)] + [F(0, chunk) for chunk in range(1, 4)]], 2, 4)
    assert str(exc.value) == ("12 computations never run: stage 0: B(mb 0, chunk 0); "
                              "stage 0: F(mb 1, chunk 0); stage 0: B(mb 1, chunk 0); "
                              "stage 0: B(mb 0, chunk 1); stage 0: F(mb 1, chunk 1); ...")


def test_chunks_out_of_order_on_one_stage() -> None:
    with pytest.raises(ScheduleError) as exc:
        simulate([[F(0, 1), F(0, 0), B(0, 1), B(0, 0)]], 1, 2)
    assert str(exc.value) == ("stage 0, action 0 F(mb 0, chunk 1): runs before F(mb 0, chunk 0), "
                              "which computes its input")
    with pytest.raises(ScheduleError) as exc:
        simulate([[F(0, 0), F(0, 1), B(0, 0), B(0, 1)]], 1, 2)
    assert str(exc.value) == ("stage 0, action 2 B(mb 0, chunk 0): runs before B(mb 0, chunk 1), "
                              "which computes its gradient")


@pytest.mark.parametrize(("schedule", "args", "message"), [
    ([[F(0), send_f(0, 2)], [], []], (1,),
     "stage 0, action 1 SEND_F(mb 0, chunk 0, to stage 2): names the wrong peer: virtual stage 1 "
     "is on stage 1"),
    ([[send_f(0, 1), F(0)], []], (1,),
     "stage 0, action 0 SEND_F(mb 0, chunk 0, to stage 1): sends before F(mb 0, chunk 0) has run"),
    ([[F(0), send_f(0, 1), send_f(0, 1)], []], (1,),
     "stage 0, action 2 SEND_F(mb 0, chunk 0, to stage 1): sends the same message twice"),
    ([[F(0), send_f(0, 1)], [recv_f(0, 0), recv_f(0, 0)]], (1,),
     "stage 1, action 1 RECV_F(mb 0, chunk 0, from stage 0): receives the same message twice"),
    ([[F(0), send_f(0, 1)], [recv_f(0, 0), F(0), send_f(0, 0)]], (1,),
     "stage 1, action 2 SEND_F(mb 0, chunk 0, to stage 0): has no peer: virtual stage 1 is the "
     "last"),
    ([[recv_f(0, 1)], []], (1,),
     "stage 0, action 0 RECV_F(mb 0, chunk 0, from stage 1): has no peer: virtual stage 0 is the "
     "first"),
    ([[F(0, 0), send_f(0, 0)]], (1, 2),
     "stage 0, action 1 SEND_F(mb 0, chunk 0, to stage 0): is not needed: virtual stage 1 is on "
     "this stage too"),
    ([[F(2)]], (2,), "stage 0, action 0 F(mb 2, chunk 0): names a micro-batch outside 0-1"),
    ([[F(0, 2)]], (1, 2), "stage 0, action 0 F(mb 0, chunk 2): names a chunk outside 0-1"),
    ([], (1,), "a schedule needs at least one stage, got none"),
    ([[]], (), "a schedule runs at least one micro-batch and one chunk, got 0 and 1"),
])
def test_other_broken_schedules(schedule, args, message) -> None:
    with pytest.raises(ScheduleError) as exc:
        simulate(schedule, *args)
    assert str(exc.value) == message


def test_times_must_be_positive() -> None:
    with pytest.raises(ValueError) as exc:
        simulate(build_schedule("1f1b", 2, 2), backward_time=0)
    assert str(exc.value) == "forward, backward and weight times must be > 0, got 1, 0 and 1"
    with pytest.raises(ValueError, match="got 1, 1 and 0"):
        simulate(build_schedule("1f1b", 2, 2, split_backward=True), weight_time=0)
