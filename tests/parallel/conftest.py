"""Fixtures shared by the parallel tests: the runtime suite's msrun jobs (rank_jobs.py), and one
process's collectives."""

from __future__ import annotations

import pytest
from rank_jobs import RuntimeSuite
from session_files import session_directory


@pytest.fixture(scope="session")
def runtime_suite(tmp_path_factory) -> RuntimeSuite:
    """The runtime suite's jobs, one per world size, each launched on first use and shared by
    every test_runtime_*.py file and every xdist worker."""
    return RuntimeSuite(session_directory(tmp_path_factory))


@pytest.fixture(scope="module")
def collectives():
    """This process's collectives as a one-rank job: every group has one rank, so each
    collective is the identity and the wrappers' own logic runs alone."""
    pytest.importorskip("mindspore")
    from mf_config import ParallelismConfig, TrainingConfig
    from mf_parallel import make_plan
    from mf_parallel.runtime import Collectives, init_communication

    plan = make_plan(ParallelismConfig(), TrainingConfig(global_batch_size=8,
                                                         local_batch_size=8), 1)
    return Collectives(init_communication(plan, "CPU"))
