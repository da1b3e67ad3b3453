"""mf-train launches kernels synchronously on the CPU backend: the results are bit-identical to
the asynchronous default (each mode in its own process: the setting cannot be undone), and only
the CPU backend is switched. The speed-up is measured in benchmarks/cpu_launch.py."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytest.importorskip("mindspore")

from mf_train.trainer import launch_synchronously_on_cpu

WORKER = r"""
import hashlib, json, sys
import numpy as np
import mindspore as ms
from mindspore import Tensor
ms.set_context(mode=ms.PYNATIVE_MODE)
ms.set_device("CPU")
if sys.argv[1] == "sync":
    from mf_train.trainer import launch_synchronously_on_cpu
    assert launch_synchronously_on_cpu("CPU")
from mf_config import ModelConfig
from mf_train.models import build_model
sizes = dict(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, head_dim=8, rms_norm_eps=1e-6,
             max_position_embeddings=32, tie_word_embeddings=True)
model = build_model(ModelConfig(model_type="qwen3", extras=sizes), seed=3)
grad_fn = ms.value_and_grad(lambda t, l: model(t, l, None), None, model.trainable_params())
rng = np.random.default_rng(0)
tokens = Tensor(rng.integers(0, 96, (2, 32)).astype(np.int32))
labels = Tensor(rng.integers(0, 96, (2, 32)).astype(np.int32))
loss, grads = grad_fn(tokens, labels)
digest = hashlib.sha256(b"".join(g.asnumpy().tobytes() for g in grads)).hexdigest()
print(json.dumps([float(loss.asnumpy()), digest, len(grads)]))
"""


def run(mode: str) -> list:
    result = subprocess.run([sys.executable, "-c", WORKER, mode], capture_output=True,
                            text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stderr[-2000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_synchronous_launch_gives_the_same_bits() -> None:
    asynchronous, synchronous = run("async"), run("sync")
    assert synchronous == asynchronous
    assert asynchronous[2] > 10 and asynchronous[0] > 0


@pytest.mark.parametrize("device", ["Ascend", "GPU"])
def test_devices_keep_asynchronous_launch(device: str) -> None:
    assert launch_synchronously_on_cpu(device) is False
