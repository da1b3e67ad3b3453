"""Batch math: micro-batches, accumulation steps, rounding and ramp-up."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mf_config import TrainingConfig
from mf_parallel.batch import BatchPlan
from mf_parallel.errors import PlanError
from mf_parallel.sequence import check_sequence_length, sequence_divisor


def batch(data_parallel: int, **training) -> BatchPlan:
    return BatchPlan.from_config(TrainingConfig(**training), data_parallel)


def test_accumulation_steps() -> None:
    plan = batch(4, local_batch_size=2, global_batch_size=64)
    assert plan.accumulation_steps() == 8
    assert plan.effective_global_batch_size() == 64
    assert plan.warnings() == []


def test_a_global_batch_that_does_not_divide_is_rounded_down_with_a_warning() -> None:
    plan = batch(4, local_batch_size=2, global_batch_size=20)
    assert plan.accumulation_steps() == 2
    assert plan.warnings() == [
        "global_batch_size 20 is not a multiple of data_parallel (4) x local_batch_size (2); "
        "each step uses 2 accumulation steps, an effective global batch of 16"]


def test_too_small_a_global_batch_is_an_error() -> None:
    with pytest.raises(PlanError) as exc:
        batch(8, local_batch_size=2, global_batch_size=8)
    assert str(exc.value) == (
        "global_batch_size (8) is smaller than data_parallel (8) x local_batch_size (2) = 16: "
        "every data-parallel rank needs at least one micro-batch per step")


@given(st.integers(1, 64), st.integers(1, 8), st.integers(1, 4096))
def test_accumulation_matches_integer_division(dp, micro, gbs) -> None:
    training = TrainingConfig(local_batch_size=micro, global_batch_size=max(gbs, micro))
    if dp * micro > training.global_batch_size:
        with pytest.raises(PlanError):
            BatchPlan.from_config(training, dp)
        return
    plan = BatchPlan.from_config(training, dp)
    steps = plan.accumulation_steps()
    assert steps == training.global_batch_size // (dp * micro)
    assert steps * dp * micro <= training.global_batch_size < (steps + 1) * dp * micro


def test_rampup_follows_megatron() -> None:
    """start 16, +16 every 300 / ((64 - 16) / 16) = 100 samples, target 64 (dp 2 x micro 8)."""
    plan = batch(2, local_batch_size=8, global_batch_size=64, rampup_batch_size=[16, 16, 300])
    at = {consumed: plan.global_batch_size_at(consumed)
          for consumed in (0, 99, 100, 199, 200, 299, 300, 10_000)}
    assert at == {0: 16, 99: 16, 100: 32, 199: 32, 200: 48, 299: 48, 300: 64, 10_000: 64}
    assert plan.accumulation_steps(0) == 1 and plan.accumulation_steps(250) == 3
    assert plan.accumulation_steps() == 4


def test_rampup_values_must_fit_the_micro_batches() -> None:
    with pytest.raises(PlanError, match=r"increment \(4\) must be a multiple of data_parallel "
                                        r"\(2\) x local_batch_size \(4\) = 8"):
        batch(2, local_batch_size=4, global_batch_size=64, rampup_batch_size=[8, 4, 100])


@pytest.mark.parametrize(("tp", "cp", "causal", "divisor"), [
    (1, 1, True, 1), (2, 1, True, 2), (1, 2, True, 4), (1, 2, False, 2), (4, 2, True, 16)])
def test_sequence_divisor(tp, cp, causal, divisor) -> None:
    assert sequence_divisor(tp, cp, causal) == divisor


def test_sequence_length_must_split() -> None:
    check_sequence_length(4096, 4, 2)
    with pytest.raises(PlanError) as exc:
        check_sequence_length(100, 4, 2)
    assert str(exc.value) == ("seq_length 100 must be a multiple of context_parallel (2) x 2 "
                              "(causal load balancing) x tensor_parallel (4, sequence "
                              "parallelism) = 16")
