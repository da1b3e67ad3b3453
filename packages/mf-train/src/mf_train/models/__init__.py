"""Models: `build_model` picks the class the `model` section names through `MODELS`.

The type is `model.architectures`, else `model.model_type` (Hugging Face's names). A model
class registered in `MODELS` (in code or through the `mf_train.models` entry points) provides
`from_config(config: ModelConfig, *, source, seed, part, layer_built) -> nn.Cell`, built from
its settings alone (`mf_train.parallelize` cuts it to a rank's part), and `settings_of(config,
source)`. Importing this package imports MindSpore and registers the built-in models.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from mf_config import ModelConfig
from mf_config.yaml_source import Source
from mf_parallel.placement import ShardingTable

from ..registry import MODELS
from . import deepseek_v3, qwen3
from .hf_weights import HFWeightsError, hf_names, hf_state, load_hf_state
from .parts import ModelPart, PipelineModel

if TYPE_CHECKING:
    from mindspore import nn

__all__ = [
    "HFWeightsError",
    "ModelPart",
    "PipelineModel",
    "build_model",
    "deepseek_v3",
    "hf_names",
    "hf_state",
    "load_hf_state",
    "qwen3",
    "sharding_table",
]


def model_class(config: ModelConfig, source: Source | None = None) -> Any:
    """The class the `model` section names (`model.architectures`, else `model.model_type`)."""
    name, key = ((config.architecture(), "architectures") if config.architectures
                 else (config.model_type, "model_type"))
    return MODELS.get(name, ("model", key), source)


def sharding_table(config: ModelConfig, source: Source | None = None) -> ShardingTable:
    """The sharding table of the model the `model` section describes, building nothing
    (`mf_parallel.placement.place_parameters` reads it with the plan)."""
    cls = model_class(config, source)
    if not hasattr(cls, "sharding_table"):
        raise TypeError(f"{cls.__name__} declares no sharding table (a classmethod "
                        "`sharding_table(config, source)`): more than one rank needs it to "
                        "know which rank counts which parameter")
    return cls.sharding_table(config, source)


def build_model(config: ModelConfig, *, source: Source | None = None, seed: int | None = None,
                part: ModelPart | None = None,
                layer_built: Callable[[nn.Cell], object] | None = None) -> nn.Cell:
    """The model the `model` section describes (its class from the `MODELS` registry), as one
    process runs it: `mf_train.parallelize.build_parallel_model` cuts it to a rank's part.

    Args:
        config: the `model` section.
        source: the YAML source, for error lines.
        seed: draws the initial weights (default: MindSpore's global seed, else 0).
        part: what a pipeline stage (or an expert-parallel rank) builds (None: the whole
            model); the model class must be a `parts.PipelineModel`.
        layer_built: called with each decoder layer as soon as it is built (what applies
            parallelism cuts it to this rank's part there); the model class must take
            `layer_built`.

    Returns:
        The model: a cell taking (tokens, labels, loss mask, position ids, document ends,
        attention mask) and returning the mean loss.

    Raises:
        ConfigError: naming the `model.<key>` of every problem.
    """
    cls: Any = model_class(config, source)
    options: dict[str, Any] = {}
    if part is not None:
        options["part"] = part
    if layer_built is not None:
        options["layer_built"] = layer_built
    return cls.from_config(config, source=source, seed=seed, **options)
