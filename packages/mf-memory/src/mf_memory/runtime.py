"""What a training process holds besides the model's tensors: the framework's own memory.

On the CPU backend the device memory is the process's resident memory, so MindSpore's
libraries, its kernels' caches, the communication library and the data loader count against
the same budget as the parameters; on Ascend and GPU they live in host memory, beside the
device's, and count for nothing here. The figures are measured, not derived: the resident
memory of an mf-train run of a model of almost no parameters (`benchmarks/layout_memory.py
--floor`, whose table in benchmarks/README.md gives the values), once everything is built and
through its steps. Pure Python.
"""

from __future__ import annotations

from typing import NamedTuple

MIB = 1024**2


class Runtime(NamedTuple):
    """The framework's own resident bytes in one rank process."""

    built: int
    """Once the model and the optimizer exist, before the first step."""
    training: int
    """Through the steps (kernels run at least once)."""


CPU_RUNTIME = Runtime(built=452 * MIB, training=499 * MIB)
"""MindSpore 2.10 on the CPU backend, one process (`benchmarks/layout_memory.py --floor`); a
rank of several holds about as much (its built peak less its share: benchmarks/README.md)."""


def runtime_bytes(device_target: str) -> Runtime:
    """The framework's own memory a device's budget carries.

    Args:
        device_target: `context.device_target` (`CPU`, `Ascend`, `GPU`, `auto`).

    Returns:
        `CPU_RUNTIME` on the CPU backend; zero elsewhere (host memory, not the device's).
    """
    return CPU_RUNTIME if str(device_target).upper() == "CPU" else Runtime(0, 0)
