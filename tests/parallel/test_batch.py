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


def simulated_rampup_steps(plan: BatchPlan) -> int:
    """The trainer's loop, one optimizer step at a time: each step consumes the accumulation
    steps valid at its start x data parallel x micro-batch."""
    consumed = steps = 0
    while plan.global_batch_size_at(consumed) < plan.global_batch_size:
        consumed += plan.accumulation_steps(consumed) * plan.data_parallel * plan.micro_batch_size
        steps += 1
    return steps


def test_rampup_next_growth() -> None:
    """Whole spacing (100 samples) and a float one (1000 / 3 = 333.3, as Megatron-LM divides)."""
    whole = batch(2, local_batch_size=8, global_batch_size=64, rampup_batch_size=[16, 16, 300])
    assert whole.rampup is not None
    assert [whole.rampup.next_growth(c) for c in (0, 99, 100, 250)] == [100, 100, 200, 300]
    thirds = batch(1, local_batch_size=16, global_batch_size=64,
                   rampup_batch_size=[16, 16, 1000])
    assert thirds.rampup is not None and thirds.rampup.samples_per_increment == 1000 / 3
    assert [thirds.rampup.next_growth(c) for c in (0, 333, 334, 666, 667)] == [
        334, 334, 667, 667, 1000]
    with pytest.raises(ValueError, match="at its target"):
        thirds.rampup.next_growth(1000)


def test_next_growth_follows_the_float_formula() -> None:
    """18 samples over 14 increments: 9 / (18 / 14) is 6.999... in floats, not 7, so the batch
    reaches 8 at 10 samples, not at the exact 7 x 18 / 14 = 9; the trainer sees the float."""
    plan = batch(1, local_batch_size=1, global_batch_size=15, rampup_batch_size=[1, 1, 18])
    assert plan.rampup is not None
    assert [plan.rampup.global_batch_size(c) for c in (8, 9, 10)] == [7, 7, 8]
    assert plan.rampup.next_growth(8) == 10
    assert plan.rampup_steps() == simulated_rampup_steps(plan) == 6


def test_rampup_steps() -> None:
    """[16, 16, 300], dp 2 x micro 8: 7 steps of 16 (to 112 samples), 3 of 32 (to 208), 2 of
    48 (to 304 >= 300): 12 steps below 64."""
    plan = batch(2, local_batch_size=8, global_batch_size=64, rampup_batch_size=[16, 16, 300])
    assert plan.rampup_steps() == 12 == simulated_rampup_steps(plan)
    # growths at 334, 667 and 1000 samples: 21 steps of 16, 11 of 32, 7 of 48
    plan = batch(2, local_batch_size=1, global_batch_size=64, rampup_batch_size=[16, 16, 1000])
    assert plan.rampup_steps() == 39 == simulated_rampup_steps(plan)


def test_a_step_can_span_several_growths() -> None:
    """Growths every 10 samples: step 0 takes 16 (the batch is then 32), step 1 takes 32 (48
    samples, past the ramp's 30)."""
    plan = batch(1, local_batch_size=16, global_batch_size=64, rampup_batch_size=[16, 16, 30])
    assert plan.rampup_steps() == 2 == simulated_rampup_steps(plan)


@pytest.mark.parametrize("rampup", [None, [16, 16, 0], [64, 16, 1000]])
def test_no_rampup_steps_without_a_ramp(rampup) -> None:
    plan = batch(2, local_batch_size=8, global_batch_size=64, rampup_batch_size=rampup)
    assert plan.rampup_steps() == 0
    assert plan.rampup is None or not plan.rampup.active
    assert plan.accumulation_steps(0) == plan.accumulation_steps() == 4


def test_a_ramp_over_millions_of_samples_walks_increments() -> None:
    """Megatron-LM's GPT-3 ramp ([32, 32, 6M] to 1536) on dp 8: 17707 steps; `rampup_steps`
    turns its loop at most once per increment (47), the simulation once per step."""
    plan = batch(8, local_batch_size=1, global_batch_size=1536,
                 rampup_batch_size=[32, 32, 6_000_000])
    assert plan.rampup_steps() == 17707 == simulated_rampup_steps(plan)


@st.composite
def ramps(draw: st.DrawFn) -> BatchPlan:
    dp, micro = draw(st.integers(1, 4)), draw(st.integers(1, 4))
    unit = dp * micro
    start, increment = unit * draw(st.integers(1, 8)), unit * draw(st.integers(1, 8))
    target = start + increment * draw(st.integers(0, 12))
    return batch(dp, local_batch_size=micro, global_batch_size=target,
                 rampup_batch_size=[start, increment, draw(st.integers(0, 3000))])


@given(ramps())
def test_rampup_steps_match_the_trainer_loop(plan: BatchPlan) -> None:
    assert plan.rampup_steps() == simulated_rampup_steps(plan)


@given(ramps(), st.integers(0, 3000))
def test_next_growth_is_the_first_larger_batch(plan: BatchPlan, consumed: int) -> None:
    rampup = plan.rampup
    assert rampup is not None
    current = rampup.global_batch_size(consumed)
    if current == rampup.target:
        return
    first = next(c for c in range(consumed + 1, rampup.samples + 1)
                 if rampup.global_batch_size(c) > current)
    assert rampup.next_growth(consumed) == first


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
