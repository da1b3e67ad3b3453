"""mf-config: one YAML file -> one typed, validated `TrainConfig`.

    from mf_config import load_config
    config = load_config("train.yaml", overrides=["training.steps=10"])
    config.training.global_batch_size, config.model.hidden_size

Depends on pyyaml and cattrs only; importing it never imports numpy or MindSpore.
"""

from .errors import ConfigError, ConfigIssue, ConfigWarning
from .layer_spec import LayerSpec
from .sections import (
    CallbackConfig,
    CheckpointConfig,
    ContextConfig,
    DataloaderConfig,
    HealthCheckpointConfig,
    LayerSwap,
    LrSchedulerConfig,
    ModelConfig,
    MoeMonitorConfig,
    MonitorConfig,
    OpenSection,
    OpSwap,
    OptimizerConfig,
    ParallelismConfig,
    ProfilerConfig,
    RecomputeCommConfig,
    RecomputeConfig,
    SwapConfig,
    TensorboardConfig,
    TrainConfig,
    TrainDatasetConfig,
    TrainingConfig,
    TrainStateConfig,
)
from .validate import load_config
from .yaml_source import UnreadableFile

__version__ = "0.1.0"

__all__ = [
    "CallbackConfig",
    "CheckpointConfig",
    "ConfigError",
    "ConfigIssue",
    "ConfigWarning",
    "ContextConfig",
    "DataloaderConfig",
    "HealthCheckpointConfig",
    "LayerSpec",
    "LayerSwap",
    "LrSchedulerConfig",
    "ModelConfig",
    "MoeMonitorConfig",
    "MonitorConfig",
    "OpSwap",
    "OpenSection",
    "OptimizerConfig",
    "ParallelismConfig",
    "ProfilerConfig",
    "RecomputeCommConfig",
    "RecomputeConfig",
    "SwapConfig",
    "TensorboardConfig",
    "TrainConfig",
    "TrainDatasetConfig",
    "TrainStateConfig",
    "TrainingConfig",
    "UnreadableFile",
    "load_config",
]
