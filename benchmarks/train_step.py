"""The trainer's step time against a hand-written MindSpore loop; tokens/s of the examples;
the cost of a checkpoint save with and without `async_save`; the time to the first step.

1. **Overhead**, in this process. `examples/qwen3_tiny.yaml` (checkpoint saving off: part 3
   measures it) built three times from the same configuration: `Trainer` (one step = the body
   of `Trainer.train`'s loop: the callbacks' hooks, `run_step`, the step record, the save check)
   and two hand-written loops, each with its own copy of the same model (`build_model` with the
   same seed, then the same `apply_recompute`): `value_and_grad` of the loss divided by the
   number of micro-batches, gradients accumulated by adding, the global norm and the clipping
   written out, then `mf_train.optim`'s AdamW `step(grads, lr)` (row "hand loop") or MindSpore's
   own `mindspore.experimental.optim.AdamW` with the same weight-decay groups ("hand loop,
   MindSpore AdamW"). Same process, so that one step of each variant can follow the other
   (interleaving is what makes a ratio readable on a VM shared with other jobs) and all three
   see the same kernel caches and allocator. Data loading is left out of all three: the
   micro-batches are read from the trainer's own stream into numpy first and replayed, the
   same batches in the same order to each (mf-data's loader is benchmarks/data.py's subject:
   0.45 ms a micro-batch). One warm-up round, then `--rounds` rounds of one step of each
   variant, the order rotated each round: (a) whole steps; (b) `--stub-rounds` rounds with
   value_and_grad replaced by a stub that returns one micro-batch's loss and gradients at once,
   so that what the trainer adds (everything but the forward and backward) is timed without
   the forward/backward's noise. Reported: median (min-max) step time, wall and CPU
   (`process_time`, all threads), the per-round ratio to the hand loop's step of the same
   round, tokens/s, and each step split into the `value_and_grad` calls, the optimizer call
   (dispatch only: PyNative runs its kernels asynchronously, they finish in the next read-back)
   and the rest. The loss of each step is compared with the hand loop's (same data, weights and
   updates: equal to float32 rounding). The trainer's added work per step is the paired
   (b) difference trainer - hand loop, against the hand loop's whole step.
2. **tokens/s and time to first step**: the `mf-train` console script in a fresh process per
   example in examples/ (qwen3_tiny, deepseek_v3_tiny when present), `--set training.steps=N`;
   tokens/s from metrics.jsonl (steps after the first). Then `--time-to-first` runs each with
   `training.steps=1` through a wrapper that is the console script plus a timestamp after the
   imports, split from the timestamps in metrics.jsonl: interpreter start, import, build
   (configuration, model, optimizer, callbacks; until the `start` event), first step (data
   stream and the step, until the step's line; the step alone is its `step_time`), and exit
   (the final checkpoint save and teardown). The first run of the example builds the dataset's
   index cache; the time-to-first-step runs find it.
3. **Checkpoint save**: the time `Trainer.save_checkpoint` blocks the loop with
   `checkpoint.async_save` false and true (alternated), and the time until the checkpoint is
   complete (`checkpoints.wait()` right after); on the tiny model and on a Qwen3 of 4.2M
   parameters (hidden 256, 4 layers, vocabulary 4096). Also the capture alone (`model_arrays` +
   `optimizer.state_dict()`), which both modes do before returning.

Run: python benchmarks/train_step.py [--rounds N] [--steps N] [--time-to-first N]
(4-5 minutes on the shared, loaded 2-core VM).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ("qwen3_tiny.yaml", "deepseek_v3_tiny.yaml")
OVERHEAD_EXAMPLE = ROOT / "examples" / "qwen3_tiny.yaml"
BIG_MODEL = ("model.hidden_size=256", "model.intermediate_size=768",
             "model.num_attention_heads=8", "model.num_key_value_heads=4", "model.head_dim=32",
             "model.vocab_size=4096")
CLIP_EPS = 1e-6
MIB = 1024 * 1024
WRAPPER = ("import sys, time\n"
           "print(f'MF_T python {time.time():.6f}', file=sys.stderr, flush=True)\n"
           "import mf_train.models, mf_train.trainer\n"
           "print(f'MF_T imported {time.time():.6f}', file=sys.stderr, flush=True)\n"
           "from mf_train.launch.cli import run\n"
           "raise SystemExit(run(sys.argv[1:]))\n")


def data_override(prefix: Path) -> str:
    return f"train_dataset.dataloader.config.data_path=['1','{prefix}']"


def prepare_data(tmp: Path) -> Path:
    """The demo corpus, preprocessed as the examples' comments say; returns the prefix."""
    corpus, prefix = tmp / "corpus.jsonl", tmp / "data" / "python_docs"
    subprocess.run([sys.executable, str(ROOT / "examples" / "data" / "make_corpus.py"),
                    str(corpus)], check=True, stdout=subprocess.DEVNULL)
    subprocess.run([str(Path(sys.executable).with_name("mf-data")), "preprocess", "--input",
                    str(corpus), "--output-prefix", str(prefix)], check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return prefix


def load_config(path: Path, overrides: Sequence[str]) -> tuple[Any, Any]:
    from mf_config.validate import config_from_source, load_source

    source = load_source(str(path), list(overrides))
    return config_from_source(source), source


def spread(values: Sequence[float]) -> str:
    return f"{statistics.median(values):.3f} ({min(values):.3f}-{max(values):.3f})"


# ------------------------------------------------------------------ 1. overhead


class Timed:
    """A callable that adds the wall time of each call of `fn` to `total`."""

    def __init__(self, fn: Callable[..., Any]):
        self.fn, self.total = fn, 0.0

    def __call__(self, *args: Any) -> Any:
        start = time.perf_counter()
        try:
            return self.fn(*args)
        finally:
            self.total += time.perf_counter() - start


class Replay:
    """The trainer's stream interface over micro-batches read beforehand."""

    def __init__(self, batches: Sequence[Any], step_samples: int):
        self.batches, self.step_samples = list(batches), step_samples
        self.index, self.consumed_samples = 0, 0

    def __iter__(self) -> Replay:
        return self

    def __next__(self) -> Any:
        batch = self.batches[self.index % len(self.batches)]
        self.index += 1
        self.consumed_samples += self.step_samples
        return batch


class TrainerVariant:
    """`Trainer`: one step is the body of `Trainer.train`'s loop (kept in step with it)."""

    name = "trainer"

    def __init__(self, config: Any, source: Any, output_dir: Path, batches: Sequence[Any]):
        from mf_train.trainer import Trainer

        self.trainer = Trainer(config, output_dir=output_dir, source=source)
        self.stream = Replay(batches, self.trainer.plan.batch.samples_per_micro_step)
        self.ctx = self.trainer.context()
        self.grad = self.trainer.layout._grad_fn = Timed(self.trainer.layout._grad_fn)
        self.optimizer = self.trainer.optimizer.step = Timed(self.trainer.optimizer.step)
        self.trainer.callbacks.on_train_begin(self.ctx)
        self.inner: list[float] = []

    def step(self) -> float:
        trainer = self.trainer
        trainer.callbacks.on_step_begin(self.ctx, trainer.step_count + 1)
        outcome = trainer.run_step(self.stream)
        trainer.callbacks.on_step_end(self.ctx, trainer._record(outcome))
        trainer.save_checkpoint()
        trainer._report_saves(self.ctx)
        self.inner.append(outcome.seconds)
        return outcome.loss

    def close(self) -> None:
        self.trainer.callbacks.on_train_end(self.ctx, None)


class HandLoop:
    """The plain loop: value_and_grad, add, norm, clip, AdamW (mf's or MindSpore's)."""

    def __init__(self, config: Any, batches: Sequence[Any], accumulation: int,
                 mindspore_adamw: bool):
        import mindspore as ms

        from mf_memory.recompute import apply_recompute
        from mf_train.models import build_model
        from mf_train.optim.lr_schedules import build_lr_schedule

        self.name = "hand loop, MindSpore AdamW" if mindspore_adamw else "hand loop"
        self.model = build_model(config.model, seed=config.training.seed)
        apply_recompute(self.model, config.recompute)
        named = [(p.name, p) for p in self.model.trainable_params()]
        params, self.update = (self._mindspore_adamw(config, named) if mindspore_adamw
                               else self._mf_adamw(config, named))
        self.grad = Timed(ms.value_and_grad(self._loss, None, params))
        self.optimizer = Timed(self.update)
        self.schedule = build_lr_schedule(config.lr_scheduler, config.training.steps)
        self.max_norm = config.training.max_norm
        self.batches, self.accumulation, self.done = list(batches), accumulation, 0

    @staticmethod
    def _mf_adamw(config: Any, named: list[Any]) -> tuple[list[Any], Callable[..., None]]:
        from mf_train.optim import build_optimizer

        optimizer = build_optimizer(config.optimizer, named)
        return [p for _, p in named], optimizer.step

    @staticmethod
    def _mindspore_adamw(config: Any, named: list[Any]) -> tuple[list[Any], Callable[..., None]]:
        import mindspore as ms
        from mindspore import ops
        from mindspore.experimental.optim import AdamW

        from mf_train.optim.base import decay_flags

        flags = decay_flags(config.optimizer, named)
        decayed = [p for (_, p), flag in zip(named, flags, strict=True) if flag]
        others = [p for (_, p), flag in zip(named, flags, strict=True) if not flag]
        optimizer = AdamW([{"params": decayed, "weight_decay": config.optimizer.weight_decay},
                           {"params": others, "weight_decay": 0.0}],
                          lr=0.0, betas=tuple(config.optimizer.betas), eps=config.optimizer.eps)

        def update(grads: list[Any], lr: float) -> None:
            for rate in optimizer.lrs:  # set_data would be ignored after the first call
                ops.assign(rate, ms.Tensor(lr, ms.float32))
            optimizer(ms.mutable(tuple(grads)))

        return decayed + others, update

    def _loss(self, tokens: Any, labels: Any, mask: Any) -> Any:
        return self.model(tokens, labels, mask) / self.accumulation

    def step(self) -> float:
        import numpy as np
        from mindspore import Tensor, ops

        first = self.done * self.accumulation % len(self.batches)
        total, grads = None, None
        for tokens, labels, mask in self.batches[first:first + self.accumulation]:
            loss, micro = self.grad(Tensor(tokens), Tensor(labels),
                                    Tensor(mask.astype(np.float32)))
            total = loss if total is None else total + loss
            grads = list(micro) if grads is None else [
                a + b for a, b in zip(grads, micro, strict=True)]
        norm = float(ops.sqrt(sum(ops.sum(g * g) for g in grads)).asnumpy())
        coef = self.max_norm / (norm + CLIP_EPS)
        if coef < 1.0:
            grads = [g * coef for g in grads]
        self.optimizer(grads, self.schedule(self.done))
        self.done += 1
        return float(total.asnumpy())

    def close(self) -> None:
        pass


def stub_of(grad: Timed, batch: Any) -> Callable[..., Any]:
    """A stand-in for `grad.fn` that returns, at once, what it returned for `batch`."""
    import numpy as np
    from mindspore import Tensor

    tokens, labels, mask = batch
    loss, grads = grad.fn(Tensor(tokens), Tensor(labels), Tensor(mask.astype(np.float32)))
    return lambda *_: (loss, grads)


def run_rounds(variants: Sequence[Any], rounds: int, label: str) -> dict[str, Any]:
    """`rounds` rounds of one step of each variant, the order rotated every round."""
    rows: dict[str, Any] = {
        v.name: {"wall": [], "cpu": [], "grad": [], "optimizer": [], "loss": []}
        for v in variants}
    for index in range(rounds):
        shift = index % len(variants)
        for variant in [*variants[shift:], *variants[:shift]]:
            variant.grad.total = variant.optimizer.total = 0.0
            start, cpu_start = time.perf_counter(), time.process_time()
            loss = variant.step()
            row = rows[variant.name]
            row["wall"].append(time.perf_counter() - start)
            row["cpu"].append(time.process_time() - cpu_start)
            row["grad"].append(variant.grad.total)
            row["optimizer"].append(variant.optimizer.total)
            row["loss"].append(loss)
        print(f"\r{label} round {index + 1}/{rounds}", end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)
    return rows


def overhead(prefix: Path, tmp: Path, rounds: int, stub_rounds: int,
             mindspore_adamw: bool) -> dict[str, Any]:
    """Part 1: a warm-up round, `rounds` timed rounds of one step of each variant, then
    `stub_rounds` rounds with value_and_grad replaced by a stub (`stub_of`)."""
    steps = max(50, 2 + rounds + stub_rounds)  # the schedule must cover every step
    overrides = [data_override(prefix), "checkpoint.enable_save=false", f"training.steps={steps}"]
    config, source = load_config(OVERHEAD_EXAMPLE, overrides)
    from mf_train.trainer import Trainer

    probe = Trainer(config, output_dir=tmp / "probe", source=source)
    accumulation = probe.plan.batch.accumulation_steps(0)
    stream = probe.stream()
    batches = [next(stream) for _ in range((rounds + 1) * accumulation)]
    del probe, stream
    variants: list[Any] = [TrainerVariant(config, source, tmp / "overhead", batches),
                           HandLoop(config, batches, accumulation, mindspore_adamw=False)]
    if mindspore_adamw:
        variants.append(HandLoop(config, batches, accumulation, mindspore_adamw=True))
    first = run_rounds(variants, 1, "warm-up")
    full = run_rounds(variants, rounds, "overhead")
    full["trainer"]["run_step inner"] = variants[0].inner[1:]
    for variant in variants:
        variant.grad.fn = stub_of(variant.grad, batches[0])
    variants[0].inner = []
    stub = run_rounds(variants, stub_rounds, "without forward/backward")
    stub["trainer"]["run_step inner"] = variants[0].inner
    for variant in variants:
        variant.close()
    for name, row in full.items():
        row["first"] = first[name]["wall"]
    return {"rows": full, "stub": stub, "tokens": accumulation * batches[0][0].size,
            "accumulation": accumulation,
            "parameters": sum(p.size for p in variants[1].model.trainable_params())}


def print_rounds(rows: dict[str, Any], tokens: int) -> None:
    base = rows["hand loop"]
    head = (f"{'variant':<27}{'wall s':>22}{'wall x':>22}{'CPU s':>22}{'CPU x':>22}"
            f"{'tokens/s':>9}{'v&g s':>7}{'opt s':>7}{'rest s':>7}{'|dloss|':>9}")
    print(head + "\n" + "-" * len(head))
    for name, row in rows.items():
        wall_x = [a / b for a, b in zip(row["wall"], base["wall"], strict=True)]
        cpu_x = [a / b for a, b in zip(row["cpu"], base["cpu"], strict=True)]
        rest = [w - g - o for w, g, o in zip(row["wall"], row["grad"], row["optimizer"],
                                             strict=True)]
        dloss = max(abs(a - b) for a, b in zip(row["loss"], base["loss"], strict=True))
        print(f"{name:<27}{spread(row['wall']):>22}{spread(wall_x):>22}{spread(row['cpu']):>22}"
              f"{spread(cpu_x):>22}{tokens / statistics.median(row['wall']):>9.0f}"
              f"{statistics.median(row['grad']):>7.3f}{statistics.median(row['optimizer']):>7.3f}"
              f"{statistics.median(rest):>7.3f}{dloss:>9.1e}")


def print_overhead(result: dict[str, Any]) -> None:
    rows, stub = result["rows"], result["stub"]
    print(f"\n1. step time, qwen3_tiny ({result['parameters']:,} parameters, "
          f"{result['accumulation']} micro-batches of {result['tokens'] // result['accumulation']}"
          f" tokens per step); median (min-max); x: per round, against the hand loop's step of "
          f"the same round\n   a) whole steps, {len(rows['hand loop']['wall'])} rounds after one "
          f"warm-up round (first steps: " + ", ".join(
              f"{name} {row['first'][0]:.2f} s" for name, row in rows.items()) + ")")
    print_rounds(rows, result["tokens"])
    print(f"   b) value_and_grad replaced by a stub returning the gradients of one micro-batch "
          f"(everything else runs), {len(stub['hand loop']['wall'])} rounds")
    print_rounds(stub, result["tokens"])
    added = [t - h for t, h in zip(stub["trainer"]["wall"], stub["hand loop"]["wall"],
                                   strict=True)]
    step = statistics.median(rows["hand loop"]["wall"])
    fastest = min(stub["trainer"]["wall"]) - min(stub["hand loop"]["wall"])
    outside = [w - i for w, i in zip(stub["trainer"]["wall"], stub["trainer"]["run_step inner"],
                                     strict=True)]
    print(f"trainer's added work per step (b): paired trainer - hand loop "
          f"{spread([a * 1e3 for a in added])} ms, {statistics.median(added) / step:+.2%} of the "
          f"hand loop's median whole step ({step:.2f} s); fastest against fastest "
          f"{fastest * 1e3:+.1f} ms, {fastest / min(rows['hand loop']['wall']):+.2%} of its "
          f"fastest whole step; around run_step (callbacks, record, data hand-off) "
          f"{statistics.median(outside) * 1e3:.1f} ms median")


# ------------------------------------------------------------------ 2. examples in a process


def run_cli(command: list[str], output: Path) -> dict[str, Any]:
    """Run `command`; return its stderr's MF_T marks, metrics.jsonl and the wall times."""
    launched = time.time()
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, check=False)
    ended = time.time()
    if done.returncode:
        raise RuntimeError(f"{' '.join(command[:3])} ... failed:\n{done.stderr[-2000:]}")
    marks = {line.split()[1]: float(line.split()[2]) for line in done.stderr.splitlines()
             if line.startswith("MF_T ")}
    lines = [json.loads(line) for line in (output / "metrics.jsonl").read_text().splitlines()]
    return {"launched": launched, "ended": ended, "marks": marks, "lines": lines}


def cli_command(example: Path, prefix: Path, out: Path, steps: int, wrapper: bool) -> list[str]:
    script = [sys.executable, "-c", WRAPPER] if wrapper else [
        str(Path(sys.executable).with_name("mf-train"))]
    return [*script, "--config", str(example), "--set", data_override(prefix),
            "--set", f"training.steps={steps}", "--set", f"checkpoint.save_path={out / 'ckpt'}",
            "--output-dir", str(out)]


def examples_in_process(prefix: Path, tmp: Path, steps: int, repeats: int) -> dict[str, Any]:
    results: dict[str, Any] = {}
    for name in EXAMPLES:
        example = ROOT / "examples" / name
        if not example.exists():
            continue
        out = tmp / f"run-{example.stem}"
        try:
            run = run_cli(cli_command(example, prefix, out, steps, wrapper=False), out)
            firsts = []
            for index in range(repeats):
                first_out = tmp / f"first-{example.stem}-{index}"
                firsts.append(first_step_split(run_cli(
                    cli_command(example, prefix, first_out, 1, wrapper=True), first_out)))
        except RuntimeError as exc:
            results[example.stem] = {"error": str(exc)}
            continue
        step_lines = [line for line in run["lines"] if "event" not in line]
        start = next(line for line in run["lines"] if line.get("event") == "start")
        results[example.stem] = {
            "tokens_per_step": step_lines[0]["tokens"],
            "tokens_per_s": [line["tokens_per_s"] for line in step_lines[1:]],
            "first_step_s": step_lines[0]["step_time"],
            "later_step_s": [line["step_time"] for line in step_lines[1:]],
            "script_to_first": step_lines[0]["time"] - run["launched"],
            "script_to_start": start["time"] - run["launched"], "first": firsts}
        print(f"{example.stem}: done", file=sys.stderr, flush=True)
    return results


def first_step_split(run: dict[str, Any]) -> dict[str, float]:
    """Seconds of each phase up to the first step's metrics line."""
    start = next(line for line in run["lines"] if line.get("event") == "start")
    step = next(line for line in run["lines"] if "event" not in line)
    python, imported = run["marks"]["python"], run["marks"]["imported"]
    return {"python": python - run["launched"], "import": imported - python,
            "build": start["time"] - imported, "stream + step": step["time"] - start["time"],
            "step": step["step_time"], "total": step["time"] - run["launched"],
            "exit": run["ended"] - step["time"]}


def print_examples(results: dict[str, Any]) -> None:
    print("\n2. examples through `mf-train` (a fresh process each; steps after the first)")
    head = (f"{'example':<18}{'tokens/step':>12}{'tokens/s':>26}{'step s':>24}"
            f"{'first step s':>14}")
    print(head + "\n" + "-" * len(head))
    for name, r in results.items():
        if "error" in r:
            print(f"{name:<18} failed: {r['error'].splitlines()[-1]}")
            continue
        print(f"{name:<18}{r['tokens_per_step']:>12}{spread(r['tokens_per_s']):>26}"
              f"{spread(r['later_step_s']):>24}{r['first_step_s']:>14.2f}")
    print("\n   time to first step (training.steps=1, index cache warm), seconds; "
          "`mf-train` script from launch to step 1's line in brackets (its first run)")
    phases = ("python", "import", "build", "stream + step", "step", "exit", "total")
    head = f"{'example':<18}{'run':>4}" + "".join(f"{p:>14}" for p in phases)
    print(head + "\n" + "-" * len(head))
    for name, r in results.items():
        for index, split in enumerate(r.get("first", [])):
            print(f"{name:<18}{index + 1:>4}" + "".join(f"{split[p]:>14.2f}" for p in phases))
        if "script_to_first" in r:
            script = f"({r['script_to_first']:.2f})"
            print(f"{name:<18}{'':>4}{'':>84}{script:>14}")


# ------------------------------------------------------------------ 3. checkpoint save


def save_costs(prefix: Path, tmp: Path, repeats: int) -> dict[str, Any]:
    import attrs

    from mf_train.checkpoint import CheckpointManager, model_arrays
    from mf_train.trainer import Trainer

    results: dict[str, Any] = {}
    for label, extra in (("qwen3_tiny", ()), ("qwen3 4.2M", BIG_MODEL)):
        config, source = load_config(OVERHEAD_EXAMPLE, [data_override(prefix), *extra])
        trainer = Trainer(config, output_dir=tmp / f"save-{len(extra)}", source=source)
        section = attrs.evolve(config.checkpoint, save_interleaved_steps=1, save_max=2,
                               save_path=str(tmp / f"ckpt-{len(extra)}"))
        times: dict[str, Any] = {"blocked false": [], "blocked true": [], "written false": [],
                                 "written true": [], "capture": []}
        for index in range(repeats):
            modes = (False, True) if index % 2 == 0 else (True, False)
            for mode in modes:
                trainer.checkpoints = CheckpointManager(
                    attrs.evolve(section, async_save=mode), source=source)
                trainer.step_count += 1
                start = time.perf_counter()
                trainer.save_checkpoint()
                blocked = time.perf_counter() - start
                trainer.checkpoints.wait()
                times[f"blocked {str(mode).lower()}"].append(blocked)
                times[f"written {str(mode).lower()}"].append(time.perf_counter() - start)
            start = time.perf_counter()
            model_arrays(trainer.model.parameters_and_names())
            trainer.optimizer.state_dict()
            times["capture"].append(time.perf_counter() - start)
        files = sorted((tmp / f"ckpt-{len(extra)}").glob("iteration_*"))[-1]
        times["bytes"] = sum(f.stat().st_size for f in files.iterdir())
        times["parameters"] = sum(p.size for p in trainer.model.trainable_params())
        results[label] = times
        del trainer
    return results


def print_saves(results: dict[str, Any], repeats: int) -> None:
    print(f"\n3. checkpoint save, {repeats} of each mode alternated, median (min-max) ms")
    head = (f"{'model':<12}{'params':>11}{'MiB':>6}{'capture':>24}{'sync: blocked':>26}"
            f"{'async: blocked':>26}{'async: until written':>26}")
    print(head + "\n" + "-" * len(head))

    def ms(values: Sequence[float]) -> str:
        return spread([v * 1e3 for v in values])

    for label, t in results.items():
        print(f"{label:<12}{t['parameters']:>11,}{t['bytes'] / MIB:>6.1f}{ms(t['capture']):>24}"
              f"{ms(t['blocked false']):>26}{ms(t['blocked true']):>26}"
              f"{ms(t['written true']):>26}")


# ------------------------------------------------------------------ main


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5, help="whole-step rounds of part 1")
    parser.add_argument("--stub-rounds", type=int, default=30,
                        help="rounds of part 1 without forward/backward")
    parser.add_argument("--steps", type=int, default=4, help="steps per example in part 2")
    parser.add_argument("--time-to-first", type=int, default=2,
                        help="time-to-first-step runs per example")
    parser.add_argument("--saves", type=int, default=4, help="saves of each mode in part 3")
    parser.add_argument("--no-mindspore-adamw", action="store_true",
                        help="leave out the MindSpore AdamW row of part 1")
    args = parser.parse_args()
    began, load = time.perf_counter(), os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="mf-train-step-") as name:
        tmp = Path(name)
        prefix = prepare_data(tmp)
        examples = examples_in_process(prefix, tmp, args.steps, args.time_to_first)
        logging.basicConfig(level=logging.INFO, filename=tmp / "bench.log",
                            format="%(asctime)s %(levelname)s %(message)s")
        os.environ.setdefault("GLOG_v", "3")  # MindSpore AdamW's jit prints every gradient
        result = overhead(prefix, tmp, args.rounds, args.stub_rounds,
                          not args.no_mindspore_adamw)
        saves = save_costs(prefix, tmp, args.saves)
    print(f"machine: {os.cpu_count()} cores, load average {load:.1f} at the start, "
          f"{os.getloadavg()[0]:.1f} at the end;"
          f" {time.perf_counter() - began:.0f} s in all")
    print_overhead(result)
    print_examples(examples)
    print_saves(saves, args.saves)


if __name__ == "__main__":
    main()
