"""`context.compile`: the model's decoder layers, and the optimizer's update, as compiled
graphs (`mindspore.jit`).

What is compiled, built on the first call and reused by every later step:
- where the layout works on the model whole (one process, replicated data parallelism:
  `StepLayout.compiles_body`) and the model can (`body_blocker()`: the whole model here, no
  tensor or context group, no per-document kernel lengths), the embedding lookup, decoder
  layers, final norm, head and loss as one graph per input shape (`compile_body`), and the
  loss with its gradients as ONE graph, forward and backward (`gradient_graph`, which the
  layout calls instead of PyNative's autograd: `StepLayout.use_gradient_graph`); the input
  checks, attention mask and rotary tables are made on the host;
- else each decoder layer as a graph of its own (one per layer and input shape, forward and
  backward), the embedding, final norm, head and loss in PyNative;
- and with either, the optimizer's update of every parameter as one graph where the
  optimizer has one (`compile_optimizer`: AdamW over float32 parameters, the same fused
  kernel per parameter as in PyNative).
The gradient reduction and norm stay in PyNative. Recompute (`Cell.recompute()` on a layer
or its parts) works inside the graphs (gradients equal PyNative's within 1e-6,
tests/train/test_compiled_layers.py).

What falls back to PyNative, decided before the first step and said in one log line:
- a model whose layers cannot be traced whole (`model.compile_blocker`: DeepSeek-V3 reads
  each MoE layer's routing back to give each expert its tokens) compiles the parts it names
  (`model.compilable_parts()`: DeepSeek-V3's attention, dense MLP, router, routed experts
  and shared experts);
- a step layout whose layers a graph cannot hold (`StepLayout.compile_blocker`: context
  parallelism launches and waits for its attention's collectives from Python). Tensor
  parallelism compiles (its regions' collectives are `GroupCollectives` cells, built
  before the graphs), and so do ZeRO and FSDP: a graph holds the parameter tensors of its
  first call, so ZeRO writes the gathered parameters into them (never swaps a parameter's
  tensor) and FSDP (told by `LayoutParts.compiled`) frees and refills their storage; every
  layout compiled is checked against PyNative and one process
  (tests/train/test_compiled_layouts.py);
- activation swap, whose hooks see each saved tensor of a layer (the update then stays in
  PyNative too);
- an optimizer without a compiled update (Muon, the sharded AdamW of ZeRO and FSDP, AdamW
  with float32 masters of low-precision parameters).

Why it is off by default (benchmarks/README.md, "speed.py"): compiling costs 5-21 s at the
first step and the peak memory grows 1.3-1.8x; on the CPU backend a compiled step is 2.6x
faster than PyNative on the tiny example and 1.6x at 28M parameters on one process.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from typing import Any

import mindspore as ms
from mindspore import Parameter, nn

from mf_config.layer_spec import ids_text
from mf_memory.layers import layer_ids


def graphs_compiled() -> int:
    """Graphs MindSpore has compiled in this process (its compile cache's size)."""
    from mindspore.graph import api  # the cache is private; its size is all that is read
    return len(getattr(api, "ms_compile_cache", ()))


@dataclasses.dataclass
class CompileReport:
    """What `compile_layers` compiled, what it left in PyNative and why, and what compiling
    has cost so far (`graphs`, `seconds`: calls during which a graph was compiled)."""

    enabled: bool
    compiled: list[str] = dataclasses.field(default_factory=list)
    fallbacks: list[tuple[str, str]] = dataclasses.field(default_factory=list)
    graphs: int = 0
    seconds: float = 0.0
    gradients: Callable[..., tuple] | None = None
    """The model's loss and gradients as one graph (`model.gradient_graph`), for the layout
    to call instead of PyNative's autograd (`StepLayout.use_gradient_graph`); None unless the
    whole body compiled."""
    _reported: tuple[int, float] = dataclasses.field(default=(0, 0.0), init=False, repr=False)

    def take_new(self) -> tuple[int, float]:
        """Graphs compiled and seconds spent compiling since the last call."""
        graphs, seconds = self.graphs - self._reported[0], self.seconds - self._reported[1]
        self._reported = (self.graphs, self.seconds)
        return graphs, seconds

    def describe(self) -> str:
        """The start-of-run log line."""
        if not self.enabled:
            return "context.compile is false: everything runs in PyNative"
        done = (f"compiled (mindspore.jit): {', '.join(self.compiled)}" if self.compiled
                else "nothing compiled")
        why = "; ".join(f"{what} run in PyNative ({reason})" for what, reason in self.fallbacks)
        return f"context.compile: {done}" + (f"; {why}" if why else "")


class CompileTimer:
    """Forward hooks around a compiled cell that time the calls during which MindSpore
    compiled a graph (the compiled `construct` itself must stay the function `mindspore.jit`
    returns: MindSpore parses it again and refuses any other callable)."""

    def __init__(self, report: CompileReport):
        self.report = report
        self._start: tuple[int, float] = (0, 0.0)

    def attach(self, cell: nn.Cell) -> None:
        cell.register_forward_pre_hook(self._before)
        cell.register_forward_hook(self._after)

    def _before(self, cell: nn.Cell, inputs: Any) -> None:
        self._start = (graphs_compiled(), time.perf_counter())

    def _after(self, cell: nn.Cell, inputs: Any, output: Any) -> None:
        self._count(*self._start)

    def _count(self, graphs: int, start: float) -> None:
        new = graphs_compiled() - graphs
        if new:
            self.report.graphs += new
            self.report.seconds += time.perf_counter() - start

    def timed(self, function: Callable[..., Any]) -> Callable[..., Any]:
        """`function`, its calls that compiled a graph counted as the hooks count a cell's."""
        def call(*args: Any) -> Any:
            graphs, start = graphs_compiled(), time.perf_counter()
            result = function(*args)
            self._count(graphs, start)
            return result
        return call


def compile_layers(model: nn.Cell, enabled: bool,
                   blockers: Sequence[tuple[str, str | None]] = (),
                   body_params: Sequence[Parameter] | None = None) -> CompileReport:
    """Compile `model.decoder_layers` when `enabled` and nothing blocks it: with
    `body_params` (the layout's `compiles_body`) and a model that can (`model.body_blocker()`
    None), the embedding lookup, layers, final norm, head and loss as one graph, and their
    gradients with respect to `body_params` as one graph forward and backward
    (`report.gradients`); else each layer as a graph of its own.

    Args:
        model: a model with the layer contract (`decoder_layers`).
        enabled: `context.compile`.
        blockers: `(what, reason or None)` pairs from the layout and the memory features;
            the first with a reason keeps every layer in PyNative.
        body_params: the parameters the layout updates, where it lets the model run from its
            embedding to the loss as one graph; None where it works on each layer.

    Returns:
        The report, which keeps counting compilations as the graphs run.
    """
    report = CompileReport(enabled)
    if not enabled:
        return report
    for what, reason in blockers:
        if reason:
            report.fallbacks.append(("the decoder layers", f"{what}: {reason}"))
            return report
    timer = CompileTimer(report)
    model_reason = getattr(model, "compile_blocker", None)
    if model_reason:
        _compile_parts(model, timer, report)
        report.fallbacks.append(("the rest of the decoder layers" if report.compiled
                                 else "the decoder layers", f"the model: {model_reason}"))
        return report
    reason = (getattr(model, "body_blocker", lambda: "the model has no compiled body")()
              if body_params is not None else "the layout works on each layer")
    if reason is None:
        _prepare(model)
        model.compile_body()
        timer.attach(model)
        report.gradients = timer.timed(model.gradient_graph(body_params))
        report.compiled.append("the embedding lookup, "
                               + _layers_text("decoder layer", layer_ids(model))
                               + ", final norm, head and loss as one graph, forward and "
                               "backward")
        return report
    for layer in model.decoder_layers:
        _compile(layer, timer)
    report.compiled.append(_layers_text("decoder layer", layer_ids(model)))
    report.fallbacks.append(("embedding, final norm, head and loss", f"not in one graph with "
                             f"the layers: {reason}"))
    return report


def compile_optimizer(optimizer: Any, report: CompileReport) -> None:
    """Run the optimizer's update as one graph where `context.compile` is on and it can
    (`compile_update`: AdamW over float32 parameters); else say why it stays in PyNative.
    Where the layers stay in PyNative (context parallelism, activation swap), so does the
    update: the field has no effect there, as mf-train warns before the run (`support`)."""
    if not report.enabled or not report.compiled:
        return
    blocker = getattr(optimizer, "compile_blocker", None)
    reason = (f"{type(optimizer).__name__} has no compiled form" if blocker is None
              else blocker())
    if reason:
        report.fallbacks.append(("the optimizer's update", reason))
        return
    optimizer.compile_update(CompileTimer(report).timed)
    report.compiled.append("the optimizer's update as one graph")


def _compile(cell: nn.Cell, timer: CompileTimer, dynamic: bool = False) -> None:
    _prepare(cell, dynamic)
    cell.construct = ms.jit(cell.construct, dynamic=int(dynamic))
    timer.attach(cell)


def _prepare(cell: nn.Cell, dynamic: bool = False) -> None:
    """PyNative-only fast paths inside `cell` step aside (`gathered_heads`) where a graph
    (of inputs of any shape, with `dynamic`) cannot hold them."""
    for _, inner in cell.cells_and_names():
        prepare = getattr(inner, "prepare_for_graph", None)
        if prepare is not None:
            prepare(dynamic)


def _layers_text(what: str, ids: Sequence[int]) -> str:
    return f"{what}s {ids_text(ids)}" if len(ids) > 1 else f"{what} {ids[0]}"


def _compile_parts(model: nn.Cell, timer: CompileTimer, report: CompileReport) -> None:
    """The cells a model whose layers do not compile whole names as compiling on their own
    (`model.compilable_parts()`: `(part name, layer id, cell, dynamic)`), by part. A
    `dynamic` cell gets one graph for inputs of any length (`mindspore.jit(dynamic=1)`:
    compiled again once, at the first call with another shape)."""
    ids: dict[str, list[int]] = {}
    for part, index, cell, dynamic in getattr(model, "compilable_parts", list)():
        _compile(cell, timer, dynamic)
        found = ids.setdefault(part, [])
        if index not in found:
            found.append(index)
    report.compiled += [f"{part} of {_layers_text('decoder layer', found)}"
                        for part, found in ids.items()]
