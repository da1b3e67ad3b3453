"""The trainer: config -> plan -> build -> run, for one rank.

`Trainer(config, output_dir=...)` builds everything from the validated configuration, in this
order, each component from the typed section it needs: backend, memory cap and seeds
(`context`, `training`), the parallel plan and what the trainer supports of the configuration
(`support`: a refused value raises, a value with no effect here is logged once on rank 0),
communication (mf-parallel), the model (`model`, through the
`MODELS` registry), recompute, communication recompute and swap (mf-memory), the optimizer and
LR schedule, the resumed state (`checkpoint.load_path`), the data stream (`train_dataset`, from
the consumed-sample count), and the callbacks. `train()` then runs `training.steps` optimizer
steps, each of `plan.batch.accumulation_steps()` micro-batches (`train_step.TrainStep`).

Data parallelism runs as `data_sharding` decides: replicated (gradients all-reduced) with a
shard degree of 1, else `parallelism.data_parallel_shard_strategy` (ZeRO-1, ZeRO-2 or FSDP,
with `sharded_optimizer.ShardedAdamW`). `parallelism.disable_gradient_division` (default
true, as MindFormers) sums the gradients over the data-parallel ranks and divides each rank's
loss by their number before the backward pass; false averages the reduced gradients instead.
Both give the same update (bit for bit when the data-parallel size is a power of two).

Under FSDP the model holds placeholders between steps:
checkpoints gather the whole parameters to save them and to load weights (`_whole_model`).
"""

from __future__ import annotations

import contextlib
import logging
import random
from pathlib import Path
from typing import Any

import mindspore as ms
import numpy as np

from mf_config import ConfigIssue, TrainConfig
from mf_config.components import decoder_layers, sequence_length
from mf_config.yaml_source import Source
from mf_parallel import Plan, make_plan

from .train_step import ReducingOptimizer, StepOutcome, TrainStep

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


def cap_device_memory(max_device_memory: str | None, device: str) -> None:
    """`context.max_device_memory` as the cap of MindSpore's device memory pool, on the
    backends where it caps anything (on CPU it does not: `support` says so before the run)."""
    if max_device_memory is not None and device != "CPU":
        ms.runtime.set_memory(max_size=max_device_memory)


def check_support(config: TrainConfig, plan: Plan, device: str,
                  source: Source | None = None) -> list[ConfigIssue]:
    """`ConfigError` for every value the trainer refuses (`support.FIELDS`); else the
    warnings for values that have no effect here."""
    from mf_config import ConfigError

    from .support import Target, support_issues

    target = Target(config, plan.dims.world_size, device, source, plan.dims.data_shard)
    issues = support_issues(target)
    errors = [issue for issue in issues if issue.severity == "error"]
    if errors:
        raise ConfigError(errors)
    return [issue for issue in issues if issue.severity == "warning"]


def make_job_plan(config: TrainConfig, world_size: int, source: Source | None = None) -> Plan:
    """The parallel plan of this configuration on `world_size` ranks (`PlanError` if it does
    not fit, `ConfigError` if the sharded data-parallel strategy cannot run with the rest of
    the configuration); also what `mf-train` checks before it touches a device."""
    from .data_sharding import check_sharding

    plan = make_plan(config.parallelism, config.training, world_size,
                     num_layers=decoder_layers(config), seq_length=sequence_length(config))
    check_sharding(plan.dims, parallelism=config.parallelism, optimizer=config.optimizer,
                   swap=config.swap, recompute_comm=config.recompute_comm, source=source)
    return plan


class TrainingStopped(RuntimeError):
    """Training cannot usefully go on (too many skipped steps); the message says why."""


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
        cap_device_memory(config.context.max_device_memory, self.device)
        seed_everything(config.training.seed, config.training.deterministic)
        self.plan = make_job_plan(config, world_size, source)
        no_effect = check_support(config, self.plan, self.device, source)
        self.comm = init_communication(self.plan, self.device)
        for warning in no_effect if self.comm.rank == 0 else ():
            LOG.warning("%s", warning)
        self.collectives = Collectives(self.comm)
        self.tensor_group = self._tensor_group()
        self.model = self._build_model()
        self.memory = self._apply_memory()
        self.optimizer, self.schedule = self._build_optimizer()
        self.step_count, self.consumed_samples = 0, 0
        self.checkpoints = self._build_checkpoints()
        self.resumed_from = self._resume()
        self.callbacks = self._build_callbacks()
        self.step = self._build_step()

    # ------------------------------------------------------------------ build

    def _tensor_group(self) -> Any:
        """This rank's tensor-parallel group (sequence parallelism on, as the spec keeps it),
        or None without tensor parallelism."""
        from mf_parallel.runtime.tensor_parallel import TensorGroup

        if self.plan.dims.tensor == 1:
            return None
        return TensorGroup(self.collectives, sequence_parallel=True)

    def _build_model(self) -> Any:
        from .models import build_model

        return build_model(self.config.model, tensor_group=self.tensor_group,
                           source=self.source, seed=self.config.training.seed)

    def _apply_memory(self) -> Any:
        from mf_memory.recompute import apply_recompute, apply_recompute_comm
        from mf_memory.swap import ActivationSwap

        marked = apply_recompute(self.model, self.config.recompute)
        if self.tensor_group is not None:
            marked += apply_recompute_comm(self.model, self.config.recompute_comm)
        if marked:
            LOG.info("recompute: %s", ", ".join(marked))
        swap = ActivationSwap(self.model, self.config.swap)
        if swap.paths:
            LOG.info("swap: %s", ", ".join(swap.paths))
        return swap

    def _build_optimizer(self) -> tuple[Any, Any]:
        """The optimizer (sharded AdamW under a sharded data-parallel strategy, which for FSDP
        also shards the model) and the LR schedule."""
        from .data_sharding import build_sharded_optimizer, describe, sharded_strategy
        from .lr_schedules import build_lr_schedule
        from .optim import build_optimizer

        parallelism = self.config.parallelism
        strategy = sharded_strategy(parallelism, self.plan.dims)
        if strategy is None:
            named = [(p.name, p) for p in self.model.trainable_params()]
            optimizer = build_optimizer(self.config.optimizer, named, self.source)
        else:
            optimizer = build_sharded_optimizer(
                strategy, self.config.optimizer, self.model, self.collectives,
                reshard_policy=parallelism.reshard_after_forward_policy,
                pipeline_parallel=self.plan.dims.pipeline,
                average=not parallelism.disable_gradient_division, source=self.source)
        schedule = build_lr_schedule(self.config.lr_scheduler, self.config.training.steps,
                                     self.source)
        LOG.info("%s; optimizer %s; %s", describe(parallelism, self.plan.dims),
                 self.config.optimizer.type, schedule.describe())
        return optimizer, schedule

    def _whole_model(self) -> Any:
        """A context in which the model's parameters are whole: FSDP gathers them (every
        rank enters it together) and frees them after; a no-op otherwise."""
        from .sharded_optimizer import ShardedAdamW

        if isinstance(self.optimizer, ShardedAdamW):
            return self.optimizer.whole_model()
        return contextlib.nullcontext()

    def _build_checkpoints(self) -> Any:
        """The checkpoint manager; an empty `checkpoint.save_path` means
        `<output-dir>/checkpoint` (MindFormers refuses an empty path)."""
        import attrs

        from .checkpoint import CheckpointManager
        from .run_directory import checkpoint_root

        section = self.config.checkpoint
        if section.enable_save and not section.save_path:
            section = attrs.evolve(section, save_path=str(checkpoint_root(section,
                                                                          self.output_dir)))
        return CheckpointManager(section, self.comm.rank, self.comm.world_size,
                                 barrier=self._barrier if self.comm.world_size > 1 else None,
                                 source=self.source)

    @staticmethod
    def _all_ranks(ok: bool) -> bool:
        """Whether `ok` holds on every rank (an all-reduce of the failures)."""
        from mindspore import communication, ops

        group = communication.GlobalComm.WORLD_COMM_GROUP
        failed = ms.Tensor(np.array([0.0 if ok else 1.0], np.float32))
        return float(ops.AllReduce(group=group)(failed).asnumpy()[0]) == 0.0

    @staticmethod
    def _barrier() -> None:
        """Every rank waits for all: an all-reduce over the world group, read back so that it
        completes (`mindspore.mint.distributed.barrier` returns at once on the CPU backend,
        logging "CPU device is not supported", so ranks ran past each other)."""
        from mindspore import communication, ops

        group = communication.GlobalComm.WORLD_COMM_GROUP
        ops.AllReduce(group=group)(ms.Tensor(np.ones(1, np.float32))).asnumpy()

    def _resume(self) -> Any:
        """Model, optimizer, step, consumed samples and RNG from `checkpoint.load_path`."""
        from .checkpoint import resume

        resumed = resume(self.config.checkpoint, self.comm.rank, self.comm.world_size,
                         self.source, agree=self._all_ranks if self.comm.world_size > 1
                         else None)
        if resumed is None:
            return None
        with self._whole_model():
            return self._apply_resumed(resumed)

    def _apply_resumed(self, resumed: Any) -> Any:
        from .checkpoint import apply_model_params, restore_rng_state
        from .models import load_hf_state

        if resumed.kind == "hf":
            load_hf_state(self.model, resumed.model_params)
            self.optimizer.reload_main_params_from_model()
            LOG.info("loaded Hugging Face weights from %s", resumed.path)
            return resumed.path
        apply_model_params(self.model.parameters_and_names(), resumed.model_params)
        if resumed.optimizer_state is None:
            self.optimizer.reload_main_params_from_model()
        else:
            self.optimizer.load_state_dict(resumed.optimizer_state)
            self.step_count = resumed.state.global_step
            self.consumed_samples = resumed.state.consumed_samples
        if resumed.state.rng:
            restore_rng_state(resumed.state.rng)
        LOG.info("resumed from %s at step %d (%d samples consumed)", resumed.path,
                 self.step_count, self.consumed_samples)
        return resumed.path

    def save_checkpoint(self) -> None:
        """Save after this step when the schedule says so (in the background with
        `async_save`; `_report_saves` tells the callbacks once it is complete)."""
        from .checkpoint import TrainState, model_arrays

        step, total = self.step_count, self.config.training.steps
        if not self.checkpoints.should_save(step, last=step == total):
            return
        optimizer_state = None if self.config.checkpoint.no_save_optim \
            else self.optimizer.state_dict()
        state = TrainState(global_step=step, consumed_samples=self.consumed_samples,
                           global_batch_size=self.config.training.global_batch_size,
                           step_num=total)
        with self._whole_model():
            arrays = model_arrays(self.model.parameters_and_names())
        self.checkpoints.save(step, arrays, optimizer_state, state, owned=True)  # host copies

    def _report_saves(self, ctx: Any) -> None:
        """Tell the callbacks of each checkpoint completed since the last step; a failed
        background save stops the run here, naming the newest complete checkpoint."""
        for step, path in self.checkpoints.poll():
            self.callbacks.on_save(ctx, step, path)

    def _build_callbacks(self) -> Any:
        from .callbacks import build_callbacks
        from .monitor import standard_callbacks

        user = build_callbacks(self.config.callbacks, self.source)
        return standard_callbacks(self.config.monitor, user, self.source,
                                  profiler=self.config.profiler)

    def _build_step(self) -> TrainStep:
        from mf_parallel.runtime.grad_sync import GradientSync

        from .monitor.health import EmbeddingHealthMonitor
        from .monitor.moe import MoeMonitor
        from .monitor.train_state import TrainStateMonitor
        from .step_monitors import MonitorObserver

        health = self.config.monitor.health_checkpoint
        skip = health.global_norm_skip_threshold if self.config.training.use_skip_step_on_nan \
            else None
        params = self.optimizer.params
        divide = not self.config.parallelism.disable_gradient_division
        sync = GradientSync(self.collectives, [tuple(p.shape) for p in params], average=divide)
        data_parallel = sync.size > 1
        # A sharded optimizer reduces, takes the norm and clips on its slices itself.
        whole = not isinstance(self.optimizer, ReducingOptimizer)
        return TrainStep(self.model, self.optimizer, max_norm=self.config.training.max_norm,
                         skip_threshold=skip,
                         reduce_grads=self._gradient_reduction(sync if data_parallel else None)
                         if whole else None,
                         norm_of=self._norm() if whole else None,
                         average_loss=self._loss_reduction(sync, divide)
                         if data_parallel else None,
                         loss_divisor=1 if divide else sync.size,
                         observer=MonitorObserver(
                             [p.name for p in self.optimizer.params],
                             self.callbacks.find(TrainStateMonitor),
                             self.callbacks.find(MoeMonitor),
                             self.callbacks.find(EmbeddingHealthMonitor)))

    @staticmethod
    def _loss_reduction(sync: Any, divide: bool) -> Any:
        """The step's loss over the data-parallel ranks: their mean; with summed gradients
        each rank's loss is already divided by their number, so their sum."""
        if divide:
            return lambda loss: sync.average_loss(loss, "data")
        return lambda loss: sync.collectives.all_reduce(loss, "data")

    def _gradient_reduction(self, sync: Any) -> Any:
        """Partial gradients summed over the tensor group (sequence-parallel norms, per-head
        q/k norms), then averaged over the data-parallel group."""
        from mf_parallel.runtime.tensor_parallel import reduce_sequence_parallel_grads

        group, params = self.tensor_group, list(self.optimizer.params)
        if group is None:
            return sync

        def reduce(grads: Any) -> Any:
            grads = reduce_sequence_parallel_grads(params, tuple(grads), group)
            return grads if sync is None else sync(grads)

        return reduce

    def _norm(self) -> Any:
        from mf_parallel.runtime.tensor_parallel import is_tensor_sharded

        from .train_step import tensor_parallel_norm

        if self.tensor_group is None:
            return None
        sharded = [is_tensor_sharded(p) for p in self.optimizer.params]
        return tensor_parallel_norm(sharded, self.tensor_group.all_reduce)

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

    def _check_skips(self, in_a_row: int) -> None:
        """Stop after too many skipped steps in a row: `training.max_consecutive_skipped_steps`
        when set (> 0), else `monitor.health_checkpoint.global_norm_skip_time`."""
        training = self.config.training
        limit = training.max_consecutive_skipped_steps or \
            self.config.monitor.health_checkpoint.global_norm_skip_time
        if in_a_row >= limit:
            raise TrainingStopped(
                f"{in_a_row} steps in a row were skipped (gradient norm not finite or above "
                f"monitor.health_checkpoint.global_norm_skip_threshold "
                f"{self.config.monitor.health_checkpoint.global_norm_skip_threshold}); "
                f"stopping at step {self.step_count} (limit {limit}: "
                "training.max_consecutive_skipped_steps, else health_checkpoint."
                "global_norm_skip_time)")

    def context(self) -> Any:
        """What the callbacks see of this run."""
        from .callbacks import TrainContext

        return TrainContext(output_dir=self.output_dir, total_steps=self.config.training.steps,
                            rank=self.comm.rank, world_size=self.comm.world_size,
                            start_step=self.step_count, monitor=self.config.monitor,
                            model=self.model)

    def train(self) -> list[StepOutcome]:
        """Run the remaining steps up to `training.steps`, calling the callbacks' hooks."""
        from .callbacks import StepRecord

        stream, ctx = self.stream(), self.context()
        outcomes: list[StepOutcome] = []
        last, skipped_in_a_row = None, 0
        self.callbacks.on_train_begin(ctx)
        try:
            while self.step_count < self.config.training.steps:
                self.callbacks.on_step_begin(ctx, self.step_count + 1)
                lr = self.schedule(self.step_count)
                outcome = self.run_step(stream)
                outcomes.append(outcome)
                last = StepRecord(
                    step=self.step_count, total_steps=self.config.training.steps,
                    loss=outcome.loss, lr=lr, grad_norm=outcome.grad_norm,
                    step_time=outcome.seconds,
                    tokens=outcome.tokens * self.plan.batch.data_parallel,
                    consumed_samples=self.consumed_samples, skipped=outcome.skipped)
                self.callbacks.on_step_end(ctx, last)
                self.save_checkpoint()
                self._report_saves(ctx)
                skipped_in_a_row = skipped_in_a_row + 1 if outcome.skipped else 0
                self._check_skips(skipped_in_a_row)
            self.checkpoints.wait()
            self._report_saves(ctx)
        finally:
            self.callbacks.on_train_end(ctx, last)
        return outcomes
