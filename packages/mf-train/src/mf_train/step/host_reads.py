"""Counting the reads of device tensors back to the host inside a training step.

A read (`asnumpy()`, `float(t)`, `t.item()`, `t.tolist()`, `np.asarray(t)`, `bool(t)`) makes
the host wait until the device has computed that tensor. On a device that runs kernels
queued ahead of the host (PyNative on Ascend and GPU) every read inside a step stalls the
queue; mf-train keeps the norm, the clip and the skip decision on the device and reads the
step's numbers only after its update is queued (`trainer.TrainStep.launch`).

With the environment variable `MF_COUNT_HOST_READS=1` each rank counts the reads its step
makes between the first forward and the queued update, and the step's metrics record them
as `host_reads` (metrics.jsonl, TensorBoard): a diagnostic for whoever changes a layout or a
model, at the cost of a Python wrapper around those methods while the step runs.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from mindspore import Tensor

ENVIRONMENT = "MF_COUNT_HOST_READS"
_READERS = ("asnumpy", "_item", "_tolist")
"""The methods every read goes through (`__float__`, `__bool__`, `item`, `numpy`,
`__array__` call one of them)."""


def counting_asked() -> bool:
    """Whether `MF_COUNT_HOST_READS` asks for the count."""
    return os.environ.get(ENVIRONMENT, "") not in ("", "0")


class HostReads:
    """The reads counted so far (`count`); a nested read (one reader calling another)
    counts once."""

    def __init__(self) -> None:
        self.count = 0
        self._depth = 0

    def wrap(self, read: Callable[..., Any]) -> Callable[..., Any]:
        def counted(tensor: Tensor, *args: Any, **kwargs: Any) -> Any:
            if self._depth == 0 and not _compiling():
                self.count += 1
            self._depth += 1
            try:
                return read(tensor, *args, **kwargs)
            finally:
                self._depth -= 1
        return counted


def _compiling() -> bool:
    """Whether MindSpore's value inference made the read: it folds constants while it builds
    a graph (`context.compile`: `infer_value_for_Cast` and the like, once per graph, its
    forward or its backward, and input shape), which is no read of the step's."""
    frame = sys._getframe(2)
    for _ in range(4):  # the inference calls the reader directly, or through Tensor's own
        if frame is None:
            return False
        if frame.f_code.co_name.startswith("infer_value") and _MINDSPORE_OPS in \
                frame.f_code.co_filename:
            return True
        frame = frame.f_back
    return False


_MINDSPORE_OPS = os.path.join("mindspore", "ops", "")


@contextmanager
def counted_reads() -> Iterator[HostReads]:
    """Count every read of a MindSpore tensor to the host inside the block."""
    reads = HostReads()
    originals = {name: getattr(Tensor, name) for name in _READERS}
    for name, read in originals.items():
        setattr(Tensor, name, reads.wrap(read))
    try:
        yield reads
    finally:
        for name, read in originals.items():
            setattr(Tensor, name, read)
