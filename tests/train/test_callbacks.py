"""Callbacks: the step record, hook order, the loss log line, callbacks built from config.

No `from __future__ import annotations` here: `EveryN.Settings` is structured by cattrs, which
reads the field types at run time.
"""

import logging
from pathlib import Path

import numpy as np
import pytest

from mf_config import CallbackConfig, ConfigError, load_config
from mf_config.sections import Section, section, setting
from mf_config.validate import load_source
from mf_train.observe.callbacks import (
    Callback,
    CallbackList,
    LossLogger,
    StepRecord,
    TrainContext,
    build_callbacks,
    format_step_line,
)
from mf_train.registry import CALLBACKS


def make_record(step: int = 3, total: int = 100, **changes) -> StepRecord:
    fields = {"step": step, "total_steps": total, "loss": 4.1234564, "lr": 1e-4,
              "grad_norm": 1.2345, "step_time": 0.123, "tokens": 1518,
              "consumed_samples": 24}
    return StepRecord(**(fields | changes))


# ----------------------------------------------------------------------- step record


def test_step_record_holds_plain_numbers() -> None:
    record = make_record(loss=np.float32(2.5), lr=np.float64(3e-4), step=np.int64(7),
                         tokens=np.int32(64), skipped=np.bool_(True))
    assert (type(record.loss), type(record.lr), type(record.step), type(record.tokens),
            type(record.skipped)) == (float, float, int, int, bool)
    assert (record.loss, record.step, record.skipped) == (2.5, 7, True)


def test_tokens_per_s_is_tokens_over_step_time_unless_given() -> None:
    assert make_record(tokens=1000, step_time=0.25).tokens_per_s == 4000.0
    assert make_record(tokens=1000, step_time=0.0).tokens_per_s == 0.0
    assert make_record(tokens_per_s=12.5).tokens_per_s == 12.5


def test_step_record_fields_are_keyword_only() -> None:
    with pytest.raises(TypeError):
        StepRecord(1, 10, 1.0, 1e-3, 1.0, 0.1, 16, 8)  # type: ignore[misc]


# ----------------------------------------------------------------------- loss log line


def test_loss_line_text() -> None:
    # tokens/s = 1518 / 0.123 = 12341.46...; step time 123 ms
    assert format_step_line(make_record()) == (
        "step [  3/100] loss 4.123456 lr 1.0e-04 grad_norm 1.234 tokens/s(global) 12341 "
        "step_time 123 ms")


def test_loss_line_with_the_largest_ranks_peak_memory() -> None:
    record = make_record(peak_memory_gib=4.6149, peak_memory_rank=2)
    assert format_step_line(record).endswith("step_time 123 ms peak_mem 4.61 GiB (rank 2)")
    assert record.scalars()["peak_memory_gib"] == 4.6149
    one = make_record(peak_memory_gib=0.5)
    assert format_step_line(one).endswith("step_time 123 ms peak_mem 0.50 GiB")
    assert "peak_memory_gib" not in make_record().scalars()  # not measured: not shown


def test_loss_line_of_small_norms_skips_and_nan() -> None:
    line = format_step_line(make_record(step=12, total=12, loss=float("nan"), grad_norm=3.2e-6,
                                        lr=2.5e-5, skipped=True))
    assert line == ("step [12/12] loss nan lr 2.5e-05 grad_norm 3.2e-06 tokens/s(global) 12341 "
                    "step_time 123 ms skipped")


def test_loss_logger_logs_on_rank_0_only(tmp_path: Path, caplog) -> None:
    caplog.set_level(logging.INFO, logger="mf_train.observe.callbacks")
    record = make_record()
    LossLogger().on_step_end(TrainContext(output_dir=tmp_path, total_steps=100, rank=1,
                                          world_size=2), record)
    assert caplog.messages == []
    LossLogger().on_step_end(TrainContext(output_dir=tmp_path, total_steps=100, rank=0,
                                          world_size=2), record)
    assert caplog.messages == [format_step_line(record)]


# ----------------------------------------------------------------------- hooks


class Recorder(Callback):
    """Appends `(name, hook, argument)` to a shared list on every hook."""

    def __init__(self, name: str, events: list):
        self.name, self.events = name, events

    def on_train_begin(self, ctx):
        self.events.append((self.name, "train_begin", ctx.start_step))

    def on_step_begin(self, ctx, step):
        self.events.append((self.name, "step_begin", step))

    def on_step_end(self, ctx, record):
        self.events.append((self.name, "step_end", record.step))

    def on_save(self, ctx, step, path):
        self.events.append((self.name, "save", (step, path.name)))

    def on_train_end(self, ctx, last):
        self.events.append((self.name, "train_end", last.step if last else None))


def test_callback_list_calls_each_hook_on_every_callback_in_order(tmp_path: Path) -> None:
    events: list = []
    callbacks = CallbackList([Recorder("a", events), Callback(), Recorder("b", events)])
    ctx = TrainContext(output_dir=tmp_path, total_steps=2, start_step=1)
    callbacks.on_train_begin(ctx)
    callbacks.on_step_begin(ctx, 2)
    record = make_record(step=2, total=2)
    callbacks.on_step_end(ctx, record)
    callbacks.on_save(ctx, 2, tmp_path / "iteration_00000002")
    callbacks.on_train_end(ctx, record)
    assert events == [
        ("a", "train_begin", 1), ("b", "train_begin", 1),
        ("a", "step_begin", 2), ("b", "step_begin", 2),
        ("a", "step_end", 2), ("b", "step_end", 2),
        ("a", "save", (2, "iteration_00000002")), ("b", "save", (2, "iteration_00000002")),
        ("a", "train_end", 2), ("b", "train_end", 2),
    ]


def test_base_callback_hooks_are_no_ops(tmp_path: Path) -> None:
    ctx = TrainContext(output_dir=str(tmp_path), total_steps=1)
    callback = Callback()
    callback.on_train_begin(ctx)
    callback.on_step_begin(ctx, 1)
    callback.on_step_end(ctx, make_record(step=1, total=1))
    callback.on_save(ctx, 1, tmp_path)
    callback.on_train_end(ctx, None)
    assert ctx.output_dir == tmp_path and ctx.is_main and not ctx.resumed


def test_find_and_duplicate_warning(tmp_path: Path, caplog) -> None:
    events: list = []
    first, second = Recorder("a", events), Recorder("b", events)
    callbacks = CallbackList([LossLogger(), first, second])
    assert callbacks.find(Recorder) is first
    assert callbacks.find(CallbackList) is None
    assert [type(cb) for cb in callbacks] == [LossLogger, Recorder, Recorder]
    assert "callbacks: more than one Recorder; each of them runs" in caplog.text


def test_context_main_rank() -> None:
    assert not TrainContext(output_dir=Path("."), total_steps=1, rank=3, world_size=4).is_main


# ----------------------------------------------------------------------- from the config


@section
class EveryNSettings(Section):
    every: int = setting(1, "Steps between two calls.", ge=1)
    label: str = setting("x", "A label.")


class EveryN(Callback):
    """A user callback with settings, registered by name and loadable by path."""

    Settings = EveryNSettings

    def __init__(self, settings: EveryNSettings):
        self.settings = settings
        self.steps: list[int] = []

    def on_step_end(self, ctx, record):
        if record.step % self.settings.every == 0:
            self.steps.append(record.step)


class Plain(Callback):
    """A user callback without settings."""


class NotACallback:
    pass


CALLBACKS.register("EveryNForTest")(EveryN)


def config(type_, **extras) -> CallbackConfig:
    return CallbackConfig(type=type_, extras=extras)


def test_build_by_registered_name_with_settings(tmp_path: Path) -> None:
    [callback] = build_callbacks([config("EveryNForTest", every=2, label="y")])
    assert isinstance(callback, EveryN)
    assert (callback.settings.every, callback.settings.label) == (2, "y")
    ctx = TrainContext(output_dir=tmp_path, total_steps=5)
    for step in range(1, 6):
        callback.on_step_end(ctx, make_record(step=step, total=5))
    assert callback.steps == [2, 4]


def test_build_by_module_class_path_with_defaults_and_in_order() -> None:
    built = build_callbacks([config(f"{__name__}:EveryN"), config(f"{__name__}:Plain")])
    assert [type(cb) for cb in built] == [EveryN, Plain]
    assert built[0].settings == EveryNSettings()


def problems(*items: CallbackConfig) -> list[str]:
    with pytest.raises(ConfigError) as info:
        build_callbacks(list(items))
    return [f"{issue.path}: {issue.message}" for issue in info.value.errors]


def test_unknown_type() -> None:
    [text] = problems(config("EveryNForTest"), config("NoSuchCallback"))
    assert text.startswith("callbacks[1].type: unknown callback type 'NoSuchCallback'; "
                           "registered: ")
    assert "EveryNForTest" in text


def test_missing_type_and_unloadable_path() -> None:
    [text] = problems(config(None, every=2))
    assert text.startswith("callbacks[0].type: required: one of ")
    [text] = problems(config(f"{__name__}:Nope"))
    assert text.startswith(f"callbacks[0].type: cannot load callback type '{__name__}:Nope'")


def test_a_class_that_is_not_a_callback() -> None:
    assert problems(config(f"{__name__}:NotACallback")) == [
        f"callbacks[0].type: '{__name__}:NotACallback' is not a callback: a subclass of "
        "mf_train.observe.callbacks.Callback is required"]


def test_unknown_key() -> None:
    assert problems(config("EveryNForTest", every=2, evry=3)) == [
        "callbacks[0].evry: Unknown configuration keys for EveryNSettings: ['evry']; did you "
        "mean 'every'?"]


def test_a_class_without_settings_takes_no_keys() -> None:
    assert problems(config(f"{__name__}:Plain", every=2, log_interval=3)) == [
        "callbacks[0].every: unknown key: Plain declares no Settings, so it takes no keys "
        "besides type",
        "callbacks[0].log_interval: unknown key: Plain declares no Settings, so it takes no "
        "keys besides type"]


def test_wrong_type_and_bound() -> None:
    assert problems(config("EveryNForTest", every="10")) == [
        "callbacks[0].every: expected an integer, got '10' (a string)"]
    assert problems(config("EveryNForTest", every=0)) == ["callbacks[0].every: must be >= 1, got 0"]


def test_errors_carry_the_yaml_line(tmp_path: Path) -> None:
    path = tmp_path / "train.yaml"
    path.write_text("model: {model_type: qwen3, vocab_size: 8, hidden_size: 8, "
                    "intermediate_size: 8, num_hidden_layers: 1, num_attention_heads: 2}\n"
                    "# a complete Qwen3\n"
                    "train_dataset:\n  dataloader:\n    type: Mock\n"
                    "training:\n  global_batch_size: 1\ncallbacks:\n"
                    "  - type: EveryNForTest\n    every: 2\n"
                    "  - type: EveryNForTest\n    every: -1\n")
    with pytest.raises(ConfigError) as validated:  # validation resolves the registered name
        load_config(path)
    train_config = load_config(path, ["callbacks[1].every=3"])
    train_config.callbacks[1].extras["every"] = -1
    with pytest.raises(ConfigError) as built:
        build_callbacks(train_config.callbacks, load_source(path))
    for info in (validated, built):
        [issue] = info.value.errors
        assert (issue.path, issue.line) == ("callbacks[1].every", 12)
        assert str(issue) == f"{path}:12: callbacks[1].every: must be >= 1, got -1"
