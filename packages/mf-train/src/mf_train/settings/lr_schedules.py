"""The keys each learning-rate schedule reads under `lr_scheduler` (MindFormers' names and
defaults; the formulas are in `mf_train.optim.lr_schedules`), and what they must satisfy together.

Each class says which step counts its schedule requires (`required`: a count or its ratio of
`total_steps`) and which rates must stay below `learning_rate` (`below_rate`); `fit_problems`
checks both. The schedules call it when they are built, and validation (`mf-config validate`,
through the `mf_config.lr_schedulers` entry points) calls it through `config_problems` with
`training.steps`, so a warm-up given neither as steps nor as a ratio, or an `lr_end` above the
learning rate, is found before training starts, without importing the formulas.

No `from __future__ import annotations` here: cattrs reads the field types at run time.
"""

from typing import ClassVar

import attrs

from mf_config.errors import Path
from mf_config.sections import Section, TrainConfig, section, setting

WARMUP = ("warmup_steps", "warmup_ratio")


@section
class WarmupSettings(Section):
    """Keys every schedule here shares: the warm-up and the schedule's length."""

    warmup_steps: int | None = setting(
        None, "Warm-up steps; required unless warmup_ratio is given.", ge=0)
    warmup_ratio: float | None = setting(
        None, "Warm-up as a fraction of total_steps; overrides warmup_steps.", ge=0, le=1)
    warmup_lr_init: float = setting(0.0, "Rate at step 0, rising linearly to learning_rate.",
                                    ge=0)
    total_steps: int | None = setting(
        None, "Length of the schedule; defaults to training.steps.", gt=0)

    key_hints: ClassVar[dict[str, str]] = {}
    """Keys of other tools, with what to write instead (see `structure_settings`)."""
    required: ClassVar[tuple[tuple[str, str], ...]] = (WARMUP,)
    """(count, ratio) pairs of which the schedule needs one each."""
    below_rate: ClassVar[tuple[str, ...]] = ()
    """Rates that must be smaller than `learning_rate`."""

    @classmethod
    def schedule(cls) -> str:
        """The schedule's name: `CosineWithWarmUpLR` for `CosineWithWarmUpLRSettings`."""
        return cls.__name__.removesuffix("Settings")

    def steps(self, name: str, ratio_name: str | None, total_steps: int) -> int | None:
        """MindFormers' `_get_lr_steps`: `floor(total_steps * ratio)` when the ratio is given
        (it overrides the count), else the count (None when neither is given)."""
        ratio = getattr(self, ratio_name) if ratio_name else None
        if ratio is not None:
            return floor_of_ratio(ratio, total_steps)
        return getattr(self, name)

    def fit_problems(self, learning_rate: float, total_steps: int) -> list[tuple[str, str]]:
        """(key, message) for each required count given neither way and each rate not below
        `learning_rate`."""
        found = [(name, f"required by {self.schedule()}: give {name} (an integer >= 0) or "
                        f"{ratio} (a fraction of total_steps, in [0, 1])")
                 for name, ratio in self.required if self.steps(name, ratio, total_steps) is None]
        for name in self.below_rate:
            value = getattr(self, name)
            if not value < learning_rate:
                default = attrs.fields_dict(type(self))[name].default
                found.append((name, f"must be smaller than learning_rate ({number(learning_rate)})"
                                    f" for {self.schedule()}, got {number(value)} (default "
                                    f"{number(default)})"))
        return found

    def config_problems(self, config: TrainConfig, path: Path) -> list[tuple[Path, ...]]:
        total = self.total_steps or config.training.steps
        problems: list[tuple[Path, ...]] = [
            ((*path, key), message)
            for key, message in self.fit_problems(config.lr_scheduler.learning_rate, total)]
        if self.total_steps is not None and self.total_steps < config.training.steps:
            problems.append(((*path, "total_steps"), shorter_than_run(
                self.total_steps, config.training.steps), "warning"))
        warmup = self.steps(*WARMUP, total)
        if warmup and warmup >= config.training.steps:
            key = "warmup_ratio" if self.warmup_ratio is not None else "warmup_steps"
            problems.append(((*path, key), self.longer_than_run(
                warmup, config.training.steps, config.lr_scheduler.learning_rate), "warning"))
        return problems

    def longer_than_run(self, warmup: int, training_steps: int, learning_rate: float) -> str:
        """The warning for a warm-up that does not end before the run does."""
        last = self.warmup_lr_init + (learning_rate - self.warmup_lr_init) * (
            (training_steps - 1) / warmup)
        return (f"the warm-up ({warmup} steps) does not end before training.steps "
                f"({training_steps}): every step runs in warm-up, the rate rising from "
                f"{number(self.warmup_lr_init)} to {number(last)} and never reaching "
                f"learning_rate ({number(learning_rate)}); shorten the warm-up")


def shorter_than_run(schedule_steps: int, training_steps: int) -> str:
    """The warning for a schedule whose `total_steps` ends before `training.steps`."""
    return (f"the schedule ({schedule_steps} steps) is shorter than training.steps "
            f"({training_steps}): the rate holds its final value from step {schedule_steps} on")


def floor_of_ratio(ratio: float, total: int) -> int:
    """`floor(total * ratio)` with `ratio` read as the decimal it is written as (its shortest
    repr: 0.29 is 29/100, not 0.28999999999999998), in integers: `floor(100 * 0.29)` is 29.

    Exact like `fractions.Fraction(repr(ratio))`, without importing `fractions` (which
    imports `decimal`: 8 ms of every `mf-config validate`, measured). `ratio` >= 0."""
    mantissa, _, exponent = repr(float(ratio)).partition("e")
    whole, _, decimals = mantissa.partition(".")
    scale = len(decimals) - int(exponent or 0)
    digits = int(whole + decimals)
    if scale <= 0:
        return total * digits * 10**-scale
    return total * digits // 10**scale


def number(value: float) -> str:
    """A rate or count as messages and the log show it: `0.0001`, `1e-07`, `0`."""
    return f"{value:g}"


# The schedules' own settings. They are plain classes here, made attrs classes (`section`)
# under their public names, `<Schedule>Settings`, the first time one is asked for (PEP 562's
# module `__getattr__`): building all seven costs 13M instructions (about 3 ms, measured with
# callgrind), a quarter of what checking a file's components costs, while validation needs
# only the schedule the file names.

_PLAIN: dict[str, type[WarmupSettings]] = {}


def later(cls: type[WarmupSettings]) -> type[WarmupSettings]:
    """Keep a schedule's settings class `_Name` to build as `NameSettings` on first use."""
    _PLAIN[cls.__name__.removeprefix("_") + "Settings"] = cls
    return cls


def __getattr__(name: str) -> type[WarmupSettings]:
    """`NameSettings`: the schedule's settings class, built the first time it is asked for."""
    plain = _PLAIN.get(name)
    if plain is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    plain.__name__ = plain.__qualname__ = name
    built = globals()[name] = section(plain)
    return built


@later
class _ConstantWarmUpLR(WarmupSettings):
    """ConstantWarmUpLR: warm-up, then `learning_rate`."""


@later
class _LinearWithWarmUpLR(WarmupSettings):
    """LinearWithWarmUpLR: warm-up, then linear to 0 at total_steps."""


@later
class _CosineWithWarmUpLR(WarmupSettings):
    """CosineWithWarmUpLR: warm-up, then cosine from learning_rate to lr_end."""

    required = ()

    key_hints: ClassVar[dict[str, str]] = {
        "min_lr": "MindFormers schedules have no min_lr; the floor is lr_end"}

    warmup_steps: int | None = setting(0, "Warm-up steps.", ge=0)
    num_cycles: float = setting(0.5, "Cosine waves over the decay; 0.5 is one half-wave down.",
                                ge=0)
    lr_end: float = setting(0.0, "Rate the cosine ends at.", ge=0)
    decay_steps: int | None = setting(
        None, "Step from which the rate is lr_end; defaults to total_steps.", ge=0)
    decay_ratio: float | None = setting(
        None, "decay_steps as a fraction of total_steps; overrides decay_steps.", ge=0, le=1)


@later
class _CosineWithRestartsAndWarmUpLR(WarmupSettings):
    """CosineWithRestartsAndWarmUpLR: warm-up, then num_cycles cosine half-waves, each
    restarting at learning_rate."""

    key_hints: ClassVar[dict[str, str]] = {
        "min_lr": "MindFormers schedules have no min_lr; the floor is lr_end"}

    num_cycles: float = setting(1.0, "Half-waves (restarts) over the decay.", ge=0)
    lr_end: float = setting(0.0, "Rate each half-wave ends at.", ge=0)
    decay_steps: int | None = setting(
        None, "Step from which the rate is lr_end; defaults to total_steps.", ge=0)


@later
class _PolynomialWithWarmUpLR(WarmupSettings):
    """PolynomialWithWarmUpLR: warm-up, then `(1 - progress) ** power` down to lr_end."""

    below_rate = ("lr_end",)

    key_hints: ClassVar[dict[str, str]] = {
        "min_lr": "MindFormers schedules have no min_lr; the floor is lr_end"}

    lr_end: float = setting(1e-7, "Rate the decay ends at; must be below learning_rate.", ge=0)
    power: float = setting(1.0, "Exponent of the decay; 1 is linear.", gt=0)
    decay_steps: int | None = setting(
        None, "Length of the decay; defaults to total_steps - warmup_steps.", ge=0)


@later
class _WarmUpStableDecayLR(WarmupSettings):
    """WarmUpStableDecayLR: warm-up, learning_rate until decay_start_steps, then linear to
    lr_end at total_steps."""

    required = (WARMUP, ("decay_start_steps", "decay_start_ratio"))
    below_rate = ("lr_end",)

    key_hints: ClassVar[dict[str, str]] = {
        "min_lr": "MindFormers schedules have no min_lr; the floor is lr_end"}

    lr_end: float = setting(1e-7, "Rate at total_steps; must be below learning_rate.", ge=0)
    decay_start_steps: int | None = setting(
        None, "Step the linear decay starts at; required unless decay_start_ratio is given.",
        ge=0)
    decay_start_ratio: float | None = setting(
        None, "decay_start_steps as a fraction of total_steps; overrides decay_start_steps.",
        ge=0, le=1)


@later
class _ConstantWithCoolDownLR(WarmupSettings):
    """ConstantWithCoolDownLR (DeepSeek-V3): warm-up, keep, cosine to lr_end1, hold lr_end1,
    then lr_end2."""

    required = (WARMUP, ("decay_steps", "decay_ratio"))

    key_hints: ClassVar[dict[str, str]] = {
        "min_lr": "MindFormers schedules have no min_lr; the floor is lr_end1"}

    keep_steps: int = setting(0, "Steps at learning_rate after the warm-up.", ge=0)
    decay_steps: int | None = setting(
        None, "Steps of the cosine decay; required unless decay_ratio is given.", ge=0)
    decay_ratio: float | None = setting(
        None, "decay_steps as a fraction of total_steps; overrides decay_steps.", ge=0, le=1)
    num_cycles: float = setting(0.5, "Cosine waves over the decay; 0.5 is one half-wave down.",
                                ge=0)
    lr_end1: float = setting(0.0, "Rate the cosine ends at, held for final_steps.", ge=0)
    final_steps: int = setting(0, "Steps at lr_end1 after the decay.", ge=0)
    lr_end2: float | None = setting(None, "Rate after final_steps; defaults to lr_end1.", ge=0)
