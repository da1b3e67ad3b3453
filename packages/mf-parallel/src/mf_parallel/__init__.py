"""mf-parallel: parallel layouts for mf, worked out in pure Python before anything is launched.

    from mf_parallel import make_plan
    plan = make_plan(parallelism, training, world_size=8, num_layers=12, seq_length=4096)

This package's plan never imports MindSpore; the runtime (`mf_parallel.runtime`: collectives,
data, sharded and tensor parallelism on real ranks) does, and is the optional extra
`mf-parallel[runtime]`.
"""

from .batch import BatchPlan, Rampup
from .dims import ParallelDims
from .errors import PlanError
from .mesh import DIMENSIONS, GROUP_KINDS, RankMesh
from .pipeline_layout import PipelineError, StageLayout, stage_layout
from .pipeline_schedules import SCHEDULES, Action, Kind, build_schedule
from .pipeline_simulator import ScheduleError, SimulationResult, simulate
from .plan import Plan, make_plan, plan_summary
from .reshard_policy import RESHARD_POLICIES, reshard_after_forward, reshard_plan
from .sequence import check_sequence_length, sequence_divisor
from .vocabulary_rows import keeps_vocabulary_rows

__all__ = [
    "DIMENSIONS",
    "GROUP_KINDS",
    "RESHARD_POLICIES",
    "SCHEDULES",
    "Action",
    "BatchPlan",
    "Kind",
    "ParallelDims",
    "PipelineError",
    "Plan",
    "PlanError",
    "Rampup",
    "RankMesh",
    "ScheduleError",
    "SimulationResult",
    "StageLayout",
    "build_schedule",
    "check_sequence_length",
    "keeps_vocabulary_rows",
    "make_plan",
    "plan_summary",
    "reshard_after_forward",
    "reshard_plan",
    "sequence_divisor",
    "simulate",
    "stage_layout",
]
