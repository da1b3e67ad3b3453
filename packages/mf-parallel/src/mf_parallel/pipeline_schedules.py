"""Pipeline schedules as per-stage lists of actions.

A schedule says, for every stage, the order in which it runs forward (F) and backward (B)
computations of (micro-batch, chunk), with the backward split in two when asked: B the input
gradient, W the weight gradient, and the point-to-point messages around them: the
activations a forward sends to the next virtual stage (SEND_F / RECV_F) and the gradients a
backward sends to the previous one (SEND_B / RECV_B).

Each schedule is defined only by its compute order; `with_communication` then adds the
messages the same way for all of them: a receive just before the computation that needs it,
a send just after the computation that produced it. (Megatron pairs sends and receives in
fused calls; kept apart, a stage waits only for the message it is about to use.)

The schedules, with p stages, m micro-batches and v chunks per stage:
- `gpipe`: every forward, then every backward; peak memory of m micro-batches' activations.
- `1f1b`: p - stage - 1 warm-up forwards, then alternately one forward and one backward, then
  the remaining backwards; at most p - stage micro-batches in flight, same bubble as GPipe.
- `interleaved_1f1b`: Megatron's schedule with v chunks per stage; the bubble shrinks by v.
- `1f1b` with the backward split (`split_backward`, `pipeline_parallel_enable_dxdw_split`):
  ZB-H1 (`zero_bubble_order`): 1F1B's memory, about a third of its bubble.
"""

from __future__ import annotations

import enum
from collections.abc import Callable

import attrs

from .pipeline_layout import PipelineError, virtual_stage


class Kind(enum.Enum):
    """What an action does."""

    F = "F"
    B = "B"
    W = "W"
    """The weight gradient of a backward split in two (B is then the input gradient only)."""
    SEND_F = "SEND_F"
    RECV_F = "RECV_F"
    SEND_B = "SEND_B"
    RECV_B = "RECV_B"


COMPUTE = frozenset({Kind.F, Kind.B, Kind.W})
SENDS = frozenset({Kind.SEND_F, Kind.SEND_B})


@attrs.frozen
class Action:
    """One step of a stage: a computation, or a message to or from `peer` stage.

    `chunk` is always this stage's chunk the action belongs to: SEND_F(mb, c) carries the
    output of F(mb, c); RECV_F(mb, c) brings the input of F(mb, c); likewise SEND_B / RECV_B for
    the gradients of B(mb, c). Across the wrap from the last stage to the first the two ends of
    one message therefore name different chunks (c on stage p - 1, c + 1 on stage 0).
    """

    kind: Kind
    microbatch: int
    chunk: int = 0
    peer: int | None = None

    def __attrs_post_init__(self) -> None:
        if (self.kind in COMPUTE) != (self.peer is None):
            need = "takes no peer stage" if self.kind in COMPUTE else "needs a peer stage"
            raise ValueError(f"{self.kind.value} {need}, got peer={self.peer}")

    def __str__(self) -> str:
        text = f"{self.kind.value}(mb {self.microbatch}, chunk {self.chunk}"
        if self.peer is None:
            return text + ")"
        direction = "to" if self.kind in SENDS else "from"
        return f"{text}, {direction} stage {self.peer})"


CARRIES = {Kind.SEND_F: Kind.F, Kind.RECV_F: Kind.F, Kind.SEND_B: Kind.B, Kind.RECV_B: Kind.B}
"""The computation whose result a message action moves."""
TOWARD = {Kind.SEND_F: +1, Kind.RECV_B: +1, Kind.RECV_F: -1, Kind.SEND_B: -1}
"""Where the other end of a message action is: the next (+1) or previous (-1) virtual stage."""


@attrs.frozen
class Message:
    """One pipeline message: the output of `carries` (F: activations, B: input gradients) for
    `microbatch`, from virtual stage `sender` to its neighbour (sender + 1 for F, - 1 for B)."""

    carries: Kind
    microbatch: int
    sender: int

    @property
    def receiver(self) -> int:
        """The virtual stage that uses the message."""
        return self.sender + (1 if self.carries is Kind.F else -1)


def message_of(action: Action, stage: int, num_stages: int) -> Message:
    """The message a SEND_* or RECV_* action of `stage` moves (named the same at both ends)."""
    virtual = virtual_stage(stage, action.chunk, num_stages)
    if action.kind in (Kind.RECV_F, Kind.RECV_B):
        virtual += TOWARD[action.kind]
    return Message(CARRIES[action.kind], action.microbatch, virtual)


Schedule = list[list[Action]]
ComputeOrder = Callable[[int, int, int, int], list[Action]]


def gpipe_order(stage: int, num_stages: int, num_microbatches: int,
                num_chunks: int) -> list[Action]:
    """Every forward in micro-batch order, then every backward in the same order."""
    forwards = [Action(Kind.F, mb) for mb in range(num_microbatches)]
    return forwards + [Action(Kind.B, mb) for mb in range(num_microbatches)]


def one_f_one_b_order(stage: int, num_stages: int, num_microbatches: int,
                      num_chunks: int) -> list[Action]:
    """Warm-up forwards, then one forward one backward, then the cool-down backwards.

    Stage s runs p - s - 1 forwards ahead, so its first backward is due as soon as the
    micro-batch it started has come back from the last stage; it never holds more than p - s
    micro-batches' activations.
    """
    warmup = min(num_stages - stage - 1, num_microbatches)
    order = [Action(Kind.F, mb) for mb in range(warmup)]
    for mb in range(warmup, num_microbatches):
        order += [Action(Kind.F, mb), Action(Kind.B, mb - warmup)]
    return order + [Action(Kind.B, mb) for mb in range(num_microbatches - warmup,
                                                        num_microbatches)]


def interleaved_order(stage: int, num_stages: int, num_microbatches: int,
                      num_chunks: int) -> list[Action]:
    """Megatron's interleaved 1F1B compute order.

    Forwards go in groups of p micro-batches: micro-batches 0..p-1 through chunk 0, then the
    same group through chunk 1, ..., chunk v-1, then the next group. Backwards go in the same
    groups with the chunks reversed. Stage s runs 2 (p - s - 1) + (v - 1) p forwards ahead
    (Megatron's warm-up), then alternates one forward and one backward.

    With zero-time messages this takes (v m + p - 1)(t_f + t_b) for chunk times t_f and t_b:
    Megatron's bubble of (p - 1)/(v m) of the ideal time. The warm-up is Megatron's even with a
    single chunk, where it runs p - s - 1 more forwards ahead than `1f1b` (same time, more
    activations held), so that the memory figures are those of the schedule Megatron runs.
    """
    total = num_microbatches * num_chunks
    warmup = min(2 * (num_stages - stage - 1) + (num_chunks - 1) * num_stages, total)

    def position(index: int, forward: bool) -> tuple[int, int]:
        group, in_group = divmod(index, num_stages * num_chunks)
        chunk = in_group // num_stages
        if not forward:
            chunk = num_chunks - 1 - chunk
        return group * num_stages + in_group % num_stages, chunk

    order = [Action(Kind.F, *position(index, True)) for index in range(warmup)]
    for index in range(warmup, total):
        order += [Action(Kind.F, *position(index, True)),
                  Action(Kind.B, *position(index - warmup, False))]
    return order + [Action(Kind.B, *position(index, False))
                    for index in range(total - warmup, total)]


def zero_bubble_order(stage: int, num_stages: int, num_microbatches: int,
                      num_chunks: int) -> list[Action]:
    """1F1B with each backward split into B (the input gradient, on the critical path) and W
    (the weight gradient): ZB-H1 of "Zero Bubble Pipeline Parallelism" (Qi et al., 2024).

    The F and B order is 1F1B's. Stage s runs each W right after a B, except that it keeps up
    to s of them waiting (oldest first out) and runs those at the end: its 1F1B cool-down
    waits s backwards' time on the stages after it, which the waiting Ws now fill. With
    t_b + t_w = 1F1B's backward time the bubble shrinks to about a third of 1F1B's for
    t_f = t_b = t_w.
    """
    warmup = min(num_stages - stage - 1, num_microbatches)
    order = [Action(Kind.F, mb) for mb in range(warmup)]
    waiting: list[int] = []

    def backward(mb: int) -> list[Action]:
        waiting.append(mb)
        if len(waiting) <= stage:
            return [Action(Kind.B, mb)]
        return [Action(Kind.B, mb), Action(Kind.W, waiting.pop(0))]

    for mb in range(warmup, num_microbatches):
        order += [Action(Kind.F, mb), *backward(mb - warmup)]
    for mb in range(num_microbatches - warmup, num_microbatches):
        order += backward(mb)
    return order + [Action(Kind.W, mb) for mb in waiting]


SCHEDULES: dict[str, ComputeOrder] = {
    "gpipe": gpipe_order,
    "1f1b": one_f_one_b_order,
    "interleaved_1f1b": interleaved_order,
}


SPLIT_SCHEDULES: dict[str, ComputeOrder] = {"1f1b": zero_bubble_order}
"""The schedules that run with the backward split in two, by the name of the one they split."""


def build_schedule(name: str, num_stages: int, num_microbatches: int,
                   num_chunks: int = 1, split_backward: bool = False) -> Schedule:
    """The actions of every stage under one pipeline schedule, sends and receives included.

    Args:
        name: the config's schedule name, one of `SCHEDULES`.
        num_stages: the pipeline degree.
        num_microbatches: micro-batches per optimizer step.
        num_chunks: model chunks per stage (interleaved schedules).
        split_backward: each backward as B (input gradient) and W (weight gradient), placed
            by the schedule's split form (`SPLIT_SCHEDULES`: ZB-H1 for 1F1B).

    Returns:
        One action list per stage.

    Raises:
        PipelineError: an unknown name or numbers the schedule cannot run.
    """
    order = SCHEDULES.get(name)
    if order is None:
        raise PipelineError(f"unknown pipeline schedule {name!r}; known: {', '.join(SCHEDULES)}")
    if split_backward:
        order = SPLIT_SCHEDULES.get(name)
        if order is None:
            raise PipelineError(
                f"{name} has no form with the backward split into input and weight gradients "
                f"(pipeline_parallel_enable_dxdw_split); the schedules that have one: "
                f"{', '.join(SPLIT_SCHEDULES)}; set pipeline_parallel_schedule to one of them "
                f"or pipeline_parallel_enable_dxdw_split to false")
    _check(name, num_stages, num_microbatches, num_chunks)
    return [with_communication(order(stage, num_stages, num_microbatches, num_chunks),
                               stage, num_stages, num_chunks)
            for stage in range(num_stages)]


def with_communication(compute: list[Action], stage: int, num_stages: int,
                       num_chunks: int) -> list[Action]:
    """`compute` with each message received just before its use and sent right after.

    With one stage every virtual stage is local and nothing is sent; otherwise the neighbours
    of a virtual stage always live on the two neighbouring stages.
    """
    if num_stages == 1:
        return list(compute)
    last = num_stages * num_chunks - 1
    previous, following = (stage - 1) % num_stages, (stage + 1) % num_stages
    actions = []
    for action in compute:
        mb, chunk = action.microbatch, action.chunk
        virtual = virtual_stage(stage, chunk, num_stages)
        if action.kind is Kind.W:  # the weight gradient: no message
            actions.append(action)
        elif action.kind is Kind.F:
            if virtual > 0:
                actions.append(Action(Kind.RECV_F, mb, chunk, previous))
            actions.append(action)
            if virtual < last:
                actions.append(Action(Kind.SEND_F, mb, chunk, following))
        else:
            if virtual < last:
                actions.append(Action(Kind.RECV_B, mb, chunk, following))
            actions.append(action)
            if virtual > 0:
                actions.append(Action(Kind.SEND_B, mb, chunk, previous))
    return actions


def _check(name: str, num_stages: int, num_microbatches: int, num_chunks: int) -> None:
    if num_stages < 1:
        raise PipelineError(f"the number of pipeline stages must be >= 1, got {num_stages}")
    if num_microbatches < 1:
        raise PipelineError(f"the number of micro-batches must be >= 1, got {num_microbatches}")
    if num_chunks < 1:
        raise PipelineError(f"the number of chunks per stage must be >= 1, got {num_chunks}")
    if name != "interleaved_1f1b":
        if num_chunks != 1:
            raise PipelineError(
                f"{name} runs one model chunk per stage, got {num_chunks}; "
                f"use interleaved_1f1b for pipeline_parallel_interleave_num > 1")
        return
    if num_microbatches % num_stages:
        raise PipelineError(
            f"interleaved_1f1b needs the number of micro-batches ({num_microbatches}) to be a "
            f"multiple of pipeline_parallel ({num_stages}), as Megatron's interleaved schedule "
            f"does")
