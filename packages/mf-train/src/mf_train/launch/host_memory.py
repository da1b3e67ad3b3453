"""The host memory a CPU run may use, and a run that cannot fit in it, said in one line.

On the CPU backend a rank's parameters, gradients, optimizer state and activations all live in
host memory. The most a process on this host may use is the smallest of: the host's memory
(`MemTotal`), its cgroup's limit (`memory.max`, cgroup v2) and its address-space limit
(`ulimit -v`, `RLIMIT_AS`). `check_host_memory` compares mf-memory's estimate of the step of
every rank this host runs with it before anything is built (a `vocab_size` of two billion is
refused in a second instead of a numpy traceback minutes later); `out_of_memory` turns what
MindSpore or numpy raise when an allocation fails anyway into one line with the estimate and
the limit beside it. Pure Python (no MindSpore import).
"""

from __future__ import annotations

import resource
from collections.abc import Sequence
from pathlib import Path

import psutil

from mf_config import TrainConfig
from mf_memory.estimate import rank_summary, size
from mf_memory.model_shape import EstimateError
from mf_parallel import PlanError


class HostMemoryError(ValueError):
    """The run cannot fit in this host's memory; the message says why, in one line."""


def host_limit() -> tuple[int, str]:
    """(bytes, what sets them): the most memory a process here may use."""
    found = [(psutil.virtual_memory().total, "this host's memory")]
    cgroup = _cgroup_limit()
    if cgroup is not None:
        found.append((cgroup, "the cgroup's memory limit (memory.max)"))
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft != resource.RLIM_INFINITY:
        found.append((soft, "the address-space limit (ulimit -v)"))
    return min(found)


def _cgroup_limit() -> int | None:
    try:
        text = Path("/sys/fs/cgroup/memory.max").read_text(encoding="ascii").strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def estimated_bytes(config: TrainConfig, world_size: int, ranks: Sequence[int]) -> int | None:
    """mf-memory's estimate of the step of `ranks` together (None: a configuration it
    cannot model)."""
    try:
        return sum(rank_summary(config, world_size, rank).peak_bytes for rank in ranks)
    except (EstimateError, PlanError, ValueError):
        return None


def check_host_memory(config: TrainConfig, world_size: int, ranks: Sequence[int],
                      device: str) -> None:
    """Refuse, before anything is built, a CPU run whose ranks on this host (`ranks`) need
    more than a process here may use (`host_limit`); a device run's parameters live on the
    device, which mf-memory's estimate is about, and is not checked here.

    Raises:
        HostMemoryError: saying the estimate and the limit.
    """
    if device != "CPU":
        return
    needed = estimated_bytes(config, world_size, ranks)
    limit, what = host_limit()
    if needed is not None and needed > limit:
        whose = f"rank {ranks[0]}'s step" if len(ranks) == 1 else \
            f"the steps of this host's {len(ranks)} ranks"
        raise HostMemoryError(
            f"mf-memory estimates {size(needed)} for {whose}, more than {what} allows "
            f"({size(limit)}); make the model smaller, or spread it over more ranks or hosts")


def out_of_memory(exc: BaseException) -> bool:
    """Whether `exc` is an allocation that failed (numpy's `MemoryError`, MindSpore's
    `RuntimeError: Allocate memory failed` and its kin)."""
    if isinstance(exc, MemoryError):
        return True
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return isinstance(exc, RuntimeError) and ("Allocate memory failed" in first
                                              or "Out of memory" in first
                                              or "out of memory" in first)


def out_of_memory_line(exc: BaseException, config: TrainConfig, world_size: int,
                       rank: int) -> str:
    """`out of memory on rank 0 (Allocate memory failed): the address-space limit (ulimit -v)
    allows 1.00 GiB; mf-memory estimates 2.3 MiB for rank 0's step ...`."""
    first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    limit, what = host_limit()
    needed = estimated_bytes(config, world_size, [rank])
    estimate = f"; mf-memory estimates {size(needed)} for rank {rank}'s step" \
        if needed is not None else ""
    return (f"out of memory on rank {rank} ({first}): {what} allows {size(limit)}{estimate} "
            "(MindSpore and Python need more beside it); raise the limit, or make the run "
            "smaller")
