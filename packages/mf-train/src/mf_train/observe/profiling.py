"""Profiling a range of training steps with MindSpore's profiler (the `profiler:` section).

`ProfilerCallback(config.profiler)` records the optimizer steps `start_step..end_step`
(1-based, both included) on the ranks of `profiler_rank` (null = every rank) with
`mindspore.profiler.profile`, and writes the result to `<output_path>/rank_<rank>` (as
MindFormers), `output_path` as written (a relative path is relative to the working
directory) or `<output_dir>/profile` when it is null. MindSpore adds one folder per
profiled run under it, `<host>_<pid>_<timestamp>_ascend_ms/`; on the CPU backend it holds

    ASCEND_PROFILER_OUTPUT/trace_view.json   Chrome trace: one event per operator run
    FRAMEWORK/cpu_op_type_info_<r>.csv       per operator type: count, total and mean time
    FRAMEWORK/cpu_op_detail_info_<r>.csv     per operator: count, total and mean time
    FRAMEWORK/cpu_op_execute_timestamp_<r>.txt   start time and duration of every run
    FRAMEWORK/cpu_ms_memory_record_<r>.txt   allocated/reserved bytes (profile_memory only)
    logs/                                    the profiler's own log

(`<r>` is MindSpore's rank id, from the RANK_ID environment variable, 0 without it).

Why a schedule and `step()` rather than `start()`/`stop()` at the range's ends: both record
the right operators on CPU in MindSpore 2.10, but without a schedule `profile` sets the
profiler up inside `start()` (so the first recorded step carries that cost), warns
"Profiler won't be using warmup" and, at `stop()`, "Stop profiler while current state is
RECORD which may result in incomplete parsed data" on every run; with a schedule the
RECORD_AND_SAVE -> NONE transition at the range's last `step()` stops, finalizes and
analyses without complaint. `profile()` accepts only MindSpore's `Schedule` (any other
callable is replaced by `Schedule(wait=0, active=1)`), so the range is expressed with it:

    schedule(wait=0, warmup=1, active=last - first + 1, repeat=1,
             skip_first=first - start - 1)

where `start` is the number of steps already done when training begins (`ctx.start_step`)
and `first..last` the steps this run records. The profiler counts its own steps from 0 at
construction; `on_train_begin` calls `step()` once right after building it (as MindFormers
does), so the profiler's step `j` is training step `start + j`, and `on_step_end` calls
`step()` after every step. The warm-up step (profiler set up, nothing recorded) is the step
before `first`, or the rest of `on_train_begin` when `first` is this run's first step: the
first recorded step then does not carry the profiler's set-up, and MindSpore does not warn
"Profiler won't be using warmup". The trace is analysed synchronously (about a second on
CPU) when step `last` ends; `on_train_end` stops and analyses a range cut short by an early
stop or a failure (training that ends during the warm-up step leaves a folder holding only
the profiler's log; one that ends earlier, nothing).

Options: `profiler_level` 0/1/2 -> `ProfilerLevel.Level0/1/2` (with the AI-core metrics
MindSpore pairs with each level, so it does not warn); activities: CPU when `profile_cpu`,
plus NPU on Ascend and GPU on GPU; `profile_memory`, `with_stack` (Python call stacks, which
MindSpore collects on Ascend only; it needs `profile_cpu`); `mstx` markers exist on Ascend
only and are ignored, with one warning, elsewhere. The level changes nothing on the CPU
backend: the CPU profiler records every host operator at any level.

Differences from MindFormers (`pynative/tools/profiler.py`): a resumed run counts steps from
the checkpoint's step (MindFormers counts from the resume), so `start_step: 3` is always
the third optimizer step of the job; the default directory is under the run's output
directory, not the working directory; a range past `training.steps` is warned about and
clipped; bad values are `ConfigError`s instead of being reset with a warning.
"""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path
from typing import Any

import mindspore as ms
from mindspore.profiler import (
    AicoreMetrics,
    ProfilerActivity,
    ProfilerLevel,
    _ExperimentalConfig,
    profile,
    schedule,
    tensorboard_trace_handler,
)

from mf_config import ProfilerConfig
from mf_config.component_settings import settings_error
from mf_config.yaml_source import Source

from .callbacks import Callback, StepRecord, TrainContext

logger = logging.getLogger(__name__)

PATH = ("profiler",)
DEFAULT_DIR = "profile"
LEVELS = {0: ProfilerLevel.Level0, 1: ProfilerLevel.Level1, 2: ProfilerLevel.Level2}
# MindSpore resets AiCoreNone to PipeUtilization (with a warning) at levels 1 and 2.
_AICORE_METRICS = {0: AicoreMetrics.AiCoreNone, 1: AicoreMetrics.PipeUtilization,
                   2: AicoreMetrics.PipeUtilization}
_DEVICE_ACTIVITY = {"Ascend": ProfilerActivity.NPU, "GPU": ProfilerActivity.GPU}
# The characters MindSpore's trace handler accepts in a directory path; on any other it logs
# an error and drops the analysis, so they are checked here first.
_PATH_CHARS = re.compile(r"[A-Za-z0-9._/~\s\u4e00-\u9fa5-]+")
_MAX_PATH, _MAX_NAME = 4096, 255


def profiler_level(level: int, source: Source | None = None) -> ProfilerLevel:
    """MindSpore's level for `profiler.profiler_level` 0, 1 or 2."""
    if isinstance(level, bool) or level not in LEVELS:
        raise settings_error([((*PATH, "profiler_level"),
                               f"must be 0, 1 or 2, got {level!r}")], source)
    return LEVELS[level]


def activities(config: ProfilerConfig, device: str) -> list[ProfilerActivity]:
    """CPU when `profile_cpu`, then the device's own activity (NPU on Ascend, GPU on GPU)."""
    found = [ProfilerActivity.CPU] if config.profile_cpu else []
    if device in _DEVICE_ACTIVITY:
        found.append(_DEVICE_ACTIVITY[device])
    return found


def profile_options(config: ProfilerConfig, device: str,
                    source: Source | None = None) -> dict[str, Any]:
    """The keyword arguments of `mindspore.profiler.profile` besides the schedule and the
    trace handler (`mstx` only on Ascend, `with_stack` only with the CPU activity)."""
    level = config.profiler_level
    experimental = _ExperimentalConfig(profiler_level=profiler_level(level, source),
                                       aic_metrics=_AICORE_METRICS[level],
                                       mstx=config.mstx and device == "Ascend")
    return {"activities": activities(config, device),
            "with_stack": config.with_stack and config.profile_cpu,
            "profile_memory": config.profile_memory,
            "experimental_config": experimental}


def profile_dir(config: ProfilerConfig, output_dir: str | Path, rank: int) -> Path:
    """`<output_path>/rank_<rank>`, `output_path` as written or `<output_dir>/profile`."""
    root = Path(config.output_path) if config.output_path else Path(output_dir) / DEFAULT_DIR
    return root / f"rank_{rank}"


def profiled_steps(config: ProfilerConfig, start_step: int, total_steps: int) -> range:
    """The steps this run records: `start_step..end_step` within the steps it runs
    (`start_step + 1 .. total_steps`, `start_step` being the steps already done)."""
    first = max(config.start_step, start_step + 1)
    last = min(config.end_step, total_steps)
    return range(first, max(first, last + 1))


def check_config(config: ProfilerConfig, device: str, source: Source | None = None) -> None:
    """`ConfigError` listing each value that cannot profile anything on `device`."""
    problems = []
    if config.start_step < 1:
        problems.append(((*PATH, "start_step"), f"must be >= 1, got {config.start_step}"))
    if config.end_step < config.start_step:
        problems.append(((*PATH, "end_step"), "must be >= start_step "
                         f"({config.start_step}), got {config.end_step}"))
    if isinstance(config.profiler_level, bool) or config.profiler_level not in LEVELS:
        problems.append(((*PATH, "profiler_level"),
                         f"must be 0, 1 or 2, got {config.profiler_level!r}"))
    for index, rank in enumerate(config.profiler_rank or []):
        if isinstance(rank, bool) or not isinstance(rank, int) or rank < 0:
            problems.append(((*PATH, "profiler_rank", index), f"must be a rank >= 0, got "
                                                               f"{rank!r}"))
    if not activities(config, device):
        problems.append(((*PATH, "profile_cpu"), f"is false, and the {device} backend has no "
                         "device activity: nothing would be recorded; set profile_cpu: true "
                         "or enable_profiling: false"))
    if config.output_path is not None:
        problems.extend(_path_problems(Path(config.output_path), explicit=True))
    if problems:
        raise settings_error(problems, source)


def _path_problems(path: Path, *, explicit: bool) -> list[tuple[tuple[str, ...], str]]:
    """MindSpore's own path rules, as `(config path, message)` pairs."""
    real = os.path.realpath(os.path.expanduser(path))
    where = "" if explicit else f"the default directory {path} "
    fix = "" if explicit else "; set profiler.output_path"
    message = None
    if os.path.islink(path):
        message = f"{where}is a symbolic link ({path}), which MindSpore's profiler refuses{fix}"
    elif not _PATH_CHARS.fullmatch(real):
        bad = sorted(set(_PATH_CHARS.sub("", real)))
        message = (f"{where}resolves to {real}, which has characters MindSpore's profiler "
                   f"refuses: {' '.join(bad)} (allowed: letters, digits, . _ - ~ / and "
                   f"spaces){fix}")
    elif len(real) > _MAX_PATH or any(len(part) > _MAX_NAME for part in real.split("/")):
        message = (f"{where}resolves to a path longer than MindSpore's profiler accepts "
                   f"({_MAX_PATH} characters, {_MAX_NAME} per name){fix}")
    elif os.path.isfile(real):
        message = f"{where}is a file ({real}), a directory is needed{fix}"
    return [] if message is None else [((*PATH, "output_path"), message)]


class ProfilerCallback(Callback):
    """MindSpore's profiler over `start_step..end_step`; see the module docstring.

    `device` is the backend ("CPU", "GPU", "Ascend"); None reads MindSpore's context. A
    disabled section, or a rank not in `profiler_rank`, does nothing and writes nothing.
    `steps` is the range this rank records and `directory` where, once training began.
    """

    def __init__(self, config: ProfilerConfig, source: Source | None = None, *,
                 device: str | None = None):
        self.config = config
        self.source = source
        self.device = device or ms.get_context("device_target") or "CPU"
        if config.enable_profiling:
            check_config(config, self.device, source)
        self.steps: range = range(0)
        self.directory: Path | None = None
        self._profile: Any = None
        self._done = 0
        self._warned_mstx = False

    def profiles_rank(self, rank: int) -> bool:
        """Whether this configuration profiles `rank` at all."""
        ranks = self.config.profiler_rank
        return self.config.enable_profiling and (ranks is None or rank in ranks)

    def on_train_begin(self, ctx: TrainContext) -> None:
        self._done = ctx.start_step
        if ctx.is_main:
            self._warn_unknown_ranks(ctx.world_size)
        if not self.profiles_rank(ctx.rank):
            return
        self.steps = self._window(ctx)
        if not self.steps:
            return
        self._warn_mstx()
        self.directory = profile_dir(self.config, ctx.output_dir, ctx.rank)
        problems = _path_problems(self.directory, explicit=self.config.output_path is not None)
        if problems:
            raise settings_error(problems, self.source)
        self._profile = self._start(ctx.start_step)
        logger.info("profiler: recording steps %d..%d into %s", self.steps[0], self.steps[-1],
                    self.directory)

    def on_step_end(self, ctx: TrainContext, record: StepRecord) -> None:
        self._done = record.step
        if self._profile is None:
            return
        self._profile.step()  # after the last step: stop, analyse and write
        if record.step >= self.steps[-1]:
            self._profile.stop()  # ends the schedule's bookkeeping; nothing is recording
            self._profile = None

    def on_train_end(self, ctx: TrainContext, last: StepRecord | None) -> None:
        if self._profile is None:
            return
        if self._done >= self.steps[0]:
            logger.warning("profiler: training ended after step %d, inside the profiled steps "
                           "%d..%d; the profile holds steps %d..%d (and whatever ran of a "
                           "step that failed)", self._done, self.steps[0], self.steps[-1],
                           self.steps[0], self._done)
        else:
            logger.warning("profiler: training ended after step %d, before the profiled "
                           "steps %d..%d; nothing was recorded", self._done, self.steps[0],
                           self.steps[-1])
        self._profile.stop()  # stops and analyses what was recorded
        self._profile = None

    # ------------------------------------------------------------------ helpers

    def _window(self, ctx: TrainContext) -> range:
        config = self.config
        steps = profiled_steps(config, ctx.start_step, ctx.total_steps)
        asked = f"profiler: steps {config.start_step}..{config.end_step} were asked"
        if not steps:
            reason = (f"training runs steps {ctx.start_step + 1}..{ctx.total_steps}"
                      if ctx.start_step < ctx.total_steps else "no step is left to run")
            logger.warning("%s, but %s: nothing is profiled", asked, reason)
        elif len(steps) < config.end_step - config.start_step + 1:
            logger.warning("%s, but training runs steps %d..%d: profiling steps %d..%d",
                           asked, ctx.start_step + 1, ctx.total_steps, steps[0], steps[-1])
        return steps

    def _start(self, start_step: int) -> Any:
        """Build the profiler (its step 0 is now) and step once, so that its step `j` is
        training step `start_step + j`; see the module docstring for the schedule."""
        plan = schedule(wait=0, warmup=1, active=len(self.steps), repeat=1,
                        skip_first=self.steps[0] - start_step - 1)
        handler = tensorboard_trace_handler(str(self.directory))
        prof = profile(schedule=plan, on_trace_ready=handler,
                       **profile_options(self.config, self.device, self.source))
        prof.step()
        return prof

    def _warn_mstx(self) -> None:
        if self.config.mstx and self.device != "Ascend" and not self._warned_mstx:
            self._warned_mstx = True
            logger.warning("profiler.mstx: mstx markers exist on Ascend only; ignored on the "
                           "%s backend", self.device)

    def _warn_unknown_ranks(self, world_size: int) -> None:
        if not self.config.enable_profiling:
            return
        outside = [r for r in self.config.profiler_rank or [] if r >= world_size]
        if outside:
            logger.warning("profiler.profiler_rank: ranks %s are not in this job of %d ranks; "
                           "they are not profiled", outside, world_size)


def profiler_callbacks(config: ProfilerConfig, source: Source | None = None, *,
                       device: str | None = None) -> list[Callback]:
    """`[ProfilerCallback(config)]` when `enable_profiling`, else `[]`: the profiler's place
    at the end of the run's callback list (`mf_train.monitor.standard_callbacks`)."""
    if not config.enable_profiling:
        return []
    return [ProfilerCallback(config, source, device=device)]
