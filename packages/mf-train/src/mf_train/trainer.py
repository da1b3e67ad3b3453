"""The training recipe, for one rank: config -> plan -> build -> run.

Read `Trainer.train` and `TrainStep.launch` to follow a step: micro-batches from the data
stream -> forward, loss and backward (`layout.forward_backward`) -> reduction over the
parallel groups and the global norm (`layout.reduce`) -> skip or clip -> optimizer update ->
the MoE routers' auxiliary-loss-free bias (`expert_bias`), all queued without reading a value
back to the host (`TrainStep.read` then reads the loss, norm and skip flag) -> checkpoint ->
metrics (callbacks). The only part that depends on the parallel layout is the `StepLayout`
(`mf_train.layouts`), chosen from the plan in one place.

`Trainer(config, output_dir=...)` builds everything from the validated configuration, in this
order, each part from the typed section it needs: backend, memory cap and seeds (`context`,
`training`), the parallel plan and what the trainer supports of the configuration (`job`: a
refused value raises, a value with no effect here is logged once on rank 0), communication
(mf-parallel), the model (`model`, through the `MODELS` registry), recompute, communication
recompute and swap (mf-memory), the step layout with its optimizer, the LR schedule, the
checkpoint manager and the resumed state (`checkpoint`), the callbacks (`monitor`,
`callbacks`), and what the step lines' TFLOP/s and MFU need (`throughput`: the model's FLOPs
per token from its shape, `model_flops`, and a peak measured on every rank). `train()` then
runs `training.steps` optimizer steps, each of `plan.batch.accumulation_steps()`
micro-batches; a stop request (`stop_signals`: SIGINT, SIGTERM) ends it at a step boundary,
every rank at the same one, after a checkpoint.

With `training.use_skip_step_on_nan` a step whose norm is not finite, or above
`monitor.health_checkpoint.global_norm_skip_threshold`, is skipped: no update, the
optimizer's step count unchanged. The expert bias is still updated on a skipped step, as
Megatron does (`mf_train.step.expert_bias` says why).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import attrs
import mindspore as ms
import numpy as np
from mindspore import Tensor, nn

from mf_config import ParallelismConfig, TrainConfig
from mf_config.components import model_shape, sequence_length
from mf_config.yaml_source import Source, dump_text
from mf_memory.estimate import rank_summary, size
from mf_memory.model_shape import EstimateError, shape_of
from mf_memory.recompute import apply_recompute, apply_recompute_comm
from mf_memory.swap import ActivationSwap
from mf_parallel import Plan, rank_progress
from mf_parallel.placement import place_parameters
from mf_parallel.runtime import Collectives, Communication, init_communication
from mf_parallel.runtime.comm import use_device
from mf_parallel.runtime.context_parallel import ContextGroup
from mf_parallel.runtime.expert_dispatch import ExpertGroup
from mf_parallel.runtime.tensor_parallel import TensorGroup

from .checkpoint import (
    CheckpointError,
    CheckpointManager,
    Resumed,
    RunProgress,
    apply_model_params,
    restore_rng_state,
    resume,
)
from .checkpoint.layout import read_common
from .checkpoint.reader import conversion
from .checkpoint.regions import RankRegions
from .export.tensor_recut import RecutIndex
from .layouts import (
    LayoutParts,
    LayoutRecord,
    MicroBatch,
    Observers,
    StepLayout,
    StepObserver,
    Unobserved,
    build_layout,
    layout_for,
    stage_part,
)
from .layouts.gradient_norm import clip_coefficient, update_kept
from .layouts.saved_model import load_model_pieces, model_pieces
from .models import sharding_table
from .models.hf_weights import HFPieces, checked_entries
from .monitor import standard_callbacks
from .monitor.step_monitors import MonitorObserver
from .observe.callbacks import CallbackList, StepRecord, TrainContext, build_callbacks
from .observe.evaluation import CONSUMED_VALID, Evaluate, Evaluation
from .observe.model_flops import flops_per_token, matmul_weights_per_token
from .observe.peak_flops import RANKS_ON_HOST, cached_peak, given_peak, peak_dtype
from .observe.process_memory import (
    largest_peak,
    map_large_allocations,
    one_block_cpu_pool,
    return_freed_host_memory,
)
from .observe.step_times import own_times, step_times
from .observe.throughput import PeakFlops, RunPace, Throughput, measure_peak_flops
from .optim import Optimizer
from .optim.lr_schedules import LrSchedule, build_lr_schedule
from .optim.qk_clip import QKClip, clip_settings
from .parallelize import build_parallel_model
from .preflight.input_checks import check_inputs
from .preflight.job import check_support, make_job_plan, resolve_device
from .preflight.run_directory import checkpoint_root
from .step import world_group
from .step.compiled_layers import CompileReport, compile_layers, compile_optimizer
from .step.expert_bias import ExpertBiasUpdate, NoExpertBiasUpdate
from .step.host_reads import counted_reads, counting_asked
from .step.micro_batches import MicroBatchStream, build_stream, evaluation_stream

LOG = logging.getLogger("mf_train")


@dataclass(frozen=True)
class StepOutcome:
    """What one optimizer step did (plain Python numbers)."""

    loss: float
    grad_norm: float
    skipped: bool
    tokens: int
    """Tokens of this step on this rank (micro-batches x batch x sequence)."""
    seconds: float
    lr: float
    host_reads: int | None = None
    """Reads of device tensors to the host while the step was launched, when counted
    (`host_reads`)."""


@dataclass(frozen=True)
class LaunchedStep:
    """A step whose work is queued, its numbers still on the device (`TrainStep.launch`)."""

    loss: Tensor
    norm: Tensor
    keep: Tensor | None
    """Whether the update applied (None: no skip decision, it did)."""
    tokens: int
    lr: float
    start: float
    """`time.perf_counter()` when the step began."""


class TrainStep:
    """One optimizer step of a layout: forward/backward, reduce, skip or clip, update.

    Args:
        layout: the step layout (with its optimizer).
        max_norm: `training.max_norm`, the clipping threshold of the global norm.
        skip_threshold: skip the update when the norm is not finite or above this (None:
            never skip).
        observer: told each micro-batch's and the step's local loss and gradients.
        expert_bias: the MoE routers' auxiliary-loss-free bias update (none by default); it
            also observes the micro-batches, to count their tokens per expert.
        count_host_reads: count the reads to the host while a step is launched
            (`host_reads`; the outcome's `host_reads`).
        qk_clip: Muon's QK-clip, run after each update (None: off).
    """

    def __init__(self, layout: StepLayout, *, max_norm: float,
                 skip_threshold: float | None = None, observer: StepObserver | None = None,
                 expert_bias: NoExpertBiasUpdate | None = None,
                 count_host_reads: bool = False, qk_clip: QKClip | None = None):
        self.layout = layout
        self.qk_clip = qk_clip
        self.count_host_reads = count_host_reads
        self.max_norm = max_norm
        self.skip_threshold = skip_threshold
        self.expert_bias = expert_bias or NoExpertBiasUpdate()
        self.observer = Observers(self.expert_bias, observer or Unobserved())

    def __call__(self, micro_batches: Sequence[MicroBatch], lr: float) -> StepOutcome:
        """Run the step on this rank's `micro_batches` at learning rate `lr`; its numbers."""
        if not self.count_host_reads:
            return self.read(self.launch(micro_batches, lr))
        with counted_reads() as reads:
            launched = self.launch(micro_batches, lr)
        return dataclasses.replace(self.read(launched), host_reads=reads.count)

    def launch(self, micro_batches: Sequence[MicroBatch], lr: float) -> LaunchedStep:
        """Queue the step's work without reading anything back to the host: the norm, the
        clip coefficient and the skip decision stay on the device (`gradient_norm`); a
        skipped step runs an update that changes nothing (`optim.protocol`)."""
        start = time.perf_counter()
        rank_progress.phase("forward_backward")
        local = self.layout.forward_backward(micro_batches, self.observer)
        self.observer.reduced(local.loss, local.grads)
        rank_progress.phase("reduction")
        reduced = self.layout.reduce(local)
        keep = None if self.skip_threshold is None else update_kept(reduced.norm,
                                                                    self.skip_threshold)
        rank_progress.phase("optimizer")
        self.layout.optimizer.step(reduced.grads, lr,
                                   clip_coefficient(reduced.norm, self.max_norm), keep)
        if self.qk_clip is not None:
            self.qk_clip(keep)
        self.expert_bias.update()  # every step, skipped or not (as Megatron)
        return LaunchedStep(reduced.loss, reduced.norm, keep, local.tokens, lr, start)

    def read(self, step: LaunchedStep) -> StepOutcome:
        """The launched step's numbers on the host (this waits for its kernels); a skipped
        step's update count taken back from the optimizer."""
        rank_progress.phase("readback")
        skipped = step.keep is not None and not bool(step.keep.asnumpy())
        if skipped:
            self.layout.optimizer.uncount()
        return StepOutcome(loss=float(step.loss.asnumpy()), grad_norm=float(step.norm.asnumpy()),
                           skipped=skipped, tokens=step.tokens,
                           seconds=time.perf_counter() - step.start, lr=step.lr)


@dataclass
class Divergence:
    """The run of consecutive steps, up to the last, whose loss or gradient norm is not
    finite and whose update was applied (a skipped step changes nothing)."""

    in_a_row: int = 0
    first: int = 0
    """The first step of that run."""
    loss: float = 0.0
    norm: float = 0.0
    """The first step's loss and gradient norm."""

    def step_done(self, step: int, outcome: StepOutcome) -> None:
        if outcome.skipped or (math.isfinite(outcome.loss)
                               and math.isfinite(outcome.grad_norm)):
            self.in_a_row = 0
            return
        if not self.in_a_row:
            self.first, self.loss, self.norm = step, outcome.loss, outcome.grad_norm
        self.in_a_row += 1


class TrainingStopped(RuntimeError):
    """Training cannot usefully go on (too many skipped steps); the message says why."""


class TrainingDiverged(TrainingStopped):
    """The loss or gradient norm stayed not finite for `training.max_nonfinite_steps` steps
    (or up to the last step); nothing was saved after the last finite step."""

    def __init__(self, message: str, step: int):
        super().__init__(message)
        self.step = step
        """The first step of the divergence."""


def seed_everything(seed: int, deterministic: bool) -> None:
    """Python, numpy and MindSpore seeds; deterministic kernels when asked."""
    random.seed(seed)
    np.random.seed(seed)
    ms.set_seed(seed)
    if deterministic and ms.get_context("deterministic") != "ON":
        # MindSpore's current API (set_context's `deterministic` prints a deprecation
        # warning); it may be set once per process, and a later trainer finds it on
        ms.set_deterministic(True)


def launch_synchronously_on_cpu(device: str) -> bool:
    """On the CPU backend, launch each kernel from the calling thread
    (`mindspore.runtime.launch_blocking`); returns whether it did.

    By default PyNative hands kernels to a launch thread, which on a machine with few cores
    competes with the kernels' own worker threads: a 256x64x64 matmul took 2-6 ms instead of
    0.1 ms, and the tiny Qwen3's forward + backward 1.9 s instead of 0.2 s (the 28M one 7.2 s
    instead of 3.1 s), with bit-identical results (benchmarks/cpu_launch.py). Devices keep
    asynchronous launch.

    Compiled graphs run on the calling thread too (`MS_DEV_HOST_BLOCKING_RUN`): else the
    next PyNative operation waits for a graph by spinning (`AsyncRQueue::Wait`, 30 % of the
    CPU samples of a 28M step), taking one of the cores the graph's kernels run on; a step
    with its forward and backward as one graph took 2.1 s instead of 1.1 s."""
    if device != "CPU":
        return False
    ms.runtime.launch_blocking()
    os.environ["MS_DEV_HOST_BLOCKING_RUN"] = "1"
    return True


def cap_device_memory(max_device_memory: str | None, device: str) -> None:
    """`context.max_device_memory` as the cap of MindSpore's device memory pool, on the
    backends where it caps anything (on CPU it does not: `support` says so before the run)."""
    if max_device_memory is not None and device != "CPU":
        ms.runtime.set_memory(max_size=max_device_memory)


class Trainer:
    """Trains the configured model on this rank; see the module docstring for the order.

    Args:
        config: the validated configuration.
        output_dir: where the run writes its logs, metrics, TensorBoard events and (unless
            `checkpoint.save_path` says otherwise) checkpoints.
        source: the YAML source, for error lines.
        world_size: the number of ranks of the job (this process is one of them).
        say_warnings: log the settings that have no effect here (False: the launcher did).
        show_step_times: end each step line with where its time went (`step_times`; the
            record has the times either way).
        peak: `--peak`: a rated device or a number of TFLOP/s (`peak_flops`); None: the
            peak measured once on this machine.
        spike_factor: `--spike-factor` (`monitor.spikes`; 0: no spike events).

    Raises:
        ConfigError, PlanError: settings refused before anything is built.
    """

    config: TrainConfig
    source: Source | None
    output_dir: Path
    device: str
    plan: Plan
    comm: Communication
    collectives: Collectives
    tensor_group: TensorGroup | None
    expert_group: ExpertGroup | None
    model: nn.Cell
    swap: ActivationSwap
    layout: StepLayout
    schedule: LrSchedule
    checkpoints: CheckpointManager
    step_count: int
    """Optimizer steps done (the LR schedule's next input)."""
    consumed_samples: int
    resumed_from: Path | None
    callbacks: CallbackList
    step: TrainStep
    compiled: CompileReport
    """What `context.compile` compiled; counts compilations as the steps run."""
    stopped: bool = False
    """Whether the last `train()` ended early because a stop was asked for."""

    def __init__(self, config: TrainConfig, *, output_dir: str | Path,
                 source: Source | None = None, world_size: int = 1,
                 say_warnings: bool = True, show_step_times: bool = False,
                 peak: str | None = None, spike_factor: float = 3.0):
        self.config, self.source, self.output_dir = config, source, Path(output_dir)
        self.given_peak = peak
        self.device = resolve_device(config.context.device_target)
        ms.set_context(mode=ms.PYNATIVE_MODE)
        use_device(self.device)
        if launch_synchronously_on_cpu(self.device):
            LOG.info("CPU backend: kernels launched synchronously (faster here than a launch "
                     "thread competing with the kernels' threads)")
        cap_device_memory(config.context.max_device_memory, self.device)
        one_block_cpu_pool(self.device)  # no tensors spread over blocks (process_memory)
        map_large_allocations()  # freed tensors leave the resident set (process_memory)
        seed_everything(config.training.seed, config.training.deterministic)
        self.plan = make_job_plan(config, world_size, source)
        no_effect = check_support(config, self.plan, self.device, source)
        check_inputs(config, source)  # before a rank joins the group or builds anything
        rank_progress.phase(rank_progress.JOINING)
        self.comm = init_communication(self.plan, self.device)
        # the launcher of ranks has said them, before any rank started (`say_warnings` False)
        for warning in no_effect if self.comm.rank == 0 and say_warnings else ():
            LOG.warning("%s", warning)
        self.collectives = Collectives(self.comm)
        self.tensor_group = (TensorGroup(self.collectives, sequence_parallel=True)
                             if self.plan.dims.tensor > 1 else None)
        self.expert_group = (ExpertGroup(self.collectives,
                                         config.parallelism.moe_token_dispatcher_type)
                             if self.plan.dims.expert > 1 else None)
        self.context_group = (ContextGroup(self.collectives, self.plan.dims.context_causal,
                                           self.plan.dims.context_overlap)
                              if self.plan.dims.context > 1 else None)
        rank_progress.phase("build_model")
        self.model = build_parallel_model(
            config.model, tensor_group=self.tensor_group, source=source,
            seed=config.training.seed, part=stage_part(self.plan, self.comm.rank),
            expert_group=self.expert_group, context_group=self.context_group,
            layer_built=self._layer_slicer(config.parallelism))
        self.swap = self._apply_memory()
        self.layout = build_layout(LayoutParts(
            self.model, config.optimizer, config.parallelism, self.plan.dims, self.collectives,
            self.tensor_group, source, self.plan, config.context.compile))
        placements = None  # one process owns everything it holds
        if self.plan.dims.world_size > 1:
            placements = place_parameters(sharding_table(config.model, source), self.plan,
                                          config.parallelism.data_parallel_shard_strategy)
            self.layout.use_record(LayoutRecord(placements, self.plan, self.collectives))
        return_freed_host_memory()  # what the layout freed of the model built whole
        self.regions = RankRegions(placements, self.plan, self.comm.rank)
        rank_progress.phase("compile")
        self.compiled = compile_layers(self.model, config.context.compile, [
            (f"the layout ({self.layout.describe()})", self.layout.compile_blocker),
            ("swap", "its hooks see each saved tensor of a layer" if self.swap.paths else None),
            ("Muon's QK-clip", "the attention records each head's largest logit as it runs"
             if clip_settings(config.optimizer, source) else None)],
            body_params=self.layout.params if self.layout.compiles_body else None)
        if self.compiled.gradients is not None:
            self.layout.use_gradient_graph(self.compiled.gradients)
        compile_optimizer(self.layout.optimizer, self.compiled)
        LOG.info("%s", self.compiled.describe())
        self.schedule = build_lr_schedule(config.lr_scheduler, config.training.steps, source)
        LOG.info("%s; optimizer %s; %s", self.layout.describe(), config.optimizer.type,
                 self.schedule.describe())
        self.step_count, self.consumed_samples, self.consumed_valid_samples = 0, 0, 0
        self.evaluation: Evaluation | None = None
        self.test_evaluation: Evaluation | None = None
        self._diverged = Divergence()
        self.checkpoints = self._build_checkpoints()
        rank_progress.phase("resume")
        self.resumed_from = self._resume()
        self.callbacks = standard_callbacks(config.monitor,
                                            build_callbacks(config.callbacks, source),
                                            source, profiler=config.profiler,
                                            step_times=show_step_times,
                                            spike_factor=spike_factor)
        self.step = self._build_step()
        self.build_peak = largest_peak(self.device, self.comm.world_size)
        """The largest rank's peak memory once everything is built (a collective)."""
        LOG.info("%s", self._memory_line())
        rank_progress.phase("measure_peak")
        self.throughput = self._throughput()
        """FLOPs per token and peak: a step's TFLOP/s and MFU (measures the peak: every rank
        at once)."""
        if self.comm.rank == 0:
            LOG.info("%s", self.throughput.describe())

    def _memory_line(self) -> str:
        """`parameters: 31.8M on rank 0 of 127.2M in the model; peak memory once built
        1.22 GiB (rank 2); mf-memory estimates 1.04 GiB for rank 0's step` (the model's count
        and the estimate from mf-memory, left out for a configuration it cannot model)."""
        held = self.layout.held_parameters()
        rank, world = self.comm.rank, self.comm.world_size
        try:
            summary = rank_summary(self.config, world, rank)
        except (EstimateError, ValueError):
            summary = None
        where = f" (rank {self.build_peak.rank})" if world > 1 else ""
        line = (f"parameters: {held / 1e6:.1f}M on rank {rank}"
                f"{f' of {summary.model_params / 1e6:.1f}M in the model' if summary else ''}; "
                f"peak memory once built {self.build_peak.gib:.2f} GiB{where}")
        if summary is not None:
            line += f"; mf-memory estimates {size(summary.peak_bytes)} for rank {rank}'s step"
        return line

    def _throughput(self) -> Throughput:
        """The model's FLOPs per token (`model_flops`, from its shape and the sequence length)
        and this rank's peak FLOP/s (`_peak`); FLOPs unknown, for a model without a shape,
        leaves the peak unmeasured."""
        world = self.comm.world_size
        try:
            shape = shape_of(self.config.model)
            seq = sequence_length(self.config)
            if seq is None:
                raise EstimateError("no sequence length: model.seq_length or "
                                    "train_dataset.dataloader.config.seq_length")
            flops = flops_per_token(shape, seq)
        except ValueError as exc:  # EstimateError is one
            return Throughput(world, unknown=str(exc))
        return Throughput(world, flops, self._peak(), seq_length=seq,
                          matmul_weights=matmul_weights_per_token(shape))

    def _peak(self) -> PeakFlops:
        """The peak MFU divides by (`peak_flops`): `--peak`'s, else measured once per machine
        (every rank measures at once when the cache has none; one rank per host keeps it)."""
        if self.given_peak is not None:
            return given_peak(self.given_peak, peak_dtype(self.config, self.device))
        ranks_on_host = int(os.environ.get(RANKS_ON_HOST, "1"))
        return cached_peak(self.device, lambda: measure_peak_flops(self.device),
                           write=self.comm.rank % ranks_on_host == 0)

    @property
    def model_vocab_size(self) -> int | None:
        """The model's vocabulary, which every token id read must fit (None: a model type
        without declared settings, whose ids are not checked)."""
        shape = model_shape(self.config.model, self.source)
        return None if shape is None else shape.vocab_size

    @property
    def optimizer(self) -> Optimizer:
        """The layout's optimizer (`mf_train.optim.Optimizer`)."""
        return self.layout.optimizer

    # ------------------------------------------------------------------ build

    def _layer_slicer(self, parallelism: ParallelismConfig,
                      ) -> Callable[[nn.Cell], object] | None:
        """The chosen layout's `layer_built` hook (None when no layout runs this plan)."""
        chosen = layout_for(self.plan.dims, parallelism)
        return None if chosen is None else chosen.layer_built(self.plan.dims, parallelism,
                                                              self.collectives)

    def _apply_memory(self) -> ActivationSwap:
        """Recompute and communication recompute marked on the model; the activation swap."""
        marked = apply_recompute(self.model, self.config.recompute)
        if self.tensor_group is not None:
            marked += apply_recompute_comm(self.model, self.config.recompute_comm)
        if marked:
            LOG.info("recompute: %s", ", ".join(marked))
        swap = ActivationSwap(self.model, self.config.swap)
        if swap.paths:
            LOG.info("swap: %s", ", ".join(swap.paths))
        return swap

    def _build_checkpoints(self) -> CheckpointManager:
        """The checkpoint manager; an empty `checkpoint.save_path` means
        `<output-dir>/checkpoint` (MindFormers refuses an empty path)."""
        section = self.config.checkpoint
        if section.enable_save and not section.save_path:
            root = checkpoint_root(section, self.output_dir)
            section = attrs.evolve(section, save_path=str(root))
        many = self.comm.world_size > 1
        return CheckpointManager(section, self.comm.rank, self.comm.world_size,
                                 barrier=world_group.barrier if many else None,
                                 source=self.source,
                                 run_config=self._effective_config())

    def _effective_config(self) -> str:
        """The configuration as the user wrote it with the `--set` overrides applied (every
        default filled in when the trainer was given no source), as YAML."""
        return dump_text(self.config.to_dict() if self.source is None else self.source.data)

    def _build_step(self) -> TrainStep:
        health = self.config.monitor.health_checkpoint
        skip = health.global_norm_skip_threshold if self.config.training.use_skip_step_on_nan \
            else None
        observer = MonitorObserver.of(self.layout.optimizer.names, self.callbacks)
        return TrainStep(self.layout, max_norm=self.config.training.max_norm,
                         skip_threshold=skip, observer=observer,
                         expert_bias=ExpertBiasUpdate.of(self.model, self.collectives),
                         count_host_reads=counting_asked(),
                         qk_clip=QKClip.of(self.model, self.config.optimizer, self.collectives,
                                           self.layout.optimizer, self.source))

    # ------------------------------------------------------------------ checkpoints

    def _resume(self) -> Path | None:
        """Model, optimizer, step, consumed samples and RNG from `checkpoint.load_path`."""
        many, started = self.comm.world_size > 1, time.perf_counter()
        self._resumed_kind: str | None = None
        resumed = resume(self.config.checkpoint, self.comm.rank, self.comm.world_size,
                         self.source, agree=world_group.all_ranks if many else None)
        if resumed is None:
            return None
        self._resumed_kind = resumed.kind
        if resumed.kind == "pieces":
            self._apply_pieces(resumed, started)
            return resumed.path
        if resumed.kind == "hf":
            self._apply_hf(resumed)
            return resumed.path
        with self.layout.whole_model():
            self._apply_resumed(resumed)
        return resumed.path

    def _apply_pieces(self, resumed: Resumed, started: float) -> None:
        """A sharded checkpoint: each rank reads the ranges it holds (any saving layout; a
        weight saved at another tensor-parallel degree is cut to this rank's place)."""
        entries = self.model.weight_maps()
        with RecutIndex(resumed.model_params, entries) as model:
            load_model_pieces(self.layout, self.regions, model,
                              self.config.checkpoint.load_worker_number)
            if resumed.optimizer_state is None:
                self.optimizer.reload_main_params_from_model()
            else:
                with RecutIndex(resumed.optimizer_state, entries) as optimizer:
                    self.optimizer.load_state_pieces(optimizer, model, self.regions)
                self._resume_progress(resumed)
            read = model.bytes_read + (resumed.optimizer_state.bytes_read
                                       if resumed.optimizer_state is not None else 0)
        if resumed.state.rng:
            restore_rng_state(resumed.state.rng)
        rng = ("its random generator states" if resumed.state.rng else
               "random generators re-seeded (saved by another world size)")
        LOG.info("resumed from %s at step %d (%d samples consumed; this rank read %s in "
                 "%.2f s; %s)", resumed.path, self.step_count, self.consumed_samples,
                 size(read), time.perf_counter() - started, rng)

    def _apply_hf(self, resumed: Resumed) -> None:
        """Hugging Face weights, read as a sharded checkpoint is (`HFPieces`): each rank reads
        its tensor-parallel share of the parameters it holds whole and only the rows of its
        ZeRO or FSDP slices, so no rank holds the model whole."""
        with resumed.model_params as weights:
            entries = checked_entries(self.model, weights)
            load_model_pieces(self.layout, self.regions,
                              HFPieces(weights, entries, resumed.path),
                              self.config.checkpoint.load_worker_number)
        self.optimizer.reload_main_params_from_model()
        LOG.info("loaded Hugging Face weights from %s: this rank read %s of the %s there",
                 resumed.path, size(weights.bytes_read), size(weights.nbytes))

    def _apply_resumed(self, resumed: Resumed) -> None:
        """A checkpoint in format 1 or 2 (an earlier mf's), loaded whole."""
        try:
            apply_model_params(self.model.parameters_and_names(), resumed.model_params)
        except CheckpointError as exc:  # format 1 or 2: tied to the layout that saved it
            common = read_common(resumed.path)
            raise CheckpointError(f"{exc}\n{resumed.path} is in format "
                                  f"{common.get('version', 1)} (an earlier mf's), which loads "
                                  "only on the layout that saved it; if that layout was not "
                                  f"this one, {conversion(resumed.path, common)}") from None
        if resumed.optimizer_state is None:
            self.optimizer.reload_main_params_from_model()
        else:
            self.optimizer.load_state_dict(resumed.optimizer_state)
            self._resume_progress(resumed)
        if resumed.state.rng:
            restore_rng_state(resumed.state.rng)
        LOG.info("resumed from %s at step %d (%d samples consumed)", resumed.path,
                 self.step_count, self.consumed_samples)

    def _resume_progress(self, resumed: Resumed) -> None:
        """Where the resumed run was: its steps, the samples it read of the training split
        and of the valid split (0 for a checkpoint without that key)."""
        self.step_count = resumed.state.global_step
        self.consumed_samples = resumed.state.consumed_samples
        self.consumed_valid_samples = int(resumed.state.extra.get(CONSUMED_VALID, 0))

    def save_checkpoint(self, *, stopping: bool = False) -> None:
        """Save after this step when the schedule says so, or when the run stops here
        (`stopping`), in the background with `async_save` (`_report_saves` tells the
        callbacks once it is complete)."""
        step, total = self.step_count, self.config.training.steps
        if self._diverged.in_a_row:
            return  # the state after a step whose loss or norm is not finite is never saved
        if not self.checkpoints.should_save(step, last=step == total or stopping):
            return
        rank_progress.phase("save")
        optimizer_state = None if self.config.checkpoint.no_save_optim \
            else self.optimizer.state_pieces(self.regions)
        if self.evaluation is not None:
            self.consumed_valid_samples = self.evaluation.consumed_samples
        progress = RunProgress(global_step=step, consumed_samples=self.consumed_samples,
                               global_batch_size=self.config.training.global_batch_size,
                               step_num=total,
                               extra={CONSUMED_VALID: self.consumed_valid_samples})
        pieces = model_pieces(self.layout, self.regions)
        self.checkpoints.save(step, pieces, optimizer_state, progress, owned=True)

    def _report_saves(self, ctx: TrainContext) -> None:
        """Tell the callbacks of each checkpoint completed since the last step; a failed
        background save stops the run here, naming the newest complete checkpoint."""
        for step, path in self.checkpoints.poll():
            self.callbacks.on_save(ctx, step, path)

    # ------------------------------------------------------------------ run

    def stream(self) -> MicroBatchStream:
        """This rank's micro-batch stream from the current consumed-sample count."""
        return build_stream(self.config.train_dataset, self.plan, self.comm.rank,
                            consumed_samples=self.consumed_samples,
                            seed=self.config.training.seed, source=self.source,
                            vocab_size=self.model_vocab_size)

    def valid_evaluation(self) -> Evaluation | None:
        """The valid split's evaluation from the resumed position, when a callback is an
        `Evaluate` (None otherwise: the valid split is not read)."""
        if self.callbacks.find(Evaluate) is None:
            return None
        return self.split_evaluation(1, self.consumed_valid_samples)

    def test_split_evaluation(self) -> Evaluation | None:
        """The test split's evaluation from its start, when an `Evaluate` callback asks for
        it (`test: true`; None otherwise: the test split is not read)."""
        evaluate = self.callbacks.find(Evaluate)
        if evaluate is None or not evaluate.settings.test:
            return None
        return self.split_evaluation(2, 0)

    def split_evaluation(self, split: int, consumed_samples: int) -> Evaluation:
        stream = evaluation_stream(self.config.train_dataset, self.plan, self.comm.rank,
                                   split=split, consumed_samples=consumed_samples,
                                   vocab_size=self.model_vocab_size)
        return Evaluation(self.layout, stream,
                          lambda: self.plan.batch.accumulation_steps(self.consumed_samples))

    def run_step(self, stream: MicroBatchStream) -> StepOutcome:
        """One optimizer step on the next micro-batches of `stream`, at the schedule's rate."""
        accumulation = self.plan.batch.accumulation_steps(self.consumed_samples)
        rank_progress.phase("data")
        micro = [next(stream) for _ in range(accumulation)]
        outcome = self.step(micro, self.schedule(self.step_count))
        self.step_count += 1
        self.consumed_samples = stream.consumed_samples
        return outcome

    def context(self) -> TrainContext:
        """What the callbacks see of this run."""
        return TrainContext(output_dir=self.output_dir, total_steps=self.config.training.steps,
                            rank=self.comm.rank, world_size=self.comm.world_size,
                            start_step=self.step_count, monitor=self.config.monitor,
                            model=self.model, collectives=self.collectives,
                            build_peak_memory_gib=round(self.build_peak.gib, 3),
                            model_flops_per_token=self.throughput.flops_per_token,
                            peak_tflops=self.throughput.peak_tflops,
                            peak_source=(self.throughput.peak.source
                                         if self.throughput.peak is not None else None),
                            evaluate=self.evaluation, evaluate_test=self.test_evaluation)

    def train(self, stop: Callable[[], bool] | None = None) -> list[StepOutcome]:
        """Run the remaining steps up to `training.steps`, calling the callbacks' hooks.

        `stop` (`stop_signals.StopSignals`: a stop signal came) is asked at every step
        boundary, before each step: once it is true on any rank, every rank stops at that
        boundary (`_stop_agreed`), saves the steps this run made (unless saving is off) and
        returns, with `stopped` set."""
        self.evaluation = self.valid_evaluation()
        self.test_evaluation = self.test_split_evaluation()
        stream, ctx, total = self.stream(), self.context(), self.config.training.steps
        outcomes: list[StepOutcome] = []
        last, skipped_in_a_row, self._diverged = None, 0, Divergence()
        self.stopped = False
        self.callbacks.on_train_begin(ctx)
        pace = RunPace(total)
        rank_progress.phase_seconds()  # the first step's times start here
        try:
            while self.step_count < total:
                rank_progress.step(self.step_count + 1)
                rank_progress.phase("step_begin")
                if stop is not None and self._stop_agreed(stop()):
                    self.stopped = True
                    if self.step_count > ctx.start_step:
                        self.save_checkpoint(stopping=True)
                    break
                self.callbacks.on_step_begin(ctx, self.step_count + 1)
                outcome = self.run_step(stream)
                outcomes.append(outcome)
                rank_progress.phase("log")
                last = self._record(outcome, pace)
                self.callbacks.on_step_end(ctx, last)
                self._diverged.step_done(self.step_count, outcome)
                self.save_checkpoint()
                self._report_saves(ctx)
                skipped_in_a_row = skipped_in_a_row + 1 if outcome.skipped else 0
                self._check_skips(skipped_in_a_row)
                self._check_divergence(finished=False)
            self._check_divergence(finished=True)
            rank_progress.phase("finishing")
            if self._converts():
                self.save_checkpoint()
            self.checkpoints.wait()
            self._report_saves(ctx)
        finally:
            self.callbacks.on_train_end(ctx, last)
        return outcomes

    def _converts(self) -> bool:
        """Whether this run resumed a checkpoint of format 2 (an earlier mf's, which loads
        only on the layout that wrote it) at its last step, from outside its own save path:
        it trains nothing and saves that step in the sharded format, which loads on any
        layout (the conversion the format-2 refusal names)."""
        return (self._resumed_kind == "mf" and self.step_count == self.config.training.steps
                and self.resumed_from is not None
                and self.resumed_from.parent.resolve() != self.checkpoints.root.resolve())

    def _stop_agreed(self, asked: bool) -> bool:
        """Whether any rank was asked to stop (one process: `asked`; several: an all-reduce
        over the world group, so that every rank stops at the same step boundary)."""
        if self.comm.world_size == 1:
            return asked
        return not world_group.all_ranks(not asked)

    def _record(self, outcome: StepOutcome, pace: RunPace) -> StepRecord:
        """The step as the callbacks see it (tokens over all data and context ranks; tokens/s
        per rank, TFLOP/s and MFU; elapsed time and ETA from `pace`; the largest rank's peak
        memory so far: a collective), with the compilation it included, if any
        (`compile_time`, `compiled_graphs`)."""
        record = StepRecord(step=self.step_count, total_steps=self.config.training.steps,
                            loss=outcome.loss, lr=outcome.lr, grad_norm=outcome.grad_norm,
                            step_time=outcome.seconds,
                            tokens=outcome.tokens * self.plan.batch.data_parallel
                            * self.plan.dims.context,
                            consumed_samples=self.consumed_samples, skipped=outcome.skipped)
        self.throughput.fill(record)
        graphs, seconds = self.compiled.take_new()
        record.elapsed_s, record.eta_s = pace.step_done(self.step_count, steady=not graphs)
        peak = largest_peak(self.device, self.comm.world_size)
        record.peak_memory_gib = round(peak.gib, 3)
        record.peak_memory_rank = peak.rank if self.comm.world_size > 1 else None
        if outcome.host_reads is not None:  # the most any rank made
            record.extra["host_reads"] = max(world_group.every_rank(outcome.host_reads)) \
                if self.comm.world_size > 1 else outcome.host_reads
        own = own_times(rank_progress.phase_seconds())
        record.extra.update(step_times(
            world_group.every_rank_values(own, "step_times") if self.comm.world_size > 1
            else [own]))
        if graphs:
            record.extra.update(compile_time=seconds, compiled_graphs=graphs)
            LOG.info("step %d compiled %d graph(s) in %.1f s", self.step_count, graphs, seconds)
        return record

    def _check_divergence(self, *, finished: bool) -> None:
        """Stop a diverged run: `training.max_nonfinite_steps` steps in a row whose loss or
        gradient norm is not finite, or any such step as the last one (`finished`). The save
        in flight (of a finite step) completes first."""
        limit, diverged = self.config.training.max_nonfinite_steps, self._diverged
        if not diverged.in_a_row or (diverged.in_a_row < limit and not finished):
            return
        self.checkpoints.wait()
        self._report_saves(self.context())
        raise TrainingDiverged(
            f"diverged at step {diverged.first}: loss {diverged.loss:.6g}, gradient norm "
            f"{diverged.norm:.6g}; stopped at step {self.step_count} after {diverged.in_a_row} "
            f"step{'s' if diverged.in_a_row > 1 else ''} not finite "
            f"(training.max_nonfinite_steps {limit}), none of them saved; "
            f"{self.checkpoints.last_good()}: lower the learning rate and run the same "
            "command to continue from it", diverged.first)

    def _check_skips(self, in_a_row: int) -> None:
        """Stop after too many skipped steps in a row: `training.max_consecutive_skipped_steps`
        when set (> 0), else `monitor.health_checkpoint.global_norm_skip_time`."""
        health = self.config.monitor.health_checkpoint
        limit = self.config.training.max_consecutive_skipped_steps or \
            health.global_norm_skip_time
        if in_a_row >= limit:
            raise TrainingStopped(
                f"{in_a_row} steps in a row were skipped (gradient norm not finite or above "
                f"monitor.health_checkpoint.global_norm_skip_threshold "
                f"{health.global_norm_skip_threshold}); stopping at step {self.step_count} "
                f"(limit {limit}: training.max_consecutive_skipped_steps, else "
                "health_checkpoint.global_norm_skip_time)")
