"""Expert parallelism on msrun ranks: what the token dispatch costs per step against the rest
of the step, for the all-to-all and the deredundant dispatcher.

A DeepSeek-V3-style model (examples/deepseek_v3_tiny.yaml widened: hidden 256, 4 layers of
which 3 MoE, 8 routed experts of width 128, top 4 within 2 of 4 expert groups, one shared
expert, sequences of 256, 2 sequences per rank and step) trained for `--steps` steps by
`mf-train` itself in fresh processes (`expert_dispatch_worker.py` times the pieces):
- **one process** holding every expert, on one rank's batch (no dispatch);
- **FSDP 2** and **FSDP 4**: the same ranks without expert parallelism (every expert on every
  rank, no dispatch): the baseline of the expert-parallel runs on as many ranks, which share
  the cores and reduce the gradients the same way;
- **EP 2** (2 ranks, FSDP 2, experts split in 2) with `alltoall`, and with
  `alltoall_deredundancy` in devices of 1 and of 2 ranks;
- **EP 4** (4 ranks on the 2 cores, oversubscribed: read its ratios, not its times) with
  `alltoall` and `alltoall_deredundancy` in devices of 2.
Each rank has the one-process batch, so a step does the same work per rank plus the
dispatch and the data-parallel reduction. Steady state: the first `--skip` steps dropped,
medians over the rest, averaged over ranks.

Printed per run: the step; its ratio to one process and to FSDP on as many ranks; the
dispatch's communication per step (all-to-all-v exchanges forward and backward, the all-gather
of the routing tables, and the gathers/reduce-scatters inside a device) and its share of the
step; the routed part's forward
(tables, exchanges and the experts); rows received per step (token rows that reach a rank's
experts: one per (token, expert) pair with all-to-all, one per (token, device) otherwise).

Usage: python benchmarks/expert_dispatch.py [--steps 8] [--skip 2] [--quick] [--no-four]
       [--json FILE] [--keep DIR]   (about 5 minutes)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

from mf_parallel.launch import run_ranks
from mf_train.launch.cli import LAUNCHED

ROOT = Path(__file__).resolve().parents[1]
WORKER = Path(__file__).resolve().parent / "expert_dispatch_worker.py"
EXAMPLE = ROOT / "examples" / "deepseek_v3_tiny.yaml"
MODEL = {"model.hidden_size": 256, "model.intermediate_size": 704,
         "model.moe_intermediate_size": 128, "model.num_hidden_layers": 4,
         "model.n_routed_experts": 8, "model.num_experts_per_tok": 4, "model.n_group": 4,
         "model.topk_group": 2, "model.kv_lora_rank": 64,
         "train_dataset.dataloader.config.seq_length": 256, "model.seq_length": 256,
         "model.max_position_embeddings": 256}
QUICK = {**MODEL, "model.hidden_size": 64, "model.intermediate_size": 176,
         "model.moe_intermediate_size": 48, "model.kv_lora_rank": 32,
         "train_dataset.dataloader.config.seq_length": 32, "model.seq_length": 32,
         "model.max_position_embeddings": 32}
RUNS = {  # name -> (ranks, overrides)
    "one": (1, {}),
    "fsdp2": (2, {}),
    "ep2_alltoall": (2, {"parallelism.expert_parallel": 2}),
    "ep2_dered_dev1": (2, {"parallelism.expert_parallel": 2,
                           "parallelism.moe_token_dispatcher_type": "alltoall_deredundancy",
                           "parallelism.npu_nums_per_device": 1}),
    "ep2_dered_dev2": (2, {"parallelism.expert_parallel": 2,
                           "parallelism.moe_token_dispatcher_type": "alltoall_deredundancy",
                           "parallelism.npu_nums_per_device": 2}),
    "fsdp4": (4, {}),
    "ep4_alltoall": (4, {"parallelism.expert_parallel": 4}),
    "ep4_dered_dev2": (4, {"parallelism.expert_parallel": 4,
                           "parallelism.moe_token_dispatcher_type": "alltoall_deredundancy",
                           "parallelism.npu_nums_per_device": 2}),
}
COMMUNICATION = ("exchange", "gather_rows", "scatter_rows", "tables")


def train_args(run_dir: Path, prefix: Path, ranks: int, steps: int, model: dict,
               more: dict) -> list[str]:
    sets = {**model, **more, "train_dataset.dataloader.config.data_path": f"['1','{prefix}']",
            "training.steps": steps, "training.local_batch_size": 2,
            "training.global_batch_size": 2 * ranks, "lr_scheduler.warmup_steps": 1,
            "checkpoint.enable_save": "false",
            "monitor.moe_monitor.save_tokens_per_expert_interval": "null"}
    return [str(run_dir / "timeline"), "--config", str(EXAMPLE), "--output-dir",
            str(run_dir / "out"), *(arg for k, v in sets.items() for arg in ("--set", f"{k}={v}"))]


def run(run_dir: Path, ranks: int, args: list[str]) -> list[dict]:
    env = {"GLOG_v": "3", LAUNCHED: "1"}
    if ranks == 1:
        with open(run_dir.with_suffix(".log"), "w") as log:
            subprocess.run([sys.executable, str(WORKER), *args], env={**os.environ, **env},
                           stdout=log, stderr=subprocess.STDOUT, check=True, timeout=1800)
    else:
        run_ranks(WORKER, ranks, log_dir=run_dir / "logs", timeout=1800, args=args, env=env)
    return [json.loads(path.read_text())
            for path in sorted((run_dir / "timeline").glob("timeline_*.json"))]


def figures(timeline: dict, skip: int) -> dict[str, float]:
    """Per-step medians of one rank: step, communication, routed forward (ms), rows."""
    by_step: dict[int, list] = defaultdict(list)
    for event in timeline["events"]:
        if event[0] >= skip:
            by_step[event[0]].append(event)

    def per_step(select) -> float:
        return statistics.median(sum(select(e) for e in events) for events in by_step.values())

    def wall(names):
        return lambda e: (e[3] - e[2]) * 1e3 if e[1] in names else 0.0

    return {"step": per_step(wall({"step"})), "comm": per_step(wall(set(COMMUNICATION))),
            "routed": per_step(wall({"routed"})),
            "rows": per_step(lambda e: e[4] or 0 if e[1] == "dispatch" else 0)}


def summarise(timelines: list[dict], skip: int) -> dict[str, float]:
    each = [figures(t, skip) for t in timelines]
    return {key: statistics.mean(f[key] for f in each) for key in each[0]}


def report(results: dict[str, dict]) -> None:
    one = results["one"]["step"]
    print(f"\n{'run':16} {'step ms':>9} {'x one':>6} {'x FSDP':>7} {'comm ms':>9} "
          f"{'comm %':>7} {'routed fwd ms':>14} {'rows/step':>10}")
    for name, r in results.items():
        share = 100 * r["comm"] / r["step"]
        same_ranks = results.get(f"fsdp{RUNS[name][0]}")
        versus = f"{r['step'] / same_ranks['step']:7.2f}" if same_ranks else f"{'':7}"
        print(f"{name:16} {r['step']:9.1f} {r['step'] / one:6.2f} {versus} {r['comm']:9.1f} "
              f"{share:6.1f}% {r['routed']:14.1f} {r['rows']:10.0f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--skip", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="a tiny model (a smoke test)")
    parser.add_argument("--no-four", action="store_true", help="skip the 4-rank runs")
    parser.add_argument("--json", metavar="FILE", help="also write every figure here")
    parser.add_argument("--keep", metavar="DIR", help="keep the runs' directories here")
    args = parser.parse_args()
    model = QUICK if args.quick else MODEL
    with tempfile.TemporaryDirectory(prefix="mf-bench-experts-") as tmp:
        base = Path(args.keep or tmp)
        base.mkdir(parents=True, exist_ok=True)
        prefix = base / "tiny"
        subprocess.run([sys.executable, "-m", "mf_data", "preprocess", "--input",
                        str(ROOT / "examples" / "data" / "tiny.jsonl"), "--output-prefix",
                        str(prefix)], check=True, stdout=subprocess.DEVNULL)
        results = {}
        for name, (ranks, more) in RUNS.items():
            if args.no_four and ranks == 4:
                continue
            print(f"running {name}", flush=True)
            timelines = run(base / name, ranks,
                            train_args(base / name, prefix, ranks, args.steps, model, more))
            results[name] = summarise(timelines, args.skip)
        report(results)
        if args.json:
            Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
