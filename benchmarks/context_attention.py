"""Context parallelism: one Qwen3 attention block at long sequences, one process (the whole
sequence) against context parallelism 2 on two msrun ranks (each holding S / 2 tokens) with the
`colossal` (all-gather of keys and values) and `ulysses` (all-to-all of heads) exchanges, and
colossal with `context_parallel_async` (the all-gather started, attention over this rank's own
keys meanwhile, the two parts merged).

Every case runs in a fresh process (or a fresh 2-rank msrun job) with
`context_attention_worker.py`, which builds a one-layer `Qwen3ForCausalLM` the way the trainer
does (examples/qwen3_tiny.yaml with `--set` overrides: hidden 256, 4 heads, 2 KV heads,
head_dim 64, batch 1) and times its decoder layer's attention cell, forward + backward, on the
inputs `AttentionPlaces` gives (rotary positions and the mask by global token index).

Every case runs `--rounds` times, interleaved with the others (odd rounds in reverse order), so
that the load of the shared machine falls on all of them. Printed per case (medians over the
rounds): ms per forward + backward (median of the measured steps after the warm-up, mean over
ranks) and its ratio to the one-process run of the same sequence length in this invocation;
the exchanges' time and share of the step; the CPU time per step summed over the ranks (all
threads, user + system: the work, which the load of a shared machine moves less than the wall
time) and its ratio to the one process; the peak resident-memory growth of
each rank (MiB) and the highest rank's ratio to the one-process run. On CPU the two ranks share
the machine's 2 cores with each other.

Usage: python benchmarks/context_attention.py [--seqs 2048 8192] [--steps 5] [--warmup 1]
       [--rounds 2] [--json FILE] [--keep DIR]   (about 15 minutes)
       python benchmarks/context_attention.py --from-json FILE
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from mf_parallel.launch import run_ranks

ROOT = Path(__file__).resolve().parents[1]
WORKER = Path(__file__).resolve().parent / "context_attention_worker.py"
EXAMPLE = ROOT / "examples" / "qwen3_tiny.yaml"
MODEL = {"model.hidden_size": 256, "model.num_attention_heads": 4,
         "model.num_key_value_heads": 2, "model.head_dim": 64, "model.num_hidden_layers": 1,
         "training.local_batch_size": 1, "training.global_batch_size": 1,
         "recompute": "{mode: None}"}
CASES = {  # name -> (ranks, overrides)
    "one": (1, {}),
    "cp2_colossal": (2, {"parallelism.context_parallel": 2,
                         "parallelism.context_parallel_method": "colossal"}),
    "cp2_ulysses": (2, {"parallelism.context_parallel": 2,
                        "parallelism.context_parallel_method": "ulysses"}),
    "cp2_colossal_async": (2, {"parallelism.context_parallel": 2,
                               "parallelism.context_parallel_method": "colossal",
                               "parallelism.context_parallel_async": True}),
}


def worker_args(out: Path, seq: int, steps: int, warmup: int, more: dict) -> list[str]:
    sets = {**MODEL, **more, "model.seq_length": seq, "model.max_position_embeddings": seq,
            "train_dataset.dataloader.config.seq_length": seq}
    return [str(out), str(steps), str(warmup), str(EXAMPLE),
            *(arg for key, value in sets.items() for arg in ("--set", f"{key}={value}"))]


def run_case(out: Path, ranks: int, args: list[str]) -> list[dict]:
    """One case in a fresh process or msrun job; each rank's figures."""
    env = {"GLOG_v": "3"}
    if ranks == 1:
        out.mkdir(parents=True, exist_ok=True)
        with open(out / "worker.log", "w") as log:
            subprocess.run([sys.executable, str(WORKER), *args], env={**os.environ, **env},
                           stdout=log, stderr=subprocess.STDOUT, check=True, timeout=1800)
    else:
        run_ranks(WORKER, ranks, log_dir=out / "logs", timeout=1800, args=args, env=env)
    return [json.loads(path.read_text()) for path in sorted(out.glob("rank_*.json"))]


def summarise(ranks: list[dict]) -> dict:
    """One run: mean step, exchange and CPU time over the ranks (they wait for each other in
    the exchanges), each rank's peak."""
    return {"step_ms": statistics.mean(r["step_ms"] for r in ranks),
            "exchange_ms": statistics.mean(r["exchange_ms"] for r in ranks),
            "cpu_ms": sum(r["cpu_ms"] for r in ranks),
            "peaks_mib": [r["peak_mib"] for r in ranks],
            "tokens": ranks[0]["tokens"], "method": ranks[0]["method"]}


def combine(runs: list[dict]) -> dict:
    """A case over the rounds: medians of the times, the per-rank peaks of the run with the
    median highest peak, every run kept."""
    peak, peaks = sorted((max(r["peaks_mib"]), r["peaks_mib"]) for r in runs)[(len(runs) - 1) // 2]
    return {**{key: statistics.median(r[key] for r in runs)
               for key in ("step_ms", "exchange_ms", "cpu_ms")},
            "peak_mib": peak, "peaks_mib": peaks,
            "tokens": runs[0]["tokens"], "method": runs[0]["method"], "runs": runs}


def report(results: dict[int, dict[str, dict]]) -> None:
    print(f"\n{'seq':>5} {'case':18} {'tokens/rank':>11} {'step ms':>9} {'x one':>6} "
          f"{'exchange ms':>12} {'exch %':>7} {'CPU ms, ranks':>14} {'x one':>6} "
          f"{'peak MiB/rank':>14} {'x one':>6}")
    for seq, cases in results.items():
        one = cases["one"]
        for name, r in cases.items():
            print(f"{seq:>5} {name:18} {r['tokens']:11} {r['step_ms']:9.1f} "
                  f"{r['step_ms'] / one['step_ms']:6.2f} {r['exchange_ms']:12.1f} "
                  f"{100 * r['exchange_ms'] / r['step_ms']:6.1f}% {r['cpu_ms']:14.0f} "
                  f"{r['cpu_ms'] / one['cpu_ms']:6.2f} "
                  f"{' / '.join(f'{p:.0f}' for p in r['peaks_mib']):>14} "
                  f"{r['peak_mib'] / one['peak_mib']:6.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seqs", type=int, nargs="+", default=[2048, 8192])
    parser.add_argument("--steps", type=int, default=5, help="measured steps per case")
    parser.add_argument("--warmup", type=int, default=1, help="steps before the measured ones")
    parser.add_argument("--rounds", type=int, default=2,
                        help="runs of every case, interleaved (odd rounds in reverse order)")
    parser.add_argument("--only", nargs="+", choices=list(CASES), default=list(CASES))
    parser.add_argument("--json", metavar="FILE", help="also write every figure here")
    parser.add_argument("--keep", metavar="DIR", help="keep the cases' directories here")
    parser.add_argument("--from-json", metavar="FILE",
                        help="print the table of an earlier run's --json file, run nothing")
    args = parser.parse_args()
    if args.from_json:
        report(json.loads(Path(args.from_json).read_text()))
        return
    if "one" not in args.only:
        parser.error("--only must include 'one' (the baseline of the ratios)")
    with tempfile.TemporaryDirectory(prefix="mf-bench-context-") as tmp:
        base = Path(args.keep or tmp)
        runs: dict[int, dict[str, list]] = {}
        for seq in args.seqs:
            for round_ in range(args.rounds):
                for name in args.only[::-1 if round_ % 2 else 1]:
                    ranks, more = CASES[name]
                    print(f"running {name} at sequence {seq}, round {round_ + 1}", flush=True)
                    out = base / f"{name}_{seq}_{round_}"
                    figures = run_case(out, ranks, worker_args(out, seq, args.steps,
                                                               args.warmup, more))
                    runs.setdefault(seq, {}).setdefault(name, []).append(summarise(figures))
        results = {seq: {name: combine(runs[seq][name]) for name in args.only}
                   for seq in runs}
        report(results)
        if args.json:
            Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
