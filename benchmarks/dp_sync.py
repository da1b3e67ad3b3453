"""Gradient synchronisation on 2 ranks: flat buckets against one all-reduce per parameter.

Both variants reduce the same gradients (a small GPT's 42 tensors, about 7M parameters) in the
same run on the same two msrun ranks on 127.0.0.1; the median time of each and their ratio
are printed. Usage: python benchmarks/dp_sync.py [--repeats N]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

from mf_parallel.launch import run_ranks

WORKER = Path(__file__).resolve().parent / "dp_sync_worker.py"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--bucket-mib", default="1,4,25",
                        help="bucket sizes to compare, comma-separated (default: 1,4,25)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "result.json"
        run_ranks(WORKER, 2, log_dir=Path(tmp) / "logs", timeout=600,
                  args=[str(out), str(args.repeats), args.bucket_mib])
        result = json.loads(out.read_text())
    baseline = statistics.median(result["per_parameter"])
    print(f"{result['parameters']:,} parameters in {result['tensors']} tensors, 2 ranks (CPU, "
          f"mccl), {args.repeats} repeats, median per synchronisation")
    print(f"{'variant':<40}{'median ms':>10}{'per-param / this':>18}")
    print(f"{'one all-reduce per parameter':<40}{baseline * 1000:>10.1f}{1.0:>18.2f}")
    for size, run in result["bucketed"].items():
        median = statistics.median(run["times"])
        name = f"buckets of {float(size):g} MiB ({run['buckets']} all-reduces)"
        print(f"{name:<40}{median * 1000:>10.1f}{baseline / median:>18.2f}")


if __name__ == "__main__":
    main()
