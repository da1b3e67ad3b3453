"""Data parallel on 2 real ranks equals one process that sees the whole global batch."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("mindspore")

from mf_parallel.launch import run_ranks

WORKER = Path(__file__).resolve().parent / "workers" / "dp_worker.py"
STEPS = 5
pytestmark = pytest.mark.ranks


def single_process(out: Path, mode: str) -> dict:
    out.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("MS_")}
    subprocess.run([sys.executable, str(WORKER), str(out), mode, str(STEPS)], check=True,
                   env=env, timeout=300, capture_output=True)
    return json.loads((out / "rank0.json").read_text())


def two_ranks(out: Path, mode: str) -> list[dict]:
    out.mkdir()
    run_ranks(WORKER, 2, log_dir=out / "logs", timeout=300, args=[str(out), mode, str(STEPS)])
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    base = tmp_path_factory.mktemp("dp")
    return {"single": single_process(base / "single", "mean"),
            "mean": two_ranks(base / "mean", "mean"),
            "sum": two_ranks(base / "sum", "sum")}


def arrays(result: dict, key: str) -> list[np.ndarray]:
    return [np.array(value, dtype=np.float32) for value in result[key]]


def test_averaged_gradients_equal_one_process(runs) -> None:
    single = arrays(runs["single"], "grads")
    for rank in runs["mean"]:
        for got, want in zip(arrays(rank, "grads"), single, strict=True):
            np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)


def test_summed_gradients_are_data_parallel_times_larger(runs) -> None:
    single = arrays(runs["single"], "grads")
    for rank in runs["sum"]:
        for got, want in zip(arrays(rank, "grads"), single, strict=True):
            np.testing.assert_allclose(got, 2 * want, rtol=0, atol=2e-6)


def test_weights_after_several_steps_match_and_are_identical_on_both_ranks(runs) -> None:
    rank0, rank1 = runs["mean"]
    for a, b in zip(arrays(rank0, "weights"), arrays(rank1, "weights"), strict=True):
        np.testing.assert_array_equal(a, b)
    for got, want in zip(arrays(rank0, "weights"), arrays(runs["single"], "weights"),
                         strict=True):
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)
    np.testing.assert_allclose(rank0["losses"], runs["single"]["losses"], rtol=1e-5)


def test_bucket_sizes_and_per_parameter_reduction_agree_exactly(runs) -> None:
    for rank in runs["mean"]:
        assert rank["buckets"] == 1 and rank["small_buckets"] == 4
        for bucketed, small, single in zip(arrays(rank, "grads"),
                                           arrays(rank, "grads_small_buckets"),
                                           arrays(rank, "grads_per_parameter"), strict=True):
            np.testing.assert_array_equal(bucketed, small)
            np.testing.assert_array_equal(bucketed, single)
