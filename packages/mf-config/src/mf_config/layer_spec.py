"""The layer-spec grammar used by `recompute`, `recompute_comm` and `swap`.

A spec names one decoder layer (`'5'`) or a closed range of them (`'0-3'` is layers 0, 1, 2
and 3). Specs are written as quoted strings in a list (a bare `[0-3]` is YAML for `[-3]`);
a plain integer is accepted for a single layer. mf-memory consumes the parsed `LayerSpec`s.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence

import attrs

_SPEC = re.compile(r"\s*(\d+)(?:-(\d+))?\s*")


@attrs.frozen
class LayerSpec:
    """Layers `start` to `end`, both included."""

    start: int
    end: int

    @classmethod
    def parse(cls, text: str | int) -> LayerSpec:
        """A spec as written in a configuration.

        Args:
            text: `'5'`, `' 0-3 '`, or a plain integer `5`.

        Returns:
            The spec.

        Raises:
            ValueError: saying what is allowed.
        """
        if isinstance(text, bool) or not isinstance(text, (str, int)):
            raise ValueError(f"a layer spec is a string such as '5' or '0-3', got {text!r}")
        if isinstance(text, int):
            if text < 0:
                raise ValueError(f"a layer number must be >= 0, got {text}")
            return cls(text, text)
        match = _SPEC.fullmatch(text)
        if match is None:
            raise ValueError(
                f"{text!r} is not a layer spec; write one layer as '5' or a closed range as '0-3'"
            )
        start = int(match.group(1))
        end = int(match.group(2)) if match.group(2) is not None else start
        if start > end:
            raise ValueError(f"range start must be <= end, got {text!r}")
        return cls(start, end)

    def layers(self) -> range:
        """The layer ids this spec names."""
        return range(self.start, self.end + 1)

    def __str__(self) -> str:
        return str(self.start) if self.start == self.end else f"{self.start}-{self.end}"


def layer_ids(specs: Sequence[LayerSpec]) -> list[int]:
    """Every layer id named by a list of specs, in order."""
    return [layer for spec in specs for layer in spec.layers()]


def ids_text(ids: Sequence[int]) -> str:
    """Layer ids for a message: `0-3` for a run, `0, 2` otherwise."""
    ids = list(ids)
    if len(ids) > 1 and ids == list(range(ids[0], ids[-1] + 1)):
        return f"{ids[0]}-{ids[-1]}"
    return ", ".join(map(str, ids))


def order_problems(specs: Sequence[LayerSpec], num_layers: int | None) -> Iterator[tuple[int, str]]:
    """What is wrong with the order of a list of specs, for the rules that read one.

    Args:
        specs: the list as written.
        num_layers: the model's layers, or None when unknown (then no spec is past the end).

    Yields:
        (list position, message) for each spec out of order, overlapping, or past the last layer.
    """
    for index, spec in enumerate(specs):
        if index and spec.start <= specs[index - 1].end:
            previous = specs[index - 1]
            relation = "overlaps" if spec.end >= previous.start else "comes before"
            yield index, (
                f"'{spec}' {relation} '{previous}'; specs must be in strictly ascending order "
                "and must not overlap"
            )
        if num_layers is not None and spec.end >= num_layers:
            yield index, (
                f"'{spec}' names layer {spec.end}, but the model has {num_layers} layers "
                f"(valid layer ids are 0 to {num_layers - 1})"
            )
