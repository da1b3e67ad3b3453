"""Per-rank memory of data parallel against ZeRO-1 (`optim`), ZeRO-2 (`optim_grads`) and
FSDP (`optim_grads_params`).

Each variant trains a stack of 1024 x 1024 linear layers (16M parameters by default; each
layer is one FSDP unit, reshard policy `default`) for 3 AdamW steps on 2 and on 4 msrun
ranks. Per rank, it reports the bytes kept between steps for parameters, gradients and
optimizer state (from the tensors the strategy holds) and the measured increase of the
process's peak resident memory (ru_maxrss) over the steps, from after the model and the
strategy's state exist; it counts gradients and the transient buffers of the reductions.
Usage: python benchmarks/sharded_memory.py [--millions M]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
from pathlib import Path

from mf_parallel.launch import run_ranks

WORKER = Path(__file__).resolve().parent / "sharded_memory_worker.py"
MIB = 2**20


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--millions", type=float, default=16.0)
    args = parser.parse_args()
    rows = []
    tmp = Path(tempfile.mkdtemp(prefix="mf-sharded-memory-"))  # kept if a run fails: its logs
    for world in (2, 4):
        for strategy in ("plain", "optim", "optim_grads", "optim_grads_params"):
            run_ranks(WORKER, world, log_dir=tmp / f"{strategy}{world}", timeout=900,
                      args=[str(tmp), strategy, str(args.millions)])
            ranks = [json.loads((tmp / f"{strategy}_{world}_rank{r}.json").read_text())
                     for r in range(world)]
            rows.append((world, strategy, ranks[0]["held"],
                         statistics.median(r["peak_increase_mib"] for r in ranks)))
    shutil.rmtree(tmp)
    print(f"{args.millions:g}M parameters (float32), AdamW, per rank")
    print(f"{'ranks':>5} {'strategy':<19}{'params MiB':>11}{'grads MiB':>10}{'optim MiB':>10}"
          f"{'held MiB':>9}{'peak rise MiB':>14}")
    for world, strategy, held, peak in rows:
        total = sum(held.values())
        print(f"{world:>5} {strategy:<19}{held['params'] / MIB:>11.1f}{held['grads'] / MIB:>10.1f}"
              f"{held['optimizer'] / MIB:>10.1f}{total / MIB:>9.1f}{peak:>14.1f}")


if __name__ == "__main__":
    main()
