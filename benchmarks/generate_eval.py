"""What the validation loss and `mf-train generate` cost, on one CPU process.

- **evaluation against training**: one micro-batch's forward without gradients (what the
  `Evaluate` callback runs, `StepLayout.evaluate`) against its forward and backward with
  gradients (what a training step runs per micro-batch), both in PyNative, median of 5 after a
  warm-up;
- **generation**: greedy tokens/s of `mf_train.export.generation.generate` with the key/value cache
  (one position's forward per token) and without it (the whole sequence per token), a
  16-token prompt and 64 new tokens.

Models: the tiny and 28M Qwen3 of `speed.py` (`MODELS`), random weights, micro-batch and
sequence as there. Run: `python benchmarks/generate_eval.py [--models tiny 28m]`; the table
is printed as Markdown (benchmarks/README.md, "generate_eval.py").
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import mindspore as ms
import numpy as np
from mindspore import Tensor

sys.path.insert(0, str(Path(__file__).parent))
from speed import MODELS

from mf_config import ModelConfig
from mf_train.export.generation import generate
from mf_train.models import build_model

PROMPT, NEW = 16, 64


def median_seconds(run, repeats: int = 5) -> float:
    run()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def measure(name: str) -> list[str]:
    spec = MODELS[name]
    model = build_model(ModelConfig(model_type="qwen3", extras=dict(spec.shape)), seed=1)
    rng = np.random.default_rng(0)
    vocab = spec.shape["vocab_size"]
    tokens = Tensor(rng.integers(0, vocab, (spec.local_batch, spec.seq)).astype(np.int32))
    labels = Tensor(rng.integers(0, vocab, (spec.local_batch, spec.seq)).astype(np.int32))
    grad_fn = ms.value_and_grad(lambda t, y: model(t, y, None), None,
                                model.trainable_params())

    def train() -> None:
        loss, grads = grad_fn(tokens, labels)
        loss.asnumpy(), grads[-1].asnumpy()

    def evaluate() -> None:
        with ms._no_grad():
            model(tokens, labels, None).asnumpy()

    trained, evaluated = median_seconds(train), median_seconds(evaluate)
    prompt = rng.integers(0, vocab, PROMPT).tolist()
    rates = []
    for cache in (True, False):
        start = time.perf_counter()
        new = generate(model, prompt, NEW, use_cache=cache)
        rates.append(len(new) / (time.perf_counter() - start))
    shape = f"{spec.local_batch} x {spec.seq}"
    return [f"| {name} | {shape} | {trained * 1e3:.0f} | {evaluated * 1e3:.0f} | "
            f"{evaluated / trained:.2f} | {rates[0]:.1f} | {rates[1]:.1f} | "
            f"{rates[0] / rates[1]:.1f}x |"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["tiny", "28m"], choices=["tiny", "28m"])
    args = parser.parse_args()
    ms.set_context(mode=ms.PYNATIVE_MODE)
    ms.set_device("CPU")
    ms.runtime.launch_blocking()
    rows = ["| model | micro-batch | forward + backward (ms) | evaluation forward (ms) | "
            "ratio | generate with cache (tokens/s) | without (tokens/s) | speed-up |",
            "|---|---|---|---|---|---|---|---|"]
    for name in args.models:
        rows += measure(name)
    print("\n".join(rows))


if __name__ == "__main__":
    main()
