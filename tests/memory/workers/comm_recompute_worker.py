"""Communication recompute on 2 real ranks: the tensor-parallel model's gradients with
`recompute_comm` on layer 1's column-parallel input equal those without, bit for bit, and the
all-gather runs again once in backward. One rank's results to rank<r>.json.

Usage: comm_recompute_worker.py OUT_DIR
"""

import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tp_model import TPModel, tp_grads

from mf_config import LayerSpec, ParallelismConfig, RecomputeCommConfig, TrainingConfig
from mf_memory.recompute import apply_recompute_comm
from mf_parallel import make_plan
from mf_parallel.runtime import Collectives, init_communication
from mf_parallel.runtime.tensor_parallel import TensorGroup

out_dir = Path(sys.argv[1])
world = int(os.environ["MS_WORKER_NUM"])
plan = make_plan(ParallelismConfig(tensor_parallel=world), TrainingConfig(), world)
comm = init_communication(plan, "CPU")
group = TensorGroup(Collectives(comm), sequence_parallel=True)

reference = tp_grads(TPModel(group))
model = TPModel(group)
wrapped = apply_recompute_comm(model, RecomputeCommConfig(
    enable=True, select_module={"up": [LayerSpec(1, 1)]}))
got = tp_grads(model)
result = {
    "wrapped": wrapped,
    "recomputes": model.decoder_layers[1].up.enter.recomputes,
    "identical": all((a == b).all() for a, b in zip(got, reference, strict=True)),
    "grads": [g.tolist() for g in got],
}
(out_dir / f"rank{comm.rank}.json").write_text(json.dumps(result))
