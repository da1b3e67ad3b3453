"""The MindSpore side of mf-parallel: communication, collectives, data-parallel gradient sync.

Importing this package imports MindSpore (1-1.5 s); the plan (`mf_parallel`) never does.
Install it with `pip install "mf-parallel[runtime]"`.
"""

from .collectives import Collectives
from .comm import Communication, init_communication
from .grad_sync import GradientSync

__all__ = ["Collectives", "Communication", "GradientSync", "init_communication"]
