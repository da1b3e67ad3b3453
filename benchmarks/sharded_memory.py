"""Per-rank memory of data parallel against ZeRO-1 (`optim`) and ZeRO-2 (`optim_grads`).

Each variant runs 3 AdamW steps of a parameter set (8 tensors, 16M parameters by default) on
2 and on 4 msrun ranks. Per rank, it reports the bytes kept between steps for parameters,
gradients and optimizer state (from the tensors the strategy holds) and the measured increase
of the process's peak resident memory (ru_maxrss) over the steps, which also counts the
transient buffers of the reduction (measured from after the parameters and one set of
gradients exist). Usage: python benchmarks/sharded_memory.py [--millions M]
"""

from __future__ import annotations

import argparse
import json
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
    with tempfile.TemporaryDirectory() as tmp:
        for world in (2, 4):
            for strategy in ("plain", "optim", "optim_grads"):
                run_ranks(WORKER, world, log_dir=Path(tmp) / f"{strategy}{world}", timeout=900,
                          args=[tmp, strategy, str(args.millions)])
                ranks = [json.loads((Path(tmp) / f"{strategy}_{world}_rank{r}.json").read_text())
                         for r in range(world)]
                held = ranks[0]["held"]
                rows.append((world, strategy, held,
                             statistics.median(r["peak_increase_mib"] for r in ranks)))
    print(f"{args.millions:g}M parameters (float32), AdamW, per rank")
    print(f"{'ranks':>5} {'strategy':<12}{'params MiB':>11}{'grads MiB':>10}{'optim MiB':>10}"
          f"{'held MiB':>9}{'peak rise MiB':>14}")
    for world, strategy, held, peak in rows:
        total = sum(held.values())
        print(f"{world:>5} {strategy:<12}{held['params'] / MIB:>11.1f}{held['grads'] / MIB:>10.1f}"
              f"{held['optimizer'] / MIB:>10.1f}{total / MIB:>9.1f}{peak:>14.1f}")


if __name__ == "__main__":
    main()
