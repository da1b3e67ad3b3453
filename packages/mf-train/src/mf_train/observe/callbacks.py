"""Training callbacks: the hook points of the loop, the list that calls them, and loss logging.

Hook points, in the order the training loop calls them. Every rank calls every hook (so a
callback may take part in a collective); a callback that writes files or logs checks
`ctx.is_main` itself.

    on_train_begin(ctx)              once, when the model, optimizer and data are ready and a
                                     checkpoint (if any) is loaded; `ctx.start_step` is the
                                     number of optimizer steps already done (0 for a new run).
    for each step s = ctx.start_step + 1 .. ctx.total_steps:
        on_step_begin(ctx, s)        before the first micro-batch of step s.
        (micro-batches, optimizer update; the monitors' `record_*` methods are called here)
        on_step_end(ctx, record)     after the update; `record.step == s` (a `StepRecord`).
        on_save(ctx, s, path)        after the checkpoint of step s has been written.
    on_train_end(ctx, last)          once, also when training stops early or fails (the loop
                                     calls it in a `finally`); `last` is the last `StepRecord`,
                                     None when no step ran.

`CallbackList` calls each callback in order. The run's list (`mf_train.monitor.
standard_callbacks`) puts the data collectors first (they fill `record.extra`), then the
user's callbacks (which see the collected values and may add their own to `record.extra`),
then the writers (loss log line, metrics.jsonl, TensorBoard, progress bar), so whatever is in
`record.extra` by then is written.

User callbacks come from the `callbacks:` list of the configuration (`build_callbacks`): each
item's `type` is resolved through `mf_train.registry.CALLBACKS` (a registered name, an entry
point of the group `mf_train.callbacks`, or `module:Class`), and its other keys are
structured into the class's own `Settings` section (`mf_config.sections.section`), so an
unknown or ill-typed key is a `ConfigError` at `callbacks[i].<key>`; the class is then built as
`cls(settings)`, or `cls()` when it declares no `Settings` (it then takes no keys). This is
MindFormers' `callbacks[i]` built by its register (`get_instance_from_cfg`), with the keys
checked.

`LossLogger` is MindFormers' LossCallback: one line per step on rank 0, through `logging`:
`step [  3/100] loss 4.123456 lr 1.0e-04 grad_norm 1.234 tokens/s(global) 12345
tokens/s/rank 6172 tflops/rank 0.0457 mfu 2.77% step_time 123 ms elapsed 1.2s eta 12.0s
peak_mem 4.61 GiB`.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from mf_config import CallbackConfig, MonitorConfig
from mf_config.component_settings import settings_error, structure_settings
from mf_config.errors import Path as YamlPath
from mf_config.yaml_source import Source

from ..registry import CALLBACKS

logger = logging.getLogger(__name__)

C = TypeVar("C", bound="Callback")


@dataclasses.dataclass(kw_only=True, slots=True)
class StepRecord:
    """What one optimizer step did, in plain Python numbers.

    `step` is the 1-based optimizer step just finished; `tokens` counts the step's tokens over
    all ranks; `step_time` is in seconds; `tokens_per_s` defaults to `tokens / step_time`.
    `skipped` marks a step whose update was skipped (non-finite loss or gradient norm, spike).
    `peak_memory_gib` is the largest rank's peak memory so far (`mf_train.observe.process_memory`)
    and `peak_memory_rank` that rank (None in a one-process run).
    `tokens_per_s_per_rank` is `tokens_per_s` over the world size; `tflops` the achieved TFLOP/s
    of a rank (model FLOPs per token x `tokens_per_s_per_rank`, `mf_train.observe.model_flops`);
    `mfu` is `tflops` over the peak TFLOP/s of a rank (a fraction); `elapsed_s` the seconds since
    the run's first step began and `eta_s` the seconds left (`mf_train.observe.throughput`). The
    trainer sets them; each is None when not known.
    `extra` holds the monitors' values (`local_loss/micro1`, `moe/layer3/expert0`, ...);
    its keys never repeat a field name. Numbers are converted with `float()`/`int()`, so a
    numpy scalar or a 0-d tensor is accepted.
    """

    step: int
    total_steps: int
    loss: float
    lr: float
    grad_norm: float
    step_time: float
    tokens: int
    consumed_samples: int
    skipped: bool = False
    tokens_per_s: float | None = None
    peak_memory_gib: float | None = None
    peak_memory_rank: int | None = None
    tokens_per_s_per_rank: float | None = None
    tflops: float | None = None
    mfu: float | None = None
    elapsed_s: float | None = None
    eta_s: float | None = None
    extra: dict[str, float] = dataclasses.field(default_factory=dict)
    events: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    """Events of this step for metrics.jsonl (`{"event": "spike", ...}`), after its line."""

    def __post_init__(self) -> None:
        for name in ("step", "total_steps", "tokens", "consumed_samples"):
            setattr(self, name, int(getattr(self, name)))
        for name in ("loss", "lr", "grad_norm", "step_time"):
            setattr(self, name, float(getattr(self, name)))
        self.skipped = bool(self.skipped)
        if self.tokens_per_s is None:
            self.tokens_per_s = self.tokens / self.step_time if self.step_time > 0 else 0.0
        self.tokens_per_s = float(self.tokens_per_s)

    def scalars(self) -> dict[str, float]:
        """The per-step numbers every writer shows: loss, lr, grad_norm, tokens_per_s,
        step_time, and those of tokens_per_s_per_rank, tflops, mfu, elapsed_s, eta_s and
        peak_memory_gib that are known."""
        values = {"loss": self.loss, "lr": self.lr, "grad_norm": self.grad_norm,
                  "tokens_per_s": float(self.tokens_per_s or 0.0), "step_time": self.step_time}
        for name in _OPTIONAL_SCALARS:
            value = getattr(self, name)
            if value is not None:
                values[name] = float(value)
        return values


_OPTIONAL_SCALARS = ("tokens_per_s_per_rank", "tflops", "mfu", "elapsed_s", "eta_s",
                     "peak_memory_gib")


@dataclasses.dataclass(kw_only=True)
class TrainContext:
    """What callbacks may read about the run.

    `output_dir` holds metrics.jsonl and (by default) the TensorBoard events; `start_step` is
    the number of optimizer steps already done when training begins (the resumed checkpoint's
    step, 0 for a new run); `model` is the model being trained (its `tokens_per_expert()`
    feeds `MoeMonitor`); `monitor` is the run's `monitor:` section; `collectives` are this
    rank's (`MoeMonitor` sums tokens per expert over ranks with them; None in one process).
    """

    output_dir: Path
    total_steps: int
    rank: int = 0
    world_size: int = 1
    start_step: int = 0
    monitor: MonitorConfig = dataclasses.field(default_factory=MonitorConfig)
    model: Any = dataclasses.field(default=None, repr=False)
    collectives: Any = dataclasses.field(default=None, repr=False)
    build_peak_memory_gib: float | None = None
    """The largest rank's peak memory once everything was built and loaded (before step 1)."""
    model_flops_per_token: int | None = None
    """Model FLOPs of training on one token (`mf_train.observe.model_flops`), None when unknown."""
    peak_tflops: float | None = None
    """The peak TFLOP/s of a rank that MFU divides by, None when unknown."""
    peak_source: str | None = None
    """Where `peak_tflops` comes from (`rated: A100 dense bfloat16, ...`, `measured once on
    this machine (...)`: `peak_flops`)."""
    evaluate: Callable[[int], float] | None = dataclasses.field(default=None, repr=False)
    """The valid split's mean loss over its next `iters` global batches (a collective; the
    `Evaluate` callback calls it, `mf_train.observe.evaluation`); None when the run evaluates
    nothing."""
    evaluate_test: Callable[[int], float] | None = dataclasses.field(default=None, repr=False)
    """The test split's mean loss over its first `iters` global batches (as `evaluate`);
    None unless `Evaluate` asks for the test split (`test: true`)."""

    def __post_init__(self) -> None:
        self.output_dir = Path(self.output_dir)

    @property
    def is_main(self) -> bool:
        """Rank 0: the rank that logs and writes files."""
        return self.rank == 0

    @property
    def resumed(self) -> bool:
        return self.start_step > 0


class Callback:
    """Base class of callbacks: every hook is a no-op; override the ones you need.

    A callback configured under `callbacks:` may declare `Settings`, a `Section` class of its
    keys (no `from __future__ import annotations` in that module: cattrs reads the field types
    at run time), and is then built as `cls(settings)`; without `Settings` it is built as
    `cls()` and takes no keys.
    """

    def on_train_begin(self, ctx: TrainContext) -> None:
        """Once, before the first step (after a checkpoint was loaded)."""

    def on_step_begin(self, ctx: TrainContext, step: int) -> None:
        """Before the first micro-batch of `step` (1-based)."""

    def on_step_end(self, ctx: TrainContext, record: StepRecord) -> None:
        """After the optimizer update of `record.step`."""

    def on_save(self, ctx: TrainContext, step: int, path: Path) -> None:
        """After the checkpoint of `step` was written to `path`."""

    def on_train_end(self, ctx: TrainContext, last: StepRecord | None) -> None:
        """Once, at the end of training, also after an error; `last` is the last record."""


class CallbackList(Callback):
    """Callbacks called in order, each hook on every one before the next hook."""

    def __init__(self, callbacks: Iterable[Callback] = ()):
        self.callbacks: list[Callback] = list(callbacks)
        _warn_duplicates(self.callbacks)

    def __iter__(self):
        return iter(self.callbacks)

    def __len__(self) -> int:
        return len(self.callbacks)

    def find(self, cls: type[C]) -> C | None:
        """The first callback that is an instance of `cls`, or None."""
        return next((cb for cb in self.callbacks if isinstance(cb, cls)), None)

    def on_train_begin(self, ctx: TrainContext) -> None:
        for callback in self.callbacks:
            callback.on_train_begin(ctx)

    def on_step_begin(self, ctx: TrainContext, step: int) -> None:
        for callback in self.callbacks:
            callback.on_step_begin(ctx, step)

    def on_step_end(self, ctx: TrainContext, record: StepRecord) -> None:
        for callback in self.callbacks:
            callback.on_step_end(ctx, record)

    def on_save(self, ctx: TrainContext, step: int, path: Path) -> None:
        for callback in self.callbacks:
            callback.on_save(ctx, step, path)

    def on_train_end(self, ctx: TrainContext, last: StepRecord | None) -> None:
        for callback in self.callbacks:
            callback.on_train_end(ctx, last)


def _warn_duplicates(callbacks: Sequence[Callback]) -> None:
    """MindFormers' CallbackHandler warns when a class appears twice; so do we (both run)."""
    seen: set[type] = set()
    for callback in callbacks:
        cls = type(callback)
        if cls in seen and cls is not CallbackList:
            logger.warning("callbacks: more than one %s; each of them runs", cls.__name__)
        seen.add(cls)


# ----------------------------------------------------------------------- from the config


def build_callbacks(configs: Sequence[CallbackConfig],
                    source: Source | None = None) -> list[Callback]:
    """The user callbacks of the `callbacks:` list, in order; `ConfigError` for an unknown
    `type`, a class that is not a `Callback`, or a key its `Settings` does not accept."""
    return [_build_one(config, index, source) for index, config in enumerate(configs)]


def callback_class(type_name: Any, type_path: YamlPath,
                   source: Source | None = None) -> type[Callback]:
    """The callback class a `callbacks[i].type` names; `ConfigError` at `type_path` when it
    names nothing registered, cannot be loaded, or is not a `Callback` subclass."""
    cls = CALLBACKS.get(type_name, type_path, source)
    if not (isinstance(cls, type) and issubclass(cls, Callback)):
        raise settings_error([(type_path, f"{type_name!r} is not a callback: a subclass of "
                                          "mf_train.observe.callbacks.Callback is required")],
                             source)
    return cls


def callback_settings(type_name: Any, type_path: YamlPath,
                      source: Source | None = None) -> type | None:
    """`mf-config validate`'s resolver for callbacks (entry point `mf_config.
    component_classes`): the `Settings` of the class a type names, None when it has none;
    `ConfigError` as `callback_class` says. Code-registered names count when registered in
    the validating process."""
    return getattr(callback_class(type_name, type_path, source), "Settings", None)


def _build_one(config: CallbackConfig, index: int, source: Source | None) -> Callback:
    path = ("callbacks", index)
    cls = callback_class(config.type, (*path, "type"), source)
    settings_cls = getattr(cls, "Settings", None)
    if settings_cls is None:
        if config.extras:
            raise settings_error([((*path, key), f"unknown key: {cls.__name__} declares no "
                                                 "Settings, so it takes no keys besides type")
                                  for key in config.extras], source)
        return cls()
    return cls(structure_settings(settings_cls, config.extras, path, source))


# --------------------------------------------------------------------------- loss logging


class LossLogger(Callback):
    """One MindFormers-like line per step on rank 0 (logger `mf_train.observe.callbacks`); with
    `step_times`, followed by where the step's time went (`step_times.format_step_times`)."""

    def __init__(self, step_times: bool = False):
        self.step_times = step_times

    def on_step_end(self, ctx: TrainContext, record: StepRecord) -> None:
        if ctx.is_main:
            line = format_step_line(record)
            if self.step_times:
                from .step_times import format_step_times

                line = f"{line} {format_step_times(record.extra)}".rstrip()
            logger.info("%s", line)


def format_step_line(record: StepRecord) -> str:
    """`step [  3/100] loss 4.123456 lr 1.0e-04 grad_norm 1.234 tokens/s(global) 12345
    tokens/s/rank 6172 tflops/rank 0.0457 mfu 2.77% step_time 123 ms elapsed 1.2s eta 12.0s
    peak_mem 4.61 GiB (rank 2)`, with ` skipped` appended when the update was skipped (each
    of tokens/s/rank, tflops/rank, mfu, elapsed, eta and peak_mem only when known, the rank
    only with several ranks), and `val_loss 4.2 val_ppl 66.7` after the loss on a step
    the `Evaluate` callback evaluated (then `test_loss 4.3 test_ppl 73.7` on the last step
    when it evaluated the test split)."""
    width = len(str(record.total_steps))
    parts = [f"step [{record.step:>{width}}/{record.total_steps}] loss {record.loss:.6f}"]
    for split in ("val", "test"):
        if f"{split}_loss" in record.extra:
            parts.append(f"{split}_loss {record.extra[f'{split}_loss']:.6f} "
                         f"{split}_ppl {record.extra[f'{split}_ppl']:.4g}")
    parts += [f"lr {record.lr:.1e} grad_norm {record.grad_norm:.4g}",
              f"tokens/s(global) {_whole(record.tokens_per_s)}"]
    parts += _known(("tokens/s/rank", record.tokens_per_s_per_rank, _whole),
                    ("tflops/rank", record.tflops, "{:.3g}".format),
                    ("mfu", record.mfu, lambda mfu: f"{mfu * 100:.3g}%"))
    parts.append(f"step_time {_whole(record.step_time * 1e3)} ms")
    parts += _known(("elapsed", record.elapsed_s, duration), ("eta", record.eta_s, duration))
    if record.peak_memory_gib is not None:
        parts.append(f"peak_mem {record.peak_memory_gib:.2f} GiB")
        if record.peak_memory_rank is not None:
            parts.append(f"(rank {record.peak_memory_rank})")
    if record.skipped:
        parts.append("skipped")
    return " ".join(parts)


def duration(seconds: float) -> str:
    """`8.1s`, `3m32s`, `2h05m` (a step line's elapsed time and ETA, the summary's time)."""
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, rest = divmod(round(seconds), 60)
    if minutes < 60:
        return f"{minutes}m{rest:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"


def _known(*fields: tuple[str, float | None, Callable[[float], str]]) -> list[str]:
    """`label value` of each (label, value, format) whose value is known (not None)."""
    return [f"{label} {text(value)}" for label, value, text in fields if value is not None]


def _whole(value: float | None) -> str:
    if value is None or not math.isfinite(value):
        return str(value)
    return f"{value:.0f}"
