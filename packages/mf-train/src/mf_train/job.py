"""The job before any rank starts: the parallel plan, and what the trainer refuses or ignores.

`mf-train` calls these in the launching process (so a bad configuration fails before msrun
starts a rank) and every rank calls them again when its `Trainer` is built.
"""

from __future__ import annotations

import mindspore as ms

from mf_config import ConfigError, ConfigIssue, TrainConfig
from mf_config.components import decoder_layers, sequence_length
from mf_config.yaml_source import Source
from mf_parallel import Plan, make_plan

from .layouts import LayoutSections, check_layout
from .support import support_issues
from .support_rules import Target


def resolve_device(device_target: str) -> str:
    """`context.device_target`, with `auto` resolved to the backend this MindSpore was built
    for (Ascend, GPU or CPU)."""
    if device_target != "auto":
        return device_target
    return ms.get_context("device_target") or "CPU"


def make_job_plan(config: TrainConfig, world_size: int, source: Source | None = None) -> Plan:
    """The parallel plan of this configuration on `world_size` ranks.

    Args:
        config: the validated configuration.
        world_size: the number of ranks the job runs on.
        source: the YAML source, for error lines.

    Returns:
        The plan (`mf_parallel.Plan`).

    Raises:
        PlanError: the degrees do not fit the world size or the model.
        ConfigError: the step layout the plan selects cannot run with the rest of the
            configuration (`mf_train.layouts`).
    """
    plan = make_plan(config.parallelism, config.training, world_size,
                     num_layers=decoder_layers(config), seq_length=sequence_length(config))
    check_layout(plan.dims, LayoutSections(config.parallelism, config.optimizer, config.swap,
                                           config.recompute_comm, source))
    return plan


def check_support(config: TrainConfig, plan: Plan, device: str,
                  source: Source | None = None) -> list[ConfigIssue]:
    """What the trainer does with every field here (`support.FIELDS`).

    Returns:
        The warnings for values that have no effect here (to say once).

    Raises:
        ConfigError: every value the trainer refuses.
    """
    issues = support_issues(Target(config, plan.dims.world_size, device, source,
                                   plan.dims.data_shard))
    errors = [issue for issue in issues if issue.severity == "error"]
    if errors:
        raise ConfigError(errors)
    return [issue for issue in issues if issue.severity == "warning"]
