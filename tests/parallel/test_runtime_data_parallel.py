"""Data parallel on 2 real ranks equals one process that sees the whole global batch; both run
workers/scenario_data_parallel.py in the runtime suite's 2-rank job (rank_jobs.py), the one
process as rank 0 alone with a one-rank plan."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("mindspore")

STEPS = 5
pytestmark = pytest.mark.ranks


@pytest.fixture(scope="module")
def runs(runtime_suite) -> dict:
    return {"single": runtime_suite.results(2, "data_parallel_one_process", ranks=1, world=1,
                                            mode="mean", steps=STEPS)[0],
            "mean": runtime_suite.results(2, "data_parallel_mean", mode="mean", steps=STEPS),
            "sum": runtime_suite.results(2, "data_parallel_sum", mode="sum", steps=STEPS)}


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
