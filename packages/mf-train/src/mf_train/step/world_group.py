"""Agreement among all ranks of the job: a barrier and an all-ranks vote (checkpoints use
them: every rank waits for a save's files, and all choose the same checkpoint to resume), and
every rank's value of one number (the step line's largest peak memory)."""

from __future__ import annotations

from collections.abc import Sequence

import mindspore as ms
import numpy as np
from mindspore import communication, ops

from mf_parallel import rank_progress


def barrier() -> None:
    """Every rank waits for all: an all-reduce over the world group, read back so that it
    completes (`mindspore.mint.distributed.barrier` returns at once on the CPU backend,
    logging "CPU device is not supported", so ranks ran past each other)."""
    rank_progress.collective("barrier", None)
    group = communication.GlobalComm.WORLD_COMM_GROUP
    ops.AllReduce(group=group)(ms.Tensor(np.ones(1, np.float32))).asnumpy()


def all_ranks(ok: bool) -> bool:
    """Whether `ok` holds on every rank (an all-reduce of the failures)."""
    rank_progress.collective("all_ranks", None)
    group = communication.GlobalComm.WORLD_COMM_GROUP
    failed = ms.Tensor(np.array([0.0 if ok else 1.0], np.float32))
    return float(ops.AllReduce(group=group)(failed).asnumpy()[0]) == 0.0


def every_rank(value: float) -> list[float]:
    """`value` as each rank has it, in rank order (an all-gather over the world group; float32,
    the CPU backend reduces no integers)."""
    return [values[0] for values in every_rank_values([value], "every_rank")]


def every_rank_values(values: Sequence[float], name: str = "every_rank_values"
                      ) -> list[list[float]]:
    """`values` (as many on every rank) as each rank has them, in rank order: one all-gather
    over the world group, float32; `name` is the collective's name in the rank's progress
    record (`mf_parallel.rank_progress`)."""
    rank_progress.collective(name, None)
    group = communication.GlobalComm.WORLD_COMM_GROUP
    mine = ms.Tensor(np.array(values, np.float32))
    gathered = ops.AllGather(group=group)(mine).asnumpy().reshape(-1, len(values))
    return [[float(value) for value in row] for row in gathered]
