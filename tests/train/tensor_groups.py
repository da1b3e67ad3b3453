"""A stand-in for one rank's tensor-parallel group, without communication: what a model reads of
its `TensorGroup` while it is built, and what the Hugging Face import's `local_value` reads to
pick a rank's slice (test_qwen3.py, test_export_hf.py, test_hf_streaming.py,
test_train_sharded.py)."""

from __future__ import annotations

import functools
from types import SimpleNamespace

from mf_parallel.runtime.tensor_parallel import TensorGroup


def tensor_group(rank: int, size: int = 2, sequence_parallel: bool = True) -> SimpleNamespace:
    """Rank `rank` of a tensor group of `size`: its rank, size, sequence-parallel flag and
    `TensorGroup.shard` (this rank's slice of a full array); no collectives (`ops`, which
    the regions keep, is None)."""
    group = SimpleNamespace(rank=rank, size=size, sequence_parallel=sequence_parallel,
                            ops=None)
    group.shard = functools.partial(TensorGroup.shard, group)
    return group
