"""Learning-rate schedules against their formulas, written out here independently.

References: MindFormers' `lr_schedule.py` formulas (the anchor, as summarised in the shared
reference notes) with the deviations the module docstring documents: ratios floor the exact
decimal product, and every decaying schedule holds its final rate past its end.
"""

from __future__ import annotations

import itertools
import math
import warnings
from decimal import Decimal
from fractions import Fraction
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mf_config import ConfigError, LrSchedulerConfig, load_config
from mf_config.errors import ConfigWarning
from mf_config.validate import check_source, config_from_source, load_source
from mf_train.optim.lr_schedules import LrSchedule, build_lr_schedule
from mf_train.registry import LR_SCHEDULERS
from mf_train.settings.lr_schedules import floor_of_ratio

SEVEN = ["ConstantWarmUpLR", "LinearWithWarmUpLR", "CosineWithWarmUpLR",
         "CosineWithRestartsAndWarmUpLR", "PolynomialWithWarmUpLR", "WarmUpStableDecayLR",
         "ConstantWithCoolDownLR"]


def build(type_: str | None, total: int, lr: float = 1e-3, **extras: Any) -> LrSchedule:
    return build_lr_schedule(LrSchedulerConfig(type=type_, learning_rate=lr, extras=extras),
                             total)


def problem(type_: str | None, total: int = 100, lr: float = 1e-3, **extras: Any) -> str:
    with pytest.raises(ConfigError) as info:
        build(type_, total, lr, **extras)
    return str(info.value)


# ----------------------------------------------------------------- reference formulas


def ref_count(params: dict, steps_key: str, ratio_key: str | None, total: int,
              default: int | None = None) -> int:
    ratio = params.get(ratio_key) if ratio_key else None
    if ratio is not None:
        return int(Decimal(str(ratio)) * total)  # floor of the decimal product (ratio >= 0)
    value = params.get(steps_key)
    return default if value is None else value


def ref_warm(t: int, lr: float, params: dict, w: int) -> float:
    init = params.get("warmup_lr_init", 0.0)
    return init + (lr - init) * t / w


def ref_constant(t, lr, total, p):
    w = ref_count(p, "warmup_steps", "warmup_ratio", total)
    return ref_warm(t, lr, p, w) if t < w else lr


def ref_linear(t, lr, total, p):
    w = ref_count(p, "warmup_steps", "warmup_ratio", total)
    if t < w:
        return ref_warm(t, lr, p, w)
    return lr * max(0.0, (total - t) / max(1, total - w))


def ref_cosine(t, lr, total, p, restarts=False):
    w = ref_count(p, "warmup_steps", "warmup_ratio", total, default=0)
    decay = max(1, ref_count(p, "decay_steps", None if restarts else "decay_ratio", total,
                             default=total))
    end = p.get("lr_end", 0.0)
    cycles = p.get("num_cycles", 1.0 if restarts else 0.5)
    if t >= decay:
        return end
    if t < w:
        return ref_warm(t, lr, p, w)
    progress = (t - w) / max(1, total - w)
    if progress >= 1:  # past total_steps (decay_steps > total_steps): hold lr_end
        return end
    angle = math.pi * ((cycles * progress) % 1) if restarts else 2 * math.pi * cycles * progress
    return end + (lr - end) * max(0.0, 0.5 * (1 + math.cos(angle)))


def ref_restarts(t, lr, total, p):
    return ref_cosine(t, lr, total, p, restarts=True)


def ref_polynomial(t, lr, total, p):
    w = ref_count(p, "warmup_steps", "warmup_ratio", total)
    end, power = p.get("lr_end", 1e-7), p.get("power", 1.0)
    decay = max(1, ref_count(p, "decay_steps", None, total, default=total - w))
    if t > total:
        return end
    if t < w:
        return ref_warm(t, lr, p, w)
    remaining = max(0.0, 1 - (t - w) / decay)  # clamped: anchor goes negative here
    return (lr - end) * remaining**power + end


def ref_wsd(t, lr, total, p):
    w = ref_count(p, "warmup_steps", "warmup_ratio", total)
    start = ref_count(p, "decay_start_steps", "decay_start_ratio", total)
    end = p.get("lr_end", 1e-7)
    if t >= total:  # clamped: the anchor keeps decaying below lr_end
        return end
    if t < w:
        return ref_warm(t, lr, p, w)
    if t < start:
        return lr
    return lr - (lr - end) * (t - start) / max(1, total - start)


def ref_cooldown(t, lr, total, p):
    w = ref_count(p, "warmup_steps", "warmup_ratio", total)
    decay = ref_count(p, "decay_steps", "decay_ratio", total)
    keep, final = p.get("keep_steps", 0), p.get("final_steps", 0)
    end1 = p.get("lr_end1", 0.0)
    end2 = end1 if p.get("lr_end2") is None else p["lr_end2"]
    cycles = p.get("num_cycles", 0.5)
    if t < w:
        return ref_warm(t, lr, p, w)
    if t < w + keep:
        return lr
    if t < w + keep + decay:
        cosine = 0.5 * (1 + math.cos(2 * math.pi * cycles * (t - w - keep) / decay))
        return end1 + (lr - end1) * max(0.0, cosine)
    if t < w + keep + decay + final:
        return end1
    return end2


REFERENCES = {"ConstantWarmUpLR": ref_constant, "LinearWithWarmUpLR": ref_linear,
              "CosineWithWarmUpLR": ref_cosine, "CosineWithRestartsAndWarmUpLR": ref_restarts,
              "PolynomialWithWarmUpLR": ref_polynomial, "WarmUpStableDecayLR": ref_wsd,
              "ConstantWithCoolDownLR": ref_cooldown}


# ----------------------------------------------------------------- values by hand

COS = math.cos
PI = math.pi

HAND_CASES = [
    ("ConstantWarmUpLR", 20, {"warmup_steps": 4, "warmup_lr_init": 1e-4},
     {0: 1e-4, 1: 3.25e-4, 3: 7.75e-4, 4: 1e-3, 19: 1e-3, 20: 1e-3, 500: 1e-3}),
    ("ConstantWarmUpLR", 20, {"warmup_steps": 0}, {0: 1e-3, 19: 1e-3}),
    ("LinearWithWarmUpLR", 110, {"warmup_steps": 10},
     {0: 0.0, 5: 5e-4, 9: 9e-4, 10: 1e-3, 60: 5e-4, 109: 1e-5, 110: 0.0, 200: 0.0}),
    ("CosineWithWarmUpLR", 110, {"warmup_steps": 10, "lr_end": 1e-4},
     {0: 0.0, 5: 5e-4, 10: 1e-3, 35: 1e-4 + 9e-4 * (0.5 + math.sqrt(2) / 4),
      60: 5.5e-4, 109: 1e-4 + 9e-4 * 0.5 * (1 + COS(PI * 0.99)), 110: 1e-4, 300: 1e-4}),
    ("CosineWithWarmUpLR", 110, {"warmup_steps": 10, "decay_steps": 80},
     {79: 1e-3 * 0.5 * (1 + COS(PI * 0.69)), 80: 0.0, 100: 0.0}),
    ("CosineWithWarmUpLR", 100, {"decay_steps": 150, "lr_end": 1e-5},  # past total: lr_end
     {0: 1e-3, 50: 5.05e-4, 99: 1e-5 + 9.9e-4 * 0.5 * (1 + COS(PI * 0.99)), 100: 1e-5,
      120: 1e-5, 150: 1e-5}),
    ("CosineWithRestartsAndWarmUpLR", 100, {"warmup_steps": 0, "num_cycles": 2.0},
     {0: 1e-3, 25: 5e-4, 49: 1e-3 * 0.5 * (1 + COS(PI * 0.98)), 50: 1e-3, 75: 5e-4,
      99: 1e-3 * 0.5 * (1 + COS(PI * 0.98)), 100: 0.0, 150: 0.0}),
    ("CosineWithRestartsAndWarmUpLR", 100,  # past total, before decay_steps: lr_end, not 0
     {"warmup_steps": 0, "decay_steps": 200, "lr_end": 2e-4}, {100: 2e-4, 199: 2e-4}),
    ("PolynomialWithWarmUpLR", 110, {"warmup_steps": 10, "lr_end": 1e-4, "power": 2.0},
     {0: 0.0, 10: 1e-3, 60: 3.25e-4, 85: 1e-4 + 9e-4 / 16, 110: 1e-4, 111: 1e-4}),
    ("PolynomialWithWarmUpLR", 110,  # decay shorter than the run: hold lr_end, no rebound
     {"warmup_steps": 10, "lr_end": 1e-4, "power": 2.0, "decay_steps": 50},
     {35: 1e-4 + 9e-4 / 4, 60: 1e-4, 85: 1e-4, 110: 1e-4}),
    ("PolynomialWithWarmUpLR", 110,  # fractional power past the decay: no complex, no NaN
     {"warmup_steps": 10, "lr_end": 1e-4, "power": 0.5, "decay_steps": 50},
     {35: 1e-4 + 9e-4 * math.sqrt(0.5), 90: 1e-4}),
    ("WarmUpStableDecayLR", 110, {"warmup_steps": 10, "decay_start_steps": 60, "lr_end": 1e-4},
     {0: 0.0, 10: 1e-3, 59: 1e-3, 60: 1e-3, 85: 5.5e-4, 109: 1e-3 - 9e-4 * 49 / 50,
      110: 1e-4, 200: 1e-4}),
    ("ConstantWithCoolDownLR", 200,
     {"warmup_steps": 10, "keep_steps": 20, "decay_steps": 40, "lr_end1": 1e-4,
      "final_steps": 10, "lr_end2": 1e-5},
     {0: 0.0, 9: 9e-4, 10: 1e-3, 29: 1e-3, 30: 1e-3, 50: 5.5e-4,
      69: 1e-4 + 9e-4 * 0.5 * (1 + COS(PI * 39 / 40)), 70: 1e-4, 79: 1e-4, 80: 1e-5,
      1000: 1e-5}),
    ("ConstantWithCoolDownLR", 100, {"warmup_steps": 0, "decay_ratio": 0.5, "lr_end1": 1e-4},
     {0: 1e-3, 25: 5.5e-4, 50: 1e-4, 99: 1e-4}),
]


@pytest.mark.parametrize(("type_", "total", "extras", "expected"), HAND_CASES,
                         ids=[f"{c[0]}-{i}" for i, c in enumerate(HAND_CASES)])
def test_values_worked_out_by_hand(type_, total, extras, expected) -> None:
    schedule = build(type_, total, 1e-3, **extras)
    reference = REFERENCES[type_]
    for step, value in expected.items():
        assert schedule(step) == pytest.approx(value, rel=1e-12, abs=1e-18), step
        assert reference(step, 1e-3, total, extras) == pytest.approx(value, rel=1e-12,
                                                                     abs=1e-18), step


# ----------------------------------------------------------------- against the references


def boundaries(total: int, *marks: int) -> list[int]:
    points = {0, 1, total - 1, total, total + 1, 2 * total}
    for mark in marks:
        points |= {mark - 1, mark, mark + 1}
    return sorted(p for p in points if p >= 0)


FORMULA_CASES = [
    ("ConstantWarmUpLR", 50, {"warmup_ratio": 0.2, "warmup_lr_init": 2e-4}),
    ("LinearWithWarmUpLR", 50, {"warmup_steps": 7, "warmup_lr_init": 1e-5}),
    ("LinearWithWarmUpLR", 5, {"warmup_steps": 9}),  # warm-up longer than the run
    ("CosineWithWarmUpLR", 80, {"warmup_ratio": 0.1, "num_cycles": 1.5, "lr_end": 3e-5,
                                "decay_ratio": 0.9}),
    ("CosineWithRestartsAndWarmUpLR", 90, {"warmup_steps": 9, "num_cycles": 3.0,
                                           "lr_end": 1e-5, "decay_steps": 70}),
    ("PolynomialWithWarmUpLR", 60, {"warmup_ratio": 0.25, "power": 3.0, "decay_steps": 70}),
    ("WarmUpStableDecayLR", 60, {"warmup_steps": 6, "decay_start_ratio": 0.7}),
    ("WarmUpStableDecayLR", 60, {"warmup_steps": 6, "decay_start_steps": 3}),
    ("ConstantWithCoolDownLR", 100, {"warmup_ratio": 0.05, "keep_steps": 5, "decay_steps": 30,
                                     "num_cycles": 1.0, "lr_end1": 1e-5, "final_steps": 7}),
]


@pytest.mark.parametrize(("type_", "total", "extras"), FORMULA_CASES,
                         ids=[f"{c[0]}-{i}" for i, c in enumerate(FORMULA_CASES)])
def test_matches_the_formula_at_every_step(type_, total, extras) -> None:
    schedule = build(type_, total, 1e-3, **extras)
    for step in range(3 * total):
        expected = REFERENCES[type_](step, 1e-3, total, extras)
        assert schedule(step) == pytest.approx(expected, rel=1e-12, abs=1e-18), step


def test_boundaries_of_every_phase() -> None:
    extras = {"warmup_steps": 10, "keep_steps": 5, "decay_steps": 20, "final_steps": 5,
              "lr_end1": 1e-4, "lr_end2": 5e-5}
    schedule = build("ConstantWithCoolDownLR", 100, **extras)
    for step in boundaries(100, 10, 15, 35, 40):
        expected = ref_cooldown(step, 1e-3, 100, extras)
        assert schedule(step) == pytest.approx(expected, rel=1e-12, abs=1e-18), step


def test_the_seven_are_registered_under_their_mindformers_names() -> None:
    assert set(SEVEN) <= set(LR_SCHEDULERS.names())
    for name in SEVEN:
        assert LR_SCHEDULERS.get(name, ("lr_scheduler", "type")).name == name


def test_null_type_is_the_constant_learning_rate() -> None:
    schedule = build(None, 10, lr=3e-4)
    assert [schedule(s) for s in (0, 9, 10, 10_000)] == [3e-4] * 4
    assert schedule.describe() == "constant learning rate 0.0003"


def test_rates_are_python_floats_and_steps_integers() -> None:
    schedule = build("LinearWithWarmUpLR", 10, warmup_steps=2)
    assert type(schedule(1)) is float
    with pytest.raises(ValueError, match=r"step must be >= 0 .*got -1"):
        schedule(-1)
    with pytest.raises(TypeError):
        schedule(1.5)  # type: ignore[arg-type]


# ----------------------------------------------------------------- ratios and total_steps


def test_warmup_ratio_overrides_warmup_steps() -> None:
    schedule = build("ConstantWarmUpLR", 100, warmup_steps=50, warmup_ratio=0.1)
    assert schedule.warmup_steps == 10
    assert schedule(9) == pytest.approx(9e-4)
    assert schedule(10) == 1e-3


def test_ratio_uses_the_decimal_written() -> None:
    # int(100 * 0.29) is 28 in float arithmetic; the user meant 29 steps.
    schedule = build("ConstantWarmUpLR", 100, warmup_ratio=0.29)
    assert schedule.warmup_steps == 29
    assert schedule(28) < 1e-3 == schedule(29)


@pytest.mark.parametrize(("type_", "extras", "attribute", "value"), [
    ("CosineWithWarmUpLR", {"decay_steps": 90, "decay_ratio": 0.5}, "decay_steps", 100),
    ("WarmUpStableDecayLR", {"warmup_steps": 0, "decay_start_steps": 10,
                             "decay_start_ratio": 0.75}, "decay_start", 150),
    ("ConstantWithCoolDownLR", {"warmup_steps": 0, "decay_steps": 10, "decay_ratio": 0.25},
     "decay_steps", 50),
])
def test_other_ratios_override_their_counts(type_, extras, attribute, value) -> None:
    assert getattr(build(type_, 200, **extras), attribute) == value


def test_yaml_total_steps_overrides_the_trainer_and_validation_warns_when_shorter(
        tmp_path) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # building says nothing: validation did
        schedule = build("LinearWithWarmUpLR", 100, warmup_steps=0, total_steps=50)
    assert schedule(25) == pytest.approx(5e-4)
    assert schedule(50) == 0.0
    path = tmp_path / "train.yaml"
    path.write_text("model: {model_type: qwen3, vocab_size: 8, hidden_size: 8, "
                    "intermediate_size: 8, num_hidden_layers: 1, num_attention_heads: 2}\n"
                    "train_dataset:\n  dataloader:\n    type: Mock\n"
                    "training:\n  global_batch_size: 1\n  steps: 100\nlr_scheduler:\n"
                    "  type: LinearWithWarmUpLR\n  warmup_steps: 0\n  total_steps: 50\n")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        load_config(path)
    [warning] = caught
    assert warning.category is ConfigWarning
    assert str(warning.message) == (
        f"{path}:11: lr_scheduler.total_steps: warning: the schedule (50 steps) is shorter "
        "than training.steps (100): the rate holds its final value from step 50 on")


WARMUP_YAML = ("model: {{model_type: qwen3, vocab_size: 8, hidden_size: 8, intermediate_size: 8, "
               "num_hidden_layers: 1, num_attention_heads: 2}}\n"
               "train_dataset:\n  dataloader:\n    type: Mock\n"
               "training:\n  global_batch_size: 1\n  steps: {steps}\nlr_scheduler:\n"
               "  type: {type_}\n  learning_rate: 0.001\n  {key}: {value}\n")


@pytest.mark.parametrize(("type_", "key", "value", "schedule_steps"), [
    ("CosineWithWarmUpLR", "warmup_steps", 5, 2),       # longer than the run
    ("ConstantWarmUpLR", "warmup_steps", 4, 4),         # exactly as long
    ("LinearWithWarmUpLR", "warmup_ratio", 0.5, 8),     # of a schedule longer than the run
])
def test_a_warmup_that_outlasts_the_run_warns_at_validation(
        tmp_path, type_: str, key: str, value: float, schedule_steps: int) -> None:
    """The run never leaves warm-up (the schedule itself shows it: no step reaches the
    learning rate), so validation says where, with the line."""
    steps = 4 if key == "warmup_ratio" else schedule_steps
    extras = {key: value, **({"total_steps": schedule_steps} if key == "warmup_ratio" else {})}
    schedule = build(type_, schedule_steps if key == "warmup_ratio" else steps, **extras)
    assert all(schedule(step) < 1e-3 for step in range(steps))
    path = tmp_path / "train.yaml"
    text = WARMUP_YAML.format(steps=steps, type_=type_, key=key, value=value)
    if key == "warmup_ratio":
        text += f"  total_steps: {schedule_steps}\n"
    path.write_text(text)
    issues = [issue for issue in check_source(load_source(path))[1]
              if issue.path.startswith("lr_scheduler")]
    assert [(issue.path, issue.line, issue.severity) for issue in issues] == [
        (f"lr_scheduler.{key}", 11, "warning")]


def test_a_warmup_that_ends_within_the_run_is_silent(tmp_path) -> None:
    schedule = build("CosineWithWarmUpLR", 6, warmup_steps=5)
    assert schedule(5) == 1e-3  # the last step reaches the learning rate
    path = tmp_path / "train.yaml"
    path.write_text(WARMUP_YAML.format(steps=6, type_="CosineWithWarmUpLR", key="warmup_steps",
                                       value=5))
    assert [issue for issue in check_source(load_source(path))[1]
            if issue.path.startswith("lr_scheduler")] == []


def test_longer_yaml_total_steps_is_silent() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        schedule = build("LinearWithWarmUpLR", 100, warmup_steps=0, total_steps=200)
    assert schedule(100) == pytest.approx(5e-4)
    assert schedule.warmup_steps == 0


def test_ratios_use_the_overridden_total() -> None:
    assert build("ConstantWarmUpLR", 100, warmup_ratio=0.1, total_steps=300).warmup_steps == 30


@pytest.mark.parametrize("total", [0, -5, 2.0, True])
def test_trainer_total_steps_must_be_a_positive_integer(total) -> None:
    with pytest.raises(ValueError, match=r"total_steps \(training.steps\) must be a positive "
                                         "integer"):
        build_lr_schedule(LrSchedulerConfig(), total)


# ----------------------------------------------------------------- describe


@pytest.mark.parametrize(("type_", "extras", "text"), [
    ("ConstantWarmUpLR", {"warmup_steps": 10},
     "ConstantWarmUpLR: 0.001, warmup 10 steps from 0, then constant"),
    ("LinearWithWarmUpLR", {"warmup_steps": 0},
     "LinearWithWarmUpLR: 0.001, no warmup, linear to 0 at step 100"),
    ("CosineWithWarmUpLR", {"warmup_steps": 10, "warmup_lr_init": 1e-5},
     "CosineWithWarmUpLR: 0.001, warmup 10 steps from 1e-05, cosine (0.5 cycles) to 0 over "
     "steps 10-100"),
    ("CosineWithWarmUpLR", {"decay_steps": 80, "lr_end": 1e-5},
     "CosineWithWarmUpLR: 0.001, no warmup, cosine (0.5 cycles) to 1e-05 over steps 0-100, "
     "1e-05 from step 80"),
    ("CosineWithRestartsAndWarmUpLR", {"warmup_steps": 5, "num_cycles": 3},
     "CosineWithRestartsAndWarmUpLR: 0.001, warmup 5 steps from 0, cosine with restarts "
     "(3 cycles) to 0 over steps 5-100"),
    ("PolynomialWithWarmUpLR", {"warmup_steps": 10, "power": 2.0},
     "PolynomialWithWarmUpLR: 0.001, warmup 10 steps from 0, polynomial (power 2) to 1e-07 "
     "over 90 steps"),
    ("WarmUpStableDecayLR", {"warmup_steps": 10, "decay_start_ratio": 0.8},
     "WarmUpStableDecayLR: 0.001, warmup 10 steps from 0, stable until step 80, linear to "
     "1e-07 at step 100"),
    ("ConstantWithCoolDownLR", {"warmup_steps": 10, "keep_steps": 20, "decay_steps": 50,
                                "lr_end1": 1e-5, "final_steps": 10},
     "ConstantWithCoolDownLR: 0.001, warmup 10 steps from 0, keep until step 30, cosine to "
     "1e-05 over 50 steps, hold until step 90, then 1e-05"),
])
def test_describe_is_one_line_for_the_log(type_, extras, text) -> None:
    schedule = build(type_, 100, **extras)
    assert schedule.describe() == text
    assert repr(schedule) == f"<{text}>"


# ----------------------------------------------------------------- errors


@pytest.mark.parametrize(("key", "value", "message"), [
    ("warmup_ratio", 1.5, "lr_scheduler.warmup_ratio: must be <= 1, got 1.5"),
    ("warmup_ratio", -0.1, "lr_scheduler.warmup_ratio: must be >= 0, got -0.1"),
    ("decay_ratio", 2, "lr_scheduler.decay_ratio: must be <= 1, got 2"),
    ("warmup_steps", -1, "lr_scheduler.warmup_steps: must be >= 0, got -1"),
    ("decay_steps", -3, "lr_scheduler.decay_steps: must be >= 0, got -3"),
    ("lr_end", -1e-5, "lr_scheduler.lr_end: must be >= 0, got -1e-05"),
    ("num_cycles", -0.5, "lr_scheduler.num_cycles: must be >= 0, got -0.5"),
    ("total_steps", 0, "lr_scheduler.total_steps: must be positive, got 0"),
])
def test_bounds(key, value, message) -> None:
    assert message in problem("CosineWithWarmUpLR", **{key: value})


@pytest.mark.parametrize(("type_", "key", "value", "message"), [
    ("WarmUpStableDecayLR", "decay_start_ratio", 1.01,
     "lr_scheduler.decay_start_ratio: must be <= 1, got 1.01"),
    ("WarmUpStableDecayLR", "decay_start_steps", -1,
     "lr_scheduler.decay_start_steps: must be >= 0, got -1"),
    ("ConstantWithCoolDownLR", "keep_steps", -2, "lr_scheduler.keep_steps: must be >= 0, got -2"),
    ("ConstantWithCoolDownLR", "final_steps", -2,
     "lr_scheduler.final_steps: must be >= 0, got -2"),
    ("PolynomialWithWarmUpLR", "power", 0, "lr_scheduler.power: must be positive, got 0"),
])
def test_bounds_of_other_schedules(type_, key, value, message) -> None:
    assert message in problem(type_, warmup_steps=0, **{key: value})


@pytest.mark.parametrize("type_", ["PolynomialWithWarmUpLR", "WarmUpStableDecayLR"])
@pytest.mark.parametrize(("lr", "lr_end", "shown"), [
    (1e-4, 1e-3, "got 0.001"), (1e-4, 1e-4, "got 0.0001"), (1e-8, None, "got 1e-07")])
def test_lr_end_must_be_below_learning_rate(type_, lr, lr_end, shown) -> None:
    extras = {"warmup_steps": 0, "decay_start_steps": 0}
    if type_ == "PolynomialWithWarmUpLR":
        del extras["decay_start_steps"]
    if lr_end is not None:
        extras["lr_end"] = lr_end
    text = problem(type_, lr=lr, **extras)
    assert (f"lr_scheduler.lr_end: must be smaller than learning_rate ({lr:g}) for {type_}, "
            f"{shown} (default 1e-07)") in text


@pytest.mark.parametrize("type_", ["ConstantWarmUpLR", "LinearWithWarmUpLR",
                                   "CosineWithRestartsAndWarmUpLR", "PolynomialWithWarmUpLR",
                                   "WarmUpStableDecayLR", "ConstantWithCoolDownLR"])
def test_missing_warmup(type_) -> None:
    others = {"WarmUpStableDecayLR": {"decay_start_steps": 0},
              "ConstantWithCoolDownLR": {"decay_steps": 10}}
    text = problem(type_, **others.get(type_, {}))
    assert text.startswith("1 problem in the configuration:")
    assert (f"lr_scheduler.warmup_steps: required by {type_}: give warmup_steps (an integer "
            ">= 0) or warmup_ratio (a fraction of total_steps, in [0, 1])") in text


def test_cosine_needs_no_warmup() -> None:
    assert build("CosineWithWarmUpLR", 10).warmup_steps == 0


def test_missing_decay_start_and_decay() -> None:
    assert ("lr_scheduler.decay_start_steps: required by WarmUpStableDecayLR: give "
            "decay_start_steps (an integer >= 0) or decay_start_ratio") in problem(
                "WarmUpStableDecayLR", warmup_steps=0)
    assert ("lr_scheduler.decay_steps: required by ConstantWithCoolDownLR: give decay_steps "
            "(an integer >= 0) or decay_ratio") in problem("ConstantWithCoolDownLR",
                                                           warmup_steps=0)


def test_every_problem_is_listed_at_once() -> None:
    text = problem("WarmUpStableDecayLR", lr=1e-8)
    assert text.startswith("3 problems in the configuration:")
    for key in ("warmup_steps", "lr_end", "decay_start_steps"):
        assert f"lr_scheduler.{key}:" in text


def test_unknown_key_suggests_the_near_name() -> None:
    text = problem("CosineWithWarmUpLR", warmup_step=10)
    assert ("lr_scheduler.warmup_step: Unknown configuration keys for learning-rate scheduler "
            "type 'CosineWithWarmUpLR': ['warmup_step']; did you mean 'warmup_steps'?") in text


def test_unknown_key_lists_the_allowed_keys() -> None:
    text = problem("ConstantWarmUpLR", warmup_steps=1, lr_end=0.0)
    assert ("lr_scheduler.lr_end: Unknown configuration keys for learning-rate scheduler type "
            "'ConstantWarmUpLR'") in text
    assert ("allowed keys: warmup_steps, warmup_ratio, warmup_lr_init, total_steps, type, "
            "learning_rate") in text


@pytest.mark.parametrize(("type_", "floor"), [("CosineWithWarmUpLR", "lr_end"),
                                              ("ConstantWithCoolDownLR", "lr_end1")])
def test_min_lr_points_to_the_floor(type_, floor) -> None:
    text = problem(type_, warmup_steps=0, decay_steps=1, min_lr=1e-5)
    assert "lr_scheduler.min_lr: Unknown configuration keys" in text
    assert text.endswith(f"; MindFormers schedules have no min_lr; the floor is {floor}")


@pytest.mark.parametrize(("key", "value", "message"), [
    ("warmup_steps", "10", "lr_scheduler.warmup_steps: expected an integer or null, got '10' "
                           "(a string)"),
    ("warmup_steps", 2.5, "lr_scheduler.warmup_steps: expected an integer or null, got 2.5 "
                          "(a number)"),
    ("lr_end", "small", "lr_scheduler.lr_end: expected a number, got 'small' (a string)"),
    ("num_cycles", True, "lr_scheduler.num_cycles: expected a number, got True (a boolean)"),
    ("warmup_ratio", [0.1], "lr_scheduler.warmup_ratio: expected a number or null, got a list"),
])
def test_wrong_types(key, value, message) -> None:
    assert message in problem("CosineWithWarmUpLR", **{key: value})


def test_unknown_type_lists_the_registered_names() -> None:
    text = problem("CosineWarmup")
    assert "lr_scheduler.type: unknown lr_scheduler type 'CosineWarmup'; registered: " in text
    for name in SEVEN:
        assert name in text


def test_a_class_without_settings_is_not_a_schedule() -> None:
    assert ("lr_scheduler.type: 'math:floor' is not an mf learning-rate schedule: it declares "
            "no Settings class") in problem("math:floor")


def test_scheduler_keys_need_a_type() -> None:
    text = problem(None, warmup_steps=10)
    assert ("lr_scheduler.warmup_steps: is a scheduler key, but lr_scheduler.type is null (a "
            "constant learning_rate); set type to one of ConstantWarmUpLR, ") in text


def test_errors_carry_the_yaml_line(tmp_path) -> None:
    path = tmp_path / "train.yaml"
    path.write_text("model: {model_type: qwen3, vocab_size: 8, hidden_size: 8, "
                    "intermediate_size: 8, num_hidden_layers: 1, num_attention_heads: 2}\n"
                    "# a complete Qwen3\n"
                    "train_dataset:\n  dataloader:\n    type: Mock\n"
                    "training:\n  global_batch_size: 1\nlr_scheduler:\n"
                    "  type: PolynomialWithWarmUpLR\n  learning_rate: 1.e-4\n"
                    "  warmup_steps: 3\n  lr_end: 1.e-3\n")
    with pytest.raises(ConfigError) as info:  # found when the file is validated
        load_config(path)
    [issue] = info.value.errors
    assert (issue.path, issue.line) == ("lr_scheduler.lr_end", 12)
    assert str(issue).startswith(f"{path}:12: lr_scheduler.lr_end: must be smaller than")
    config = config_from_source(load_source(path, ["lr_scheduler.lr_end=1.e-5"]))
    assert build_lr_schedule(config.lr_scheduler, config.training.steps)(3) == 1e-4


# ----------------------------------------------------------------- third-party schedules


class HalvingLR(LrSchedule):
    """A schedule from outside mf, loaded by `module:Class` (the entry-point contract)."""

    Settings = LR_SCHEDULERS.get("ConstantWarmUpLR", ("t",)).Settings
    name = "HalvingLR"

    def __init__(self, learning_rate, settings, total_steps):
        self.learning_rate, self.total_steps = learning_rate, total_steps

    def rate(self, step):
        return self.learning_rate / 2 ** (step // 10)

    def describe(self):
        return "halving"


def test_module_class_schedules_follow_the_same_contract() -> None:
    schedule = build(f"{__name__}:HalvingLR", 30, lr=1.0, total_steps=40)
    assert [schedule(s) for s in (0, 10, 25)] == [1.0, 0.5, 0.25]
    assert schedule.total_steps == 40


# ----------------------------------------------------------------- properties

rates = st.floats(1e-6, 1e-2)
fractions = st.floats(0, 1)


@st.composite
def decaying_configs(draw) -> tuple[str, float, int, dict]:
    """A random decaying schedule: (type, learning_rate, total_steps, extras)."""
    type_ = draw(st.sampled_from(SEVEN[1:]))
    lr = draw(rates)
    total = draw(st.integers(1, 120))
    extras: dict[str, Any] = {"warmup_lr_init": draw(st.floats(0, 2e-2))}
    if draw(st.booleans()):
        extras["warmup_ratio"] = draw(fractions)
    else:
        extras["warmup_steps"] = draw(st.integers(0, 150))
    end = draw(st.floats(0, 0.999)) * lr
    if type_ in ("CosineWithWarmUpLR", "CosineWithRestartsAndWarmUpLR"):
        extras |= {"lr_end": end, "num_cycles": draw(st.floats(0, 4)),
                   "decay_steps": draw(st.none() | st.integers(0, 200))}
    if type_ == "PolynomialWithWarmUpLR":
        extras |= {"lr_end": end, "power": draw(st.floats(0.1, 4)),
                   "decay_steps": draw(st.none() | st.integers(0, 200))}
    if type_ == "WarmUpStableDecayLR":
        extras |= {"lr_end": end, "decay_start_steps": draw(st.integers(0, 150))}
    if type_ == "ConstantWithCoolDownLR":
        end2 = draw(st.none() | st.floats(0, 2).map(lambda x: x * lr))
        extras |= {"lr_end1": end, "lr_end2": end2, "keep_steps": draw(st.integers(0, 50)),
                   "decay_steps": draw(st.integers(0, 100)),
                   "final_steps": draw(st.integers(0, 50)), "num_cycles": draw(st.floats(0, 2))}
    return type_, lr, total, extras


@settings(max_examples=150, deadline=None)
@given(decaying_configs())
def test_property_rate_stays_between_floor_and_peak(case) -> None:
    type_, lr, total, extras = case
    schedule = build(type_, total, lr, **extras)
    floor_keys = ("lr_end", "lr_end1", "lr_end2", "warmup_lr_init")
    values = [extras[k] for k in floor_keys if extras.get(k) is not None]
    low = min([0.0 if type_ == "LinearWithWarmUpLR" else lr, *values])
    high = max(lr, extras["warmup_lr_init"], extras.get("lr_end2") or 0.0)
    for step in range(2 * total + 160):
        value = schedule(step)
        assert low - 1e-15 <= value <= high + 1e-15, (step, value)
        reference = REFERENCES[type_](step, lr, total, extras)
        assert value == pytest.approx(reference, rel=1e-12, abs=1e-18), step


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(["LinearWithWarmUpLR", "PolynomialWithWarmUpLR", "WarmUpStableDecayLR",
                        "CosineWithWarmUpLR"]), rates, st.integers(1, 200),
       st.integers(0, 50), st.integers(0, 50))
def test_property_never_rises_after_warmup(type_, lr, total, warmup, stable) -> None:
    extras = {"warmup_steps": warmup, "decay_start_steps": warmup + stable}
    if type_ != "WarmUpStableDecayLR":
        del extras["decay_start_steps"]
    schedule = build(type_, total, lr, **extras)
    after = [schedule(s) for s in range(warmup, 2 * total + 1)]
    assert all(b <= a + 1e-18 for a, b in itertools.pairwise(after))
    if warmup < total:
        assert schedule(warmup) == pytest.approx(lr)  # warm-up ends exactly at the peak


@given(st.floats(0, 1, allow_nan=False), st.integers(1, 10**9))
def test_floor_of_ratio_is_exact_on_the_written_decimal(ratio: float, total: int) -> None:
    assert floor_of_ratio(ratio, total) == math.floor(Fraction(repr(ratio)) * total)
