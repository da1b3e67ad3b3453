"""This rank's memory: the most it has used (what the step line, metrics.jsonl and the summary
show), and handing freed host memory back to the system.

On a device it is MindSpore's allocator high-water mark (`mindspore.runtime.
max_memory_allocated`, the figure torchtitan's log gives from `torch.cuda`); on CPU, where the
allocator figure leaves out everything MindSpore and Python hold outside the pool, it is the
process's peak resident set (`ru_maxrss`), which is what the kernel's out-of-memory killer and a
cgroup limit count. Both only ever grow: the peak "so far".

Every rank measures its own; `largest_peak` gathers them so that rank 0 reports the largest
rank and which one it is (the rank that runs out first).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import resource
import sys
from dataclasses import dataclass

import mindspore as ms
import psutil

from ..step import world_group

GIB = 2**30


def peak_memory_bytes(device: str) -> int:
    """This process's peak memory so far, in bytes (see the module docstring)."""
    if device != "CPU":
        return int(ms.runtime.max_memory_allocated())
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)  # macOS: bytes; Linux: KiB


@dataclass(frozen=True)
class RankPeak:
    """The largest peak over the ranks of the job, and the rank that has it."""

    bytes: int
    rank: int

    @property
    def gib(self) -> float:
        return self.bytes / GIB


def largest_peak(device: str, world_size: int) -> RankPeak:
    """The largest rank's peak memory so far (a collective over the world when there are
    several ranks: every rank calls it at the same point)."""
    mine = peak_memory_bytes(device)
    if world_size == 1:
        return RankPeak(mine, 0)
    every = world_group.every_rank(mine / 2**20)  # MiB: exact enough in float32
    rank = max(range(len(every)), key=every.__getitem__)
    return RankPeak(round(every[rank] * 2**20), rank)


def one_block_cpu_pool(device: str) -> str | None:
    """On the CPU backend, make MindSpore's memory pool one block as large as the machine's
    memory (`mindspore.runtime.set_memory`), before any kernel runs; returns the size set, or
    None (another backend, or the pool configured already in this process).

    Why: the CPU pool otherwise grows by blocks of 1 GiB and places each tensor best-fit in
    one of them; a tensor that fits no free range of any block opens a new block, whose pages
    become resident beside the freed ranges of the others. The 127M Qwen3 on one process used
    at most 1.96 GiB of pool but opened a third block and peaked at 4.0 GiB resident against
    3.14 with one block, from step 2 on; a change of kernel (Dense or MatMul in
    `linear_rows`) was enough to move it (benchmarks/README.md, "layout_memory.py"). One
    block costs address space only: a page is resident once a tensor has used it. On devices
    MindSpore's pool keeps its own defaults, and so does a machine that commits address space
    strictly (`vm.overcommit_memory` 2), where reserving it would count against the limit."""
    if device != "CPU":
        return None
    size = cpu_pool_block(psutil.virtual_memory().total, overcommit_mode())
    if size is None:
        return None
    try:
        ms.runtime.set_memory(init_size=size, increase_size=size)
    except RuntimeError:  # "can not be set repeatedly": a second trainer in this process
        return None
    return size


def cpu_pool_block(total_bytes: int, overcommit_mode: int | None) -> str | None:
    """The size `one_block_cpu_pool` gives the pool (`"<GiB>GB"`, at least 1) for a machine
    of `total_bytes` of memory, or None where address space is committed strictly."""
    if overcommit_mode == 2:
        return None
    return f"{max(1, total_bytes // GIB)}GB"


def overcommit_mode() -> int | None:
    """Linux's `vm.overcommit_memory` (0 heuristic, 1 always, 2 strict); None elsewhere."""
    try:
        with open("/proc/sys/vm/overcommit_memory") as f:
            return int(f.read().strip())
    except (OSError, ValueError):  # not Linux
        return None


M_MMAP_THRESHOLD = -3
"""glibc's `mallopt` parameter for the size from which `malloc` maps memory of its own."""
MMAP_THRESHOLD = 1 << 20


def map_large_allocations() -> bool:
    """Have glibc map every allocation of 1 MiB or more on its own, so that freeing it hands
    it back to the system at once; returns whether it could.

    Why: glibc starts mapping large blocks separately, then raises that threshold (up to
    32 MiB) each time it unmaps one, after which blocks of that size come from its arenas,
    where a freed block stays resident until a later one reuses its place. MindSpore's tensors
    on CPU come from `malloc`; a rank that builds and frees layer by layer (FSDP's build)
    raised the threshold and then kept 0.18 GiB more of its training step resident (2.44
    against 2.26 GiB, the 127M Qwen3 on 4 ranks; 2.27 with a fixed threshold). Setting it
    also turns the adjustment off. Measured on one process of the same model: the same peak and
    step time (2.97 against 3.03 s, within the noise)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        return bool(_libc().mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD))
    except (OSError, AttributeError):  # not glibc
        return False


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")


def return_freed_host_memory() -> bool:
    """Hand the memory the C allocator keeps after large frees back to the system (glibc's
    `malloc_trim`); returns whether it could.

    Why: the model is built from numpy arrays in host memory; when FSDP, ZeRO or a pipeline
    stage then frees what the rank does not hold, glibc keeps much of it in its arenas, and
    MindSpore's own memory pool cannot reuse it, so it stays in the rank's resident memory for
    the whole run (0.3 GiB of the 0.5 GiB a 127M-parameter model's whole weights took)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        return bool(_libc().malloc_trim(0))
    except (OSError, AttributeError):  # not glibc (musl has no malloc_trim)
        return False
