"""The trainer: config -> plan -> build -> run, for one rank.

`Trainer(config, output_dir=...)` builds everything from the validated configuration, in this
order, each component from the typed section it needs: backend and seeds (`context`,
`training`), the parallel plan and communication (mf-parallel), the model (`model`, through the
`MODELS` registry), recompute, communication recompute and swap (mf-memory), the optimizer and
LR schedule, the resumed state (`checkpoint.load_path`), the data stream (`train_dataset`, from
the consumed-sample count), and the callbacks. `train()` then runs `training.steps` optimizer
steps, each of `plan.batch.accumulation_steps()` micro-batches (`train_step.TrainStep`).
"""

from __future__ import annotations

import logging
import random
from pathlib import Path
from typing import Any

import mindspore as ms
import numpy as np

from mf_config import TrainConfig
from mf_config.yaml_source import Source
from mf_parallel import Plan, make_plan

from .train_step import StepOutcome, TrainStep

LOG = logging.getLogger("mf_train")


def resolve_device(device_target: str) -> str:
    """`context.device_target`, with `auto` resolved to the backend this MindSpore was built
    for (Ascend, GPU or CPU)."""
    if device_target != "auto":
        return device_target
    return ms.get_context("device_target") or "CPU"


def seed_everything(seed: int, deterministic: bool) -> None:
    """Python, numpy and MindSpore seeds; deterministic kernels when asked."""
    random.seed(seed)
    np.random.seed(seed)
    ms.set_seed(seed)
    if deterministic:
        ms.set_context(deterministic="ON")


def make_job_plan(config: TrainConfig, world_size: int) -> Plan:
    """The parallel plan of this configuration on `world_size` ranks (`PlanError` if it does
    not fit); also what `mf-train` checks before it touches a device."""
    seq = config.model.get("seq_length")
    return make_plan(config.parallelism, config.training, world_size,
                     num_layers=config.model.layer_count(), seq_length=seq)


class Trainer:
    """Trains the configured model on this rank; see the module docstring for the order."""

    def __init__(self, config: TrainConfig, *, output_dir: str | Path,
                 source: Source | None = None, world_size: int = 1):
        from mf_parallel.runtime import Collectives, init_communication

        self.config, self.source = config, source
        self.output_dir = Path(output_dir)
        self.device = resolve_device(config.context.device_target)
        ms.set_context(mode=ms.PYNATIVE_MODE)
        ms.set_device(self.device)
        seed_everything(config.training.seed, config.training.deterministic)
        self.plan = make_job_plan(config, world_size)
        self.comm = init_communication(self.plan, self.device)
        self.collectives = Collectives(self.comm)
        self.model = self._build_model()
        self.memory = self._apply_memory()
        self.optimizer, self.schedule = self._build_optimizer()
        self.step_count, self.consumed_samples = 0, 0
        self.step = self._build_step()

    # ------------------------------------------------------------------ build

    def _build_model(self) -> Any:
        from .models import build_model

        if self.plan.dims.tensor > 1 or self.plan.dims.pipeline > 1:
            raise ValueError("parallelism: the trainer runs data parallelism (replicated or "
                             "sharded) only so far; tensor_parallel and pipeline_parallel must "
                             "be 1")
        return build_model(self.config.model, tensor_group=None, source=self.source,
                           seed=self.config.training.seed)

    def _apply_memory(self) -> Any:
        from mf_memory.recompute import apply_recompute
        from mf_memory.swap import ActivationSwap

        marked = apply_recompute(self.model, self.config.recompute)
        if marked:
            LOG.info("recompute: %s", ", ".join(marked))
        swap = ActivationSwap(self.model, self.config.swap)
        if swap.paths:
            LOG.info("swap: %s", ", ".join(swap.paths))
        return swap

    def _build_optimizer(self) -> tuple[Any, Any]:
        from .lr_schedules import build_lr_schedule
        from .optim import build_optimizer

        named = [(p.name, p) for p in self.model.trainable_params()]
        optimizer = build_optimizer(self.config.optimizer, named, self.source)
        schedule = build_lr_schedule(self.config.lr_scheduler, self.config.training.steps,
                                     self.source)
        LOG.info("optimizer %s; %s", self.config.optimizer.type, schedule.describe())
        return optimizer, schedule

    def _build_step(self) -> TrainStep:
        from mf_parallel.runtime.grad_sync import GradientSync

        health = self.config.monitor.health_checkpoint
        skip = health.global_norm_skip_threshold if self.config.training.use_skip_step_on_nan \
            else None
        sync = GradientSync(self.collectives, [tuple(p.shape) for p in self.optimizer.params],
                            average=True)
        data_parallel = sync.size > 1
        return TrainStep(self.model, self.optimizer, max_norm=self.config.training.max_norm,
                         skip_threshold=skip,
                         reduce_grads=sync if data_parallel else None,
                         average_loss=(lambda loss: sync.average_loss(loss, "data"))
                         if data_parallel else None)

    def stream(self) -> Any:
        """The data stream from the current consumed-sample count."""
        from .data import build_stream

        return build_stream(self.config.train_dataset, self.plan, self.comm.rank,
                            consumed_samples=self.consumed_samples,
                            seed=self.config.training.seed, source=self.source)

    # ------------------------------------------------------------------ run

    def run_step(self, stream: Any) -> StepOutcome:
        """One optimizer step on the next micro-batches of `stream`."""
        accumulation = self.plan.batch.accumulation_steps(self.consumed_samples)
        micro = [next(stream) for _ in range(accumulation)]
        lr = self.schedule(self.step_count)
        outcome = self.step(micro, lr)
        self.step_count += 1
        self.consumed_samples = stream.consumed_samples
        return outcome

    def train(self) -> list[StepOutcome]:
        """Run the remaining steps up to `training.steps`, one log line per step."""
        stream = self.stream()
        outcomes = []
        total = self.config.training.steps
        while self.step_count < total:
            outcome = self.run_step(stream)
            outcomes.append(outcome)
            if self.comm.rank == 0:
                LOG.info("step [%*d/%d] loss %.6f lr %.3e grad_norm %.4f tokens/s %.0f "
                         "step_time %.0f ms%s", len(str(total)), self.step_count, total,
                         outcome.loss, self.schedule(self.step_count - 1), outcome.grad_norm,
                         outcome.tokens * self.plan.batch.data_parallel / outcome.seconds,
                         outcome.seconds * 1000, " (skipped)" if outcome.skipped else "")
        return outcomes
