"""Where this rank's tensors sit in the model-wide ones, and which of them it writes.

A checkpoint (`checkpoint.pieces`) stores each tensor once, under the name and shape one
process gives it (per tensor place for a weight tensor parallelism splits), so any layout can
read it. `Placement` answers, for one parameter of this rank:

- `tensor(param)`: `(place, degree)` when tensor parallelism splits it (the checkpoint then
  keeps each place's shard), None when every tensor place holds it whole;
- `owns(name, param, sliced)`: whether this rank writes what it holds of it. A tensor held
  by several ranks is written by the first of them in every group it is replicated over:
  the data-parallel, context-parallel (the `loss` group) and, for a weight tensor
  parallelism does not split, tensor ranks; the expert-data ranks for a routed expert under
  expert parallelism (they hold the same experts); and of the two pipeline stages holding a
  tied embedding, the first. A slice of a ZeRO or FSDP buffer (`sliced`) is this rank's
  alone within its shard group, so only its HSDP replicas (`replicate`) hold it too; a slice
  of routed experts (sliced over their expert-data group) is this rank's alone.
- `writes_scalars`: rank 0 writes what every rank has the same (the optimizer's step count).
"""

from __future__ import annotations

from collections.abc import Collection

from mindspore import Parameter

from mf_parallel.dims import ParallelDims
from mf_parallel.runtime import Communication
from mf_parallel.runtime.tensor_parallel import is_tensor_sharded

from .layouts.expert_parallel import expert_index


class Placement:
    """This rank's place in the checkpoint's model-wide tensors.

    Args:
        comm: this rank's communication groups.
        dims: the parallel degrees.
        copies: names of parameters this rank holds as a copy another rank writes (the
            last pipeline stage's tied embedding).
    """

    def __init__(self, comm: Communication, dims: ParallelDims,
                 copies: Collection[str] = ()):
        self.comm, self.dims, self.copies = comm, dims, frozenset(copies)

    @property
    def writes_scalars(self) -> bool:
        return self.comm.rank == 0

    def tensor(self, param: Parameter) -> tuple[int, int] | None:
        """`(place, degree)` of a weight tensor parallelism splits; None otherwise."""
        if self.dims.tensor > 1 and is_tensor_sharded(param):
            return self.comm.group_rank("tensor"), self.dims.tensor
        return None

    def owns(self, name: str, param: Parameter, sliced: bool = False) -> bool:
        """Whether this rank writes what it holds of parameter `name` (see the module)."""
        if name in self.copies:
            return False
        if self.dims.expert > 1 and expert_index(name) is not None:
            groups = [] if sliced else ["expert_data"]  # sliced over the expert-data group
        else:
            groups = ["replicate" if sliced else "loss"]
            if self.dims.tensor > 1 and self.tensor(param) is None:
                groups.append("tensor")
        return all(self.comm.group_rank(group) == 0 for group in groups)
