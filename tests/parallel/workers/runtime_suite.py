"""Runs on every rank under msrun: every runtime scenario of the job's world size, one after
the other in the same process; writes OUT_DIR/<scenario>/rank<r>.json for each.

Usage: runtime_suite.py OUT_DIR [SCENARIO ...]   (default: every scenario of the world size)

One job per world size instead of one per scenario: each msrun job costs 10-20 s before its
first collective (msrun, a scheduler and every rank import MindSpore, then wait for the
cluster), more than most scenarios take. The scenarios (scenario_*.py) are what the
test_runtime_*.py files assert on; tests/parallel/rank_jobs.py launches this script once per
pytest run and world size and reads the files. Each scenario is written as soon as it is done,
so the scenarios before a failing one keep their results; a scenario's failure ends the job
(its peers would otherwise wait in a collective until the deadline).

Sharing one process: `mindspore.communication.init()` runs once, through `init_communication`
at the start, and each scenario gets its own plan's groups from `connect`. Every scenario
starts from the same random state (`ms.set_seed(0)`, as the data-parallel scenario sets it
itself; the others draw from generators of their own).
"""

import json
import os
import sys
import time
from functools import partial
from pathlib import Path

import mindspore as ms
import numpy as np
import scenario_collectives
import scenario_data_parallel
import scenario_dp_tp
import scenario_experts
import scenario_sharded
import scenario_tensor_parallel
from mindspore import communication

from mf_config import ParallelismConfig, TrainingConfig
from mf_parallel import make_plan
from mf_parallel.plan import Plan
from mf_parallel.runtime import Communication, init_communication
from mf_parallel.runtime.comm import _create_groups

# The parameters must match what the test files expect (they check them: see `params`).
SCENARIOS = {
    2: {
        "collectives": partial(scenario_collectives.run, world=2, tensor_parallel=1),
        "data_parallel_one_process": partial(scenario_data_parallel.run, world=1,
                                             mode="mean", steps=5),
        "data_parallel_mean": partial(scenario_data_parallel.run, world=2, mode="mean",
                                      steps=5),
        "data_parallel_sum": partial(scenario_data_parallel.run, world=2, mode="sum", steps=5),
        "sharded": partial(scenario_sharded.run, world=2, shard=-1, steps=3),
        "tensor_parallel_plain": partial(scenario_tensor_parallel.run, world=2,
                                         sequence_parallel=False),
        "tensor_parallel_sequence_parallel": partial(scenario_tensor_parallel.run, world=2,
                                                     sequence_parallel=True),
        "experts_alltoall-2": partial(scenario_experts.run, world=2, dispatcher="alltoall",
                                      npu_nums_per_device=1),
        "experts_dered-2-device1": partial(scenario_experts.run, world=2,
                                           dispatcher="alltoall_deredundancy",
                                           npu_nums_per_device=1),
    },
    4: {
        "collectives": partial(scenario_collectives.run, world=4, tensor_parallel=2),
        "sharded_hsdp": partial(scenario_sharded.run, world=4, shard=2, steps=3),
        "dp_tp": partial(scenario_dp_tp.run, world=4, steps=3),
        "experts_alltoall-4": partial(scenario_experts.run, world=4, dispatcher="alltoall",
                                      npu_nums_per_device=1),
        "experts_dered-4-device2": partial(scenario_experts.run, world=4,
                                           dispatcher="alltoall_deredundancy",
                                           npu_nums_per_device=2),
    },
}
"""World size -> scenario name (its directory) -> the scenario, run in this order."""

ONE_PROCESS = {"data_parallel_one_process"}
"""Scenarios of a one-rank plan: the reference of one process that sees the whole global
batch, computed by rank 0 alone (the other ranks go on to the next scenario and wait for it
in that scenario's first collective)."""


def connect(plan: Plan) -> Communication:
    """This rank's communication for `plan`: what `init_communication(plan)` returns in a
    process of its own, in a process where it has already run.

    `init_communication` cannot run twice: its `ms.set_device("CPU")` (device 0) raises
    "The 'mindspore.set_device' can not be modified." on every rank but 0 once
    `communication.init()` has given the rank its own device. Its group creation can: the
    names are the member ranks (`mf_0_1`), and creating an existing group again is a no-op
    (MindSpore logs "'mf_0_1' group has existed."), so scenarios with the same groups share
    them, and `_create_groups` is exactly what `init_communication` runs. A one-rank plan
    gets what `init_communication` gives it: this process alone, no groups.
    """
    world = plan.dims.world_size
    if world == 1:
        return Communication(rank=0, world_size=1, device_target="CPU",
                             group_ranks=plan.mesh.groups_of(0), group_names={})
    rank, size = communication.get_rank(), communication.get_group_size()
    if size != world:
        raise RuntimeError(f"the plan is for {world} ranks but msrun started {size}")
    return Communication(rank=rank, world_size=world, device_target="CPU",
                         group_ranks=plan.mesh.groups_of(rank),
                         group_names=_create_groups(plan.mesh, rank, world))


def main() -> None:
    out_dir, chosen = Path(sys.argv[1]), sys.argv[2:]
    world = int(os.environ["MS_WORKER_NUM"])
    scenarios = SCENARIOS[world]
    unknown = sorted(set(chosen) - set(scenarios))
    if unknown:
        raise SystemExit(f"no {world}-rank scenarios {unknown}; there are {sorted(scenarios)}")
    # msrun's scheduler runs this script too and stays in here until the job ends.
    init_communication(make_plan(ParallelismConfig(), TrainingConfig(global_batch_size=world),
                                 world), "CPU")
    rank = communication.get_rank()
    for name, scenario in scenarios.items():
        if (chosen and name not in chosen) or (name in ONE_PROCESS and rank != 0):
            continue
        ms.set_seed(0)
        np.random.seed(0)
        start = time.monotonic()
        result = scenario(connect)
        result["params"] = scenario.keywords
        (out_dir / name).mkdir(parents=True, exist_ok=True)
        (out_dir / name / f"rank{rank}.json").write_text(json.dumps(result))
        print(f"scenario {name}: {time.monotonic() - start:.1f} s", flush=True)


if __name__ == "__main__":
    main()
