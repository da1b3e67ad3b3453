"""One comparison of named arrays for every test that compares weights or optimizer state:
the same names, and each array within a relative and an absolute tolerance (both 0: equal bit
for bit)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np


def assert_same_tensors(got: Mapping | Sequence, want: Mapping | Sequence, rel: float = 1e-5,
                        atol: float = 1e-6, what: str = "") -> None:
    """`got` holds the arrays of `want` (a mapping name -> array, or a sequence of arrays),
    no more and no fewer, each within `rel` and `atol`; `what` opens each error message."""
    if not isinstance(want, Mapping):
        got, want = dict(enumerate(got)), dict(enumerate(want))
    assert got.keys() == want.keys(), (what, sorted(set(got) ^ set(want)))
    for name, array in want.items():
        message = f"{what}{': ' if what else ''}{name}"
        mine = np.asarray(got[name])
        assert mine.shape == np.shape(array), message
        if rel == atol == 0:
            np.testing.assert_array_equal(mine, array, err_msg=message)
        else:
            np.testing.assert_allclose(mine, array, rtol=rel, atol=atol, err_msg=message)
