"""One pipeline stage running its part of a step: the plan's actions, in the plan's order.

The program is mf-parallel's (`pipeline_program.stage_programs` over `build_schedule`, the same
action lists the plan simulates): F and B computations of (micro-batch, chunk), SEND / RECV of
activations and gradients, and the `Transfer` points at which a message moves between two
stages (a rendezvous, see that module for why and why it cannot deadlock). With
`overlap_p2p` a transfer is launched and not waited for: the receiver waits when it uses the
message, the sender at its next transfer (so it holds at most one sent message; the peer
reaches the earlier transfer first, in the same global order, so this cannot deadlock) or at
the end of the step: neither stage stops at the rendezvous while the message moves
(Megatron's `overlap_p2p_comm`). On Ascend and GPU that is a non-blocking send
and receive on the communication stream; MindSpore's CPU backend runs every operation of a
process in one queue, so there the message still waits for what was queued before it.

How F and B run in PyNative. MindSpore keeps the autograd record of one forward pass at a time
for a later backward only in last-in, first-out order (measured: vjp functions called in the
order of their forwards fail, "Can not find top cell for backward"), and 1F1B and GPipe run
backwards first-in, first-out. So F runs the chunk's forward without recording and keeps only
its input; B runs the chunk's forward again with `value_and_grad` and takes the gradients at
once, the backward seeded with the received output gradient `dy` through `sum(out * dy)`
(whose gradient with respect to `out` is exactly `dy`). This is Megatron's full recompute:
one more forward per chunk, and a stage holds only the inputs of its micro-batches in flight.
The last virtual stage runs nothing at F: its B computes the loss and the gradients together.

With the backward split (`split_backward`, ZB-H1): B runs the chunk's forward again and
differentiates with respect to its input only (the gradient the previous stage waits for, sent
at once), keeping the chunk's input and received gradient; W, later, runs the forward once more
and differentiates with respect to the chunk's parameters. That is one more forward per chunk
than without the split: here the split moves work off the critical path at the price of a
recompute, where Megatron's zero-bubble keeps each layer's inputs from B for W.
The models here have no dropout; one with dropout would need F's random state restored for the
recompute at B (as Megatron's activation checkpointing does).

Loss scaling is the step contract's: each micro-batch's loss times `scale`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import Any

import mindspore as ms
from mindspore import Parameter, Tensor, ops

from mf_parallel.pipeline_layout import StageLayout
from mf_parallel.pipeline_program import Step, Transfer, stage_programs
from mf_parallel.pipeline_schedules import Kind, Message, build_schedule
from mf_parallel.pipeline_simulator import unit_times
from mf_parallel.runtime import Collectives, Pending

from ..models.parts import PipelineModel
from .contract import LocalGradients, MicroBatch, StepObserver


@dataclass(frozen=True)
class Chunk:
    """One model chunk of this stage: a virtual stage's layers and parameters."""

    virtual: int
    layers: tuple[int, ...]
    first: bool
    last: bool
    params: tuple[int, ...]
    """Indices into the stage's parameter list."""


class StageRunner:
    """Runs one stage's program for a step and returns its local loss and gradients.

    Args:
        model: this stage's part of the model.
        params: the parameters to differentiate (the layout's, in its order).
        layout: which layers each (stage, chunk) holds (the plan's).
        schedule: the plan's schedule name.
        stage: this rank's pipeline stage.
        stage_ranks: the global rank of each stage of this rank's pipeline group.
        collectives: this rank's collectives (point to point between stages).
        forward_context: entered around each computation (the layout's `forward_context`).
        split_backward: each backward as B (input gradient) and W (weight gradient), the
            plan's `split_backward` (ZB-H1).
        overlap_p2p: launch each transfer without waiting for it
            (`pipeline_parallel_overlap_p2p`).
    """

    def __init__(self, model: PipelineModel, params: Sequence[Parameter], layout: StageLayout,
                 schedule: str, stage: int, stage_ranks: Sequence[int], collectives: Collectives,
                 forward_context: Callable[[], AbstractContextManager[None]] = nullcontext, *,
                 split_backward: bool = False, overlap_p2p: bool = False):
        self.model, self.params = model, list(params)
        self.forward_context = forward_context
        self.layout, self.schedule, self.stage = layout, schedule, stage
        self.split_backward, self.overlap_p2p = split_backward, overlap_p2p
        self.stage_ranks, self.collectives = list(stage_ranks), collectives
        self.num_stages, self.num_chunks = layout.num_stages, layout.num_chunks
        self.chunks = [self._chunk(c) for c in range(self.num_chunks)]
        self._grad_fns = [self._grad_fn(chunk, inputs=True, weights=not split_backward)
                          for chunk in self.chunks]
        """Per chunk: B's gradients (of the input, unless the chunk is the first, and of the
        weights, unless the backward is split)."""
        self._weight_fns = [self._grad_fn(chunk, inputs=False, weights=True)
                            for chunk in self.chunks] if split_backward else []
        """Per chunk: W's gradients (of the weights), with the backward split."""
        self._programs: dict[int, list[Step]] = {}
        self.scale = 1.0

    def program(self, num_microbatches: int) -> list[Step]:
        """This stage's actions and transfers for a step of `num_microbatches`."""
        if num_microbatches not in self._programs:
            actions = build_schedule(self.schedule, self.num_stages, num_microbatches,
                                     self.num_chunks, self.split_backward)
            self._programs[num_microbatches] = stage_programs(
                actions, self.num_chunks, **unit_times(self.split_backward))[self.stage]
        return self._programs[num_microbatches]

    def run(self, micro_batches: Sequence[MicroBatch], scale: float,
            observer: StepObserver) -> LocalGradients:
        """The step's computations and messages on this stage.

        Returns:
            This stage's share of the sum of the scaled micro-batch losses (the loss on the
            last stage, plus the auxiliary losses of its own layers; zero on a stage without
            either), the accumulated gradients of `params`, and the step's tokens.
        """
        self.scale = scale
        step = _StepState(micro_batches, [None] * len(self.params))
        for item in self.program(len(micro_batches)):
            if isinstance(item, Transfer):
                self._transfer(item, step)
            elif item.kind is Kind.F:
                self._forward(self.chunks[item.chunk], item.microbatch, step)
            elif item.kind is Kind.B:
                self._backward(self.chunks[item.chunk], item.microbatch, step, observer)
            elif item.kind is Kind.W:
                self._weights(self.chunks[item.chunk], item.microbatch, step, observer)
        step.wait_sent()
        grads = [ops.zeros_like(p) if g is None else g for g, p in zip(step.grads, self.params,
                                                                        strict=True)]
        loss = step.loss if step.loss is not None else Tensor(0.0, ms.float32)
        tokens = sum(int(batch.tokens.size) for batch in micro_batches)
        return LocalGradients(loss, grads, tokens)

    def evaluate(self, micro_batches: Sequence[MicroBatch]) -> Tensor:
        """The micro-batches' forward only, without gradients: each through the virtual
        stages in order, the hidden states passed from stage to stage as the schedule's F
        messages are (the schedules differ only in where the backward goes, and evaluation
        has none).

        Returns:
            This stage's share of the sum of the micro-batches' losses: the loss on the last
            virtual stage plus the auxiliary losses of this stage's layers (zero on a stage
            with neither), a 0-d float32 tensor.
        """
        total = Tensor(0.0, ms.float32)
        virtual_stages = self.num_stages * self.num_chunks
        with ms._no_grad():  # PyNative records no autograd graph
            for batch in micro_batches:
                tokens, labels, mask = batch.model_inputs()[:3]
                hidden: Tensor | None = None
                for virtual in range(virtual_stages):
                    source, stage = (virtual - 1) % self.num_stages, virtual % self.num_stages
                    if virtual > 0 and self.stage in (source, stage):
                        hidden = self._pass_forward(hidden, source, stage, batch)
                    if stage != self.stage:
                        continue
                    chunk = self.chunks[virtual // self.num_stages]
                    with self.forward_context():
                        hidden, auxiliary = self._chunk_forward(chunk, hidden, tokens,
                                                                *batch.attention_inputs())
                        if chunk.last:
                            total = total + self.model.head_loss(hidden, labels, mask)
                    if auxiliary is not None:
                        total = total + auxiliary
        return total

    def _pass_forward(self, hidden: Tensor | None, source: int, target: int,
                      batch: MicroBatch) -> Tensor:
        """The hidden states of one micro-batch from stage `source` to stage `target` (both
        call this): what `target` receives, what `source` sent."""
        if self.stage != source:
            shape, dtype = self.model.hidden_spec(*batch.tokens.shape)
            hidden = ops.zeros(shape, dtype)
        assert hidden is not None
        return self.collectives.start_send_recv(hidden, self.stage_ranks[source],
                                                self.stage_ranks[target]).wait()

    # ------------------------------------------------------------------ computations

    def _forward(self, chunk: Chunk, mb: int, step: _StepState) -> None:
        """Keep the chunk's input; unless this is the last virtual stage, run the forward and
        keep its output for sending."""
        hidden = None if chunk.first else step.received(Message(Kind.F, mb, chunk.virtual - 1))
        step.inputs[(mb, chunk.virtual)] = hidden
        if chunk.last:
            return
        batch = step.micro_batches[mb]
        with self.forward_context():
            out, _ = self._chunk_forward(chunk, hidden, Tensor(batch.tokens),
                                         *batch.attention_inputs())
        step.outbox[Message(Kind.F, mb, chunk.virtual)] = out

    def _backward(self, chunk: Chunk, mb: int, step: _StepState,
                  observer: StepObserver) -> None:
        """The chunk's forward again with gradients, seeded by the received `dy` (or the
        loss); the input gradient kept for sending; parameter gradients accumulated, or, with
        the backward split, the chunk's arguments kept for its W."""
        hidden = step.inputs.pop((mb, chunk.virtual))
        batch = step.micro_batches[mb]
        tokens, labels, mask, attention = (*batch.model_inputs()[:3], batch.attention_inputs())
        if chunk.last:
            extra = (labels, mask)
        else:
            extra = (step.received(Message(Kind.B, mb, chunk.virtual + 1)),)
        inputs = (tokens, *attention, *extra)
        args = inputs if chunk.first else (hidden, *inputs)
        if self.split_backward:
            step.weights_due[(mb, chunk.virtual)] = args
            if chunk.first:  # no input gradient to send: W does all
                return
        with self.forward_context():
            (_, value), grads = self._grad_fns[chunk.virtual // self.num_stages](*args)
        if not chunk.first:
            dx, grads = (grads, None) if self.split_backward else grads
            step.outbox[Message(Kind.B, mb, chunk.virtual)] = dx
        if grads is not None:
            self._accumulate(chunk, mb, step, observer, value, grads)

    def _weights(self, chunk: Chunk, mb: int, step: _StepState,
                 observer: StepObserver) -> None:
        """W of a split backward: the chunk's forward again, differentiated with respect to
        its parameters (seeded as its B was), the gradients accumulated."""
        args = step.weights_due.pop((mb, chunk.virtual))
        with self.forward_context():
            (_, value), grads = self._weight_fns[chunk.virtual // self.num_stages](*args)
        self._accumulate(chunk, mb, step, observer, value, grads)

    def _accumulate(self, chunk: Chunk, mb: int, step: _StepState, observer: StepObserver,
                    value: Tensor, grads: Sequence[Tensor]) -> None:
        """Add one micro-batch's gradients of the chunk's parameters and its share of the
        loss; tell the observer (its routing; on the last virtual stage, its loss)."""
        for index, grad in zip(chunk.params, grads, strict=True):
            step.grads[index] = grad if step.grads[index] is None else step.grads[index] + grad
        step.loss = value if step.loss is None else step.loss + value
        observer.routed(chunk.layers)
        if chunk.last:
            local = [None] * len(self.params)
            for index, grad in zip(chunk.params, grads, strict=True):
                local[index] = grad
            observer.micro_batch(mb + 1, value / self.scale, local)

    def _chunk_forward(self, chunk: Chunk, hidden: Tensor | None, tokens: Tensor,
                       *attention: Tensor | None) -> tuple[Tensor, Tensor | None]:
        """The chunk's layers on `hidden` (the embedded tokens on the first virtual stage), and
        the auxiliary loss they add (None without one); `attention`: the micro-batch's
        position ids, document ends and attention mask."""
        if chunk.first:
            hidden = self.model.embed(tokens)
        return self.model.decoder(hidden, chunk.layers, self.model.attending(tokens, *attention))

    def _grad_fn(self, chunk: Chunk, *, inputs: bool,
                 weights: bool) -> Callable[..., Any] | None:
        """`value_and_grad` of the chunk: the scaled loss on the last virtual stage, else
        `sum(out * dy)`, each plus the chunk's scaled auxiliary loss; with respect to the input
        hidden states (`inputs`, never on the first) and the chunk's parameters (`weights`).
        Its value (`_accumulate`'s share of the step's loss): the scaled loss, or the scaled
        auxiliary loss elsewhere."""
        model = self.model

        def with_auxiliary(value: Tensor, auxiliary: Tensor | None) -> tuple[Tensor, Tensor]:
            """(what is differentiated, this chunk's share of the reported loss)."""
            if auxiliary is None:
                return value, value if chunk.last else ops.zeros((), ms.float32)
            auxiliary = auxiliary * self.scale
            return value + auxiliary, (value if chunk.last else 0.0) + auxiliary

        if chunk.last:
            def seeded(hidden, tokens, positions, ends, dense, labels, mask):
                out, auxiliary = self._chunk_forward(chunk, hidden, tokens, positions, ends,
                                                     dense)
                return with_auxiliary(model.head_loss(out, labels, mask) * self.scale,
                                      auxiliary)
        else:
            def seeded(hidden, tokens, positions, ends, dense, dy):
                out, auxiliary = self._chunk_forward(chunk, hidden, tokens, positions, ends,
                                                     dense)
                return with_auxiliary((out * dy).sum(), auxiliary)

        params = [self.params[index] for index in chunk.params] if weights else None
        if chunk.first:
            if params is None:  # the first chunk's B of a split backward: nothing to do
                return None
            return ms.value_and_grad(lambda *args: seeded(None, *args), None, params,
                                     has_aux=True)
        return ms.value_and_grad(seeded, 0 if inputs else None, params, has_aux=True)

    # ------------------------------------------------------------------ messages

    def _transfer(self, transfer: Transfer, step: _StepState) -> None:
        """Move one message between this stage and its neighbour (both call this); with
        `overlap_p2p`, launch it only."""
        source, target = self.stage_ranks[transfer.source], self.stage_ranks[transfer.target]
        message = transfer.message
        if transfer.source == self.stage:
            tensor = step.outbox.pop(message)
        else:
            tokens = step.micro_batches[message.microbatch].tokens
            shape, dtype = self.model.hidden_spec(*tokens.shape)
            tensor = ops.zeros(shape, dtype)
        if self.overlap_p2p:
            step.wait_sent()
        pending = self.collectives.start_send_recv(tensor, source, target)
        if not self.overlap_p2p:
            pending.wait()
        if transfer.source != self.stage:
            step.arrived[message] = pending
        elif self.overlap_p2p:
            step.sending.append(pending)

    def _chunk(self, chunk: int) -> Chunk:
        virtual = chunk * self.num_stages + self.stage
        layers = tuple(self.layout.layers(self.stage, chunk))
        first, last = virtual == 0, virtual == self.num_stages * self.num_chunks - 1
        in_layers = {id(p) for index in layers
                     for p in self.model.decoder_layers.by_id(index).get_parameters()}
        all_layers = {id(p) for layer in self.model.decoder_layers for p in layer.get_parameters()}
        outer = first or last
        params = tuple(i for i, p in enumerate(self.params)
                       if id(p) in in_layers or (outer and id(p) not in all_layers))
        return Chunk(virtual, layers, first, last, params)


@dataclass
class _StepState:
    """What one step keeps between its actions."""

    micro_batches: Sequence[MicroBatch]
    grads: list[Tensor | None]
    loss: Tensor | None = None
    inputs: dict[tuple[int, int], Tensor | None] = field(default_factory=dict)
    """(micro-batch, virtual stage) -> the chunk's input, kept from F to B."""
    outbox: dict[Message, Tensor] = field(default_factory=dict)
    """Outputs and input gradients computed, not yet transferred."""
    arrived: dict[Message, Pending] = field(default_factory=dict)
    """Messages transferred (or, with `overlap_p2p`, under way) to this stage, not yet used."""
    sending: list[Pending] = field(default_factory=list)
    """Messages this stage sent and has not waited for (`overlap_p2p`: at most one)."""
    weights_due: dict[tuple[int, int], tuple[Any, ...]] = field(default_factory=dict)
    """(micro-batch, virtual stage) -> the arguments of a chunk's backward whose W is still to
    run (the backward split)."""

    def wait_sent(self) -> None:
        """Wait for the messages this stage sent; their tensors may then be freed."""
        for pending in self.sending:
            pending.wait()
        self.sending.clear()

    def received(self, message: Message) -> Tensor:
        """A message that arrived (waited for, if it is still under way), taken out."""
        return self.arrived.pop(message).wait()
