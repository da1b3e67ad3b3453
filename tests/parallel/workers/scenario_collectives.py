"""Each collective on known inputs, over this rank's data and tensor groups, and a send from
rank 0 to the last rank: what test_runtime_collectives.py compares with numpy.

A scenario of runtime_suite.py: `run` returns this rank's results.
"""

import mindspore as ms
import numpy as np
from mindspore import Tensor

from mf_config import ParallelismConfig, TrainingConfig
from mf_parallel import make_plan
from mf_parallel.runtime import Collectives
from mf_parallel.runtime.flat_shard import FlatShard
from mf_parallel.runtime.grad_reduce import GradientReducer

FLAT_SHAPES = [(5, 3), (4,), (2, 2, 2)]
"""The tensors of the flat-buffer gather: 31 elements, padded on every shard degree."""


def run(connect, *, world: int, tensor_parallel: int) -> dict:
    """Data parallel x `tensor_parallel` on `world` ranks; `connect` gives this rank's
    communication for the plan."""
    plan = make_plan(ParallelismConfig(tensor_parallel=tensor_parallel),
                     TrainingConfig(global_batch_size=world), world)
    comm = connect(plan)
    col = Collectives(comm)
    rank = comm.rank

    def value(shape, offset=0.0):
        """Rank-dependent input: rank * 100 + position + offset."""
        return Tensor(np.arange(np.prod(shape), dtype=np.float32).reshape(shape)
                      + rank * 100 + offset)

    results = {"rank": rank, "groups": comm.group_ranks}
    for kind in ("data", "tensor"):
        size = comm.group_size(kind)
        x = value((2 * size, 3))
        transposed = value((3, 2 * size)).T  # non-contiguous input
        summed_in_place = x * 1  # a tensor of its own (the input stays as it was)
        col.all_reduce_in_place(summed_in_place, kind)
        results[kind] = {
            "all_reduce": col.all_reduce(x, kind).asnumpy().tolist(),
            "all_reduce_in_place": summed_in_place.asnumpy().tolist(),
            "all_reduce_noncontiguous": col.all_reduce(transposed, kind).asnumpy().tolist(),
            "all_reduce_max": col.all_reduce(x, kind, op="max").asnumpy().tolist(),
            "all_gather": col.all_gather(x, kind).asnumpy().tolist(),
            "reduce_scatter": col.reduce_scatter(x, kind).asnumpy().tolist(),
            "all_to_all": col.all_to_all(x, kind).asnumpy().tolist(),
            "broadcast": col.broadcast(x, kind,
                                       src=comm.group_ranks[kind][-1]).asnumpy().tolist(),
        }
    flat = FlatShard(FLAT_SHAPES, col)  # over the shard group
    wholes = [Tensor(np.arange(np.prod(shape), dtype=np.float32).reshape(shape) + 100 * i)
              for i, shape in enumerate(FLAT_SHAPES)]
    gathered = flat.all_gather(flat.own(flat.flatten(wholes)))
    results["flat_gather"] = {
        "values": [t.asnumpy().tolist() for t in gathered],
        "own_memory": len({t.data_ptr() for t in gathered}) == len(gathered)
        and all(t.is_contiguous() and t.storage_offset() == 0 for t in gathered)}
    results["reduce_dtype"] = reduced_in_dtypes(col)
    if comm.world_size >= 2:  # rank 0 sends to the last rank
        last = comm.world_size - 1
        payload = value((2, 2), 0.5) if rank == 0 else Tensor(np.zeros((2, 2), np.float32))
        if rank in (0, last):
            results["send_recv"] = col.send_recv(payload, src=0, dst=last).asnumpy().tolist()
    return results


def reduce_input(rank: int, shape: tuple[int, ...]) -> np.ndarray:
    """A rank's gradient whose values float16 and bfloat16 round (thirds)."""
    return ((np.arange(np.prod(shape), dtype=np.float32).reshape(shape) + 1) / 3
            + rank / 7).astype(np.float32)


def reduced_in_dtypes(col: Collectives) -> dict:
    """The gradients `reduce_input` summed over the data group by `GradientReducer` and
    reduce-scattered over the shard group by `FlatShard`, in each `reduce_dtype`: what
    test_runtime_collectives.py compares with numpy's sums of the rounded inputs."""
    grads = [Tensor(reduce_input(col.comm.rank, shape)) for shape in FLAT_SHAPES]
    out = {}
    for name in ("float32", "float16", "bfloat16"):
        dtype = getattr(ms, name)
        synced = GradientReducer.data_parallel(col, FLAT_SHAPES, average=False,
                                               reduce_dtype=dtype).reduce_whole(grads)
        mine = FlatShard(FLAT_SHAPES, col, reduce_dtype=dtype).reduce_scatter_tensors(grads)
        out[name] = {"sync": [g.asnumpy().tolist() for g in synced],
                     "sync_dtypes": [str(g.dtype) for g in synced],
                     "flat": mine.asnumpy().tolist(), "flat_dtype": str(mine.dtype)}
    return out
