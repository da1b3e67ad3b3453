"""One sample shown as the trainer sees it: what `mf-data sample` prints."""

from __future__ import annotations

from typing import Any

import numpy as np

SHOWN = 24
"""Values printed per column before eliding the middle."""


def format_sample(index: int, split: str, columns: dict[str, np.ndarray],
                  tokenizer: Any | None = None) -> str:
    """A readable report: each column's shape and values, the decoded text with a tokenizer."""
    lines = [f"{split} sample {index}"]
    for name, values in columns.items():
        lines.append(f"  {name} {list(values.shape)} {values.dtype}: {_values(values)}")
    first = next(iter(columns.values()))
    if tokenizer is not None:
        lines.append(f"  text of {next(iter(columns))} (documents end at {EOD_MARK}):")
        lines.append("    " + repr(decode_documents(first.tolist(), tokenizer)))
    return "\n".join(lines)


EOD_MARK = "<|eod|>"


def decode_documents(ids: list[int], tokenizer: Any) -> str:
    """The text of `ids`, with EOD_MARK where a document ends (tokenizers drop the EOD)."""
    pieces, current = [], []
    for token in ids:
        if token == tokenizer.eod:
            pieces.append(tokenizer.decode(current) + EOD_MARK)
            current = []
        else:
            current.append(token)
    pieces.append(tokenizer.decode(current))
    return "".join(pieces)


def _values(values: np.ndarray) -> str:
    if values.ndim > 1:
        return (f"{int(values.sum())} of {values.size} set"
                if values.max(initial=0) <= 1 and values.min(initial=0) >= 0
                else f"min {values.min()}, max {values.max()}")
    flat = values.tolist()
    if len(flat) <= SHOWN:
        return str(flat)
    half = SHOWN // 2
    return f"{str(flat[:half])[:-1]}, ... {str(flat[-half:])[1:]}"
