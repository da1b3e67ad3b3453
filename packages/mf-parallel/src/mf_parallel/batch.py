"""Batch math: micro-batches, gradient-accumulation steps and the effective global batch.

A micro-batch is `local_batch_size` samples on one data-parallel rank. One optimizer step
accumulates `global_batch_size // (data_parallel * local_batch_size)` micro-batches on every
rank. As in MindFormers and the spec, a global batch that does not divide is rounded down (with a
warning that says the batch actually used: `warnings`, which `mf-parallel plan` prints and
`mf-train` says before any rank starts); a global batch smaller than one micro-batch per rank
is an error. `rampup_batch_size` grows the global batch with the samples consumed, the way
Megatron-LM's `RampupBatchsizeNumMicroBatches` does.
"""

from __future__ import annotations

import attrs

from mf_config import TrainingConfig

from .errors import PlanError


@attrs.frozen(kw_only=True)
class Rampup:
    """`[start, increment, samples]`: the global batch grows from `start` by `increment` every
    `samples / ((target - start) / increment)` consumed samples, until it reaches the target."""

    start: int
    increment: int
    samples: int
    target: int

    @property
    def num_increments(self) -> int:
        """How many times the global batch grows on its way to the target."""
        return (self.target - self.start) // self.increment

    @property
    def samples_per_increment(self) -> float:
        """Consumed samples between two growths (not always whole, as in Megatron-LM)."""
        return self.samples / self.num_increments if self.num_increments else 0.0

    @property
    def active(self) -> bool:
        """False when the ramp never lowers the batch: it starts at the target or over 0
        samples."""
        return self.global_batch_size(0) < self.target

    def global_batch_size(self, consumed_samples: int) -> int:
        """The global batch size after `consumed_samples` samples."""
        steps = self.num_increments
        if steps == 0 or consumed_samples >= self.samples:
            return self.target
        samples_per_increment = self.samples / steps
        return min(self.target,
                   self.start + int(consumed_samples / samples_per_increment) * self.increment)

    def next_growth(self, consumed_samples: int) -> int:
        """The first consumed-sample count after `consumed_samples` with a larger global batch
        (`ValueError` at the target). Estimated in integers, then settled on `global_batch_size`
        itself, so that its float division and this can never disagree."""
        current = self.global_batch_size(consumed_samples)
        if current >= self.target:
            raise ValueError(f"the global batch is at its target ({self.target}) after "
                             f"{consumed_samples} samples; it grows no more")
        level = (current - self.start) // self.increment + 1
        at = max(consumed_samples + 1, -(-level * self.samples // self.num_increments))
        while at > consumed_samples + 1 and self.global_batch_size(at - 1) > current:
            at -= 1
        while self.global_batch_size(at) == current:
            at += 1
        return at


@attrs.frozen(kw_only=True)
class BatchPlan:
    """How one optimizer step's samples are split over ranks and micro-batches."""

    micro_batch_size: int
    data_parallel: int
    global_batch_size: int
    """As configured (the target, when ramping up)."""
    rampup: Rampup | None = None

    @classmethod
    def from_config(cls, training: TrainingConfig, data_parallel: int) -> BatchPlan:
        """Check the batch sizes against the data-parallel degree.

        Args:
            training: the config's `training` section.
            data_parallel: the data-parallel degree.

        Returns:
            The batch plan.

        Raises:
            PlanError: not even one micro-batch per data-parallel rank fits; says why.
        """
        plan = cls(micro_batch_size=training.local_batch_size, data_parallel=data_parallel,
                   global_batch_size=training.global_batch_size,
                   rampup=_rampup(training, data_parallel))
        plan.accumulation_steps()  # raises when even one micro-batch per rank does not fit
        return plan

    @property
    def samples_per_micro_step(self) -> int:
        """Samples of one micro-batch on every data-parallel rank together."""
        return self.micro_batch_size * self.data_parallel

    def accumulation_steps(self, consumed_samples: int | None = None) -> int:
        """Micro-batches per optimizer step, what the trainer asks every step.

        Args:
            consumed_samples: samples consumed so far, when ramping up (None: the final value).

        Returns:
            global batch // (data parallel x micro-batch), rounded down.
        """
        gbs = self.global_batch_size_at(consumed_samples)
        if self.samples_per_micro_step > gbs:
            raise PlanError(
                f"global_batch_size ({gbs}) is smaller than data_parallel ({self.data_parallel})"
                f" x local_batch_size ({self.micro_batch_size}) = {self.samples_per_micro_step}:"
                " every data-parallel rank needs at least one micro-batch per step")
        return gbs // self.samples_per_micro_step

    def global_batch_size_at(self, consumed_samples: int | None = None) -> int:
        """The configured global batch (or the ramp-up's value at `consumed_samples`)."""
        if self.rampup is None or consumed_samples is None:
            return self.global_batch_size
        return self.rampup.global_batch_size(consumed_samples)

    def effective_global_batch_size(self, consumed_samples: int | None = None) -> int:
        """Samples really used per optimizer step: accumulation steps x data parallel x micro,
        at `consumed_samples`; without it, the final one (after any ramp-up)."""
        return self.accumulation_steps(consumed_samples) * self.samples_per_micro_step

    def rampup_steps(self) -> int:
        """Optimizer steps taken before the global batch reaches its configured value, 0 without
        ramp-up. Counted as the trainer steps: each step consumes the effective batch valid at
        its start. It jumps from one growth of the batch to the next, so a ramp over millions of
        samples costs at most one turn of the loop per increment, not one per step or sample."""
        if self.rampup is None:
            return 0
        consumed = steps = 0
        while self.rampup.global_batch_size(consumed) < self.global_batch_size:
            batch = self.effective_global_batch_size(consumed)
            taken = -(-(self.rampup.next_growth(consumed) - consumed) // batch)
            steps += taken
            consumed += taken * batch
        return steps

    def warnings(self) -> list[str]:
        """A note when the configured global batch is rounded down."""
        effective = self.effective_global_batch_size()
        if effective == self.global_batch_size:
            return []
        return [f"global_batch_size {self.global_batch_size} is not a multiple of data_parallel "
                f"({self.data_parallel}) x local_batch_size ({self.micro_batch_size}); each step "
                f"uses {self.accumulation_steps()} accumulation steps, an effective global batch "
                f"of {effective}"]


def _rampup(training: TrainingConfig, data_parallel: int) -> Rampup | None:
    if training.rampup_batch_size is None:
        return None
    start, increment, samples = training.rampup_batch_size
    micro = training.local_batch_size * data_parallel
    for name, value in (("start_global_batch_size", start), ("increment", increment)):
        if value % micro:
            raise PlanError(
                f"rampup_batch_size {name} ({value}) must be a multiple of data_parallel "
                f"({data_parallel}) x local_batch_size ({training.local_batch_size}) = {micro}")
    return Rampup(start=start, increment=increment, samples=samples,
                  target=training.global_batch_size)
