"""When each pipeline message moves, for transports where both ends must take part at once.

A schedule (`pipeline_schedules`) is written for buffered sends: SEND never waits, RECV waits
until the message has been sent. The transports mf-train has are rendezvous: a blocking
send/receive pair, or, on MindSpore's CPU backend, a broadcast inside a two-rank group that
both ranks call together. Run naively, a rendezvous send deadlocks 1F1B (stage 0 sends F(1)
while stage 1 sends B(0) back), and on the emulation the two crossing calls would even meet
and add the two tensors together.

`stage_programs` keeps every stage's action list exactly as planned and adds `Transfer` steps:
the points at which a message physically moves. They are found by running the schedule on the
simulator's timing model (forward and backward durations, messages instantaneous) with one
rule: a message moves when its receiver waits for it and its sender is between two actions,
the sender finishing the computation it is in first. Every transfer is one event of a single
global order, and each stage's program lists its actions and transfers in that order, so:
- two neighbours always reach their shared transfers in the same order (no crossing calls);
- no cycle of waits can form (the earliest unfinished transfer has both ends ready), also
  with the tensor- and data-parallel collectives inside the computations, since those involve
  only ranks of one stage, which run the same program.
A stage's executor then runs SEND as "keep for sending", `Transfer` as the blocking move, and
RECV as "take what arrived" (it always has).
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs

from .pipeline_schedules import Action, Kind, Message, message_of
from .pipeline_simulator import ScheduleError, simulate

Number = int | float

@attrs.frozen
class Transfer:
    """A message moving from stage `source` to stage `target` (both run this step)."""

    message: Message
    source: int
    target: int
    time: Number
    """When it moves on the timing model (for reading; the order is what matters)."""

    def __str__(self) -> str:
        kind = "activations" if self.message.carries is Kind.F else "gradients"
        return (f"TRANSFER({kind} of mb {self.message.microbatch}, stage {self.source} -> "
                f"{self.target})")


Step = Action | Transfer


def stage_programs(schedule: Sequence[Sequence[Action]], num_chunks: int = 1, *,
                   forward_time: Number = 1, backward_time: Number = 2,
                   weight_time: Number = 1) -> list[list[Step]]:
    """Every stage's actions, in planned order, with the transfers placed between them.

    Args:
        schedule: one action list per stage (`build_schedule`); checked with `simulate` first.
        num_chunks: model chunks per stage.
        forward_time: duration of one forward, as in the plan's simulation.
        backward_time: duration of one backward (with the backward split: of B).
        weight_time: duration of one W (the schedules with the backward split).

    Returns:
        One program per stage: its actions in their planned order, with a `Transfer` before
        each RECV and somewhere after each SEND, in one global order shared by all stages.

    Raises:
        ScheduleError: the schedule is wrong (as `simulate` finds it).
    """
    simulate(schedule, num_chunks=num_chunks, forward_time=forward_time,
             backward_time=backward_time, weight_time=weight_time)
    run = _Rendezvous(schedule, {Kind.F: forward_time, Kind.B: backward_time,
                                 Kind.W: weight_time})
    run.execute()
    return run.programs


def count_transfers(programs: Sequence[Sequence[Step]]) -> int:
    """Transfers in a set of programs (each counted once, though both ends list it)."""
    return sum(isinstance(step, Transfer) for program in programs for step in program) // 2


@attrs.define
class _Rendezvous:
    """The schedule run event by event in time order, recording each stage's program."""

    schedule: Sequence[Sequence[Action]]
    durations: dict[Kind, Number]
    programs: list[list[Step]] = attrs.field(init=False)
    position: list[int] = attrs.field(init=False)
    clock: list[Number] = attrs.field(init=False)
    waiting: dict[int, Message] = attrs.field(init=False, factory=dict)
    """Stage -> the message its next RECV needs (it is blocked until that arrives)."""
    kept: dict[Message, int] = attrs.field(init=False, factory=dict)
    """Messages sent but not yet moved -> their sending stage."""
    arrived: set[Message] = attrs.field(init=False, factory=set)

    def __attrs_post_init__(self) -> None:
        stages = len(self.schedule)
        self.programs = [[] for _ in range(stages)]
        self.position, self.clock = [0] * stages, [0] * stages

    def execute(self) -> None:
        while True:
            event = self.next_event()
            if event is None:
                break
            _, kind, stage = event
            if kind == "transfer":
                self.transfer(stage)
            else:
                self.advance(stage)
        if self.waiting or any(self.position[s] < len(a) for s, a in enumerate(self.schedule)):
            raise ScheduleError("the schedule cannot run with rendezvous transfers: stages "
                                f"{sorted(self.waiting)} wait forever")

    def next_event(self) -> tuple[Number, str, int] | None:
        """The earliest event: a waiting stage's message moving (its sender is idle between
        actions or finished), or a ready stage starting its next action."""
        events = []
        for stage, message in self.waiting.items():
            sender = self.kept.get(message)
            if sender is not None and self.idle(sender):
                events.append((max(self.clock[stage], self.clock[sender]), "transfer", stage))
        events += [(self.clock[stage], "advance", stage) for stage in range(len(self.schedule))
                   if stage not in self.waiting and not self.idle(stage)]
        # At equal times, messages move before stages start computing again.
        return min(events, key=lambda e: (e[0], e[1] != "transfer", e[2]), default=None)

    def idle(self, stage: int) -> bool:
        """Whether `stage` is between actions for good: waiting, or done."""
        return stage in self.waiting or self.position[stage] == len(self.schedule[stage])

    def advance(self, stage: int) -> None:
        """Move what waiting stages need from this stage, then run its next action."""
        for receiver, message in sorted(self.waiting.items()):
            if self.kept.get(message) == stage and self.clock[receiver] <= self.clock[stage]:
                self.transfer(receiver)
        action = self.schedule[stage][self.position[stage]]
        if action.kind in (Kind.RECV_F, Kind.RECV_B):
            message = message_of(action, stage, len(self.schedule))
            if message not in self.arrived:
                self.waiting[stage] = message
                return
            self.arrived.discard(message)
        elif action.kind in (Kind.SEND_F, Kind.SEND_B):
            self.kept[message_of(action, stage, len(self.schedule))] = stage
        else:
            self.clock[stage] += self.durations[action.kind]
        self.programs[stage].append(action)
        self.position[stage] += 1

    def transfer(self, receiver: int) -> None:
        """The message `receiver` waits for moves now; it then runs its RECV."""
        message = self.waiting.pop(receiver)
        sender = self.kept.pop(message)
        time = max(self.clock[receiver], self.clock[sender])
        step = Transfer(message, sender, receiver, time)
        self.programs[sender].append(step)
        self.programs[receiver].append(step)
        self.clock[receiver] = time
        self.arrived.add(message)
