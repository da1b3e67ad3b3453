"""Fixtures shared by the parallel tests: the runtime suite's msrun jobs (rank_jobs.py)."""

from __future__ import annotations

import os

import pytest
from rank_jobs import RuntimeSuite


@pytest.fixture(scope="session")
def runtime_suite(tmp_path_factory) -> RuntimeSuite:
    """The runtime suite's jobs, one per world size, each launched on first use and shared by
    every test_runtime_*.py file. Under pytest-xdist each worker process has a base temporary
    directory of its own, inside one that they share: the jobs go there, so that the workers
    share them too."""
    base = tmp_path_factory.getbasetemp()
    return RuntimeSuite(base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base)
