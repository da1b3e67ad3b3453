"""Recompute and swap on the reference decoder: step time, peak memory and saved tensors per
mode, beside `mf_memory.estimate`'s figure for the same configuration.

The model is tests/memory/decoder_model.py (a Qwen3-style decoder, float32) at a few million
parameters. Five variants, one fresh process each, run in sequence: no recompute, full
recompute of every layer, select recompute of every layer's attention, of every layer's MLP,
and swap of every layer (`default_prefetch` 1), applied through mf-memory's own entry points
(`apply_recompute`, `ActivationSwap`) with mf-config section objects. A step is one forward and
backward (`value_and_grad` of the cross-entropy), no optimizer: what the variants change.

Per variant:
- **step**: median wall time of 3 steps after 1 warm-up step (whose peak is measured);
- **peak**: the first step's high-water mark above the resident memory before it: the mark is
  reset through `/proc/self/clear_refs` ("5"), then `VmHWM` after the step minus `VmRSS` before
  it (from /proc/self/status). Only the first step says something: MindSpore's CPU memory pool
  keeps what a step allocated, so later steps rise by a few MiB over a resident memory that
  already holds their peak (`later_peaks` in the per-variant JSON line on stderr);
- **saved**: bytes of the tensors autograd saves for backward in one more step's forward,
  counted by a `mindspore.saved_tensors_hooks` pair entered inside the differentiated function
  (unique tensors by address, parameters left out). Saved-tensor hooks do not stack: inside
  the swapped layers swap's own pair replaces the counter, so for swap the column holds only
  what is saved outside the layers; **swapped** is what swap moved to the host per step (its
  own count: every pack, so a tensor saved by two ops counts twice);
- **estimate**: `estimate(config, world_size=1)` on a TrainConfig of the same structure, batch,
  recompute and swap sections: `activations - transient - working + logits` (what the forward leaves
  saved, compared with **saved**) and `activations + logits` (that plus the recompute rebuild
  and swap prefetch, compared with **peak**).

Run: python benchmarks/memory.py (about three minutes on a 2-core CPU).
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SIZE = {"vocab_size": 4096, "hidden_size": 256, "intermediate_size": 768, "num_layers": 4,
        "num_heads": 8, "num_kv_heads": 4, "seq_length": 256}
MICRO_BATCH = 4
TIMED_STEPS = 3
VARIANTS = ("none", "full", "select attention", "select mlp", "swap")
MIB = 1024 * 1024


def memory_sections(variant: str) -> tuple[Any, Any]:
    """The (RecomputeConfig, SwapConfig) of `variant`, every layer listed."""
    from mf_config import LayerSpec, LayerSwap, RecomputeConfig, SwapConfig

    every = [LayerSpec(0, SIZE["num_layers"] - 1)]
    recompute = {
        "none": RecomputeConfig(),
        "full": RecomputeConfig(mode="full", full_recompute_layer=every),
        "select attention": RecomputeConfig(mode="select", select_module={"attention": every}),
        "select mlp": RecomputeConfig(mode="select", select_module={"mlp": every}),
    }.get(variant, RecomputeConfig())
    swap = (SwapConfig(enable=True, default_prefetch=1, layer_swap=[LayerSwap(layers=every)])
            if variant == "swap" else SwapConfig())
    return recompute, swap


# ------------------------------------------------------------------ one variant, in its process


def status_bytes(field: str) -> int:
    """A `/proc/self/status` field (reported in kB) in bytes."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"/proc/self/status has no {field}")


def reset_peak() -> None:
    """Set VmHWM back to the current VmRSS (Linux >= 4.0), so the next peak is the step's."""
    with open("/proc/self/clear_refs", "w") as refs:
        refs.write("5")


def count_saved(model: Any, loss: Any, ids: Any, labels: Any) -> int:
    """Bytes of the unique non-parameter tensors saved for backward by one step's forward.

    The hooks are entered inside the differentiated function, so they see the forward only:
    around the whole step they would also count what recompute saves while it runs a
    layer's forward again in backward."""
    import mindspore as ms

    params = {p.data_ptr() for p in model.get_parameters()}
    seen: dict[int, int] = {}

    def pack(tensor: ms.Tensor) -> ms.Tensor:
        if tensor.data_ptr() not in params:
            seen[tensor.data_ptr()] = max(seen.get(tensor.data_ptr(), 0), tensor.nbytes)
        return tensor

    def forward(a: ms.Tensor, b: ms.Tensor) -> ms.Tensor:
        with ms.saved_tensors_hooks(pack, lambda tensor: tensor):
            return loss(model, a, b)

    value, _ = ms.value_and_grad(forward, None, model.trainable_params())(ids, labels)
    float(value.asnumpy())
    return sum(seen.values())


def measure(variant: str) -> dict[str, Any]:
    """Build the model with `variant` applied, time and measure its steps."""
    sys.path.insert(0, str(ROOT / "tests" / "memory"))
    import decoder_model as dm
    import mindspore as ms

    from mf_memory.recompute import apply_recompute
    from mf_memory.swap import ActivationSwap

    ms.set_context(mode=ms.PYNATIVE_MODE)
    ms.set_device("CPU")
    model = dm.DecoderModel(seed=0, **SIZE)
    recompute, swap_config = memory_sections(variant)
    marked = apply_recompute(model, recompute)
    swap = ActivationSwap(model, swap_config)
    ids, labels = dm.batch(SIZE["seq_length"], MICRO_BATCH, SIZE["vocab_size"])
    step = ms.value_and_grad(lambda a, b: dm.loss(model, a, b), None, model.trainable_params())
    times, peaks, losses = [], [], []
    for _ in range(1 + TIMED_STEPS):
        reset_peak()
        before = status_bytes("VmRSS")
        start = time.perf_counter()
        value, grads = step(ids, labels)
        losses.append(float(value.asnumpy()))
        elapsed = time.perf_counter() - start
        peak = status_bytes("VmHWM") - before
        del grads
        times.append(elapsed)
        peaks.append(peak)
    swapped_per_step = swap.stats.bytes_offloaded // (1 + TIMED_STEPS)
    return {"variant": variant, "marked": len(marked), "swapped_paths": len(swap.paths),
            "step_s": statistics.median(times[1:]), "peak": peaks[0], "later_peaks": peaks[1:],
            "loss": losses[-1], "swapped": swapped_per_step,
            "saved": count_saved(model, dm.loss, ids, labels),
            "parameters": sum(p.size for p in model.get_parameters())}


# ------------------------------------------------------------------ the estimate, and the table


def estimated(variant: str) -> dict[str, int]:
    """`mf_memory.estimate` of the same model, batch and memory sections, in bytes."""
    import attrs

    from mf_config import TrainConfig
    from mf_memory.estimate import estimate

    base = TrainConfig.from_dict({
        "model": {"model_type": "qwen3", "vocab_size": SIZE["vocab_size"],
                  "hidden_size": SIZE["hidden_size"],
                  "intermediate_size": SIZE["intermediate_size"],
                  "num_hidden_layers": SIZE["num_layers"],
                  "num_attention_heads": SIZE["num_heads"],
                  "num_key_value_heads": SIZE["num_kv_heads"],
                  "seq_length": SIZE["seq_length"], "tie_word_embeddings": False},
        "train_dataset": {"dataloader": {"type": "Mock"}},
        "training": {"local_batch_size": MICRO_BATCH, "global_batch_size": MICRO_BATCH}})
    recompute, swap = memory_sections(variant)
    result = estimate(attrs.evolve(base, recompute=recompute, swap=swap), world_size=1)
    return {"held": result.activations - result.transient - result.working + result.logits,
            "peak": result.activations + result.logits,
            "parameters": result.parameter_count}


def run_variant(variant: str) -> dict[str, Any]:
    out = subprocess.run([sys.executable, __file__, variant], capture_output=True, text=True,
                         timeout=900, check=False)
    if out.returncode:
        raise SystemExit(f"variant {variant!r} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}" if b else "-"


def main() -> None:
    if len(sys.argv) == 2:
        print(json.dumps(measure(sys.argv[1])))
        return
    estimates = {variant: estimated(variant) for variant in VARIANTS}
    print(f"reference decoder {SIZE}, micro-batch {MICRO_BATCH}, "
          f"{estimates['none']['parameters']:,} parameters (estimator's count)", flush=True)
    header = (f"{'variant':<17}{'step s':>8}{'time x':>8}{'peak MiB':>10}{'peak x':>8}"
              f"{'saved MiB':>11}{'swapped':>9}{'est held':>10}{'est/saved':>11}"
              f"{'est peak':>10}{'est/peak':>10}")
    print(header + "\n" + "-" * len(header), flush=True)
    base = None
    for variant in VARIANTS:
        m, e = run_variant(variant), estimates[variant]
        base = base or m
        print(f"{variant:<17}{m['step_s']:>8.2f}{ratio(m['step_s'], base['step_s']):>8}"
              f"{m['peak'] / MIB:>10.1f}{ratio(m['peak'], base['peak']):>8}"
              f"{m['saved'] / MIB:>11.1f}{m['swapped'] / MIB:>9.1f}{e['held'] / MIB:>10.1f}"
              f"{ratio(e['held'], m['saved']):>11}{e['peak'] / MIB:>10.1f}"
              f"{ratio(e['peak'], m['peak']):>10}", flush=True)
        print(f"  {json.dumps(m)}", file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()
