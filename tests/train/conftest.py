"""Fixtures shared by the trainer's tests: the tiny corpus and the session's trainer runs
(tests/train/runs.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from session_files import session_directory, shared_directory

ROOT = Path(__file__).resolve().parents[2]
os.environ["MF_COUNT_HOST_READS"] = "1"
"""Every training run of these tests counts the reads to the host inside its steps
(`mf_train.step.host_reads`): metrics.jsonl's `host_reads`, which the layouts' comparisons with one
process check (runs.assert_same_run)."""


@pytest.fixture(scope="session")
def data_prefix(tmp_path_factory) -> str:
    """examples/data/tiny.jsonl preprocessed by `mf-data preprocess` (byte tokens, EOD 256):
    the prefix of its .bin/.idx pair."""

    def preprocess(directory: Path) -> None:
        directory.mkdir(parents=True)
        subprocess.run([sys.executable, "-m", "mf_data", "preprocess", "--input",
                        str(ROOT / "examples" / "data" / "tiny.jsonl"), "--output-prefix",
                        str(directory / "tiny_text_document")], check=True,
                       capture_output=True)

    data = shared_directory(session_directory(tmp_path_factory) / "data", preprocess)
    return str(data / "tiny_text_document")


@pytest.fixture(scope="session")
def runs(data_prefix, tmp_path_factory):
    """The session's trainer runs: `runs(config, *sets, nproc=N)` -> output directory."""
    from runs import Runs

    base = session_directory(tmp_path_factory) / "runs"
    base.mkdir(exist_ok=True)
    return Runs(base, data_prefix)


@pytest.fixture(scope="session")
def together(data_prefix, tmp_path_factory):
    """Runs trained together in one msrun job: `together([(config, sets), ...], nproc)` ->
    their output directories (tests/train/runs.py)."""
    from runs import RunsTogether

    base = session_directory(tmp_path_factory) / "runs"
    base.mkdir(exist_ok=True)
    return RunsTogether(base, data_prefix)


@pytest.fixture(scope="session")
def matrix_runs(runs, together):
    """Every layout of the compile x layout matrix's runs (PyNative, compiled, evaluated):
    `matrix_runs(name, variant)` -> output directory (tests/train/matrix_runs.py)."""
    from matrix_runs import MatrixRuns

    return MatrixRuns(runs, together)


@pytest.fixture(scope="module")
def layout_runs(request, runs, together):
    """The runs of the test file's `CASES` and their comparison with one process
    (tests/train/runs.py `LayoutRuns`)."""
    from runs import LayoutRuns

    return LayoutRuns(runs, together, request.module.CASES)
