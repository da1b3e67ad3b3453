"""mf's optimizers: AdamW and Muon built from the `optimizer` section, and sharded AdamW.

`build_optimizer(config, named_params)` resolves `optimizer.type` in `mf_train.registry.
OPTIMIZERS` ("AdamW", "Muon", lower-case aliases, entry points or a `module:Class` path) and
calls the class's `from_config(config, named_params, source)`. The sharded step layouts build
`ShardedAdamW` instead. Both kinds implement `protocol.Optimizer`: `.names`, `.params`,
`.global_step`, `.step(grads, lr, clip, keep)`, `.uncount()`, `.state_dict()`,
`.load_state_dict(state)`, `.reload_main_params_from_model()` and `.groups_summary()`.
"""

from __future__ import annotations

from collections.abc import Sequence

from mindspore import Parameter

from mf_config import OptimizerConfig
from mf_config.yaml_source import Source

from ..registry import OPTIMIZERS
from .adamw import AdamW, adamw_update, adamw_update_in_place
from .base import ParameterOptimizer
from .muon import Muon, MuonSettings, muon_update, newton_schulz
from .param_groups import gets_weight_decay, rule_matches
from .protocol import Optimizer, OptimizerStateError
from .sharded_adamw import ShardedAdamW

__all__ = ["AdamW", "Muon", "MuonSettings", "Optimizer", "OptimizerStateError",
           "ParameterOptimizer", "ShardedAdamW", "adamw_update", "adamw_update_in_place",
           "build_optimizer", "gets_weight_decay", "muon_update", "newton_schulz", "rule_matches"]


def build_optimizer(config: OptimizerConfig, named_params: Sequence[tuple[str, Parameter]],
                    source: Source | None = None) -> Optimizer:
    """The optimizer `optimizer.type` names, over a model's parameters.

    Args:
        config: the `optimizer` section.
        named_params: the model's trainable `(name, Parameter)` pairs, in gradient order.
        source: the YAML source, for error lines.

    Returns:
        The optimizer (a `ParameterOptimizer` for the built-in types).

    Raises:
        ConfigError: an unknown type or bad settings, with the YAML line when `source` is
            given.
    """
    cls = OPTIMIZERS.get(config.type, ("optimizer", "type"), source)
    return cls.from_config(config, list(named_params), source)
