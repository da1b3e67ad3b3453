"""Check `mf-memory estimate`'s activation figure against MindSpore on this machine.

For three sizes of the reference decoder (tests/memory/decoder_model.py) and recompute none /
full (every layer) / select attention (every layer), one subprocess per variant:
build the model and AdamW, run one warm-up step on 8 tokens (kernels, gradients and optimizer
state allocated), then one measured step. Two measurements of that step, both from
/proc/self/status after the high-water mark was reset (`memory.reset_peak`):
- `held`: resident memory when backward starts (first unpack of a saved tensor, sampled by
  `mindspore.saved_tensors_hooks`) minus before the step: what the forward pass leaves;
- `peak`: the step's high-water mark (VmHWM, what ru_maxrss reports) minus the resident
  memory before it: the activation part of the step's peak.
Compared with `estimate`: `activations - transient - working + logits` (what the forward
saves) against `held`, and `activations + logits` (plus the recompute rebuild and the backward
working memory) against `peak`. Run: python benchmarks/memory_estimate_check.py
"""

from __future__ import annotations

import json
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
sys.path.insert(0, str(ROOT / "benchmarks"))
from memory import reset_peak, status_bytes  # noqa: E402  (the benchmark beside this one)


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
        held.setdefault("at_backward", status_bytes("VmRSS"))
        return t

    def step_fn(ids, labels):
        with ms.saved_tensors_hooks(pack, unpack):
            return dm.loss(model, ids, labels)

    grad_fn = ms.value_and_grad(step_fn, None, opt.parameters)
    for seq, batch in ((8, 1), (s, b)):
        ids, labels = dm.batch(seq, batch, v)
        held.clear()
        reset_peak()
        before = status_bytes("VmRSS")
        loss, grads = grad_fn(ids, labels)
        opt(grads)
        float(loss.asnumpy())
    return {"held": held["at_backward"] - before, "peak": status_bytes("VmHWM") - before}


def estimated(size: str, mode: str) -> tuple[int, int]:
    """(what the forward saves, the activation part of the step's peak), in bytes."""
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
    peak = result.activations + result.logits
    return peak - result.transient - result.working, peak


def main() -> None:
    if len(sys.argv) == 3:
        print(json.dumps(worker(sys.argv[1], sys.argv[2])))
        return
    mib = 1024 * 1024
    print(f"{'size':<8}{'recompute':<10}{'saved est':>10}{'held':>8}{'ratio':>7}"
          f"{'peak est':>10}{'peak':>8}{'ratio':>7}   (MiB; ratio = measured / estimate)")
    for size in SIZES:
        for mode in MODES:
            out = subprocess.run([sys.executable, __file__, size, mode], capture_output=True,
                                 text=True, timeout=600, check=True)
            measured = json.loads(out.stdout.strip().splitlines()[-1])
            saved, peak = estimated(size, mode)
            print(f"{size:<8}{mode:<10}{saved / mib:>10.1f}{measured['held'] / mib:>8.1f}"
                  f"{measured['held'] / saved:>7.2f}{peak / mib:>10.1f}"
                  f"{measured['peak'] / mib:>8.1f}{measured['peak'] / peak:>7.2f}", flush=True)


if __name__ == "__main__":
    main()
