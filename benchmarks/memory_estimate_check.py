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

DeepSeek-V3 (MLA and a mixture of experts): `python benchmarks/memory_estimate_check.py
deepseek [VARIANT ...]` (`DEEPSEEK_VARIANTS`, default all) runs mf-train's DeepSeek-V3 of
examples/deepseek_v3_tiny.yaml (float32, CPU; one fresh process per variant) and counts, with
`mindspore.saved_tensors_hooks`, the bytes of the unique non-parameter tensors each decoder
layer's forward saves for backward (each layer's `construct` is wrapped to attribute them),
against the estimate's `full` bytes of that layer, and what is saved outside the layers
(embedding, final norm, head, loss) against the rest of the estimate; also `held` and `peak`
as above. Routing decides how many rows each expert gets, but the rows sum to tokens x top_k,
so a layer's sum does not depend on the routing.

Expert parallelism: `python benchmarks/memory_estimate_check.py deepseek-ep [DISPATCHER ...]`
runs the example on 2 msrun ranks (127.0.0.1) with `expert_parallel` 2 (`alltoall` and
`alltoall_deredundancy` in devices of one rank, default both), each rank routing its own 2
sequences, and prints each rank's saved bytes per layer and the rows its experts computed;
the ranks' sum against 2 x the estimate (which assumes the average, tokens x top_k rows per
rank) does not depend on the routing either.
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


DEEPSEEK = ROOT / "examples" / "deepseek_v3_tiny.yaml"
DEEPSEEK_VARIANTS = {  # name: (sequences of 128 tokens a micro-batch, q_lora_rank)
    "b2": (2, None), "b8": (8, None), "b2-qlora": (2, 24)}
"""The example as written; a wider micro-batch; query compression on (the example has none)."""


def deepseek_config(variant: str):  # -> TrainConfig
    """The example with the variant's micro-batch (one micro-batch a step) and q_lora_rank."""
    import attrs

    from mf_config import load_config

    batch, q_lora_rank = DEEPSEEK_VARIANTS[variant]
    config = load_config(str(DEEPSEEK))
    model = attrs.evolve(config.model, extras={**config.model.extras,
                                               "q_lora_rank": q_lora_rank})
    return attrs.evolve(config, model=model, training=attrs.evolve(
        config.training, local_batch_size=batch, global_batch_size=batch))


def deepseek_worker(variant: str, expert_group=None, seed: int = 0
                    ) -> dict[str, object]:
    """Saved bytes per decoder layer and outside them, held and peak, for one micro-batch
    (tokens drawn from `seed`); with an `expert_group`, the routed experts split over it."""
    import mindspore as ms
    import numpy as np

    from mf_train.parallelize import build_parallel_model

    if expert_group is None:  # otherwise init_communication has set them
        ms.set_context(mode=ms.PYNATIVE_MODE)
        ms.set_device("CPU")
    config = deepseek_config(variant)
    batch = config.training.local_batch_size
    model = build_parallel_model(config.model, seed=0, expert_group=expert_group)
    params = {p.data_ptr() for p in model.get_parameters()}
    current = ["outside"]
    saved: dict[str, dict[int, int]] = {}

    def attributed(index: int, construct):
        def run(x):
            current[0] = str(index)
            try:
                return construct(x)
            finally:
                current[0] = "outside"
        return run

    for index, layer in enumerate(model.decoder_layers):
        layer.construct = attributed(index, layer.construct)
    held: dict[str, int] = {}

    def pack(t):
        if t.data_ptr() not in params:
            place = saved.setdefault(current[0], {})
            place[t.data_ptr()] = max(place.get(t.data_ptr(), 0), t.nbytes)
        return t

    def unpack(t):
        held.setdefault("at_backward", status_bytes("VmRSS"))
        return t

    def step(ids, labels):
        with ms.saved_tensors_hooks(pack, unpack):
            return model(ids, labels)

    grad_fn = ms.value_and_grad(step, None, model.trainable_params())
    seq = config.model.extras["seq_length"]
    rng = np.random.default_rng(seed)
    for tokens, rows in ((8, 1), (seq, batch)):  # warm-up at a small shape, then measured
        ids = ms.Tensor(rng.integers(0, 512, (rows, tokens)).astype(np.int32))
        labels = ms.Tensor(rng.integers(0, 512, (rows, tokens)).astype(np.int32))
        saved.clear()
        held.clear()
        reset_peak()
        before = status_bytes("VmRSS")
        loss, grads = grad_fn(ids, labels)
        float(loss.asnumpy())
        del grads
    return {"layers": {key: sum(v.values()) for key, v in saved.items()},
            "held": held["at_backward"] - before, "peak": status_bytes("VmHWM") - before,
            "rows": {str(layer): int(load.sum()) for layer, load in model.expert_load().items()}}


EP = 2


def ep_config(variant: str, dispatcher: str):  # -> TrainConfig
    """The variant with its routed experts split over `EP` ranks (one micro-batch each) by
    `dispatcher` (devices of one rank for the deredundant one)."""
    import attrs

    config = deepseek_config(variant)
    batch = config.training.local_batch_size
    return attrs.evolve(
        config, parallelism=attrs.evolve(config.parallelism, expert_parallel=EP,
                                         moe_token_dispatcher_type=dispatcher,
                                         npu_nums_per_device=1),
        training=attrs.evolve(config.training, global_batch_size=EP * batch))


def deepseek_ep_worker(out_dir: str, dispatcher: str) -> None:
    """One rank of `EP` (under msrun): its saved bytes per layer to rank<r>.json."""
    from mf_parallel import make_plan
    from mf_parallel.runtime import Collectives, init_communication
    from mf_parallel.runtime.expert_dispatch import ExpertGroup

    config = ep_config("b2", dispatcher)
    plan = make_plan(config.parallelism, config.training, EP)
    comm = init_communication(plan, "CPU")
    group = ExpertGroup(Collectives(comm), config.parallelism.moe_token_dispatcher_type)
    result = deepseek_worker("b2", group, seed=comm.rank)
    Path(out_dir, f"rank{comm.rank}.json").write_text(json.dumps(result))


def deepseek_ep_main(dispatcher: str) -> None:
    """Saved bytes of each MoE layer on `EP` ranks against the estimate (module docstring)."""
    import tempfile

    from mf_memory.estimate import estimate
    from mf_parallel.launch import run_ranks

    with tempfile.TemporaryDirectory() as out:
        run_ranks(__file__, EP, log_dir=Path(out) / "logs", timeout=600,
                  args=["deepseek-ep-worker", out, dispatcher])
        ranks = [json.loads(Path(out, f"rank{r}.json").read_text()) for r in range(EP)]
    result = estimate(ep_config("b2", dispatcher), EP)
    print(f"expert_parallel {EP}, {dispatcher}, b2 on each rank (bytes; rows = (token, expert) "
          f"pairs this rank's experts computed)")
    print(f"{'layer':<7}{'estimate':>12}" + "".join(
        f"{f'rank {r} saved':>15}{'rows':>6}" for r in range(EP))
        + f"{'sum / (ranks x estimate)':>26}")
    for la in result.layer_activations:
        got = [rank["layers"][str(la.layer)] for rank in ranks]
        rows = [rank["rows"].get(str(la.layer), 0) for rank in ranks]
        print(f"{la.layer:<7}{la.full:>12,}" + "".join(
            f"{g:>15,}{r:>6}" for g, r in zip(got, rows, strict=True))
            + f"{sum(got) / (EP * la.full):>26.4f}", flush=True)


def deepseek_main() -> None:
    """Print the DeepSeek-V3 comparison (module docstring)."""
    from mf_memory.estimate import estimate

    mib = 1024 * 1024
    print(f"{'variant':<10}{'layer':<9}{'kind':<6}{'estimate B':>12}{'saved B':>12}"
          f"{'ratio':>8}   (ratio = measured / estimate)")
    totals = []
    for variant in sys.argv[2:] or DEEPSEEK_VARIANTS:
        out = subprocess.run([sys.executable, __file__, "deepseek-worker", variant],
                             capture_output=True, text=True, timeout=900, check=True)
        measured = json.loads(out.stdout.strip().splitlines()[-1])
        config = deepseek_config(variant)
        result = estimate(config, 1)
        first_moe = config.model.extras["first_k_dense_replace"]
        for la in result.layer_activations:
            got = measured["layers"][str(la.layer)]
            kind = "MoE" if la.layer >= first_moe else "dense"
            print(f"{variant:<10}{la.layer:<9}{kind:<6}{la.full:>12,}{got:>12,}"
                  f"{got / la.full:>8.4f}", flush=True)
        outside_est = result.logits + (result.activations - result.working
                                       - sum(la.kept for la in result.layer_activations))
        outside = measured["layers"].get("outside", 0)
        print(f"{variant:<10}{'outside':<9}{'':<6}{outside_est:>12,}{outside:>12,}"
              f"{outside / outside_est:>8.4f}", flush=True)
        saved_est = result.activations - result.transient - result.working + result.logits
        peak_est = result.activations + result.logits
        totals.append((variant, saved_est, measured["held"], peak_est, measured["peak"]))
    print(f"\n{'variant':<10}{'saved est':>10}{'held':>8}{'ratio':>7}{'peak est':>10}"
          f"{'peak':>8}{'ratio':>7}   (MiB)")
    for variant, saved_est, held, peak_est, peak in totals:
        print(f"{variant:<10}{saved_est / mib:>10.1f}{held / mib:>8.1f}{held / saved_est:>7.2f}"
              f"{peak_est / mib:>10.1f}{peak / mib:>8.1f}{peak / peak_est:>7.2f}")


def main() -> None:
    if sys.argv[1:2] == ["deepseek-worker"]:
        print(json.dumps(deepseek_worker(sys.argv[2])))
        return
    if sys.argv[1:2] == ["deepseek-ep-worker"]:
        deepseek_ep_worker(sys.argv[2], sys.argv[3])
        return
    if sys.argv[1:2] == ["deepseek"]:
        deepseek_main()
        return
    if sys.argv[1:2] == ["deepseek-ep"]:
        for dispatcher in sys.argv[2:] or ("alltoall", "alltoall_deredundancy"):
            deepseek_ep_main(dispatcher)
        return
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
