"""Qwen3 on 2 tensor-parallel ranks against its single-process twin, built from the same seed
in the same process: loss, this rank's vocabulary slice of the logits, and every gradient
(after the tensor-group sum of the marked parameters) against the twin's gradient cut the way
this rank holds the parameter. Writes rank<r>.json.

Usage: qwen3_tp_worker.py OUT_DIR

Cases: sequence parallelism with an untied head and attention biases; plain tensor
parallelism with a tied head.
"""

import json
import os
import sys
from pathlib import Path

import mindspore as ms
import numpy as np
from mindspore import Tensor
from tensor_reduction import reduce_tensor_partial

from mf_config import ModelConfig, ParallelismConfig, TrainingConfig
from mf_parallel import make_plan
from mf_parallel.runtime import Collectives, init_communication
from mf_parallel.runtime.tensor_parallel import TensorGroup
from mf_train.models import build_model
from mf_train.models.blocks import split_rows
from mf_train.models.hf_weights import ArraysSource, local_value
from mf_train.parallelize import build_parallel_model

out_dir = Path(sys.argv[1])
world = int(os.environ["MS_WORKER_NUM"])
ms.set_context(mode=ms.PYNATIVE_MODE)
plan = make_plan(ParallelismConfig(tensor_parallel=world), TrainingConfig(), world)
comm = init_communication(plan, "CPU")
collectives = Collectives(comm)
SIZES = {"vocab_size": 64, "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2,
         "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8,
         "initializer_range": 0.3, "max_position_embeddings": 32}
CASES = {"sequence_parallel_untied": (True, {"attention_bias": True}),
         "plain_tied": (False, {"tie_word_embeddings": True})}

rng = np.random.default_rng(0)  # the same batch on every rank
ids = rng.integers(0, SIZES["vocab_size"], (2, 8)).astype(np.int32)
labels = rng.integers(0, SIZES["vocab_size"], (2, 8)).astype(np.int32)
mask = (rng.random((2, 8)) > 0.3).astype(np.float32)


def loss_and_grads(model, params):
    return ms.value_and_grad(model, None, params)(Tensor(ids), Tensor(labels), Tensor(mask))


result = {}
for case, (sequence_parallel, overrides) in CASES.items():
    config = ModelConfig(model_type="qwen3", extras=SIZES | overrides)
    group = TensorGroup(collectives, sequence_parallel=sequence_parallel)
    model = build_parallel_model(config, tensor_group=group, seed=5)
    twin = build_model(config, seed=5)
    params = model.trainable_params()
    loss, grads = loss_and_grads(model, params)
    grads = reduce_tensor_partial(collectives, config, params, grads, sequence_parallel,
                                  world)
    twin_params = twin.trainable_params()
    twin_loss, twin_grads = loss_and_grads(twin, twin_params)
    twin_grad = {p.name: g.asnumpy() for p, g in zip(twin_params, twin_grads, strict=True)}
    grad = {p.name: g.asnumpy() for p, g in zip(params, grads, strict=True)}
    grad_diff = {}
    for entry in model.weight_maps():
        full = twin_grad[entry.ours]
        parts = split_rows(full, entry.rows()) if len(entry.hf) > 1 else [full]
        want = local_value(entry, ArraysSource(dict(zip(entry.hf, parts, strict=True))), group)
        grad_diff[entry.ours] = float(np.abs(grad[entry.ours] - want).max())
    logits = model.logits(Tensor(ids)).asnumpy()
    twin_logits = np.split(twin.logits(Tensor(ids)).asnumpy(), world, axis=-1)[group.rank]
    result[case] = {"loss": float(loss.asnumpy()), "twin_loss": float(twin_loss.asnumpy()),
                    "logits_diff": float(np.abs(logits - twin_logits).max()),
                    "grad_diff": grad_diff,
                    "grad_scale": float(max(np.abs(g).max() for g in twin_grad.values()))}
(out_dir / f"rank{comm.rank}.json").write_text(json.dumps(result))
