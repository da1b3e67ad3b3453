"""A two-layer tensor-parallel model (column- then row-parallel pairs) honouring the layer
contract, for communication recompute in one process and on real ranks."""

from __future__ import annotations

import mindspore as ms
import numpy as np
from mindspore import Tensor, nn, ops


class TPBlock(nn.Cell):
    """A column-parallel then row-parallel pair (an MLP), as one `decoder_layers` entry."""

    def __init__(self, group, seed: int):
        from mf_parallel.runtime.tensor_parallel import ColumnParallelLinear, RowParallelLinear

        super().__init__()
        rng = np.random.default_rng(seed)
        self.up = ColumnParallelLinear(rng.standard_normal((8, 4)).astype(np.float32), None,
                                       group)
        self.down = RowParallelLinear(rng.standard_normal((4, 8)).astype(np.float32), None,
                                      group)

    def construct(self, x: Tensor) -> Tensor:
        return self.down(ops.relu(self.up(x)))


class TPModel(nn.Cell):
    def __init__(self, group):
        super().__init__()
        self.decoder_layers = nn.CellList([TPBlock(group, 0), TPBlock(group, 1)])

    def construct(self, x: Tensor) -> Tensor:
        for layer in self.decoder_layers:
            x = layer(x)
        return x


def tp_grads(model: nn.Cell, shape: tuple[int, ...] = (4, 4)) -> list[np.ndarray]:
    """Gradients of the model's parameters for one input of `shape` (`[seq, ..., 4]`)."""
    x = Tensor(np.random.default_rng(3).standard_normal(shape).astype(np.float32))
    params = model.trainable_params()
    _, grads = ms.value_and_grad(lambda v: (model(v) ** 2).sum(), None, params)(x)
    return [g.asnumpy() for g in grads]
