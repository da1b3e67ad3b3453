"""Fixtures shared by the parallel tests: the runtime suite's msrun jobs (rank_jobs.py)."""

from __future__ import annotations

import pytest
from rank_jobs import RuntimeSuite
from session_files import session_directory


@pytest.fixture(scope="session")
def runtime_suite(tmp_path_factory) -> RuntimeSuite:
    """The runtime suite's jobs, one per world size, each launched on first use and shared by
    every test_runtime_*.py file and every xdist worker."""
    return RuntimeSuite(session_directory(tmp_path_factory))
