"""The typed configuration: `TrainConfig` and its fourteen section classes.

The fields are declared with `section_base.setting` (default, help text, bounds). Closed
sections reject unknown keys. Open sections (`optimizer`, `lr_scheduler`,
`train_dataset.dataloader`, `model`, each callback) keep undeclared keys in `extras` for the
component their `type` selects.
"""

from typing import Any, Literal

from .layer_spec import LayerSpec
from .section_base import (
    MAX_DIMENSION,
    MAX_SEED,
    OpenSection,
    Section,
    declared_fields,
    section,
    setting,
)

__all__ = [  # the declaring names too: components' settings classes import them from here
    "MAX_DIMENSION", "MAX_SEED", "REQUIRED_SECTIONS", "CallbackConfig", "CheckpointConfig",
    "ContextConfig", "DataloaderConfig", "Dtype", "HealthCheckpointConfig", "LayerSwap",
    "LrSchedulerConfig", "ModelConfig", "MoeMonitorConfig", "MonitorConfig", "OpSwap",
    "OpenSection", "OptimizerConfig", "ParallelismConfig", "ProfilerConfig", "RecomputeCommConfig",
    "RecomputeConfig", "Section", "SwapConfig", "TensorboardConfig", "TrainConfig",
    "TrainDatasetConfig", "TrainStateConfig", "TrainingConfig", "declared_fields", "section",
    "setting",
]

Dtype = Literal["float32", "bfloat16", "float16"]


@section
class ContextConfig(Section):
    """Where and how MindSpore runs."""

    device_target: Literal["auto", "CPU", "GPU", "Ascend"] = setting(
        "auto", "Backend; auto picks the first available of Ascend, GPU, CPU.")
    mode: int = setting(1, "1 = PyNative (dynamic graph); graph mode (0) is not supported.")
    max_device_memory: str | None = setting(
        None, "Device memory cap such as \"59GB\", passed to the backend where it applies.")
    compile: bool = setting(
        False, "Run the model (its forward and backward) and the optimizer's update as "
        "compiled graphs (mindspore.jit) where the layout allows; false: pure PyNative. One "
        "log line says what was compiled and why not.")


@section
class CheckpointConfig(Section):
    """Saving and loading of weights and optimizer state."""

    enable_save: bool = setting(True, "Whether to save checkpoints.")
    save_path: str = setting("", "Directory checkpoints are written to.")
    save_max: int = setting(5, "Newest checkpoints kept; older ones are deleted.", ge=1)
    save_interleaved_steps: int = setting(1000, "Steps between two saves.", ge=1)
    no_save_optim: bool = setting(False, "Save weights only (resuming is then not exact).")
    async_save: bool = setting(False, "Write checkpoints without blocking the step.")
    prefix: str = setting("checkpoint", "File name prefix of saved checkpoints.")
    remove_redundancy: bool = setting(False, "Drop data replicated across ranks when saving.")
    load_path: str = setting("", "Checkpoint to load; empty starts from scratch.")
    load_balanced: bool = setting(False, "Balance loading across devices.")
    no_load_optim: bool = setting(False, "Load weights only, not the optimizer state.")
    load_worker_number: int = setting(1, "Threads used to load.", ge=1)
    save_global_layout_cache: bool = setting(True, "Save the global layout cache for later loads.")


@section
class TrainingConfig(Section):
    """Scale of the run: steps, batch sizes, clipping, seed."""

    steps: int = setting(1000, "Total optimizer steps.", gt=0)
    local_batch_size: int = setting(1, "Micro-batch size per device.", gt=0)
    global_batch_size: int = setting(
        1, "Samples per optimizer step across all data-parallel ranks.", gt=0)
    max_norm: float = setting(1.0, "Global gradient norm clipped to this value.", gt=0)
    seed: int = setting(42, "Random seed.", ge=0, le=MAX_SEED)
    deterministic: bool = setting(False, "Deterministic kernels (slower, repeatable).")
    rampup_batch_size: list[int] | None = setting(
        None, "[start_global_batch_size, increment, rampup_samples]: grow the global batch.")
    use_skip_step_on_nan: bool = setting(
        False, "Skip the optimizer update when the gradient norm is not finite.")
    max_consecutive_skipped_steps: int = setting(
        0, "Stop after this many consecutive skipped steps; 0 means no limit.", ge=0)
    max_nonfinite_steps: int = setting(
        3, "Stop after this many consecutive steps whose loss or gradient norm is not finite "
        "(a diverged run, without use_skip_step_on_nan); no such step is saved.", ge=1)


@section
class ParallelismConfig(Section):
    """Parallel layout: FSDP/HSDP, tensor, context, pipeline, expert and sequence parallelism."""

    data_parallel_shard: int = setting(
        -1, "FSDP shard degree; -1 shards over all data-parallel ranks.")
    data_parallel_shard_strategy: Literal["optim", "optim_grads", "optim_grads_params"] = setting(
        "optim_grads_params", "What FSDP shards: optimizer state, also gradients, also parameters.")
    reshard_after_forward_policy: Literal["always", "never", "default"] = setting(
        "default", "Whether FSDP reshards parameters after the forward pass.")
    cpu_offload: bool = setting(False, "Offload FSDP parameters or state to the CPU.")
    disable_gradient_division: bool = setting(
        True, "Sum gradients across data-parallel ranks instead of averaging them.")
    tensor_parallel: int = setting(1, "Tensor-parallel degree.", ge=1)
    context_parallel: int = setting(1, "Context-parallel degree.", ge=1)
    context_parallel_method: Literal["colossal", "ulysses", "hybrid"] = setting(
        "colossal", "Context-parallel implementation.")
    context_parallel_async: bool = setting(
        False, "Overlap the key/value all-gather with attention over this rank's own keys.")
    ulysses_degree_in_cp: int | None = setting(
        None, "Ulysses degree inside context parallelism; required for hybrid.", ge=1)
    context_parallel_mask_type: Literal["causal", "full"] = setting(
        "causal", "Attention mask type of the context-parallel input preparation.")
    pipeline_parallel: int = setting(1, "Pipeline stages.", ge=1)
    pipeline_parallel_layers_per_stage: list[int] | str | None = setting(
        None, "Layers per stage (times interleave_num chunks): a list, or a string \"4,4,3,3\".")
    pipeline_parallel_schedule: Literal["gpipe", "1f1b", "interleaved_1f1b"] = setting(
        "1f1b", "Pipeline schedule.")
    pipeline_parallel_interleave_num: int = setting(
        1, "Model chunks per pipeline stage (interleaved 1F1B).", ge=1)
    pipeline_parallel_overlap_p2p: bool = setting(False, "Overlap pipeline communication.")
    pipeline_parallel_overlap_b_f: bool = setting(False, "Overlap pipeline computation.")
    pipeline_parallel_enable_dxdw_split: bool = setting(False, "Split dx/dw in the pipeline.")
    sequence_parallel: bool = setting(
        False, "Sequence parallelism; always on with tensor_parallel > 1.")
    expert_parallel: int = setting(1, "Expert-parallel degree (MoE).", ge=1)
    npu_nums_per_device: int = setting(8, "NPU ranks per device.", ge=1)
    moe_token_dispatcher_type: Literal["alltoall", "alltoall_deredundancy"] = setting(
        "alltoall", "MoE token dispatch.")
    param_dtype: Dtype = setting("float32", "Dtype FSDP keeps parameters in.")
    reduce_dtype: Dtype = setting("float32", "Dtype gradients are reduced in.")

    def layers_per_stage(self) -> list[int] | None:
        """`pipeline_parallel_layers_per_stage` as a list, whichever form it was written in."""
        value = self.pipeline_parallel_layers_per_stage
        if not isinstance(value, str):
            return value
        return [int(part) for part in value.replace("[", "").replace("]", "").split(",")]

    def ulysses_degree(self) -> int:
        """Context ranks that swap attention heads all-to-all: 1 for `colossal` (or without
        context parallelism), `context_parallel` for `ulysses`, `ulysses_degree_in_cp` for
        `hybrid` (1 when it is not set; the rules refuse that)."""
        if self.context_parallel == 1 or self.context_parallel_method == "colossal":
            return 1
        if self.context_parallel_method == "ulysses":
            return self.context_parallel
        return self.ulysses_degree_in_cp or 1


@section
class OptimizerConfig(OpenSection):
    """The optimizer; keys beyond these go to the optimizer `type` selects."""

    type: str = setting("AdamW", "Optimizer type, such as AdamW or Muon.")
    betas: list[float] = setting([0.9, 0.95], "First and second moment coefficients.")
    eps: float = setting(1.0e-8, "Numerical stability term.", gt=0)
    weight_decay: float = setting(0.01, "Weight decay coefficient.", ge=0)
    weight_decay_include: list[str] | None = setting(
        None, "Parameter name rules that always get weight decay.")
    weight_decay_exclude: list[str] | None = setting(
        None, "Parameter name rules that never get weight decay.")


@section
class LrSchedulerConfig(OpenSection):
    """The learning-rate schedule; keys beyond these go to the scheduler `type` selects."""

    type: str | None = setting(None, "Scheduler type; null means a constant learning rate.")
    learning_rate: float = setting(1e-5, "Base learning rate.", ge=0)


@section
class DataloaderConfig(OpenSection):
    """The data loader; keys beyond these go to the loader `type` selects."""

    type: str | None = setting(None, "Loader type, such as BlendedMegatronDatasetDataLoader.")
    shuffle: bool = setting(False, "Shuffle samples.")
    column_names: list[str] = setting(["input_ids", "labels"], "Columns of each batch, in order.")
    python_multiprocessing: bool = setting(False, "Load with Python worker processes.")


@section
class TrainDatasetConfig(Section):
    """The training data source."""

    dataloader: DataloaderConfig = setting(DataloaderConfig(), "Loader sub-configuration.")
    drop_remainder: bool = setting(True, "Drop the last incomplete batch.")
    num_parallel_workers: int = setting(8, "Parallel loading workers.", ge=1)
    prefetch_size: int = setting(1, "Batches prefetched.", ge=1)
    numa_enable: bool = setting(False, "NUMA-affine loading.")


@section
class ModelConfig(OpenSection):
    """The model; structure keys (Hugging Face names) go to the model class."""

    model_type: str | None = setting(None, "Model type id, such as deepseek_v3 or qwen3.")
    architectures: str | list[str] | None = setting(
        None, "Model class name, such as DeepseekV3ForCausalLM (or Hugging Face's one-item list).")

    def architecture(self) -> str | None:
        """The class name of `architectures`, written as a string or as Hugging Face's
        `config.json` writes it, a list of one."""
        value = self.architectures
        return value[0] if isinstance(value, list) and len(value) == 1 else (
            value if isinstance(value, str) else None)

    def decoder_layer_count(self) -> int | None:
        """`num_hidden_layers` (or `num_layers`) as written, when it is a positive integer.

        Only for models whose type no installed package declares settings for: otherwise the
        model's own settings give its numbers (`components.model_shape`)."""
        base = self.extras.get("num_hidden_layers", self.extras.get("num_layers"))
        return base if _is_count(base) and base > 0 else None

    def layer_count(self) -> int | None:
        """Decoder layers plus multi-token-prediction layers as written (same proviso as
        `decoder_layer_count`)."""
        base = self.decoder_layer_count()
        if base is None:
            return None
        extra = self.extras.get("mtp_num_layers", self.extras.get("num_nextn_predict_layers", 0))
        return base + extra if _is_count(extra) else base


def _is_count(value: Any) -> bool:
    return type(value) is int and value >= 0


@section
class TrainStateConfig(Section):
    """Per-step monitoring of norms and losses."""

    local_norm: bool | str | list[str] = setting(
        "", "Local gradient norms: true, or module-name filters.")
    local_loss: bool = setting(False, "Monitor the local loss.")
    device_norm: bool | str | list[str] = setting(
        False, "Device-level norms: true, or module-name filters.")
    device_loss: bool = setting(False, "Monitor the device-level loss.")


@section
class MoeMonitorConfig(Section):
    """Tokens-per-expert statistics of MoE layers."""

    save_tokens_per_expert_interval: int | None = setting(
        None, "Steps between records of tokens per expert; null disables it.", gt=0)
    target_layers: int | list[int] | None = setting(
        None, "Layers monitored: a list of layer ids, or an int > 0.")


@section
class HealthCheckpointConfig(Section):
    """Thresholds of the training health checks."""

    embedding_local_norm_threshold: float = setting(
        100.0, "Embedding local norm above which a step is reported.", gt=0)
    global_norm_skip_threshold: float = setting(
        100.0, "Global gradient norm above which a step is skipped.", gt=0)
    global_norm_skip_time: int = setting(
        10, "Consecutive skipped steps tolerated before training stops.", ge=1)


@section
class TensorboardConfig(Section):
    """TensorBoard event files."""

    output_dir: str = setting("", "Event file directory; empty uses the run's output directory.")
    log_interval: int = setting(1, "Steps between two logged points.", ge=1)
    queue_size: int = setting(1000, "Events buffered before a flush.", ge=1)


@section
class MonitorConfig(Section):
    """Training monitoring: state, MoE statistics, health checks, TensorBoard."""

    train_state: TrainStateConfig = setting(TrainStateConfig(), "Per-step norm and loss monitors.")
    moe_monitor: MoeMonitorConfig = setting(MoeMonitorConfig(), "MoE load statistics.")
    health_checkpoint: HealthCheckpointConfig = setting(
        HealthCheckpointConfig(), "Health-check thresholds.")
    tensorboard: TensorboardConfig = setting(TensorboardConfig(), "TensorBoard logging.")


@section
class ProfilerConfig(Section):
    """Performance profiling over a range of steps."""

    enable_profiling: bool = setting(False, "Collect a profile.")
    start_step: int = setting(1, "First profiled step.", gt=0)
    end_step: int = setting(1, "Last profiled step (>= start_step).", gt=0)
    output_path: str | None = setting(None, "Result directory; null picks one.")
    profiler_rank: list[int] | None = setting(None, "Ranks profiled; null means all.")
    profiler_level: Literal[0, 1, 2] = setting(0, "Detail level: 0, 1 or 2.")
    mstx: bool = setting(False, "Collect lightweight mstx markers.")
    profile_memory: bool = setting(False, "Collect tensor memory data.")
    with_stack: bool = setting(True, "Collect Python call stacks.")
    profile_cpu: bool = setting(True, "Collect CPU activity.")


@section
class RecomputeConfig(Section):
    """Activation recomputation by layer (full) or by module (select)."""

    mode: Literal["None", "full", "select"] = setting("None", "\"None\", \"full\" or \"select\".")
    full_recompute_layer: list[LayerSpec] | None = setting(
        None, "Layer specs recomputed whole (mode full).")
    select_module: dict[str, list[LayerSpec]] | None = setting(
        None, "Module path -> layer specs recomputed (mode select).")


@section
class RecomputeCommConfig(Section):
    """Recomputation of communication modules' activations."""

    enable: bool = setting(False, "Recompute communication activations.")
    select_module: dict[str, list[LayerSpec]] | None = setting(
        None, "Communication module path -> layer specs.")


@section
class LayerSwap(Section):
    """Whole layers whose activations are offloaded."""

    layers: list[LayerSpec] = setting([], "Layer specs offloaded.")


@section
class OpSwap(Section):
    """A module whose activations are offloaded, in the listed layers."""

    op_name: str = setting("", "Module path, such as attention.")
    layers: list[LayerSpec] = setting([], "Layer specs offloaded.")


@section
class SwapConfig(Section):
    """Activation offload to host memory."""

    enable: bool = setting(False, "Offload activations.")
    default_prefetch: int = setting(
        1, "Layers ahead that activations are brought back (1 to num_layers - 1).", ge=1)
    layer_swap: list[LayerSwap] | None = setting(None, "Whole-layer offload entries.")
    op_swap: list[OpSwap] | None = setting(None, "Module-level offload entries.")


@section
class CallbackConfig(OpenSection):
    """A user callback; keys beyond `type` go to its constructor."""

    type: str | None = setting(None, "Registered callback name (required).")


@section
class TrainConfig(Section):
    """The whole training configuration, one field per top-level YAML section."""

    context: ContextConfig = setting(ContextConfig(), "Backend and execution mode.")
    checkpoint: CheckpointConfig = setting(CheckpointConfig(), "Checkpoint saving and loading.")
    training: TrainingConfig = setting(TrainingConfig(), "Steps, batch sizes, clipping, seed.")
    parallelism: ParallelismConfig = setting(ParallelismConfig(), "Parallel layout.")
    optimizer: OptimizerConfig = setting(OptimizerConfig(), "Optimizer.")
    lr_scheduler: LrSchedulerConfig = setting(LrSchedulerConfig(), "Learning-rate schedule.")
    train_dataset: TrainDatasetConfig = setting(TrainDatasetConfig(), "Training data.")
    model: ModelConfig = setting(ModelConfig(), "Model type and structure.")
    monitor: MonitorConfig = setting(MonitorConfig(), "Monitoring.")
    profiler: ProfilerConfig = setting(ProfilerConfig(), "Profiling.")
    recompute: RecomputeConfig = setting(RecomputeConfig(), "Activation recomputation.")
    recompute_comm: RecomputeCommConfig = setting(
        RecomputeCommConfig(), "Communication recomputation.")
    swap: SwapConfig = setting(SwapConfig(), "Activation offload.")
    callbacks: list[CallbackConfig] = setting([], "Extra callbacks.")

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "TrainConfig":
        """Validate plain data (as parsed from YAML, or built in code) without a file.

        Args:
            data: a mapping of sections.

        Returns:
            The validated configuration.

        Raises:
            ConfigError: listing every problem, each with its path.
        """
        from .validate import config_from_source
        from .yaml_source import Source

        return config_from_source(Source(data))

    def to_dict(self) -> dict[str, Any]:
        """Plain data with every default filled in; `from_dict` of it gives this config back."""
        from .converter import converter

        return converter.unstructure(self)


REQUIRED_SECTIONS = ("model", "train_dataset", "training")
