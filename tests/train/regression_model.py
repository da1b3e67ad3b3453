"""A tiny regression model with the trainer's signature and its micro-batches: what the step
tests (test_train_step.py, test_layouts.py) train one optimizer step at a time."""

from __future__ import annotations

import mindspore as ms
import numpy as np
from mindspore import Parameter, Tensor, nn, ops

from mf_train.layouts import MicroBatch


class Regression(nn.Cell):
    """loss = mean(mask * (tokens @ w - labels)^2): a model with the trainer's signature."""

    def __init__(self) -> None:
        super().__init__()
        self.w = Parameter(Tensor(np.linspace(-1, 1, 12, dtype=np.float32).reshape(4, 3)),
                           name="w")

    def construct(self, tokens, labels, loss_mask=None):
        error = ops.square(ops.matmul(tokens.astype(ms.float32), self.w)
                           - labels.astype(ms.float32))
        mask = ops.ones_like(error) if loss_mask is None else loss_mask.reshape(error.shape)
        return (error * mask).sum() / mask.sum()


def batch(seed: int, rows: int = 2) -> MicroBatch:
    """A micro-batch of `rows` samples for `Regression`: int32 tokens (4 wide) and labels
    (3 wide) in [-3, 3], drawn from `seed`."""
    rng = np.random.default_rng(seed)
    return MicroBatch(rng.integers(-3, 4, (rows, 4)).astype(np.int32),
                      rng.integers(-3, 4, (rows, 3)).astype(np.int32))
