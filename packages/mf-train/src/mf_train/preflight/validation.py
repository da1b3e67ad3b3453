"""mf-train's pre-launch checks for `mf-config validate`, without MindSpore.

Before it starts a rank, mf-train's launcher works out the parallel plan on the job's ranks
(`job_plan`), checks that the step layout runs with the rest of the configuration
(`layouts.check_layout`, which needs MindSpore), that this MindSpore runs the backend
(`job.device_issues`), and says what it refuses and what has no effect
(`support.launch_issues`). `pre_launch_issues` makes the plan and the last of those, which
import neither MindSpore nor numpy, so that `mf-config validate` prints the same lines as the
launcher; mf-train declares it under the entry-point group `mf_config.pre_launch`.
"""

from __future__ import annotations

from mf_config import ConfigIssue, TrainConfig
from mf_config.components import decoder_layers, sequence_length
from mf_config.yaml_source import Source
from mf_parallel import Plan, PlanError, make_plan

from .support import launch_issues

BACKENDS = ("Ascend", "GPU", "CPU")
"""The backends `context.device_target` names, in the order `auto` prefers them."""


def job_plan(config: TrainConfig, world_size: int) -> Plan:
    """The parallel plan of a configuration on `world_size` ranks.

    Raises:
        PlanError: the degrees do not fit the world size or the model.
    """
    return make_plan(config.parallelism, config.training, world_size,
                     num_layers=decoder_layers(config), seq_length=sequence_length(config))


def pre_launch_issues(config: TrainConfig, source: Source,
                      world_size: int | None = None) -> list[ConfigIssue]:
    """What mf-train would refuse or say has no effect before launching this configuration.

    Args:
        config: a configuration that validated without errors.
        source: where its values came from.
        world_size: the ranks the job would run on (mf-train's `--nproc` over its nodes);
            None: the fewest the parallelism section runs on, said in a note when above one.

    Returns:
        The launcher's errors and warnings (`support.launch_issues`), or one error when the
        layout does not fit `world_size` ranks. With `context.device_target: auto` they are
        the CPU's, and when they would differ on another backend a note says so.
    """
    chosen: list[ConfigIssue] = []
    if world_size is None:
        world_size = fewest_ranks(config)
        if world_size > 1:
            chosen.append(source.issue(("parallelism",), f"checked as on {world_size} ranks, the "
                                       "fewest this layout runs on (--nproc N checks another "
                                       "count)", "note"))
    try:
        plan = job_plan(config, world_size)
    except PlanError as exc:
        return [source.issue(("parallelism",), f"on {world_size} rank"
                             f"{'s' if world_size != 1 else ''}: {exc}")]
    device = config.context.device_target
    if device != "auto":
        return [*chosen, *launch_issues(config, plan, device, source)]
    found = {backend: launch_issues(config, plan, backend, source) for backend in BACKENDS}
    if all(issues == found["CPU"] for issues in found.values()):
        return [*chosen, *found["CPU"]]
    note = source.issue(("context", "device_target"), "'auto' is resolved when mf-train "
                        "starts; what is said here of the settings whose effect depends on the "
                        "backend is said for CPU (set device_target to check Ascend or GPU)",
                        "note")
    return [*chosen, *found["CPU"], note]


def fewest_ranks(config: TrainConfig, most: int = 256) -> int:
    """The smallest world size the configuration's layout plans on (1 when none up to `most`
    does: the plan's own error then says why)."""
    for world in range(1, most + 1):
        try:
            job_plan(config, world)
        except PlanError:
            continue
        return world
    return 1
