"""The transfer points of pipeline messages for rendezvous transports (`stage_programs`).

A rendezvous executor below runs the programs as real ranks would: a transfer completes only
when both of its stages stand at it. Every schedule must finish without a deadlock, each
message must move after its SEND and before its RECV, and the planned actions must stay in
their planned order. Moving each message right at its SEND (the naive rendezvous) deadlocks
1F1B, which is why the transfer points exist."""

from __future__ import annotations

import itertools

import pytest

from mf_parallel.pipeline_program import Transfer, count_transfers, stage_programs
from mf_parallel.pipeline_schedules import (
    COMPUTE,
    SENDS,
    Action,
    Kind,
    Message,
    build_schedule,
    message_of,
)
from mf_parallel.pipeline_simulator import ScheduleError

SPLIT = "1f1b, backward split"
"""1F1B with each backward as B and W (ZB-H1)."""


def schedule_of(name: str, stages: int, microbatches: int, chunks: int):
    if name == SPLIT:
        return build_schedule("1f1b", stages, microbatches, chunks, split_backward=True)
    return build_schedule(name, stages, microbatches, chunks)


CASES = [
    *[("gpipe", p, m, 1) for p, m in itertools.product((2, 3, 4), (1, 2, 5, 8))],
    *[("1f1b", p, m, 1) for p, m in itertools.product((2, 3, 4), (1, 2, 5, 8))],
    *[(SPLIT, p, m, 1) for p, m in itertools.product((2, 3, 4), (1, 2, 5, 8))],
    *[("interleaved_1f1b", p, m, v) for p, v in itertools.product((2, 4), (2, 3))
      for m in (p, 2 * p, 4 * p)],
]


class Deadlock(AssertionError):
    pass


def run_rendezvous(programs, num_stages: int) -> list[list[object]]:
    """Execute the programs with blocking transfers; return each stage's executed steps.
    Checks that every message is sent before it moves and has moved before it is received."""
    position = [0] * len(programs)
    sent: set[Message] = set()
    moved: set[Message] = set()
    done: list[list[object]] = [[] for _ in programs]
    while any(position[s] < len(p) for s, p in enumerate(programs)):
        progress = False
        for stage, program in enumerate(programs):
            while position[stage] < len(program):
                step = program[position[stage]]
                if isinstance(step, Transfer):
                    other = step.target if step.source == stage else step.source
                    if position[other] >= len(programs[other]) or \
                            programs[other][position[other]] != step:
                        break
                    assert step.message in sent, f"{step} before its SEND"
                    moved.add(step.message)
                    done[stage].append(step)
                    done[other].append(step)
                    position[stage] += 1
                    position[other] += 1
                    progress = True
                    continue
                if step.kind in SENDS:
                    sent.add(message_of(step, stage, num_stages))
                elif step.kind in (Kind.RECV_F, Kind.RECV_B):
                    assert message_of(step, stage, num_stages) in moved, f"{step} before it moved"
                done[stage].append(step)
                position[stage] += 1
                progress = True
        if not progress:
            raise Deadlock("stages wait on each other: " + ", ".join(
                f"stage {s} at {programs[s][position[s]]}" for s in range(len(programs))
                if position[s] < len(programs[s])))
    return done


@pytest.mark.parametrize(("name", "stages", "microbatches", "chunks"), CASES)
def test_every_schedule_runs_with_rendezvous_transfers(name, stages, microbatches,
                                                       chunks) -> None:
    schedule = schedule_of(name, stages, microbatches, chunks)
    programs = stage_programs(schedule, chunks)
    run_rendezvous(programs, stages)
    for stage, (actions, program) in enumerate(zip(schedule, programs, strict=True)):
        assert [s for s in program if not isinstance(s, Transfer)] == actions, stage
    sends = sum(a.kind in SENDS for actions in schedule for a in actions)
    assert count_transfers(programs) == sends


@pytest.mark.parametrize(("name", "stages", "microbatches", "chunks"), CASES)
def test_neighbours_list_their_transfers_in_the_same_order(name, stages, microbatches,
                                                           chunks) -> None:
    programs = stage_programs(schedule_of(name, stages, microbatches, chunks), chunks)
    for a, b in itertools.combinations(range(stages), 2):
        between = [[s for s in programs[x] if isinstance(s, Transfer)
                    and {s.source, s.target} == {a, b}] for x in (a, b)]
        assert between[0] == between[1]


def test_one_f_one_b_on_two_stages_pairs_crossing_messages() -> None:
    """Stage 0 holds F(1)'s activations while stage 1 holds B(0)'s gradients: both move at
    one point, in the same order on both stages (Megatron's send_forward_recv_backward)."""
    programs = stage_programs(build_schedule("1f1b", 2, 3))
    text = [str(step) for step in programs[0]]
    assert text[:9] == [
        "F(mb 0, chunk 0)", "SEND_F(mb 0, chunk 0, to stage 1)",
        "TRANSFER(activations of mb 0, stage 0 -> 1)",
        "F(mb 1, chunk 0)", "SEND_F(mb 1, chunk 0, to stage 1)",
        "TRANSFER(gradients of mb 0, stage 1 -> 0)",
        "TRANSFER(activations of mb 1, stage 0 -> 1)",
        "RECV_B(mb 0, chunk 0, from stage 1)", "B(mb 0, chunk 0)"]


def test_moving_each_message_at_its_send_deadlocks_one_f_one_b() -> None:
    """The naive rendezvous: a transfer right after each SEND and right before each RECV."""
    schedule = build_schedule("1f1b", 2, 4)
    naive = []
    for stage, actions in enumerate(schedule):
        program: list[Action | Transfer] = []
        for action in actions:
            if action.kind in COMPUTE:
                program.append(action)
                continue
            message = message_of(action, stage, 2)
            source, target = (stage, action.peer) if action.kind in SENDS else (action.peer, stage)
            transfer = Transfer(message, source, target, 0)
            program += [action, transfer] if action.kind in SENDS else [transfer, action]
        naive.append(program)
    with pytest.raises(Deadlock, match="stage 0 at TRANSFER\\(activations of mb 1"):
        run_rendezvous(naive, 2)


def test_a_wrong_schedule_is_refused_before_any_transfer_is_placed() -> None:
    schedule = build_schedule("1f1b", 2, 2)
    schedule[1] = [a for a in schedule[1] if a != Action(Kind.B, 1)]
    with pytest.raises(ScheduleError, match=r"stage 1, action 6 SEND_B\(mb 1, chunk 0, to stage "
                                            r"0\): sends before B\(mb 1, chunk 0\) has run"):
        stage_programs(schedule)


def test_a_batch_ramp_the_interleaved_schedule_cannot_run_is_refused_in_the_plan() -> None:
    """Every step of a ramp-up runs its own schedule: interleaving needs each step's
    micro-batch count to be a multiple of the stages, found before launch."""
    from mf_config import ParallelismConfig, TrainingConfig
    from mf_parallel import PlanError, make_plan

    parallelism = ParallelismConfig(pipeline_parallel=2, data_parallel_shard=1,
                                    pipeline_parallel_schedule="interleaved_1f1b",
                                    pipeline_parallel_interleave_num=2)
    steady = TrainingConfig(global_batch_size=8, local_batch_size=1)
    assert make_plan(parallelism, steady, 2, num_layers=4).simulation is not None
    ramp = TrainingConfig(global_batch_size=8, local_batch_size=1,
                          rampup_batch_size=[2, 1, 100])
    with pytest.raises(PlanError, match=r"micro-batches \(3\) to be a multiple of "
                                        r"pipeline_parallel \(2\)"):
        make_plan(parallelism, ramp, 2, num_layers=4)
    even = TrainingConfig(global_batch_size=8, local_batch_size=1, rampup_batch_size=[2, 2, 100])
    assert make_plan(parallelism, even, 2, num_layers=4).simulation is not None
