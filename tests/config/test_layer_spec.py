"""The layer-spec grammar."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mf_config import LayerSpec
from mf_config.layer_spec import layer_ids, order_problems


@pytest.mark.parametrize(("text", "start", "end"), [
    ("5", 5, 5), ("0-3", 0, 3), (" 0-3 ", 0, 3), ("\t7\n", 7, 7), ("3-3", 3, 3), (4, 4, 4),
    ("007", 7, 7), ("10-120", 10, 120),
])
def test_valid_specs(text, start, end) -> None:
    spec = LayerSpec.parse(text)
    assert (spec.start, spec.end) == (start, end)
    assert list(spec.layers()) == list(range(start, end + 1))


@pytest.mark.parametrize(("text", "message"), [
    ("4-2", "range start must be <= end, got '4-2'"),
    ("-1", "'-1' is not a layer spec"),
    ("0 - 3", "'0 - 3' is not a layer spec"),
    ("0-3-5", "is not a layer spec"),
    ("", "is not a layer spec"),
    ("a", "is not a layer spec; write one layer as '5' or a closed range as '0-3'"),
    ("1,2", "is not a layer spec"),
    (-3, "a layer number must be >= 0, got -3"),
    (True, "a layer spec is a string such as '5' or '0-3', got True"),
    (1.5, "got 1.5"),
    (None, "got None"),
])
def test_invalid_specs(text, message) -> None:
    with pytest.raises(ValueError, match=None) as exc:
        LayerSpec.parse(text)
    assert message in str(exc.value)


@given(st.integers(0, 10_000), st.integers(0, 10_000))
def test_str_parses_back(a: int, b: int) -> None:
    spec = LayerSpec(min(a, b), max(a, b))
    assert LayerSpec.parse(str(spec)) == spec
    assert str(spec) == (str(a) if a == b else f"{min(a, b)}-{max(a, b)}")


def test_layer_ids_and_order() -> None:
    specs = [LayerSpec.parse(s) for s in ["0-1", "3", "5-6"]]
    assert layer_ids(specs) == [0, 1, 3, 5, 6]
    assert list(order_problems(specs, 7)) == []
    assert list(order_problems(specs, 6)) == [
        (2, "'5-6' names layer 6, but the model has 6 layers (valid layer ids are 0 to 5)")]


@given(st.lists(st.tuples(st.integers(0, 40), st.integers(0, 5)), max_size=6))
def test_order_problems_agree_with_a_set_reference(pairs) -> None:
    """Specs are fine exactly when each starts after the previous one ends."""
    specs = [LayerSpec(start, start + width) for start, width in pairs]
    expected_ok = all(specs[i].start > specs[i - 1].end for i in range(1, len(specs)))
    assert (list(order_problems(specs, None)) == []) == expected_ok
    if expected_ok:
        ids = layer_ids(specs)
        assert ids == sorted(set(ids))
