"""The compiled sample-index walk: built once into the cache, equal to the numpy path, and
optional (no compiler, or MF_DATA_COMPILE=0, falls back to numpy with the same arrays)."""

from __future__ import annotations

import os
import subprocess
import sys
from unittest import mock

import numpy as np
import pytest

import mf_data.gpt_indices as gpt_indices
from mf_data.compiled_walk import walker
from mf_data.gpt_indices import build_sample_index

needs_compiler = pytest.mark.skipif(walker() is None, reason="no C compiler here")


def corpus(seed: int, documents: int = 5_000, epochs: int = 3):
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, 300, documents).astype(np.int32)
    document_index = np.tile(np.arange(documents, dtype=np.int32), epochs)
    rng.shuffle(document_index)
    return lengths, document_index, epochs, int(lengths.sum())


@needs_compiler
@pytest.mark.parametrize(("seq_length", "drop_last", "extra"), [
    (64, True, 1), (64, False, 1), (128, True, 0), (7, False, 0), (4096, False, 1)])
def test_compiled_walk_equals_the_numpy_path(seq_length, drop_last, extra) -> None:
    lengths, document_index, epochs, tokens = corpus(seq_length)
    arguments = (lengths, document_index, seq_length, epochs, tokens, drop_last, extra)
    compiled = build_sample_index(*arguments)
    with mock.patch.object(gpt_indices, "walker", lambda: None):
        numpy_path = build_sample_index(*arguments)
    np.testing.assert_array_equal(compiled, numpy_path)


@needs_compiler
def test_the_int64_variant_writes_the_same_rows() -> None:
    lengths, document_index, epochs, tokens = corpus(1)
    expected = build_sample_index(lengths, document_index, 50, epochs, tokens, True, 1)
    rows = np.zeros_like(expected, dtype=np.int64)
    walker()(lengths, document_index, 50, 1, rows[1:])
    np.testing.assert_array_equal(rows, expected)


def run_python(code: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, env={**os.environ, **env})


PROBE = ("import logging; logging.basicConfig(level=logging.INFO); "
         "from mf_data.compiled_walk import walker; print(walker() is not None)")


@needs_compiler
def test_compiles_once_into_the_cache_directory(tmp_path) -> None:
    first = run_python(PROBE, MF_DATA_CACHE=str(tmp_path))
    assert first.stdout.strip() == "True", first.stderr
    built = sorted(p.name for p in tmp_path.iterdir())
    assert len(built) == 1 and built[0].startswith("sample_walk-") and built[0].endswith(".so")
    stamp = (tmp_path / built[0]).stat().st_mtime_ns
    assert run_python(PROBE, MF_DATA_CACHE=str(tmp_path)).stdout.strip() == "True"
    assert (tmp_path / built[0]).stat().st_mtime_ns == stamp  # reused, not rebuilt


def test_without_a_compiler_the_numpy_path_is_used(tmp_path) -> None:
    result = run_python(PROBE, MF_DATA_CACHE=str(tmp_path), CC=str(tmp_path / "no-such-cc"))
    assert result.stdout.strip() == "False"
    assert "could not compile sample_walk.c" in result.stderr
    assert "uses numpy" in result.stderr
    assert list(tmp_path.iterdir()) == []  # no half-built library left behind


def test_compiling_can_be_switched_off() -> None:
    result = run_python(PROBE, MF_DATA_COMPILE="0")
    assert result.stdout.strip() == "False"
    assert "MF_DATA_COMPILE=0" in result.stderr
