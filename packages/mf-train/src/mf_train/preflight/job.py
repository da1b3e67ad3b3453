"""The job before any rank starts: the parallel plan, and what the trainer refuses or ignores.

`mf-train` calls these in the launching process (so a bad configuration fails before msrun
starts a rank) and every rank calls them again when its `Trainer` is built.

A `context.device_target` this MindSpore cannot run (GPU on a CPU-only installation) is refused
here in one line, from the device plugins MindSpore loaded when it was imported: no device is
initialised, and no rank is started to fail in `mindspore.set_device`.
"""

from __future__ import annotations

import mindspore as ms

from mf_config import ConfigError, ConfigIssue, TrainConfig
from mf_config.component_settings import located_issue
from mf_config.yaml_source import Source
from mf_parallel import Plan

from ..layouts import LayoutSections, check_layout
from ..observe.evaluation import evaluation_issues
from .support import launch_issues
from .validation import BACKENDS, job_plan


def installed_backends() -> tuple[str, ...] | None:
    """The backends this MindSpore can run here: those whose device plugin loaded when it
    was imported (what `mindspore.device_context.gpu.is_available()` and its siblings read,
    without their log lines); no device is initialised. None when this MindSpore cannot say.
    """
    try:
        from mindspore._c_expression import MSContext

        context = MSContext.get_instance()
        return tuple(name for name in BACKENDS if context.is_pkg_support_device(name))
    except (ImportError, AttributeError, RuntimeError):
        return None


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
    plan = job_plan(config, world_size)
    check_layout(plan.dims, LayoutSections(config.parallelism, config.optimizer, config.swap,
                                           config.recompute_comm, source))
    return plan


def check_support(config: TrainConfig, plan: Plan, device: str,
                  source: Source | None = None) -> list[ConfigIssue]:
    """Whether this MindSpore runs `device` (`device_issues`), and what the trainer does with
    every field here and the global batch each step really uses (`support.launch_issues`,
    which `mf-config validate` shows too).

    Returns:
        The warnings for values that have no effect here and for a rounded-down global batch
        (to say once).

    Raises:
        ConfigError: every value the trainer refuses.
    """
    issues = device_issues(config, device, source) + launch_issues(config, plan, device, source)
    issues += evaluation_issues(config, plan, source)
    errors = [issue for issue in issues if issue.severity == "error"]
    if errors:
        raise ConfigError(errors)
    return [issue for issue in issues if issue.severity == "warning"]


def device_issues(config: TrainConfig, device: str, source: Source | None,
                  backends: tuple[str, ...] | None = None) -> list[ConfigIssue]:
    """An error when `context.device_target` names a backend this MindSpore cannot run
    (`backends`: the installed ones, found when not given)."""
    if config.context.device_target == "auto":
        return []  # resolved to what this MindSpore runs
    backends = installed_backends() if backends is None else backends
    if backends is None or device in backends:
        return []
    usable = " or ".join(backends) if backends else "no backend"
    message = (f"{device} is not available to this MindSpore ({ms.__version__}): its {device} "
               f"plugin did not load (an installation without {device} support, or the "
               f"{device}'s drivers are missing); it runs on {usable} here: set "
               f"device_target to {' or '.join((*backends, 'auto'))}, or install MindSpore "
               f"for {device}")
    return [located_issue(("context", "device_target"), message, "error", source)]
