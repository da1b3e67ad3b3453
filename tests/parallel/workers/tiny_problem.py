"""The small problem the data-parallel workers train: an MLP with fixed weights and one fixed
global batch, the same on every rank, of which each data-parallel rank takes its slice."""

import numpy as np
from mindspore import Tensor, nn


def tiny_mlp(hidden: int, depth: int = 1) -> nn.SequentialCell:
    """16 -> hidden (-> hidden, depth - 1 times) -> 8 with tanh between, weights drawn from a
    fixed seed. The linear layers are cells 0, 2, 4, ..."""
    rng = np.random.default_rng(0)
    cells = [nn.Dense(16, hidden), nn.Tanh()]
    for _ in range(depth - 1):
        cells += [nn.Dense(hidden, hidden), nn.Tanh()]
    net = nn.SequentialCell(*cells, nn.Dense(hidden, 8))
    for param in net.trainable_params():
        param.set_data(Tensor(rng.normal(0, 0.3, param.shape).astype(np.float32)))
    return net


def local_batch(comm, global_batch: int) -> tuple[Tensor, Tensor]:
    """This rank's contiguous slice of the fixed global batch (all of it on one process)."""
    data = np.random.default_rng(1)
    inputs = data.normal(size=(global_batch, 16)).astype(np.float32)
    targets = data.normal(size=(global_batch, 8)).astype(np.float32)
    local = global_batch // comm.group_size("data")
    rows = slice(comm.group_rank("data") * local, (comm.group_rank("data") + 1) * local)
    return Tensor(inputs[rows]), Tensor(targets[rows])
