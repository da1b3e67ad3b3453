"""mf's optimizers: AdamW and Muon, built from the `optimizer` section.

`build_optimizer(config, named_params)` resolves `optimizer.type` in `mf_train.registry.
OPTIMIZERS` ("AdamW", "Muon", lower-case aliases, entry points or a `module:Class` path) and
calls the class's `from_config(config, named_params, source)`. Every optimizer offers
`.params`, `.step(grads, lr)`, `.state_dict()`, `.load_state_dict(state)`,
`.reload_main_params_from_model()` and `.groups_summary()` (see `base.Optimizer`).
"""

from __future__ import annotations

from collections.abc import Sequence

from mindspore import Parameter

from mf_config import OptimizerConfig
from mf_config.yaml_source import Source

from ..registry import OPTIMIZERS
from .adamw import AdamW, adamw_update
from .base import Optimizer, OptimizerStateError
from .muon import Muon, MuonSettings, muon_update, newton_schulz
from .param_groups import gets_weight_decay, rule_matches

__all__ = ["AdamW", "Muon", "MuonSettings", "Optimizer", "OptimizerStateError", "adamw_update",
           "build_optimizer", "gets_weight_decay", "muon_update", "newton_schulz",
           "rule_matches"]


def build_optimizer(config: OptimizerConfig, named_params: Sequence[tuple[str, Parameter]],
                    source: Source | None = None) -> Optimizer:
    """The optimizer `config.type` names, over `named_params` (a model's trainable
    `(name, Parameter)` pairs, in the order its gradients come); `ConfigError` for an unknown
    type or bad settings, with the YAML line when `source` is given."""
    cls = OPTIMIZERS.get(config.type, ("optimizer", "type"), source)
    return cls.from_config(config, list(named_params), source)
