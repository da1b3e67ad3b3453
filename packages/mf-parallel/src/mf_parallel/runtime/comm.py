"""Communication set-up under msrun: initialise, then create the plan's groups on every rank.

msrun sets the environment (`MS_ROLE`, `MS_WORKER_NUM`, `RANK_ID`, ...) that
`mindspore.communication.init()` reads; init picks HCCL on Ascend, NCCL on GPU and mccl on CPU.
Groups are created in one global order (kind by kind, groups sorted), each by its members only,
so every rank issues the same creations in the same order. One-rank groups are not created:
collectives over them are the identity (`Collectives` skips them).
"""

from __future__ import annotations

import os

import attrs
import mindspore as ms
from mindspore import communication

from ..mesh import GROUP_KINDS, RankMesh
from ..plan import Plan


@attrs.frozen(kw_only=True)
class Communication:
    """This rank's place in the job: rank, world size, backend, and its group of every kind."""

    rank: int
    world_size: int
    device_target: str
    group_ranks: dict[str, list[int]]
    """Kind -> the ranks of this rank's group of that kind."""
    group_names: dict[str, str]
    """Kind -> the MindSpore group name (only for groups of more than one rank)."""

    def group(self, kind: str) -> str | None:
        """MindSpore group name of this rank's `kind` group; None for a one-rank group."""
        return self.group_names.get(kind)

    def group_size(self, kind: str) -> int:
        return len(self.group_ranks[kind])

    def group_rank(self, kind: str) -> int:
        """This rank's index inside its `kind` group."""
        return self.group_ranks[kind].index(self.rank)

    def context_as_data(self) -> Communication:
        """The same rank seen by a layout that treats context ranks as data ranks: `data` is
        the `loss` group (data x context); with sharding (`shard` groups of more than one
        rank) `shard` becomes the `shard_context` group, without it `replicate` becomes the
        `loss` group; `context` is this rank alone. Context ranks hold the same parameters and
        see different tokens of the same samples, so their gradients are reduced (and ZeRO or
        FSDP shard) over data x context, as Megatron-LM's data-parallel-with-context group and
        torchtitan's `dp_shard_cp` do. The ranks are the plan's own: rank order puts context
        right after shard, so these are the data groups of the plan with context merged
        (`mf_train.layouts.context_parallel.without_context`)."""
        merged = {"data": "loss"}
        merged.update({"shard": "shard_context"} if self.group_size("shard") > 1
                      else {"replicate": "loss"})
        ranks = {**self.group_ranks, "context": [self.rank]}
        names = {kind: name for kind, name in self.group_names.items() if kind != "context"}
        for kind, source in merged.items():
            ranks[kind] = self.group_ranks[source]
            names.pop(kind, None)
            if source in self.group_names:
                names[kind] = self.group_names[source]
        return attrs.evolve(self, group_ranks=ranks, group_names=names)


def init_communication(plan: Plan, device_target: str = "CPU") -> Communication:
    """Initialise MindSpore communication (if the job has several ranks) and the plan's groups.

    Sets PyNative mode and the device first; call it before any collective. A second plan in
    the same process (a test running several trainer runs in one job) reuses MindSpore's
    communication and creates only the groups no earlier plan created.

    Args:
        plan: the job's plan (its world size must be the number of ranks msrun started).
        device_target: `"CPU"`, `"Ascend"` or `"GPU"`.

    Returns:
        This rank's place: rank, world size, backend and its group of every kind.

    Raises:
        RuntimeError: several ranks planned but not started by msrun, or a different count.
    """
    ms.set_context(mode=ms.PYNATIVE_MODE)
    use_device(device_target)
    world = plan.dims.world_size
    if world == 1:
        groups = RankMesh(plan.dims).groups_of(0)
        return Communication(rank=0, world_size=1, device_target=device_target,
                             group_ranks=groups, group_names={})
    if "MS_WORKER_NUM" not in os.environ and "RANK_SIZE" not in os.environ:
        raise RuntimeError(f"the plan has {world} ranks but this process was not started by "
                           "msrun (MS_WORKER_NUM is not set); launch it with mf_parallel.launch")
    if not communication.GlobalComm.INITED:  # a later plan in the same process reuses it
        communication.init()
    rank, size = communication.get_rank(), communication.get_group_size()
    if size != world:
        raise RuntimeError(f"the plan is for {world} ranks but msrun started {size}")
    names = _create_groups(plan.mesh, rank, world)
    return Communication(rank=rank, world_size=world, device_target=device_target,
                         group_ranks=plan.mesh.groups_of(rank), group_names=names)


def use_device(device_target: str) -> None:
    """`mindspore.set_device(device_target)`, unless this process already runs on that
    backend: MindSpore refuses to set the device again once communication has started (msrun
    gave each rank its device id), which a second plan in the same process would do."""
    try:
        ms.set_device(device_target)
    except RuntimeError:
        if ms.get_context("device_target") != device_target:
            raise


def group_name(ranks: list[int], world_size: int) -> str:
    """One name per rank set, the same on every member (the world group keeps its own name)."""
    if len(ranks) == world_size:
        return communication.GlobalComm.WORLD_COMM_GROUP
    return "mf_" + "_".join(str(r) for r in ranks)


_CREATED: set[str] = set()
"""The groups this process has created: a group is created once, whichever plan needs it."""


def _create_groups(mesh: RankMesh, rank: int, world: int) -> dict[str, str]:
    names = {}
    for kind in GROUP_KINDS:
        for ranks in mesh.groups(kind):
            if len(ranks) == 1 or rank not in ranks:
                continue
            name = group_name(ranks, world)
            if name not in _CREATED and len(ranks) < world:
                communication.create_group(name, ranks)
            _CREATED.add(name)
            names[kind] = name
    return names
