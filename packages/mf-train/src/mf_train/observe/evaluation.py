"""The validation loss during training: the `Evaluate` callback, what it runs, and what is
refused or said about it before launch.

`callbacks: [{type: Evaluate, interval: 50, iters: 10}]` evaluates after every step whose
number is a multiple of `interval`, and after the last step: `iters` global batches of the
Megatron loader's valid split (`split` / `sizes`, or `valid_data_path`), each cut into this
rank's micro-batches as a training step's are, through the model's forward only
(`StepLayout.evaluate`: no gradient, no update, no monitor told). The loss is averaged over
the micro-batches and then over the data-parallel ranks, as the training loss is, so every
layout that evaluates reports the one-process value for the same samples. `val_loss` and
`val_ppl` (its exponential) go into the step's `record.extra`, so the step line,
metrics.jsonl, TensorBoard, W&B and the end-of-run summary show them.

The valid split is read as a stream, as Megatron's `eval_iters` reads it: each evaluation
takes the next batches, pass after pass; its position (`consumed_valid_samples`, in the
checkpoint's run progress) is restored on resume, so a resumed run evaluates the samples the
uninterrupted run would have. An evaluation changes nothing the training reads: its own
stream, the random generators put back as they were (`checkpoint.rng`), no gradient kept.

With `test: true`, after the last step the test split's first `iters` global batches are
evaluated the same way (Megatron's evaluation of the test split after training), as
`test_loss` and `test_ppl` on the last step's record; nothing of it is kept in a checkpoint
(it always starts at the split's first sample).

Before launch (`evaluation_issues`, called by `mf_train.preflight.job.check_support`): Evaluate is
refused when the valid split is empty (or, with `test: true`, the test split) or the loader
is not the Megatron one, and under a layout that does not evaluate yet
(`StepLayout.evaluates`); a valid split that is built while no Evaluate is configured, or a
test split that nothing evaluates, is a warning, said once.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from mf_config import ConfigError, ConfigIssue, TrainConfig
from mf_config.component_settings import located_issue
from mf_config.yaml_source import Source
from mf_data.builder import split_requested
from mf_data.errors import DataError
from mf_data.loader_config import LOADER_TYPE, megatron_settings
from mf_parallel import Plan

from ..checkpoint.rng import capture_rng_state, restore_rng_state
from ..layouts import StepLayout, layout_for
from ..settings.evaluate import EvaluateSettings
from .callbacks import Callback, StepRecord, TrainContext, callback_class

CONSUMED_VALID = "consumed_valid_samples"
"""The key of the valid stream's position (samples read over all ranks) in the checkpoint's
run progress (`RunProgress.extra`)."""


class Evaluate(Callback):
    """`val_loss` and `val_ppl` of the valid split after every `interval` steps and the last,
    with `test: true` also `test_loss` and `test_ppl` of the test split after the last
    (every rank calls it: the evaluation is a collective under data parallelism)."""

    Settings = EvaluateSettings

    def __init__(self, settings: EvaluateSettings | None = None):
        self.settings = settings or EvaluateSettings()

    def on_step_end(self, ctx: TrainContext, record: StepRecord) -> None:
        if record.step % self.settings.interval and record.step != ctx.total_steps:
            return
        if ctx.evaluate is None:
            raise RuntimeError("the Evaluate callback runs in mf-train's trainer, which "
                               "gives it the valid split (TrainContext.evaluate)")
        loss = ctx.evaluate(self.settings.iters)
        record.extra["val_loss"] = loss
        record.extra["val_ppl"] = perplexity(loss)
        if self.settings.test and record.step == ctx.total_steps:
            if ctx.evaluate_test is None:
                raise RuntimeError("Evaluate's test: true needs the test split "
                                   "(TrainContext.evaluate_test), which mf-train's trainer "
                                   "gives it")
            loss = ctx.evaluate_test(self.settings.iters)
            record.extra["test_loss"] = loss
            record.extra["test_ppl"] = perplexity(loss)


def perplexity(loss: float) -> float:
    """`exp(loss)`, infinite where it overflows (NaN stays NaN)."""
    return math.exp(loss) if loss < 709.0 or math.isnan(loss) else math.inf


class Evaluation:
    """A split's loss under a layout, read from a stream that goes on between calls.

    Args:
        layout: the step layout (its `evaluate`).
        stream: this rank's micro-batches of the split (`micro_batches.evaluation_stream`).
        micro_batches: micro-batches per global batch on this rank (the training step's
            accumulation steps).
    """

    def __init__(self, layout: StepLayout, stream: Any, micro_batches: Callable[[], int]):
        self.layout = layout
        self.stream = stream
        self.micro_batches = micro_batches

    @property
    def consumed_samples(self) -> int:
        """Samples read so far, over all ranks (what a checkpoint keeps of the valid
        split's)."""
        return int(self.stream.consumed_samples)

    def __call__(self, iters: int) -> float:
        """The mean loss of the next `iters` global batches of the split."""
        state = capture_rng_state()
        batches = [next(self.stream) for _ in range(iters * self.micro_batches())]
        loss = float(self.layout.evaluate(batches).asnumpy())
        restore_rng_state(state)
        return loss


def evaluates(config: TrainConfig, source: Source | None = None) -> int | None:
    """The index of the first `callbacks:` item that is an `Evaluate`, None when none is
    (an item whose type does not resolve is refused elsewhere)."""
    for index, item in enumerate(config.callbacks):
        try:
            cls = callback_class(item.type, ("callbacks", index, "type"), source)
        except ConfigError:
            continue
        if issubclass(cls, Evaluate):
            return index
    return None


def evaluation_issues(config: TrainConfig, plan: Plan,
                      source: Source | None = None) -> list[ConfigIssue]:
    """Before launch: errors for an Evaluate callback that cannot run here (no valid split,
    `test: true` without a test split, not the Megatron loader, a layout that does not
    evaluate), a warning for a valid or test split that is built while nothing reads it."""
    loader = config.train_dataset.dataloader
    megatron = loader.type == LOADER_TYPE
    try:
        valid, test = (megatron and split_requested(loader, 1),
                       megatron and split_requested(loader, 2))
    except DataError:  # the loader's settings are refused elsewhere, with their paths
        valid = test = False
    index = evaluates(config, source)
    tests = index is not None and config.callbacks[index].extras.get("test") is True
    issues = []
    if valid and index is None:
        issues.append(located_issue(_asked_at(config, "valid_data_path"), "builds a valid "
                                    "split that nothing reads: add the Evaluate callback "
                                    "(callbacks: [{type: Evaluate, interval: 50, iters: 10}]) "
                                    "to evaluate it during training", "warning", source))
    if test and not tests:
        issues.append(located_issue(_asked_at(config, "test_data_path"), "builds a test "
                                    "split that nothing reads: give the Evaluate callback "
                                    "test: true to evaluate it after the last step", "warning",
                                    source))
    if index is None:
        return issues
    where = ("callbacks", index, "type")
    if not megatron:
        return [located_issue(where, f"Evaluate reads the valid split of the {LOADER_TYPE}; "
                              f"train_dataset.dataloader.type is {loader.type!r}", "error",
                              source)]
    if not valid:
        issues.append(located_issue(where, "Evaluate reads the valid split, which the data "
                                    "settings leave empty: give it samples (train_dataset."
                                    "dataloader.sizes[1] > 0 and a share of split, such as "
                                    "\"9, 1, 0\", or valid_data_path)", "error", source))
    if tests and not test:
        issues.append(located_issue(("callbacks", index, "test"), "Evaluate's test: true "
                                    "reads the test split, which the data settings leave "
                                    "empty: give it samples (train_dataset.dataloader.sizes[2] "
                                    "> 0 and a share of split, such as \"8, 1, 1\", or "
                                    "test_data_path)", "error", source))
    layout = layout_for(plan.dims, config.parallelism)
    if layout is not None and not layout.evaluates:
        issues.append(located_issue(where, f"the step layout {layout.__name__} that runs "
                                    f"{plan.dims.describe()} has no forward-only evaluation "
                                    "(StepLayout.evaluates): remove Evaluate from callbacks "
                                    "for this run", "error", source))
    return issues


def _asked_at(config: TrainConfig, key: str) -> tuple[str, ...]:
    """Where the settings ask for a split: its own blend (`key`, such as `valid_data_path`)
    when given, else `sizes`."""
    if getattr(megatron_settings(config.train_dataset.dataloader).config, key):
        return ("train_dataset", "dataloader", "config", key)
    return ("train_dataset", "dataloader", "sizes")
