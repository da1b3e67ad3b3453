"""The MindSpore side of mf-parallel: communication, collectives, the gradient reduction,
sharded data parallelism (ZeRO-1/2 and FSDP) and tensor-parallel layers (`tensor_parallel`).

Importing this package imports MindSpore (1-1.5 s); the plan (`mf_parallel`) never does.
Install it with `pip install "mf-parallel[runtime]"`.
"""

from .collectives import Collectives, Pending
from .comm import Communication, init_communication
from .fully_sharded import FullyShardedDataParallel
from .grad_reduce import GradientReducer
from .sharded import ShardedDataParallel

__all__ = [
    "Collectives",
    "Communication",
    "FullyShardedDataParallel",
    "GradientReducer",
    "Pending",
    "ShardedDataParallel",
    "init_communication",
]
