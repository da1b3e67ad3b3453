"""Training speed of mf against PyTorch eager + Hugging Face transformers, side by side.

Each measurement is a fresh process; the implementations alternate (the order rotated each
round), `--rounds` rounds of each. Two models, both Qwen3 with tied embeddings, float32,
recompute off:

- **tiny**: examples/qwen3_tiny.yaml's model (vocabulary 512, hidden 64, 4 layers, 4 heads,
  2 KV heads), sequence 128, micro-batch 2, global batch 4 = 2 micro-batches per step;
- **28m**: hidden 512, intermediate 1408, 8 layers, 8 heads, 4 KV heads, head_dim 64,
  vocabulary 8192, one sequence of 512 per step;
- **28m-2ranks**: the same model, two sequences per step, also under FSDP and tensor
  parallelism on 2 ranks (`LAYOUT_VARIANTS`), each in PyNative and compiled;
- **deepseek-tiny**: examples/deepseek_v3_tiny.yaml's MoE model, PyNative and compiled (no
  PyTorch rows: its ratios are to the PyNative row).

Implementations (the tables `MF_VARIANTS` and `TORCH_VARIANTS` below):

- **mf**: the `mf-train` console script on a configuration generated from
  examples/qwen3_tiny.yaml (checkpoint saving off, TensorBoard's log_interval beyond the last
  step, recompute section dropped), trained on the demo corpus (examples/data/make_corpus.py,
  `mf-data preprocess`, built once). Step times are the `step_time` field of metrics.jsonl
  (the trainer's `TrainStep`: forward/backward of every micro-batch, reduction, norm,
  clipping, optimizer update, loss read-back; not the data loading nor the callbacks).
  A variant whose `--set` override mf-train rejects as an unknown key is reported
  "n/a (setting not available)".
- **PyTorch**: torch CPU, `transformers.Qwen3ForCausalLM` of the same configuration (HF's
  default attention, `sdpa`), `torch.set_num_threads(2)`, random token batches of the same
  shape made beforehand, loss = cross-entropy of the logits / micro-batches, `backward` per
  micro-batch, `clip_grad_norm_(max_norm=1.0)`, `torch.optim.AdamW` with the same betas, eps
  and weight decay (not on 1-D parameters, as mf). Timed the same way: from the first
  micro-batch to the loss read-back after `optimizer.step()`. A second row runs the same
  with OMP_WAIT_POLICY=PASSIVE: while another process holds one of the 2 cores, the default
  (spinning) OpenMP threads made the tiny model's step about 30x slower (2.0 s against 59 ms).

Reported per model and implementation: median step time without the first step (min-max
over all rounds), tokens/s from it, the first step's time (median over rounds), peak memory
(the worker process's `ru_maxrss` from `os.wait4`: the peak resident set of the whole
process, interpreter, framework libraries, model, optimizer state and activations; the
children it waited for would count too), the whole process's wall time (launch to exit:
imports, building, the data index, all steps, teardown), and the ratios of step time and
of peak memory to the first PyTorch row (mf / PyTorch).

Run: python benchmarks/speed.py [--rounds N] [--steps N] [--only MODEL] [--previous DIR]
(`nox -s bench_speed -- ...` installs mf, torch 2.13.0 CPU and transformers 4.57.6 first).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "qwen3_tiny.yaml"
DEEPSEEK = ROOT / "examples" / "deepseek_v3_tiny.yaml"

COMPILE = "context.compile=true"
MF_VARIANTS: tuple[tuple[str, tuple[str, ...], int], ...] = (
    ("mf (default: PyNative)", (), 1),
    ("mf, context.compile=true", (COMPILE,), 1),
)
"""mf rows: (label, `--set` overrides of mf-train, ranks). `--previous DIR` adds a row for each
one-process row, running the packages of another checkout (`DIR/packages/*/src` first on
PYTHONPATH), e.g. a `git worktree` of an earlier commit, with the same overrides."""

FSDP = "parallelism.data_parallel_shard_strategy=optim_grads_params"
TENSOR = "parallelism.tensor_parallel=2"
LAYOUT_VARIANTS: tuple[tuple[str, tuple[str, ...], int], ...] = (
    *MF_VARIANTS,
    ("mf FSDP 2 ranks", (FSDP,), 2),
    ("mf FSDP 2 ranks, compiled", (FSDP, COMPILE), 2),
    ("mf TP 2 ranks", (TENSOR,), 2),
    ("mf TP 2 ranks, compiled", (TENSOR, COMPILE), 2),
)
"""The layouts' rows (the `28m-2ranks` model): one process, FSDP and tensor parallelism on
2 ranks (msrun on this machine's 2 cores), each in PyNative and compiled. Their peak is the
largest rank's peak resident set as the trainer reports it (`peak_memory_gib`, `ru_maxrss` of
each rank): the launcher's `os.wait4` sees a rank only when msrun reaped it first."""

TORCH_VARIANTS: tuple[tuple[str, dict[str, Any], dict[str, str]], ...] = (
    ("PyTorch eager + HF", {"attention": "sdpa", "threads": 2}, {}),
    ("PyTorch, OMP passive wait", {"attention": "sdpa", "threads": 2},
     {"OMP_WAIT_POLICY": "PASSIVE"}),
)
"""PyTorch rows: (label, worker options, environment variables). The first is the baseline of
the ratios. The second shows what the machine's load does to PyTorch: its 2 OpenMP threads
spin while they wait for each other; with another process holding one of the 2 cores, the
tiny model's forward + backward took 0.1-1.6 s with the default and 25 ms with
OMP_WAIT_POLICY=PASSIVE (the threads sleep instead) or with 1 thread."""


@dataclass(frozen=True)
class Model:
    """One benchmarked configuration: the model's keys, the batch and the default steps."""

    shape: dict[str, Any]
    seq: int
    local_batch: int
    global_batch: int
    steps: int
    example: Path = EXAMPLE
    """The mf configuration the run starts from (its model section updated with `shape`)."""
    variants: tuple[tuple[str, tuple[str, ...], int], ...] = MF_VARIANTS
    torch: bool = True
    """Whether the PyTorch rows run (a Qwen3 of `shape`); without them the ratios are to the
    first mf row."""

    @property
    def tokens(self) -> int:
        return self.global_batch * self.seq


COMMON = {"rms_norm_eps": 1e-6, "rope_theta": 10000.0, "tie_word_embeddings": True}
MODELS = {
    "tiny": Model({"vocab_size": 512, "hidden_size": 64, "intermediate_size": 176,
                   "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2,
                   "head_dim": 16, "max_position_embeddings": 128, **COMMON},
                  seq=128, local_batch=2, global_batch=4, steps=8),
    "28m": Model({"vocab_size": 8192, "hidden_size": 512, "intermediate_size": 1408,
                  "num_hidden_layers": 8, "num_attention_heads": 8, "num_key_value_heads": 4,
                  "head_dim": 64, "max_position_embeddings": 512, **COMMON},
                 seq=512, local_batch=1, global_batch=1, steps=12),
}
"""12 steps at 28M: MindSpore's graph runtime times each graph's steps 2-5 with and without
its multi-threaded actor execution before it keeps the faster (a compiled 28M step takes
1.2 s there, 0.9 s after); the median over steps 2-12 is the steady step."""
MODELS["28m-2ranks"] = Model(MODELS["28m"].shape, seq=512, local_batch=1, global_batch=2,
                             steps=4, variants=LAYOUT_VARIANTS)
"""The 28M model, two sequences per step: one process (2 micro-batches), FSDP 2 (one per
rank), TP 2 (2 micro-batches on both ranks)."""
MODELS["deepseek-tiny"] = Model({}, seq=128, local_batch=2, global_batch=4, steps=8,
                                example=DEEPSEEK, torch=False)
"""examples/deepseek_v3_tiny.yaml's model as written (3 layers, 4 routed experts, top 2),
PyNative and compiled (attention, dense MLP, router and shared experts)."""

TORCH_WORKER = r"""
import json, sys, time
import torch
from transformers import Qwen3Config, Qwen3ForCausalLM
spec = json.loads(sys.argv[1])
torch.set_num_threads(spec["threads"])
torch.manual_seed(spec["seed"])
config = Qwen3Config(**spec["model"], use_cache=False, attn_implementation=spec["attention"])
model = Qwen3ForCausalLM(config).train()
named = list(model.named_parameters())
decay = [p for n, p in named if p.ndim >= 2 and "norm" not in n]
other = [p for n, p in named if not (p.ndim >= 2 and "norm" not in n)]
opt = spec["optimizer"]
optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": opt["weight_decay"]},
                               {"params": other, "weight_decay": 0.0}],
                              lr=opt["lr"], betas=tuple(opt["betas"]), eps=opt["eps"])
vocab, micro, accumulation = config.vocab_size, spec["micro_shape"], spec["accumulation"]
gen = torch.Generator().manual_seed(spec["seed"])
batches = [[(torch.randint(0, vocab, micro, generator=gen),
             torch.randint(0, vocab, micro, generator=gen)) for _ in range(accumulation)]
           for _ in range(spec["steps"])]
times, losses = [], []
for step in batches:
    start = time.perf_counter()
    optimizer.zero_grad(set_to_none=True)
    total = 0.0
    for tokens, labels in step:
        logits = model(input_ids=tokens).logits
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, vocab).float(),
                                                 labels.reshape(-1)) / accumulation
        loss.backward()
        total = total + loss.detach()
    torch.nn.utils.clip_grad_norm_(model.parameters(), spec["max_norm"])
    optimizer.step()
    losses.append(float(total))
    times.append(time.perf_counter() - start)
print(json.dumps({"step_times": times, "losses": losses,
                  "tokens": accumulation * micro[0] * micro[1],
                  "attention": model.config._attn_implementation,
                  "parameters": sum(p.numel() for p in model.parameters())}))
"""


class NotAvailable(Exception):
    """mf-train rejected a variant's override: the setting does not exist (yet)."""


@dataclass(frozen=True)
class Run:
    """One process's measurement."""

    step_times: list[float]
    tokens: int
    """Tokens per step."""
    peak_kib: int
    wall: float
    note: str = ""


@dataclass
class Row:
    """What one implementation measured over the rounds of one model."""

    later: list[float] = field(default_factory=list)
    first: list[float] = field(default_factory=list)
    peak_kib: list[int] = field(default_factory=list)
    wall: list[float] = field(default_factory=list)
    tokens: int = 0
    status: str = ""
    note: str = ""

    def add(self, run: Run) -> None:
        self.first.append(run.step_times[0])
        self.later += run.step_times[1:]
        self.peak_kib.append(run.peak_kib)
        self.wall.append(run.wall)
        self.tokens, self.note = run.tokens, run.note


# ------------------------------------------------------------------ processes


def run_measured(command: list[str], timeout: float, env: dict[str, str] | None = None,
                 ) -> tuple[int, str, str, int, float]:
    """Run `command` in its own session (`env` added to the environment); return (exit code,
    stdout, stderr, peak RSS in KiB of the process from `os.wait4`, wall seconds). Killed (its
    whole group) after `timeout`."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        start = time.perf_counter()
        proc = subprocess.Popen(command, stdout=out, stderr=err, start_new_session=True,
                                env={**os.environ, **(env or {})})
        try:
            status, usage = wait_until(proc.pid, start + timeout)
        except BaseException:  # the timeout, or Ctrl-C (the child has its own session)
            os.killpg(proc.pid, signal.SIGKILL)
            os.wait4(proc.pid, 0)
            proc.returncode = -signal.SIGKILL
            raise
        wall = time.perf_counter() - start
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        return (proc.returncode, out.read().decode(errors="replace"),
                err.read().decode(errors="replace"), usage.ru_maxrss, wall)


def wait_until(pid: int, deadline: float) -> tuple[int, Any]:
    """Reap `pid` (status, rusage), polling; TimeoutError past `deadline` (perf_counter)."""
    while True:
        done, status, usage = os.wait4(pid, os.WNOHANG)
        if done:
            return status, usage
        if time.perf_counter() > deadline:
            raise TimeoutError("killed after the timeout (--timeout)")
        time.sleep(0.02)


def tool(name: str) -> str:
    """A console script of this interpreter's environment (mf-train, mf-data)."""
    return str(Path(sys.executable).with_name(name))


def prepare_data(tmp: Path, timeout: float) -> Path:
    """The demo corpus, preprocessed as the examples' comments say; returns the prefix."""
    corpus, prefix = tmp / "corpus.jsonl", tmp / "data" / "python_docs"
    subprocess.run([sys.executable, str(ROOT / "examples" / "data" / "make_corpus.py"),
                    str(corpus)], check=True, stdout=subprocess.DEVNULL, timeout=timeout)
    subprocess.run([tool("mf-data"), "preprocess", "--input", str(corpus), "--output-prefix",
                    str(prefix)], check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL, timeout=timeout)
    return prefix


# ------------------------------------------------------------------ mf


def mf_config(model: Model, steps: int, prefix: Path) -> dict[str, Any]:
    """examples/qwen3_tiny.yaml with the model's shape and batch, no recompute, no saves."""
    config = yaml.safe_load(model.example.read_text())
    config.pop("recompute", None)
    config["training"].update(steps=steps, local_batch_size=model.local_batch,
                              global_batch_size=model.global_batch)
    config["checkpoint"] = {"enable_save": False}
    config["monitor"] = {"tensorboard": {"log_interval": steps + 1}}  # no event is written
    loader = config["train_dataset"]["dataloader"]
    loader["sizes"] = [max(64, 2 * steps * model.global_batch), 0, 0]
    loader["config"].update(seq_length=model.seq, data_path=["1", str(prefix)])
    config["model"].update(model.shape)
    return config


def run_mf(overrides: tuple[str, ...], config: Path, out: Path, timeout: float,
           env: dict[str, str] | None = None, nproc: int = 1) -> Run:
    """One mf-train run on `nproc` ranks; step times and tokens from its metrics.jsonl."""
    command = [tool("mf-train"), "--config", str(config), "--output-dir", str(out)]
    if nproc > 1:
        command += ["--nproc", str(nproc), "--timeout", str(int(timeout))]
    for override in overrides:
        command += ["--set", override]
    code, _, err, peak, wall = run_measured(command, timeout, env)
    if code == 2 and "Unknown configuration key" in err:
        raise NotAvailable(err.strip().splitlines()[-1])
    if code != 0:
        raise RuntimeError(f"mf-train exited {code}:\n{err[-2000:]}")
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [line for line in lines if "event" not in line]
    note = f"last loss {steps[-1]['loss']:.3f} (the demo corpus)"
    if nproc > 1:  # the largest rank's peak resident set, as the trainer measured it: the
        # launcher's wait4 sees the ranks only when msrun reaped them before it exited
        peak = max(peak, max(line["peak_memory_gib"] for line in steps) * 2**20)
    return Run([line["step_time"] for line in steps], steps[0]["tokens"], peak, wall, note)


# ------------------------------------------------------------------ PyTorch


def torch_spec(model: Model, steps: int, options: dict[str, Any]) -> dict[str, Any]:
    """The worker's arguments: the same model, batch, optimizer and clipping as mf's run."""
    example = yaml.safe_load(EXAMPLE.read_text())
    optimizer = example["optimizer"]
    return {"model": model.shape, "micro_shape": [model.local_batch, model.seq],
            "accumulation": model.global_batch // model.local_batch, "steps": steps,
            "seed": example["training"]["seed"], "max_norm": example["training"]["max_norm"],
            "optimizer": {"lr": float(example["lr_scheduler"]["learning_rate"]),
                          "betas": optimizer["betas"], "eps": float(optimizer["eps"]),
                          "weight_decay": float(optimizer["weight_decay"])}, **options}


def run_torch(spec: dict[str, Any], env: dict[str, str], timeout: float) -> Run:
    """One PyTorch worker run."""
    code, out, err, peak, wall = run_measured(
        [sys.executable, "-c", TORCH_WORKER, json.dumps(spec)], timeout, env)
    if code != 0:
        raise RuntimeError(f"PyTorch worker exited {code}:\n{err[-2000:]}")
    result = json.loads(out.strip().splitlines()[-1])
    note = (f"{result['parameters'] / 1e6:.2f}M parameters, attention "
            f"{result['attention']}, last loss {result['losses'][-1]:.3f} (random tokens)")
    return Run(result["step_times"], result["tokens"], peak, wall, note)


# ------------------------------------------------------------------ rounds


def previous_env(checkout: Path) -> dict[str, str]:
    """PYTHONPATH putting another checkout's packages before the installed ones."""
    sources = sorted(str(path) for path in (checkout / "packages").glob("*/src"))
    if not sources:
        raise SystemExit(f"--previous {checkout}: no packages/*/src there")
    return {"PYTHONPATH": os.pathsep.join([*sources, os.environ.get("PYTHONPATH", "")])}


def measure(name: str, model: Model, steps: int, rounds: int, tmp: Path, prefix: Path,
            timeout: float, previous: Path | None = None) -> dict[str, Row]:
    """`rounds` rounds of one run of each implementation, the order rotated each round."""
    config = tmp / f"{name}.yaml"
    config.write_text(yaml.safe_dump(mf_config(model, steps, prefix), sort_keys=False))
    older = [] if previous is None else [
        (label.replace("mf", f"mf at {previous.name}", 1) + " (previous)",
         lambda out, o=overrides: run_mf(o, config, out, timeout, previous_env(previous)))
        for label, overrides, nproc in model.variants if nproc == 1]
    runs: list[tuple[str, Any]] = [
        *((label, lambda out, o=overrides, n=nproc: run_mf(o, config, out, timeout, nproc=n))
          for label, overrides, nproc in model.variants), *older,
        *((label, lambda out, o=options, e=env: run_torch(torch_spec(model, steps, o), e,
                                                          timeout))
          for label, options, env in (TORCH_VARIANTS if model.torch else ()))]
    rows = {label: Row() for label, _ in runs}
    for index in range(rounds):
        shift = index % len(runs)
        for label, run in [*runs[shift:], *runs[:shift]]:
            row = rows[label]
            if row.status:
                continue
            try:
                measured = run(tmp / f"{name}-{label}-{index}".replace(" ", "_"))
            except NotAvailable:
                row.status = "n/a (setting not available)"
                continue
            except (RuntimeError, TimeoutError) as exc:
                print(f"{name} / {label}: {exc}", file=sys.stderr)
                row.status = f"failed: {str(exc).splitlines()[0]}"
                continue
            row.add(measured)
            print(f"{name} round {index + 1}/{rounds}: {label}, {measured.wall:.1f} s",
                  file=sys.stderr, flush=True)
    return rows


# ------------------------------------------------------------------ report


def print_table(name: str, model: Model, steps: int, rows: dict[str, Row]) -> None:
    baseline = rows[TORCH_VARIANTS[0][0]] if model.torch else next(iter(rows.values()))
    print(f"\n{name}: {model.tokens} tokens per step ({model.global_batch // model.local_batch}"
          f" x {model.local_batch} x {model.seq}), {steps} steps per run")
    width = max(28, *(len(label) + 2 for label in rows))
    head = (f"{'implementation':<{width}}{'step ms, median (min-max)':>28}{'tokens/s':>10}"
            f"{'first step ms':>15}{'peak MiB':>10}{'process s':>11}{'step ratio':>12}"
            f"{'mem ratio':>11}")
    print(head + "\n" + "-" * len(head))
    for label, row in rows.items():
        if row.status or not row.later:
            print(f"{label:<{width}}{row.status or 'no step after the first (use --steps 2+)':>28}")
            continue
        step, peak = statistics.median(row.later), statistics.median(row.peak_kib) / 1024
        ratios = ""
        if baseline.later and row is not baseline:
            ratios = (f"{step / statistics.median(baseline.later):>11.2f}x"
                      f"{peak * 1024 / statistics.median(baseline.peak_kib):>10.2f}x")
        spread = (f"{step * 1e3:.1f} ({min(row.later) * 1e3:.1f}-"
                  f"{max(row.later) * 1e3:.1f})")
        print(f"{label:<{width}}{spread:>28}{row.tokens / step:>10.0f}"
              f"{statistics.median(row.first) * 1e3:>15.1f}{peak:>10.0f}"
              f"{statistics.median(row.wall):>11.1f}{ratios}", flush=True)
    for label, row in rows.items():
        if row.note:
            print(f"  {label}: {row.note}")


def versions() -> str:
    found = []
    for package in ("mindspore", "torch", "transformers"):
        try:
            found.append(f"{package} {importlib.metadata.version(package)}")
        except importlib.metadata.PackageNotFoundError:
            found.append(f"{package} missing")
    spec = importlib.util.find_spec("mf_train")
    where = Path(spec.origin).parent if spec and spec.origin else "missing"
    return ", ".join(found) + f"; mf_train from {where}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--rounds", type=int, default=2, help="alternating rounds (default 2)")
    parser.add_argument("--steps", type=int, default=None,
                        help="steps per run (default: 8 for the tiny models, 12 at 28m, "
                             "4 at 28m-2ranks)")
    parser.add_argument("--only", choices=sorted(MODELS), help="one model only")
    parser.add_argument("--timeout", type=float, default=1800,
                        help="seconds before a run is killed (default 1800)")
    parser.add_argument("--previous", type=Path, default=None,
                        help="a checkout of an earlier mf to measure beside (its packages/*/src)")
    args = parser.parse_args()
    began, load = time.perf_counter(), os.getloadavg()[0]
    print(f"{os.cpu_count()} cores, load average {load:.1f}; {versions()}", flush=True)
    if load >= 0.5:
        print("the machine is busy: PyTorch's spinning OpenMP threads are slowed far more than "
              "by the lost CPU time alone (see the OMP passive wait row)", flush=True)
    with tempfile.TemporaryDirectory(prefix="mf-speed-") as name:
        tmp = Path(name)
        prefix = prepare_data(tmp, args.timeout)
        for key, model in MODELS.items():
            if args.only and key != args.only:
                continue
            steps = args.steps or model.steps
            rows = measure(key, model, steps, args.rounds, tmp, prefix, args.timeout,
                           args.previous)
            print_table(key, model, steps, rows)
    print(f"\nload average {load:.1f} at the start, {os.getloadavg()[0]:.1f} at the end; "
          f"{time.perf_counter() - began:.0f} s in all; step ratio and mem ratio: "
          f"the row / {TORCH_VARIANTS[0][0]} (deepseek-tiny: / its first row)")


if __name__ == "__main__":
    main()
