"""How gradients are grouped into buckets (no ranks needed)."""

from __future__ import annotations

import pytest

pytest.importorskip("mindspore")

from mf_parallel.runtime.grad_reduce import _buckets


@pytest.mark.parametrize(("sizes", "limit", "expected"), [
    ([4, 4, 4, 4], 8, [[0, 1], [2, 3]]),
    ([4, 4, 4], 100, [[0, 1, 2]]),
    ([10, 1, 1], 4, [[0], [1, 2]]),      # a gradient larger than the limit stands alone
    ([1, 10, 1], 4, [[0], [1], [2]]),
    ([], 4, []),
])
def test_buckets_are_consecutive_and_within_the_limit(sizes, limit, expected) -> None:
    assert _buckets(list(range(len(sizes))), sizes, limit) == expected
