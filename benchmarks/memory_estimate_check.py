"""Check `mf-memory estimate`'s activation figure against MindSpore on this machine.

For three sizes of the reference decoder (tests/memory/decoder_model.py) and recompute none /
full (every layer) / select attention (every layer), one subprocess per variant:
build the model and AdamW, run one warm-up step on 8 tokens (kernels, gradients and optimizer
state allocated), then one measured step. Two measurements of that step:
- `held`: resident memory (/proc/self/statm) when backward starts (first unpack of a saved
  tensor, sampled by `mindspore.saved_tensors_hooks`) minus before the step: the activations
  kept through the forward pass;
- `peak`: the increase of ru_maxrss over the step (activations plus backward temporaries).
The estimate is `activations + logits` of `mf_memory.estimate` (without the recompute rebuild,
which happens inside backward). Run: python benchmarks/memory_estimate_check.py
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SIZES = {  # hidden, intermediate, layers, heads, kv heads, seq, batch, vocab
    "small": (128, 256, 2, 4, 2, 256, 4, 512),
    "medium": (256, 512, 3, 4, 2, 256, 8, 1024),
    "large": (256, 768, 4, 8, 4, 512, 4, 1024),
}
MODES = ("None", "full", "select")


def rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def worker(size: str, mode: str) -> dict[str, int]:
    sys.path.insert(0, str(ROOT / "tests" / "memory"))
    import decoder_model as dm
    import mindspore as ms
    from mindspore.experimental.optim import AdamW

    ms.set_context(mode=ms.PYNATIVE_MODE)
    ms.set_device("CPU")
    h, f, n, a, g, s, b, v = SIZES[size]
    model = dm.DecoderModel(v, h, f, n, a, g, s, seed=0)
    for layer in model.decoder_layers:
        if mode == "full":
            layer.recompute()
        elif mode == "select":
            layer.attention.recompute()
    opt = AdamW(model.trainable_params(), lr=1e-3)
    held = {}

    def pack(t):
        return t

    def unpack(t):
        held.setdefault("at_backward", rss())
        return t

    def step_fn(ids, labels):
        with ms.saved_tensors_hooks(pack, unpack):
            return dm.loss(model, ids, labels)

    grad_fn = ms.value_and_grad(step_fn, None, opt.parameters)
    for seq, batch in ((8, 1), (s, b)):
        ids, labels = dm.batch(seq, batch, v)
        held.clear()
        before, peak_before = rss(), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        loss, grads = grad_fn(ids, labels)
        opt(grads)
        float(loss.asnumpy())
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - peak_before
    return {"held": held["at_backward"] - before, "peak": peak * 1024}


def estimated(size: str, mode: str) -> int:
    from mf_config import TrainConfig
    from mf_memory.estimate import estimate

    h, f, n, a, g, s, b, v = SIZES[size]
    every = [f"0-{n - 1}"]
    recompute = {"None": {"mode": "None"}, "full": {"mode": "full", "full_recompute_layer": every},
                 "select": {"mode": "select", "select_module": {"attention": every}}}[mode]
    config = TrainConfig.from_dict({
        "model": {"model_type": "qwen3", "vocab_size": v, "hidden_size": h, "intermediate_size": f,
                  "num_hidden_layers": n, "num_attention_heads": a, "num_key_value_heads": g,
                  "seq_length": s},
        "train_dataset": {"dataloader": {"type": "Mock"}},
        "training": {"local_batch_size": b, "global_batch_size": b},
        "recompute": recompute})
    result = estimate(config, 1)
    return result.activations - result.transient + result.logits


def main() -> None:
    if len(sys.argv) == 3:
        print(json.dumps(worker(sys.argv[1], sys.argv[2])))
        return
    mib = 1024 * 1024
    print(f"{'size':<8}{'recompute':<10}{'estimate MiB':>14}{'held MiB':>10}{'ratio':>7}"
          f"{'peak MiB':>10}{'ratio':>7}")
    for size in SIZES:
        for mode in MODES:
            out = subprocess.run([sys.executable, __file__, size, mode], capture_output=True,
                                 text=True, timeout=600, check=True)
            measured = json.loads(out.stdout.strip().splitlines()[-1])
            est = estimated(size, mode)
            print(f"{size:<8}{mode:<10}{est / mib:>14.1f}{measured['held'] / mib:>10.1f}"
                  f"{measured['held'] / est:>7.2f}{measured['peak'] / mib:>10.1f}"
                  f"{measured['peak'] / est:>7.2f}", flush=True)


if __name__ == "__main__":
    main()
