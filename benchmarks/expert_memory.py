"""Per-rank memory of a DeepSeek-V3 whose routed experts dominate, under expert parallelism.

examples/deepseek_v3_tiny.yaml scaled up (hidden 512, 5 layers: one dense, 4 with 16 routed
experts of width 1024, top 2, one shared expert; vocabulary 512; float32, AdamW, sequence
128): 101M routed-expert parameters of 121M. One real `mf-train --nproc N` run per layout,
global batch 4 (one micro-batch per rank), 2 steps and a checkpoint:

- `one`: one process (local batch 4);
- `ep2`: expert parallel 2 on 2 ranks (each holds 8 experts, no other rank holds them: their
  AdamW state whole; the rest under FSDP over the 2);
- `ep2_fsdp2`: expert parallel 2 x FSDP 2 on 4 ranks (the rest sliced over 4; each rank's
  8 experts sliced over its 2-rank expert-data group: half their AdamW state);
- `ep2_zero2`: expert parallel 2 x ZeRO-2 on 4 ranks (the experts' gradients and AdamW state
  sliced over the expert-data group as the rest's over 4; parameters whole);
- `fsdp4`: FSDP on 4 ranks, no expert parallelism (all 16 experts in the flat buffers,
  sliced over 4 and gathered layer by layer).

Columns as layout_memory.py's (built, training, whole run, mf-memory's estimate), and
mf-memory's figure for the optimizer state a rank holds. `--revisions A,B` measures each git
revision's packages side by side in the same run.
Usage: python benchmarks/expert_memory.py [--layouts ep2,ep2_fsdp,fsdp] [--revisions ...]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import layout_memory  # a sibling script: corpus, polling, worktrees

SIZES = {"hidden_size": 512, "moe_intermediate_size": 1024, "intermediate_size": 1408,
         "num_hidden_layers": 5, "n_routed_experts": 16}
LAYOUTS = {  # name: (ranks, --set arguments)
    "one": (1, ["training.local_batch_size=4"]),
    "ep2": (2, ["parallelism.expert_parallel=2", "training.local_batch_size=2"]),
    "ep2_fsdp2": (4, ["parallelism.expert_parallel=2"]),
    "ep2_zero2": (4, ["parallelism.expert_parallel=2",
                      "parallelism.data_parallel_shard_strategy=optim_grads"]),
    "fsdp4": (4, []),
}
GIB = 2**30


def config_text(data_prefix: Path) -> str:
    """examples/deepseek_v3_tiny.yaml scaled up, 2 steps, saved once, one sample per rank
    (global batch 4: 4 ranks)."""
    text = layout_memory.scaled_example(
        "deepseek_v3_tiny.yaml", data_prefix, SIZES,
        {"steps: 60": "steps: 2", "save_interleaved_steps: 30": "save_interleaved_steps: 2",
         "local_batch_size: 2": "local_batch_size: 1"})
    return text[:text.index("monitor:")]


def estimate(config_path: Path, layout: str) -> tuple[float | None, float | None]:
    """mf-memory's whole estimate and its optimizer-state figure for one rank, GiB."""
    from mf_config import load_config
    from mf_memory.estimate import estimate as memory_estimate

    ranks, sets = LAYOUTS[layout]
    try:
        result = memory_estimate(load_config(config_path, sets), ranks)
    except Exception as exc:  # an estimate that fails is reported, not fatal
        print(f"estimate failed: {exc}", file=sys.stderr)
        return None, None
    return result.total / GIB, result.optimizer / GIB


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layouts", default=",".join(LAYOUTS))
    parser.add_argument("--revisions", help="git revisions to measure, comma-separated "
                                            "(default: the installed packages)")
    parser.add_argument("--jsonl", type=Path, help="append each run's figures to this file")
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="mf-expert-memory-"))  # kept if a run fails
    _, codes, trees = layout_memory.prepare(tmp, args.revisions)
    config = tmp / "deepseek_v3_121m.yaml"
    config.write_text(config_text(tmp / "docs"))
    rows, failed = [], False
    for layout in args.layouts.split(","):
        total, optimizer = estimate(config, layout)
        for code, env in codes:
            output = tmp / f"{code}-{layout}"
            ranks, sets = LAYOUTS[layout]
            launch = ["--nproc", str(ranks)] if ranks > 1 else []
            command = ["mf-train", "--config", str(config), "--output-dir", str(output),
                       *launch, *[arg for item in sets for arg in ("--set", item)]]
            rc, peaks = layout_memory.polled_peaks(command, env, tmp / f"{output.name}.log")
            built, training = layout_memory.metrics_peaks(output) if rc == 0 else (None, None)
            failed |= rc != 0
            rows.append((code, layout, built, training, max(peaks, default=None), total,
                         optimizer, rc))
            print(rows[-1], flush=True)
            if args.jsonl:
                with args.jsonl.open("a") as out:
                    out.write(json.dumps({
                        "code": code, "model": "deepseek_121m", "ranks": ranks,
                        "layout": layout, "sets": sets, "built": built, "training": training,
                        "rank_peaks": peaks, "estimate": total, "exit": rc}) + "\n")
    layout_memory.remove_worktrees(trees)
    print("| code | layout | built GiB | training GiB | whole run GiB | estimate GiB | "
          "optimizer state (estimate) GiB | exit |")
    print("|---|---|---|---|---|---|---|---|")
    for code, layout, *figures, rc in rows:
        cells = " | ".join("-" if value is None else f"{value:.2f}" for value in figures)
        print(f"| {code} | {layout} | {cells} | {rc} |")
    if not failed:
        shutil.rmtree(tmp)


if __name__ == "__main__":
    main()
