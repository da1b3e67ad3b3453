"""Asynchronous against synchronous kernel launch on the CPU backend, side by side.

PyNative hands each kernel to a launch thread by default; `mindspore.runtime.launch_blocking()`
launches it from the calling thread instead. mf-train launches synchronously on CPU. This
measures both, alternating, each in a fresh process (the setting is per process and cannot be
undone), on three workloads:

- one 256x64 @ 64x64 matmul (`mint.matmul`), 200 times;
- forward + backward of the tiny Qwen3 of examples/qwen3_tiny.yaml (2 x 128 tokens);
- forward + backward of a 28M-parameter Qwen3 (hidden 512, 8 layers, 8 heads, 4 KV heads,
  vocabulary 8192, one sequence of 512).

It prints the median time of each and the ratio, and checks that the loss and the first
gradient are bit-identical between the two modes.

Run: python benchmarks/cpu_launch.py [--rounds N]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys

WORKER = r"""
import json, statistics, sys, time
import numpy as np
import mindspore as ms
from mindspore import Tensor, mint
ms.set_context(mode=ms.PYNATIVE_MODE)
ms.set_device("CPU")
mode, workload = sys.argv[1], sys.argv[2]
if mode == "sync":
    ms.runtime.launch_blocking()
rng = np.random.default_rng(0)
if workload == "matmul":
    a = Tensor(rng.normal(size=(256, 64)).astype(np.float32))
    w = Tensor(rng.normal(size=(64, 64)).astype(np.float32))
    for _ in range(5):
        mint.matmul(a, w).asnumpy()
    start = time.perf_counter()
    for _ in range(200):
        out = mint.matmul(a, w)
    out.asnumpy()
    print(json.dumps({"seconds": (time.perf_counter() - start) / 200,
                      "check": float(out.asnumpy().sum())}))
    raise SystemExit
from mf_config import ModelConfig
from mf_train.models import build_model
TINY = dict(vocab_size=512, hidden_size=64, intermediate_size=176, num_hidden_layers=4,
            num_attention_heads=4, num_key_value_heads=2, head_dim=16,
            max_position_embeddings=128, batch=(2, 128))
M28 = dict(vocab_size=8192, hidden_size=512, intermediate_size=1408, num_hidden_layers=8,
           num_attention_heads=8, num_key_value_heads=4, head_dim=64,
           max_position_embeddings=512, batch=(1, 512))
sizes = dict(TINY if workload == "tiny" else M28)
batch = sizes.pop("batch")
sizes.update(rms_norm_eps=1e-6, rope_theta=10000.0, tie_word_embeddings=True)
model = build_model(ModelConfig(model_type="qwen3", extras=sizes), seed=1)
grad_fn = ms.value_and_grad(lambda t, l: model(t, l, None), None, model.trainable_params())
tokens = Tensor(rng.integers(0, sizes["vocab_size"], batch).astype(np.int32))
labels = Tensor(rng.integers(0, sizes["vocab_size"], batch).astype(np.int32))
grad_fn(tokens, labels)[0].asnumpy()
times = []
for _ in range(3):
    start = time.perf_counter()
    loss, grads = grad_fn(tokens, labels)
    first = grads[0].asnumpy()
    times.append(time.perf_counter() - start)
print(json.dumps({"seconds": statistics.median(times),
                  "check": [float(loss.asnumpy()), float(np.abs(first).sum())]}))
"""


def run(mode: str, workload: str) -> dict:
    result = subprocess.run([sys.executable, "-c", WORKER, mode, workload], capture_output=True,
                            text=True, timeout=1800, check=False)
    if result.returncode != 0:
        raise SystemExit(f"{mode} {workload} failed:\n{result.stderr[-2000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds (default 3)")
    args = parser.parse_args()
    print(f"{'workload':<8} {'async (default)':>16} {'sync (mf-train)':>16} {'speed-up':>9}  "
          "results")
    for workload in ("matmul", "tiny", "28m"):
        seconds: dict[str, list[float]] = {"async": [], "sync": []}
        checks = set()
        for _ in range(args.rounds):
            for mode in ("async", "sync"):
                measured = run(mode, workload)
                seconds[mode].append(measured["seconds"])
                checks.add(json.dumps(measured["check"]))
        slow, fast = (statistics.median(seconds[m]) for m in ("async", "sync"))
        same = "bit-identical" if len(checks) == 1 else f"DIFFER: {sorted(checks)}"
        print(f"{workload:<8} {_fmt(slow):>16} {_fmt(fast):>16} {slow / fast:>8.1f}x  {same}",
              flush=True)


def _fmt(seconds: float) -> str:
    return f"{seconds * 1e3:.1f} ms" if seconds < 1 else f"{seconds:.2f} s"


if __name__ == "__main__":
    main()
