"""One rank of `dp_sync.py`: times gradient synchronisation both ways; rank 0 writes JSON.

Usage: dp_sync_worker.py OUT_FILE REPEATS BUCKET_MIB[,BUCKET_MIB...]
"""

import json
import sys
import time

import numpy as np
from mindspore import Tensor

from mf_config import ParallelismConfig, TrainingConfig
from mf_parallel import make_plan
from mf_parallel.runtime import Collectives, GradientReducer, init_communication


def gpt_shapes(layers: int = 4, hidden: int = 256, vocab: int = 4096) -> list[tuple[int, ...]]:
    """The parameter shapes of a small GPT (about 7M parameters, 42 tensors)."""
    shapes: list[tuple[int, ...]] = [(vocab, hidden)]
    for _ in range(layers):
        shapes += [(hidden,), (3 * hidden, hidden), (hidden, hidden), (hidden,),
                   (4 * hidden, hidden), (hidden, 4 * hidden), (hidden,), (hidden,), (hidden,),
                   (hidden,)]
    return [*shapes, (hidden,)]


out_file, repeats = sys.argv[1], int(sys.argv[2])
bucket_mib = [float(size) for size in sys.argv[3].split(",")]
plan = make_plan(ParallelismConfig(), TrainingConfig(global_batch_size=2), 2)
comm = init_communication(plan, "CPU")
shapes = gpt_shapes()
rng = np.random.default_rng(comm.rank)
grads = [Tensor(rng.normal(size=s).astype(np.float32)) for s in shapes]
collectives = Collectives(comm)
syncs = {size: GradientReducer.data_parallel(collectives, shapes, average=True,
                                             bucket_bytes=int(size * 2**20)).reduce_whole
         for size in bucket_mib}
per_parameter_sync = GradientReducer.data_parallel(collectives, shapes, average=True,
                                                   bucket_bytes=0)  # a bucket per gradient


def timed(fn) -> list[float]:
    fn(grads)  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        out = fn(grads)
        out[-1].asnumpy()  # wait for the result
        times.append(time.perf_counter() - start)
    return times


per_parameter = timed(per_parameter_sync.reduce_whole)
bucketed = {size: {"buckets": len(sync.__self__.buckets), "times": timed(sync)}
            for size, sync in syncs.items()}
if comm.rank == 0:
    summary = {"parameters": int(sum(np.prod(s) for s in shapes)), "tensors": len(shapes),
               "bucketed": bucketed, "per_parameter": per_parameter}
    with open(out_file, "w") as out:
        json.dump(summary, out)
