"""Which fully sharded units reshard after forward, per reshard_after_forward_policy."""

from __future__ import annotations

import pytest

from mf_parallel.reshard_policy import RESHARD_POLICIES, reshard_after_forward, reshard_plan


def test_policies_match_the_config_enumeration() -> None:
    from typing import get_args

    import attrs

    from mf_config import ParallelismConfig

    field = attrs.fields(ParallelismConfig).reshard_after_forward_policy
    assert set(get_args(field.type)) == set(RESHARD_POLICIES)


@pytest.mark.parametrize(("policy", "pipeline", "expected"), [
    ("always", 1, [True, True, True, True]),
    ("always", 2, [True, True, True, True]),
    ("never", 1, [False, False, False, False]),
    ("default", 1, [True, True, True, False]),   # the last unit is needed again at once
    ("default", 2, [False, False, False, False]),  # every micro-batch would gather again
])
def test_reshard_plan(policy, pipeline, expected) -> None:
    assert reshard_plan(policy, 4, pipeline) == expected


def test_one_unit_under_default_keeps_its_parameters() -> None:
    assert reshard_plan("default", 1) == [False]


def test_unknown_policy_names_the_allowed_ones() -> None:
    with pytest.raises(ValueError, match=r"one of always, never, default, got 'sometimes'"):
        reshard_after_forward("sometimes", 0, 2)


def test_unit_out_of_range() -> None:
    with pytest.raises(ValueError, match=r"unit 3 is outside 0\.\.2"):
        reshard_after_forward("always", 3, 3)
