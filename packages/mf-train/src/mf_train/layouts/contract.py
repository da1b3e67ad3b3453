"""The step contract: what every parallel layout does in a training step.

A step is: the micro-batches' forward and backward passes (`forward_backward`), the
reduction of this rank's gradients to what its optimizer updates, with the step's loss and
global gradient norm (`reduce`), then the update the trainer asks of the optimizer. Plain,
data-parallel, tensor-parallel, ZeRO and FSDP training are implementations of `StepLayout`
(`replicated`, `sharded`), chosen from the parallel plan in one place (`mf_train.layouts`);
the pipeline layout (`pipelined`) overrides `forward_backward` and wraps one of them for
`reduce`; an expert-parallel dispatch would override `reduce`.

The loss of each micro-batch is divided by the number of micro-batches, so the accumulated
gradient is that of the step's mean loss (Megatron's and MindFormers' convention). When the
gradients are summed over the data-parallel ranks (`parallelism.disable_gradient_division`,
MindFormers' default) each rank's loss is also divided by `loss_divisor`, the data-parallel
size, before the backward pass.
"""

from __future__ import annotations

import contextlib
import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import ClassVar, Protocol

import mindspore as ms
import numpy as np
from mindspore import Parameter, Tensor, nn

from mf_config import OptimizerConfig, ParallelismConfig, RecomputeCommConfig, SwapConfig
from mf_config.errors import Path
from mf_config.yaml_source import Source
from mf_parallel import Plan
from mf_parallel.dims import ParallelDims
from mf_parallel.placement import Placement, owns
from mf_parallel.runtime import Collectives, GradientReducer
from mf_parallel.runtime.flat_shard import FlatBucket, built_shape
from mf_parallel.runtime.grad_reduce import DEFAULT_BUCKET_BYTES
from mf_parallel.runtime.tensor_parallel import TensorGroup

from ..optim import Optimizer
from .gradient_norm import Owned, OwnedNorm


@dataclass(frozen=True)
class MicroBatch:
    """One micro-batch of this rank, as the data stream gives it (numpy, `[batch, seq]`; under
    context parallelism `seq` is this rank's tokens)."""

    tokens: np.ndarray
    labels: np.ndarray
    loss_mask: np.ndarray | None = None
    position_ids: np.ndarray | None = None
    """Rotary positions (`reset_position_ids`: restarting per document); None: the tokens'
    places in the sequence."""
    actual_seq_len: np.ndarray | None = None
    """`[batch, P]` document ends (the compact mask, `create_compressed_eod_mask`)."""
    attention_mask: np.ndarray | None = None
    """Bool `[batch or 1, 1, rows, seq]`, True = masked (the dense document mask)."""

    def model_inputs(self) -> tuple[Tensor | np.ndarray | None, ...]:
        """What the model's forward takes: (tokens, labels, loss mask, position ids, document
        ends, attention mask), the first three as tensors, the attention inputs as host
        arrays (`attention_inputs`), None where absent, without the trailing absent ones (a
        model that takes no packing or context inputs is called with three)."""
        mask = None if self.loss_mask is None else Tensor(self.loss_mask.astype(np.float32))
        inputs = [Tensor(self.tokens), Tensor(self.labels), mask, *self.attention_inputs()]
        while len(inputs) > 3 and inputs[-1] is None:
            inputs.pop()
        return tuple(inputs)

    def attention_inputs(self) -> tuple[np.ndarray | None, np.ndarray | None,
                                        np.ndarray | None]:
        """(position ids, document ends, attention mask), None where absent: host arrays,
        as the model makes its rotary positions and masks from them on the host
        (`models.attention_inputs`); a tensor would be read back for that."""
        return self.position_ids, self.actual_seq_len, self.attention_mask

Problem = tuple[Path, str]
"""A configuration path and what is wrong there (`settings_error` makes the `ConfigError`)."""


class StepObserver(Protocol):
    """What the monitors see inside a step (`mf_train.monitor.step_monitors.MonitorObserver`)."""

    def micro_batch(self, index: int, loss: Tensor, grads: Sequence[Tensor]) -> None: ...

    def routed(self, layers: Sequence[int] | None) -> None:
        """The forward and backward passes of these decoder layers (global ids; None: all of
        this rank's) for one micro-batch are over: what their routers did last is that
        micro-batch's (an MoE model's `tokens_per_expert()`). A pipeline stage says it chunk
        by chunk, the other layouts once per micro-batch."""
        ...

    def reduced(self, loss: Tensor, grads: Sequence[Tensor]) -> None: ...

    def watches(self, name: str) -> bool:
        """Whether the observer reads the gradient of parameter `name` (a layout that reduces
        gradients during backward keeps only those whole)."""
        ...


@dataclass
class LocalGradients:
    """This rank's accumulated result of a step's micro-batches, before any reduction."""

    loss: Tensor
    """The step's loss on this rank (each micro-batch's loss scaled as the module says)."""
    grads: list[Tensor | None]
    """Gradients aligned with the layout's `params` (None where a sharded layout reduced
    them during backward and no monitor watches them: see `slices`)."""
    tokens: int
    """Tokens of the step on this rank."""
    slices: list[Tensor] | None = None
    """This rank's reduced float32 slices, when the layout reduced the gradients as backward
    produced them (ZeRO-2, FSDP); None: `grads` are whole and not reduced yet."""


@dataclass
class ReducedGradients:
    """What the optimizer updates from, with the numbers the step reports."""

    loss: Tensor
    """The step's loss over the data-parallel ranks."""
    grads: list[Tensor]
    """Whole reduced gradients, or this rank's slice of them (sharded layouts)."""
    norm: Tensor
    """The global L2 norm of the reduced gradients (every element counted once): a 0-d
    float32 tensor, on the device (`gradient_norm`)."""


class LayoutRecord:
    """This rank's view of the placement record (`mf_parallel.placement`): which parameters
    it owns (counts in the norm), and the all-reduce over the world.

    Args:
        placements: every parameter's placement, by model-wide name.
        plan: the job's plan.
        collectives: this rank's collectives.
    """

    def __init__(self, placements: dict[str, Placement], plan: Plan, collectives: Collectives):
        self.placements, self.plan, self.collectives = placements, plan, collectives
        self.rank = collectives.comm.rank

    def owns(self, name: str) -> bool:
        """Whether this rank counts what it holds of parameter `name` after the reduction."""
        placement = self.placements.get(name)
        if placement is None:
            raise KeyError(f"{name}: not in the model's sharding table")
        return owns(placement, self.rank, self.plan)

    def sum(self, tensor: Tensor) -> Tensor:
        """The all-reduce (sum) over every rank."""
        return self.collectives.all_reduce(tensor, "world")

    def partial(self, name: str) -> tuple[str, ...]:
        """The groups the local gradient of parameter `name` is a partial sum over."""
        return self.placements[name].grad_partial


def reduce_dtype(parallelism: ParallelismConfig) -> ms.Type:
    """The dtype the data-parallel gradient reductions communicate in
    (`parallelism.reduce_dtype`; gradients of another dtype are cast to it and back)."""
    return getattr(ms, parallelism.reduce_dtype)


@dataclass(frozen=True)
class Reduction:
    """How a layout's gradients are reduced: over its collectives' groups, averaged or summed
    (`parallelism.disable_gradient_division`), whole gradients in buckets of about
    `bucket_bytes` communicated in `reduce_dtype`."""

    collectives: Collectives
    average: bool
    reduce_dtype: ms.Type | None = None
    bucket_bytes: int = DEFAULT_BUCKET_BYTES

    @classmethod
    def of(cls, collectives: Collectives, parallelism: ParallelismConfig) -> Reduction:
        return cls(collectives, not parallelism.disable_gradient_division,
                   reduce_dtype(parallelism))

    def reducer(self, params: Sequence[Parameter], record: LayoutRecord | None,
                ) -> GradientReducer:
        """mf-parallel's reducer of `params`' gradients, routed as the record places them
        (without a record, one process: each over the data group alone)."""
        partial = [("loss",) if record is None else record.partial(p.name) for p in params]
        return GradientReducer(self.collectives, partial, [built_shape(p) for p in params],
                               average=self.average, reduce_dtype=self.reduce_dtype,
                               bucket_bytes=self.bucket_bytes)


@dataclass(frozen=True)
class LayoutParts:
    """What a layout is built from: the model, the typed sections it may read, its groups."""

    model: nn.Cell
    optimizer: OptimizerConfig
    parallelism: ParallelismConfig
    dims: ParallelDims
    collectives: Collectives
    tensor_group: TensorGroup | None
    source: Source | None = None
    plan: Plan | None = None
    """The whole plan (the pipeline layout reads its stage layout and schedule)."""
    compiled: bool = False
    """`context.compile`: the decoder layers may become graphs holding their parameter
    tensors (FSDP then frees a parameter's storage instead of swapping its tensor)."""


@dataclass(frozen=True)
class LayoutSections:
    """The typed sections a layout's pre-launch check may read (and the YAML source)."""

    parallelism: ParallelismConfig
    optimizer: OptimizerConfig
    swap: SwapConfig
    recompute_comm: RecomputeCommConfig
    source: Source | None = None


class StepLayout(ABC):
    """One parallel layout's part of a training step; see the module docstring.

    Subclasses say what they refuse before launch
    (`problems`), how they are built (`build`) and how gradients are reduced (`reduce`).
    """

    name: ClassVar[str]
    """A short name for the log (`data parallel`, `FSDP`, ...)."""
    compile_blocker: ClassVar[str | None] = None
    """Why the decoder layers cannot be compiled under this layout (`context.compile`), or
    None when they can."""
    compiles_body: ClassVar[bool] = False
    """Whether `context.compile` may run the model from its first layer to the loss as one
    graph under this layout (it neither gathers, splits nor hooks anything per layer); when
    not, each decoder layer is a graph of its own."""
    evaluates: ClassVar[bool] = False
    """Whether `evaluate` runs under this layout (the Evaluate callback is refused before
    launch where it does not: `mf_train.observe.evaluation`)."""
    record: LayoutRecord | None = None
    """The placement record, once `use_record` gave it (None on one process: every gradient
    element is this rank's)."""
    _norm: OwnedNorm | None = None
    reduction: Reduction | None = None
    """How this layout's gradients are reduced (None: one rank, nothing to reduce)."""
    _reducer: GradientReducer | None = None
    shards_experts: ClassVar[bool] = False
    """Whether `build` takes routed experts left out of the model's parameters (expert
    parallelism) to shard as units of their own over the expert-data group (FSDP)."""

    def __init__(self, model: nn.Cell, optimizer: Optimizer, *, loss_divisor: int = 1):
        self.model = model
        self.optimizer = optimizer
        self.params = list(optimizer.params)
        self.loss_divisor = loss_divisor
        self._scale = 1.0
        self._grad_fn = ms.value_and_grad(self._forward, None, self.params)

    @classmethod
    def problems(cls, dims: ParallelDims, sections: LayoutSections) -> list[Problem]:
        """The settings this layout cannot run with, found before any rank starts."""
        return []

    @classmethod
    def layer_built(cls, dims: ParallelDims, parallelism: ParallelismConfig,
                    collectives: Collectives) -> Callable[[nn.Cell], object] | None:
        """What to do with each decoder layer as soon as the model has built it, before the
        next is built (`build_model(layer_built=)`): a layout that shards parameters cuts it
        to this rank's part there, so the model never exists whole on a rank; a composing
        layout asks its inner one. None (the default) keeps layers as built; `build` then
        receives the model whole."""
        return None

    @classmethod
    @abstractmethod
    def build(cls, parts: LayoutParts) -> StepLayout:
        """The layout, with its optimizer, over `parts.model`."""

    def describe(self) -> str:
        """One line for the log."""
        return self.name

    def forward_backward(self, micro_batches: Sequence[MicroBatch],
                         observer: StepObserver) -> LocalGradients:
        """Forward and backward passes of every micro-batch, gradients accumulated.

        Args:
            micro_batches: the step's micro-batches on this rank.
            observer: told each micro-batch's own loss and gradients.

        Returns:
            The step's loss and gradients on this rank, and its token count.
        """
        self._scale = 1.0 / (len(micro_batches) * self.loss_divisor)
        loss: Tensor | None = None
        grads: list[Tensor] = []
        tokens = 0
        for index, batch in enumerate(micro_batches, 1):
            micro_loss, micro_grads = self._grad_fn(*batch.model_inputs())
            observer.micro_batch(index, micro_loss / self._scale, micro_grads)
            observer.routed(None)
            loss = micro_loss if loss is None else loss + micro_loss
            if not grads:
                grads = list(micro_grads)
            else:  # tensor by tensor: each old sum freed as its new one exists
                for i, micro in enumerate(micro_grads):
                    grads[i] = grads[i] + micro
            del micro_grads
            tokens += int(batch.tokens.size)
        if loss is None:
            raise ValueError("a training step needs at least one micro-batch")
        return LocalGradients(loss, grads, tokens)

    def evaluate(self, micro_batches: Sequence[MicroBatch]) -> Tensor:
        """The loss of `micro_batches` without gradients: the model's forward only, each
        micro-batch's loss averaged as a training step averages them, then over the ranks
        as the step's loss is (`evaluated_loss`). Nothing a training step reads is changed:
        no gradient, no optimizer state, no monitor is told.

        Args:
            micro_batches: this rank's micro-batches of the valid split.

        Returns:
            A 0-d float32 tensor, the same on every rank.
        """
        if not micro_batches:
            raise ValueError("an evaluation needs at least one micro-batch")
        total: Tensor | None = None
        with ms._no_grad():  # PyNative records no autograd graph
            for batch in micro_batches:
                loss = self.model(*batch.model_inputs())
                total = loss if total is None else total + loss
        assert total is not None
        return self.evaluated_loss(total / len(micro_batches))

    def free_gathered(self) -> None:  # noqa: B027 (a no-op unless the layout gathers)
        """Free the parameters a forward pass gathered (FSDP's units); nothing by default."""

    def evaluated_loss(self, loss: Tensor) -> Tensor:
        """This rank's mean evaluation loss made the job's (one rank: itself); a layout that
        `evaluates` over several data-parallel ranks averages it over them."""
        return loss

    def reduce(self, local: LocalGradients) -> ReducedGradients:
        """This rank's gradients reduced to what the optimizer updates, with the step's
        loss over the data-parallel ranks and the global norm (collectives: every rank of
        the job calls it at the same step)."""
        loss, grads = self.reduce_grads(local)
        return ReducedGradients(loss, grads, self.grad_norm(grads))

    @abstractmethod
    def reduce_grads(self, local: LocalGradients) -> tuple[Tensor, list[Tensor]]:
        """The step's loss over the data-parallel ranks and the reduced gradients (whole, or
        this rank's slices), as `reduce` gives them, without the norm."""

    def use_record(self, record: LayoutRecord) -> None:
        """Take the placement record of this rank's parameters (a layout composing another
        passes it on)."""
        self.record = record
        self._norm = self._reducer = None

    @property
    def reducer(self) -> GradientReducer:
        """The reducer of `params`' gradients (`Reduction.reducer`), made once the record
        is known."""
        if self.reduction is None:
            raise RuntimeError(f"{self.name} reduces no gradients")
        if self._reducer is None:
            self._reducer = self.reduction.reducer(self.params, self.record)
        return self._reducer

    def owned(self) -> list[Owned]:
        """What this rank owns of each gradient `reduce_grads` gives (`gradient_norm.Owned`):
        by default one whole gradient per parameter of `params`, owned as the record says
        (everything without a record: one process)."""
        return [self.record is None or self.record.owns(p.name) for p in self.params]

    def grad_norm(self, grads: Sequence[Tensor]) -> Tensor:
        """The global L2 norm of the reduced gradients (`gradient_norm.OwnedNorm`)."""
        if self._norm is None:
            self._norm = OwnedNorm(self.owned(),
                                   None if self.record is None else self.record.sum)
        return self._norm(grads)

    def whole_model(self) -> AbstractContextManager[None]:
        """A context in which the model's parameters are whole (to load a checkpoint of an
        earlier format, which holds them whole; sharded and Hugging Face loads read each
        rank's slices instead); a layout that shards them (FSDP) gathers them on entry and
        frees them on exit."""
        return contextlib.nullcontext()

    def held_parameters(self) -> int:
        """Parameter elements this rank holds between steps: its model's (its tensor-parallel
        parts, its stage, its experts), and under FSDP its slices."""
        return sum(math.prod(p.shape) for p in self.model.get_parameters())

    def flat_buckets(self) -> Sequence[FlatBucket]:
        """The ZeRO or FSDP buffers whose slices this rank holds (mf-parallel's `FlatBucket`,
        each rank's chunk of every parameter of a unit); none where parameters are kept whole."""
        return ()

    def publish_slices(self, slices: Sequence[Tensor]) -> None:
        """Take new slices of `flat_buckets` (loaded from a checkpoint): gathered into the
        parameters (ZeRO) or kept as the units' shards (FSDP)."""
        raise NotImplementedError(f"{self.name} holds no slices")

    def forward_context(self) -> AbstractContextManager[None]:
        """A context around each direct call of the model's pieces: the pipeline runs
        `embed` / `decoder` / `head_loss` itself, so hooks on the model's own forward do not
        fire; a layout that relies on them (FSDP's root unit) does their work here."""
        return contextlib.nullcontext()

    def _forward(self, *inputs: Tensor | None) -> Tensor:
        return self.model(*inputs) * self._scale

    def use_gradient_graph(self, graph: Callable[..., tuple]) -> None:
        """Take each micro-batch's loss and gradients from `graph` (the model's forward and
        backward as one compiled graph, `compiled_layers`: called as `(scale, *model
        inputs)`, it returns the scaled loss and the gradients of `params`) instead of
        PyNative's autograd around the model. Only a layout that `compiles_body` is given
        one."""
        def grads(*inputs: Tensor | None) -> tuple:
            return graph(Tensor(self._scale, ms.float32), *inputs)
        self._grad_fn = grads


class Unobserved:
    """The observer of a step nobody monitors."""

    def micro_batch(self, index: int, loss: Tensor, grads: Sequence[Tensor]) -> None:
        """Nothing to record."""

    def routed(self, layers: Sequence[int] | None) -> None:
        """Nothing to count."""

    def reduced(self, loss: Tensor, grads: Sequence[Tensor]) -> None:
        """Nothing to record."""

    def watches(self, name: str) -> bool:
        """No gradient is read."""
        return False


class Observers:
    """Several observers told the same things, in order (the trainer's monitors and its
    expert-bias update)."""

    def __init__(self, *observers: StepObserver):
        self.observers = observers

    def micro_batch(self, index: int, loss: Tensor, grads: Sequence[Tensor]) -> None:
        for observer in self.observers:
            observer.micro_batch(index, loss, grads)

    def routed(self, layers: Sequence[int] | None) -> None:
        for observer in self.observers:
            observer.routed(layers)

    def reduced(self, loss: Tensor, grads: Sequence[Tensor]) -> None:
        for observer in self.observers:
            observer.reduced(loss, grads)

    def watches(self, name: str) -> bool:
        """Whether any observer reads the gradient of `name`."""
        return any(observer.watches(name) for observer in self.observers)
