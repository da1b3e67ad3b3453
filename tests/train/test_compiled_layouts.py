"""Every layout the trainer runs, compiled (`context.compile: true`) against the same layout in
PyNative and against one process: losses and gradient norms of 4 steps, and the weights and
optimizer state after them, within 1e-5. A layout cannot be compiled without being checked
here; where its layers cannot be compiled, the start line says why and the run equals
PyNative all the same.

The layouts and their runs are tests/train/matrix_runs.py's: the compiled runs of one rank
count are trained in one msrun job; the PyNative runs and the one-process runs are the ones
the layouts' own test files compare, plus a few only this matrix needs."""

from __future__ import annotations

import pytest

pytest.importorskip("mindspore")

from matrix_runs import MATRIX
from runs import (
    PREFIXES,
    assert_same_pieces,
    assert_same_run,
    assert_same_weights,
    run_log,
)

pytestmark = pytest.mark.ranks

NOT_COMPILED = {"context parallel": "context-parallel attention exchanges key/value blocks"}
"""The layouts whose layers stay in PyNative under `context.compile`, and the start line's
reason."""


@pytest.mark.parametrize("name", list(MATRIX))
def test_compiled_layout_equals_pynative_and_one_process(matrix_runs, name) -> None:
    config, _, _, nproc = MATRIX[name]
    got, pynative = matrix_runs(name, "compiled"), matrix_runs(name, "pynative")
    one = matrix_runs(name, "one")
    assert_same_run(got, pynative)
    assert_same_run(got, one)
    assert_same_pieces(got, pynative, nproc, PREFIXES[config])
    assert_same_weights(got, one)
    start = next(line for line in run_log(got).splitlines() if "context.compile" in line)
    if name in NOT_COMPILED:
        assert NOT_COMPILED[name] in start
    else:
        assert "compiled (mindspore.jit): " in start and "decoder layers" in start
