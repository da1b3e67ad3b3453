"""Learning-rate schedules: `lr_scheduler` -> a pure function of the optimizer step.

`build_lr_schedule(config, total_steps)` (below) returns an `LrSchedule`;
`schedule(step)` is the rate for the update after `step` updates (0 for the first:
MindFormers evaluates `lr(global_step)` before incrementing it). The trainer passes the float
to the optimizer each step, so a schedule is plain Python: exact (float64, where MindFormers
computes in float32 and differs by ~1e-7 relative), cheap, and testable without MindSpore.
Its state is the step count alone, which the optimizer checkpoint already holds.

The seven schedules are MindFormers' (`mindformers/core/lr/lr_schedule.py`), registered in
`LR_SCHEDULERS` under their class names, with the same parameters, defaults and formulas.
Shared rules:
* Warm-up: while `step < warmup_steps`,
  `lr = warmup_lr_init + (learning_rate - warmup_lr_init) * step / warmup_steps`.
* A `*_ratio` overrides its step count: `warmup_ratio` -> `warmup_steps`, `decay_ratio` ->
  `decay_steps`, `decay_start_ratio` -> `decay_start_steps`, each `floor(total_steps * ratio)`.
* A step count whose MindFormers default is None (`warmup_steps` everywhere but
  CosineWithWarmUpLR, `decay_start_steps`, ConstantWithCoolDownLR's `decay_steps`) is
  required: give it or its ratio (MindFormers raises a TypeError on None).
* `total_steps` is `training.steps`, passed by the trainer. A `total_steps` written under
  `lr_scheduler` overrides it, so the schedule can span more or fewer steps than one run (a
  run that is the first part of a longer schedule; Megatron's `lr_decay_iters`). MindFormers'
  trainer silently overwrites that key; here it takes effect, and a schedule shorter than
  the run warns (`ConfigWarning`), since it then holds its final rate.
* There is no `min_lr`: the floor is `lr_end` (`lr_end1` for ConstantWithCoolDownLR); an
  unknown `min_lr` key says so.

Where MindFormers' formula misbehaves this module does the evident intent instead:
* Ratios use the decimal value written: `floor(100 * 0.29)` is 29 here, 28 in MindFormers
  (`int(100 * 0.29)` truncates the float product 28.999999999999996).
* CosineWithWarmUpLR with `decay_steps > total_steps`: MindFormers keeps evaluating the
  cosine past `total_steps`, so the rate rises again; here it holds `lr_end` from
  `total_steps` on.
* CosineWithRestartsAndWarmUpLR past `total_steps` (before `decay_steps`): MindFormers
  returns 0, not `lr_end`; here `lr_end`.
* PolynomialWithWarmUpLR with `decay_steps < total_steps - warmup_steps`: MindFormers raises
  a negative base to `power` after the decay (below `lr_end`, or NaN for a fractional power);
  here the remaining fraction is clamped at 0, so the rate holds `lr_end`. `power` must be > 0.
* WarmUpStableDecayLR past `total_steps`: MindFormers' linear decay is not clamped and goes
  below `lr_end` (negative eventually); here it holds `lr_end`. `decay_start_steps >=
  total_steps` (a zero or negative decay length in MindFormers) means no decay before
  `total_steps`.
Rates and step counts are checked non-negative (MindFormers does not check).

The keys of each schedule, and which of them it requires or bounds by the learning rate, are
in `settings.lr_schedules` (MindSpore-free, declared to mf-config through entry points, so
that `mf-config validate` checks them and how they fit together without importing this
module).
"""

import math
import operator
from typing import Any, ClassVar

from mf_config import LrSchedulerConfig
from mf_config.component_settings import settings_error, structure_settings
from mf_config.sections import Section, declared_fields
from mf_config.yaml_source import Source

from ..registry import LR_SCHEDULERS
from ..settings.lr_schedules import (
    WARMUP,
    ConstantWarmUpLRSettings,
    ConstantWithCoolDownLRSettings,
    CosineWithRestartsAndWarmUpLRSettings,
    CosineWithWarmUpLRSettings,
    LinearWithWarmUpLRSettings,
    PolynomialWithWarmUpLRSettings,
    WarmupSettings,
    WarmUpStableDecayLRSettings,
    number,
)

PATH = ("lr_scheduler",)


# ----------------------------------------------------------------------------- schedules


class SettingProblems(ValueError):
    """Settings that are well-typed but do not fit together: (key, message) pairs, keys
    relative to `lr_scheduler`. `build_lr_schedule` reports them as a `ConfigError`."""

    def __init__(self, found: list[tuple[str, str]]):
        self.found = found
        super().__init__("; ".join(f"{key}: {message}" for key, message in found))


class LrSchedule:
    """The learning rate as a function of the optimizer updates already done.

    A registered schedule class declares `Settings` (its `Section` of keys under
    `lr_scheduler`) and is built as `cls(learning_rate, settings, total_steps)`, raising
    `SettingProblems` for settings that do not fit together; it implements `rate(step)` and
    `describe()`. Entry-point schedules (`mf_train.lr_schedulers`) follow the same contract.
    """

    Settings: ClassVar[type[Section]]
    name: ClassVar[str] = "LrSchedule"
    """The name in the log: the class name unless a class sets its own."""

    learning_rate: float
    total_steps: int
    warmup_steps: int = 0
    warmup_lr_init: float = 0.0

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.name = cls.__dict__.get("name", cls.__name__)

    def __init__(self, learning_rate: float, settings: WarmupSettings, total_steps: int):
        """Check that the settings fit (`SettingProblems` otherwise) and set the fields every
        warm-up schedule has."""
        found = settings.fit_problems(learning_rate, total_steps)
        if found:
            raise SettingProblems(found)
        self.learning_rate = learning_rate
        self.total_steps = total_steps
        self.warmup_lr_init = settings.warmup_lr_init
        self.warmup_steps = settings.steps(*WARMUP, total_steps) or 0

    def __call__(self, step: int) -> float:
        """The rate for the update after `step` updates (`step >= 0`)."""
        step = operator.index(step)
        if step < 0:
            raise ValueError(f"step must be >= 0 (optimizer updates already done), got {step}")
        return float(self.rate(step))

    def rate(self, step: int) -> float:
        raise NotImplementedError

    def describe(self) -> str:
        """One line for the trainer's start-up log."""
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"<{self.describe()}>"

    def in_warmup(self, step: int) -> bool:
        return step < self.warmup_steps

    def warmup_rate(self, step: int) -> float:
        """Linear from `warmup_lr_init` at step 0 towards `learning_rate` at `warmup_steps`."""
        fraction = step / self.warmup_steps
        return self.warmup_lr_init + (self.learning_rate - self.warmup_lr_init) * fraction

    def head(self) -> str:
        """`Name: rate, warmup ...`: the start of every `describe()`."""
        if self.warmup_steps == 0:
            return f"{self.name}: {number(self.learning_rate)}, no warmup"
        return (f"{self.name}: {number(self.learning_rate)}, warmup {self.warmup_steps} steps "
                f"from {number(self.warmup_lr_init)}")


class ConstantLR(LrSchedule):
    """`type: null`: `learning_rate` at every step."""

    name = "constant"

    def __init__(self, learning_rate: float):
        self.learning_rate = learning_rate

    def rate(self, step: int) -> float:
        return self.learning_rate

    def describe(self) -> str:
        return f"constant learning rate {number(self.learning_rate)}"


@LR_SCHEDULERS.register("ConstantWarmUpLR")
class ConstantWarmUpLR(LrSchedule):
    """Warm-up, then `learning_rate`."""

    Settings = ConstantWarmUpLRSettings

    def rate(self, step: int) -> float:
        if self.in_warmup(step):
            return self.warmup_rate(step)
        return self.learning_rate

    def describe(self) -> str:
        return f"{self.head()}, then constant"


@LR_SCHEDULERS.register("LinearWithWarmUpLR")
class LinearWithWarmUpLR(LrSchedule):
    """Warm-up, then `learning_rate * max(0, (total - t) / max(1, total - warmup))`."""

    Settings = LinearWithWarmUpLRSettings

    def __init__(self, learning_rate: float, settings: LinearWithWarmUpLRSettings,
                 total_steps: int):
        super().__init__(learning_rate, settings, total_steps)
        self.linear_steps = max(1, total_steps - self.warmup_steps)

    def rate(self, step: int) -> float:
        if self.in_warmup(step):
            return self.warmup_rate(step)
        return self.learning_rate * max(0.0, (self.total_steps - step) / self.linear_steps)

    def describe(self) -> str:
        return f"{self.head()}, linear to 0 at step {self.total_steps}"


@LR_SCHEDULERS.register("CosineWithWarmUpLR")
class CosineWithWarmUpLR(LrSchedule):
    """Warm-up, then `lr_end + (lr - lr_end) * max(0, 0.5 * (1 + cos(2 pi num_cycles p)))`
    with `p = (t - warmup) / max(1, total - warmup)`; `lr_end` from `decay_steps` (default
    total_steps) on, and from total_steps on."""

    Settings = CosineWithWarmUpLRSettings
    decay_ratio_key: ClassVar[str | None] = "decay_ratio"

    def __init__(self, learning_rate: float, settings: Any, total_steps: int):
        super().__init__(learning_rate, settings, total_steps)
        decay_steps = settings.steps("decay_steps", self.decay_ratio_key, total_steps)
        self.decay_steps = max(1, total_steps if decay_steps is None else decay_steps)
        self.cosine_steps = max(1, total_steps - self.warmup_steps)
        self.num_cycles = settings.num_cycles
        self.lr_end = settings.lr_end

    def rate(self, step: int) -> float:
        if step >= self.decay_steps:
            return self.lr_end
        if self.in_warmup(step):
            return self.warmup_rate(step)
        progress = (step - self.warmup_steps) / self.cosine_steps
        if progress >= 1:
            return self.lr_end
        return self.lr_end + (self.learning_rate - self.lr_end) * self.fraction(progress)

    def fraction(self, progress: float) -> float:
        return max(0.0, 0.5 * (1.0 + math.cos(math.pi * self.num_cycles * 2.0 * progress)))

    def describe(self) -> str:
        end = min(self.decay_steps, self.total_steps)
        cut = f", {number(self.lr_end)} from step {end}" if end < self.total_steps else ""
        return (f"{self.head()}, {self.curve()} ({number(self.num_cycles)} cycles) to "
                f"{number(self.lr_end)} over steps {self.warmup_steps}-{self.total_steps}{cut}")

    def curve(self) -> str:
        return "cosine"


@LR_SCHEDULERS.register("CosineWithRestartsAndWarmUpLR")
class CosineWithRestartsAndWarmUpLR(CosineWithWarmUpLR):
    """As CosineWithWarmUpLR, with `fraction = max(0, 0.5 * (1 + cos(pi * ((num_cycles * p)
    mod 1))))`: each of the num_cycles half-waves restarts at learning_rate."""

    Settings = CosineWithRestartsAndWarmUpLRSettings
    decay_ratio_key = None

    def fraction(self, progress: float) -> float:
        return max(0.0, 0.5 * (1.0 + math.cos(math.pi * ((self.num_cycles * progress) % 1.0))))

    def curve(self) -> str:
        return "cosine with restarts"


@LR_SCHEDULERS.register("PolynomialWithWarmUpLR")
class PolynomialWithWarmUpLR(LrSchedule):
    """Warm-up, then `(lr - lr_end) * max(0, 1 - (t - warmup) / decay_steps) ** power +
    lr_end`, `decay_steps` defaulting to `max(1, total - warmup)`; `lr_end` past total_steps."""

    Settings = PolynomialWithWarmUpLRSettings

    def __init__(self, learning_rate: float, settings: PolynomialWithWarmUpLRSettings,
                 total_steps: int):
        super().__init__(learning_rate, settings, total_steps)
        self.lr_end = settings.lr_end
        default_decay = total_steps - self.warmup_steps
        decay_steps = settings.decay_steps
        self.decay_steps = max(1, default_decay if decay_steps is None else decay_steps)
        self.power = settings.power

    def rate(self, step: int) -> float:
        if step > self.total_steps:
            return self.lr_end
        if self.in_warmup(step):
            return self.warmup_rate(step)
        remaining = max(0.0, 1.0 - (step - self.warmup_steps) / self.decay_steps)
        return (self.learning_rate - self.lr_end) * remaining ** self.power + self.lr_end

    def describe(self) -> str:
        return (f"{self.head()}, polynomial (power {number(self.power)}) to "
                f"{number(self.lr_end)} over {self.decay_steps} steps")


@LR_SCHEDULERS.register("WarmUpStableDecayLR")
class WarmUpStableDecayLR(LrSchedule):
    """Warm-up, `learning_rate` while `t < decay_start`, then `lr - (lr - lr_end) *
    (t - decay_start) / (total - decay_start)`; `lr_end` from total_steps on."""

    Settings = WarmUpStableDecayLRSettings

    def __init__(self, learning_rate: float, settings: WarmUpStableDecayLRSettings,
                 total_steps: int):
        super().__init__(learning_rate, settings, total_steps)
        self.lr_end = settings.lr_end
        self.decay_start = settings.steps("decay_start_steps", "decay_start_ratio", total_steps)
        self.decay_steps = max(1, total_steps - self.decay_start)

    def rate(self, step: int) -> float:
        if step >= self.total_steps:
            return self.lr_end
        if self.in_warmup(step):
            return self.warmup_rate(step)
        if step < self.decay_start:
            return self.learning_rate
        fraction = (step - self.decay_start) / self.decay_steps
        return self.learning_rate - (self.learning_rate - self.lr_end) * fraction

    def describe(self) -> str:
        return (f"{self.head()}, stable until step {self.decay_start}, linear to "
                f"{number(self.lr_end)} at step {self.total_steps}")


@LR_SCHEDULERS.register("ConstantWithCoolDownLR")
class ConstantWithCoolDownLR(LrSchedule):
    """Warm-up; `learning_rate` for keep_steps; cosine `lr_end1 + (lr - lr_end1) *
    max(0, 0.5 * (1 + cos(2 pi num_cycles p)))` over decay_steps; lr_end1 for final_steps;
    then lr_end2 (default lr_end1)."""

    Settings = ConstantWithCoolDownLRSettings

    def __init__(self, learning_rate: float, settings: ConstantWithCoolDownLRSettings,
                 total_steps: int):
        super().__init__(learning_rate, settings, total_steps)
        decay_steps = settings.steps("decay_steps", "decay_ratio", total_steps)
        self.decay_start = self.warmup_steps + settings.keep_steps
        self.decay_steps = decay_steps
        self.final_start = self.decay_start + decay_steps
        self.final_end = self.final_start + settings.final_steps
        self.num_cycles = settings.num_cycles
        self.lr_end1 = settings.lr_end1
        self.lr_end2 = settings.lr_end1 if settings.lr_end2 is None else settings.lr_end2

    def rate(self, step: int) -> float:
        if self.in_warmup(step):
            return self.warmup_rate(step)
        if step < self.decay_start:
            return self.learning_rate
        if step < self.final_start:
            progress = (step - self.decay_start) / self.decay_steps
            cosine = 0.5 * (1.0 + math.cos(math.pi * self.num_cycles * 2.0 * progress))
            return self.lr_end1 + (self.learning_rate - self.lr_end1) * max(0.0, cosine)
        if step < self.final_end:
            return self.lr_end1
        return self.lr_end2

    def describe(self) -> str:
        return (f"{self.head()}, keep until step {self.decay_start}, cosine to "
                f"{number(self.lr_end1)} over {self.decay_steps} steps, hold until step "
                f"{self.final_end}, then {number(self.lr_end2)}")


# ----------------------------------------------------------------------------- building


def build_lr_schedule(config: LrSchedulerConfig, total_steps: int,
                      source: Source | None = None) -> LrSchedule:
    """The learning-rate schedule of a run (`type: null` is the constant `learning_rate`).

    Args:
        config: the `lr_scheduler` section.
        total_steps: `training.steps` (a `total_steps` key under `lr_scheduler` overrides it).
        source: the YAML source, for error lines.

    Returns:
        The schedule: `schedule(step)` is the rate of the update after `step` updates.

    Raises:
        ConfigError: naming `lr_scheduler.<key>` of every problem.
    """
    if type(total_steps) is not int or total_steps < 1:
        raise ValueError(f"total_steps (training.steps) must be a positive integer, got "
                         f"{total_steps!r}")
    if config.type is None:
        _reject_keys_without_type(config, source)
        return ConstantLR(config.learning_rate)
    cls = LR_SCHEDULERS.get(config.type, (*PATH, "type"), source)
    settings_class = getattr(cls, "Settings", None)
    if settings_class is None:
        raise settings_error([((*PATH, "type"), f"{config.type!r} is not an mf learning-rate "
                                                "schedule: it declares no Settings class")],
                             source)
    settings = structure_settings(settings_class, config.extras, PATH, source,
                                  owner=f"learning-rate scheduler type {config.type!r}",
                                  also_allowed=declared_fields(LrSchedulerConfig))
    length = _schedule_length(settings, total_steps)
    try:
        return cls(config.learning_rate, settings, length)
    except SettingProblems as exc:
        raise settings_error([((*PATH, key), message) for key, message in exc.found],
                             source) from None


def _reject_keys_without_type(config: LrSchedulerConfig, source: Source | None) -> None:
    """Keys for a schedule while `type` is null would be ignored silently: refuse them."""
    if not config.extras:
        return
    message = (f"is a scheduler key, but lr_scheduler.type is null (a constant "
               f"learning_rate); set type to one of {', '.join(LR_SCHEDULERS.names())}, or "
               "remove the key")
    raise settings_error([((*PATH, key), message) for key in config.extras], source)


def _schedule_length(settings: Any, total_steps: int) -> int:
    """`lr_scheduler.total_steps` when written, else the trainer's `training.steps` (a
    schedule shorter than the run is warned about when the file is validated)."""
    written = getattr(settings, "total_steps", None)
    return total_steps if written is None else written
