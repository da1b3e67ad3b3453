"""Run a pipeline schedule on paper: check it is correct and measure its bubble.

The model: every stage runs its actions in order, each on its own clock starting at 0. A
forward takes `forward_time`, a backward `backward_time` (per chunk; split in two, its input
gradient B `backward_time` and its weight gradient W `weight_time`); messages take no time.
Sends are buffered and never wait; a receive waits until the matching send has happened, and
the stage's clock moves on to the time of that send. The clocks depend only on the schedule,
not on the order in which the simulator visits the stages, so the result is exact.

The checks are those a real run would fail on, found here before anything is launched: a
computation without its input, a message sent to the wrong stage or never received, a
computation missing or run twice, and a deadlock (stages waiting on each other forever).
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs

from .pipeline_layout import placement, virtual_stage
from .pipeline_schedules import CARRIES, TOWARD, Action, Kind, Message, message_of

Number = int | float


class ScheduleError(ValueError):
    """A schedule that would compute wrong results, lose messages, or hang."""


@attrs.frozen
class SimulationResult:
    """Timing and memory of one simulated schedule.

    `peak_in_flight[s]` is the most forwards stage s had run whose backwards it had not run
    yet (with the backward split, whose W), counting one per (micro-batch, chunk): the
    activations it holds at its fullest. With
    v chunks per stage each of them is the activation memory of 1/v of the stage's layers.
    """

    busy: tuple[Number, ...]
    makespan: Number
    peak_in_flight: tuple[int, ...]

    @property
    def num_stages(self) -> int:
        """Stages of the simulated pipeline."""
        return len(self.busy)

    @property
    def bubble_fraction(self) -> float:
        """Idle share of all stages' time: 1 - total busy / (num_stages * makespan).

        Computed as idle / total, so that with whole-number times it is one exact division
        (the same float as the textbook fraction, such as (p - 1) / (m + p - 1)).
        """
        total = self.num_stages * self.makespan
        return (total - sum(self.busy)) / total


def unit_times(split_backward: bool) -> dict[str, int]:
    """The plan's timing model, as `simulate`'s and `stage_programs`' keyword arguments: a
    backward takes two forwards' time; split, its B and its W take one each. Every rank
    places its transfers on this model, so it must be the same one everywhere."""
    return {"forward_time": 1, "backward_time": 1 if split_backward else 2, "weight_time": 1}


def simulate(schedule: Sequence[Sequence[Action]], num_microbatches: int | None = None,
             num_chunks: int = 1, *, forward_time: Number = 1,
             backward_time: Number = 1, weight_time: Number = 1) -> SimulationResult:
    """Execute a schedule on a unit-time model, to check it and measure its bubble.

    Args:
        schedule: one action list per stage (from `build_schedule`).
        num_microbatches: defaults to one more than the largest micro-batch the actions
            name; give it to also catch a schedule that leaves out the last ones altogether.
        num_chunks: model chunks per stage.
        forward_time: the duration of one forward.
        backward_time: the duration of one backward (with the backward split: of B).
        weight_time: the duration of one W (the schedules with the backward split).

    Returns:
        Busy time per stage, makespan and peak micro-batches in flight.

    Raises:
        ScheduleError: wrong order, a lost message, or a hang.
    """
    if not forward_time > 0 or not backward_time > 0 or not weight_time > 0:
        raise ValueError(f"forward, backward and weight times must be > 0, got {forward_time}, "
                         f"{backward_time} and {weight_time}")
    if not schedule:
        raise ScheduleError("a schedule needs at least one stage, got none")
    if num_microbatches is None:
        num_microbatches = 1 + max((a.microbatch for actions in schedule for a in actions),
                                   default=-1)
    if num_microbatches < 1 or num_chunks < 1:
        raise ScheduleError(f"a schedule runs at least one micro-batch and one chunk, got "
                            f"{num_microbatches} and {num_chunks}")
    durations = {Kind.F: forward_time, Kind.B: backward_time, Kind.W: weight_time}
    run = _Run(schedule, num_microbatches, num_chunks, durations)
    run.execute()
    run.check_complete()
    return SimulationResult(busy=tuple(run.busy), makespan=max(run.clock),
                            peak_in_flight=tuple(run.peak))




@attrs.define
class _Run:
    """The state of one simulation: where each stage is, what has run, what is in transit."""

    schedule: Sequence[Sequence[Action]]
    num_microbatches: int
    num_chunks: int
    durations: dict[Kind, Number]
    position: list[int] = attrs.field(init=False)
    clock: list[Number] = attrs.field(init=False)
    busy: list[Number] = attrs.field(init=False)
    in_flight: list[int] = attrs.field(init=False)
    peak: list[int] = attrs.field(init=False)
    # (micro-batch, virtual stage) of every forward and backward run so far.
    done: dict[Kind, set[tuple[int, int]]] = attrs.field(
        init=False, factory=lambda: {Kind.F: set(), Kind.B: set(), Kind.W: set()})
    split: bool = attrs.field(init=False)
    """Whether the backward is split in two (the schedule has W actions)."""
    # Every send: its time, and where it stands in the schedule for error messages.
    sent: dict[Message, tuple[Number, int, Action]] = attrs.field(init=False, factory=dict)
    received: set[Message] = attrs.field(init=False, factory=set)

    def __attrs_post_init__(self) -> None:
        stages = len(self.schedule)
        self.position, self.clock, self.busy = [0] * stages, [0] * stages, [0] * stages
        self.in_flight, self.peak = [0] * stages, [0] * stages
        self.split = any(action.kind is Kind.W for actions in self.schedule for action in actions)

    @property
    def num_stages(self) -> int:
        return len(self.schedule)

    @property
    def num_virtual(self) -> int:
        return self.num_stages * self.num_chunks

    def execute(self) -> None:
        """Advance every stage as far as it can until all are done; raise on a deadlock."""
        progress = True
        while progress:
            progress = False
            for stage, actions in enumerate(self.schedule):
                while self.position[stage] < len(actions):
                    if not self.step(stage, actions[self.position[stage]]):
                        break
                    self.position[stage] += 1
                    progress = True
        waiting = [stage for stage, actions in enumerate(self.schedule)
                   if self.position[stage] < len(actions)]
        if waiting:
            raise ScheduleError("deadlock: no stage can progress; "
                                + "; ".join(self.wait_reason(stage) for stage in waiting))

    def step(self, stage: int, action: Action) -> bool:
        """Run `action` on `stage`; False if it is a receive whose message is not sent yet."""
        virtual = self.check_action(stage, action)
        if action.kind in (Kind.F, Kind.B, Kind.W):
            self.compute(stage, action, virtual)
            return True
        message = message_of(action, stage, self.num_stages)
        if action.kind in (Kind.SEND_F, Kind.SEND_B):
            self.send(stage, action, virtual, message)
            return True
        return self.receive(stage, action, message)

    def compute(self, stage: int, action: Action, virtual: int) -> None:
        """Run F, B or W after checking it has not run and its inputs are there."""
        kind, mb = action.kind, action.microbatch
        if (mb, virtual) in self.done[kind]:
            raise self.error(stage, action, "runs twice")
        if kind is Kind.W and not self.split:
            raise self.error(stage, action, "is a W in a schedule without split backwards")
        before = {Kind.B: Kind.F, Kind.W: Kind.B}.get(kind)
        if before is not None and (mb, virtual) not in self.done[before]:
            name = "forward" if before is Kind.F else "input gradient"
            raise self.error(stage, action, f"runs before its {name} {_as(before, action)}")
        source = virtual - 1 if kind is Kind.F else virtual + 1
        if kind is not Kind.W and 0 <= source < self.num_virtual and not self.has_input(
                kind, mb, source):
            raise self.error(stage, action, self.missing_input(kind, mb, source))
        self.done[kind].add((mb, virtual))
        duration = self.durations[kind]
        self.clock[stage] += duration
        self.busy[stage] += duration
        held_until = Kind.W if self.split else Kind.B
        self.in_flight[stage] += 1 if kind is Kind.F else -1 if kind is held_until else 0
        self.peak[stage] = max(self.peak[stage], self.in_flight[stage])

    def has_input(self, kind: Kind, mb: int, source: int) -> bool:
        """Whether the result of `kind` on virtual stage `source` has reached this stage."""
        if self.num_stages == 1:
            return (mb, source) in self.done[kind]
        return Message(kind, mb, source) in self.received

    def missing_input(self, kind: Kind, mb: int, source: int) -> str:
        stage, chunk = placement(source, self.num_stages)
        producer = Action(kind, mb, chunk)
        what = "input" if kind is Kind.F else "gradient"
        if self.num_stages == 1:
            return f"runs before {producer}, which computes its {what}"
        return f"runs before its {what} from {producer} on stage {stage} is received"

    def send(self, stage: int, action: Action, virtual: int, message: Message) -> None:
        kind = CARRIES[action.kind]
        if (action.microbatch, virtual) not in self.done[kind]:
            raise self.error(stage, action, f"sends before {_as(kind, action)} has run")
        if message in self.sent:
            raise self.error(stage, action, "sends the same message twice")
        self.sent[message] = (self.clock[stage], stage, action)

    def receive(self, stage: int, action: Action, message: Message) -> bool:
        if message in self.received:
            raise self.error(stage, action, "receives the same message twice")
        if message not in self.sent:
            return False
        self.received.add(message)
        self.clock[stage] = max(self.clock[stage], self.sent[message][0])
        return True

    def check_action(self, stage: int, action: Action) -> int:
        """The virtual stage of `action`, after checking its numbers and its peer.

        An action's stage and chunk fix its virtual stage, so every computation runs on the
        stage that holds its layers; what can be wrong is a number out of range or a peer.
        """
        if not 0 <= action.microbatch < self.num_microbatches:
            raise self.error(stage, action,
                             f"names a micro-batch outside 0-{self.num_microbatches - 1}")
        if not 0 <= action.chunk < self.num_chunks:
            raise self.error(stage, action, f"names a chunk outside 0-{self.num_chunks - 1}")
        virtual = virtual_stage(stage, action.chunk, self.num_stages)
        if action.peer is None:
            return virtual
        neighbour = virtual + TOWARD[action.kind]
        if not 0 <= neighbour < self.num_virtual:
            end = "last" if neighbour > virtual else "first"
            raise self.error(stage, action, f"has no peer: virtual stage {virtual} is the {end}")
        peer, _ = placement(neighbour, self.num_stages)
        if peer == stage:
            raise self.error(
                stage, action, f"is not needed: virtual stage {neighbour} is on this stage too")
        if action.peer != peer:
            raise self.error(stage, action,
                             f"names the wrong peer: virtual stage {neighbour} is on stage {peer}")
        return virtual

    def check_complete(self) -> None:
        """Raise if a message was never received or a computation never ran."""
        for message, (_, stage, action) in self.sent.items():
            if message not in self.received:
                raise ScheduleError(f"stage {stage}: {action} is never received")
        missing = []
        for virtual in range(self.num_virtual):
            stage, chunk = placement(virtual, self.num_stages)
            for mb in range(self.num_microbatches):
                missing += [f"stage {stage}: {Action(kind, mb, chunk)}"
                            for kind in ((Kind.F, Kind.B, Kind.W) if self.split else
                                         (Kind.F, Kind.B))
                            if (mb, virtual) not in self.done[kind]]
        if missing:
            shown = "; ".join(missing[:5]) + ("; ..." if len(missing) > 5 else "")
            raise ScheduleError(f"{len(missing)} computations never run: {shown}")

    def wait_reason(self, stage: int) -> str:
        """What a blocked stage waits for, and whether its peer can still send it."""
        action = self.schedule[stage][self.position[stage]]
        reason = f"stage {stage} waits on {action} (action {self.position[stage]})"
        peer = action.peer
        if peer is not None and self.position[peer] == len(self.schedule[peer]):
            reason += f", but stage {peer} has finished without sending it"
        return reason

    def error(self, stage: int, action: Action, problem: str) -> ScheduleError:
        return ScheduleError(f"stage {stage}, action {self.position[stage]} {action}: {problem}")


def _as(kind: Kind, action: Action) -> Action:
    """The computation of `kind` on the same micro-batch and chunk as `action`."""
    return Action(kind, action.microbatch, action.chunk)
