"""How fast a run goes: elapsed time and ETA, tokens per second per rank, the achieved FLOP/s
of a rank and MFU, for the step line, metrics.jsonl and the summary.

* `RunPace`: elapsed time since this run's first step began, and the ETA: the mean wall time
  of this run's steady steps (step end to step end, so data loading, callbacks and checkpoint
  saves count) times the steps left. The run's first step and any step that compiled graphs
  are left out (compilation, warm-up): until a steady step has run there is no ETA.
* `Throughput`: per-rank tokens/s (the global tokens/s over the world size), achieved TFLOP/s
  per rank (`model_flops.flops_per_token` x per-rank tokens/s) and MFU (achieved / peak).
* `measure_peak_flops`: a measured peak, for MFU when none is given (`peak_flops`: a rated
  one by `--peak DEVICE`, a number by `--peak TFLOPS`, else this measurement, once per
  machine): the fastest of a few float32 1024x1024 matmuls on the run's device, on every rank
  at once (ranks sharing cores share them in the measurement as in training). It is a
  measured peak, not a rated one (on a device, a bfloat16 matmul may well be faster).

Pure Python but for `measure_peak_flops`, which imports MindSpore when called.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .callbacks import StepRecord

PEAK_MATMUL_SIZE = 1024
PEAK_REPEATS = 5


@dataclass(frozen=True)
class PeakFlops:
    """The peak FLOP/s of one rank that MFU divides by, and where it comes from."""

    flops: float
    """FLOP/s of one rank."""
    source: str
    """How it was found (`peak_flops`: rated, given, or measured once on this machine)."""


def measure_peak_flops(device: str, size: int = PEAK_MATMUL_SIZE,
                       repeats: int = PEAK_REPEATS) -> PeakFlops:
    """Time a float32 `size x size` matmul on this process's MindSpore device.

    Args:
        device: the device MindSpore runs on (`CPU`), for the description.
        size: the matrices' side.
        repeats: timed matmuls after one untimed (kernel selection, allocation).

    Returns:
        `2 * size**3` FLOPs over the fastest matmul's time.
    """
    import numpy as np
    from mindspore import Tensor, mint

    rng = np.random.default_rng(0)
    a, b = (Tensor(rng.standard_normal((size, size), dtype=np.float32)) for _ in range(2))
    # reading one element back waits for the matmul on any backend
    # (`mindspore.runtime.synchronize` logs an error on CPU)
    mint.matmul(a, b)[0, 0].asnumpy()
    fastest = math.inf
    for _ in range(repeats):
        start = time.perf_counter()
        mint.matmul(a, b)[0, 0].asnumpy()
        fastest = min(fastest, time.perf_counter() - start)
    return PeakFlops(2 * size**3 / fastest,
                     f"float32 {size}x{size} matmul on {device}, fastest of {repeats}")


class RunPace:
    """Elapsed time and ETA of this run's steps (see the module docstring).

    Args:
        total_steps: the run's last step.
        clock: seconds, monotonic (`time.perf_counter`); its first reading is the start.
    """

    def __init__(self, total_steps: int, clock: Callable[[], float] = time.perf_counter):
        self.total_steps, self.clock = total_steps, clock
        self.started = self._last = clock()
        self.periods: list[float] = []
        """Wall seconds of each steady step of this run, step end to step end."""
        self.compiling: list[float] = []
        """Those of the steps after the first that compiled graphs (used only when no step
        is steady: a run whose every step compiles)."""
        self.steps_seen = 0

    def step_done(self, step: int, steady: bool = True) -> tuple[float, float | None]:
        """Step `step` just ended.

        Args:
            step: the step (1-based, of the whole run).
            steady: False for a step that compiled graphs (its time is not the pace).

        Returns:
            (elapsed seconds since the start, ETA in seconds: the mean of this run's steady
            steps times the steps after `step`; None after the first step alone, 0 at the
            last step).
        """
        now = self.clock()
        if self.steps_seen:  # the run's first step (warm-up) never counts
            (self.periods if steady else self.compiling).append(now - self._last)
        self.steps_seen += 1
        self._last = now
        left = max(self.total_steps - step, 0)
        timed = self.periods or self.compiling  # steps that all compile: what there is
        if not left or not timed:
            return now - self.started, 0.0 if not left else None
        return now - self.started, sum(timed) / len(timed) * left


@dataclass(frozen=True)
class Throughput:
    """A run's FLOPs per token and peak, which turn a step's tokens/s into TFLOP/s and MFU.

    Args:
        world_size: the ranks of the job (per-rank tokens/s = global tokens/s / world_size).
        flops_per_token: model FLOPs of one trained token (`model_flops`), None when unknown.
        peak: one rank's peak FLOP/s, None when not measured.
        unknown: why `flops_per_token` is None, for the start line.
        seq_length: the sequence length the attention term counts, for the start line.
        matmul_weights: `W` of `model_flops`, for the start line.
    """

    world_size: int
    flops_per_token: int | None = None
    peak: PeakFlops | None = None
    unknown: str = ""
    seq_length: int | None = None
    matmul_weights: int | None = None

    @property
    def peak_tflops(self) -> float | None:
        return None if self.peak is None else self.peak.flops / 1e12

    def fill(self, record: StepRecord) -> None:
        """Set the record's `tokens_per_s_per_rank`, `tflops` (achieved, per rank) and `mfu`
        (a fraction: tflops / peak_tflops) from its global `tokens_per_s`."""
        per_rank = float(record.tokens_per_s or 0.0) / self.world_size
        record.tokens_per_s_per_rank = per_rank
        if self.flops_per_token is None:
            return
        record.tflops = self.flops_per_token * per_rank / 1e12
        if self.peak_tflops:
            record.mfu = record.tflops / self.peak_tflops

    def describe(self) -> str:
        """The start line: `model FLOPs: 2.95M per token (6 x 0.39M matmul weights + 0.59M
        attention at seq_length 128); peak 0.165 TFLOP/s per rank (measured once on this
        machine (...)); MFU = achieved TFLOP/s per rank / peak`."""
        if self.flops_per_token is None:
            return (f"model FLOPs per token unknown ({self.unknown}): the step lines give no "
                    "TFLOP/s or MFU")
        head = f"model FLOPs: {_si(self.flops_per_token)} per token"
        if self.matmul_weights is not None:
            attention = self.flops_per_token - 6 * self.matmul_weights
            head += (f" (6 x {_si(self.matmul_weights)} matmul weights + {_si(attention)} "
                     f"attention at seq_length {self.seq_length})")
        if self.peak is None:
            return f"{head}; no peak FLOP/s: the step lines give no MFU"
        return (f"{head}; peak {self.peak_tflops:.3g} TFLOP/s per rank ({self.peak.source}); "
                "MFU = achieved TFLOP/s per rank / peak")


def _si(value: float) -> str:
    """`2.95M`, `1.2G`, `512`."""
    for scale, unit in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if value >= scale:
            return f"{value / scale:.3g}{unit}"
    return f"{value:.3g}"
