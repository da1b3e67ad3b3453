"""What the hang watch's records and the step-time breakdown cost a step.

Each phase change costs a clock reading (always) and, under a launcher, a record written into
a memory-mapped file; each collective a record. This measures one call of each (recording on
and off, `timeit`, best of 5), counts the calls of a real step (one process of the tiny Qwen3
trained in this process with recording on: the record's count over the steps), and prints
the cost per step against the median step's wall time (`time/iteration`).

Usage: python benchmarks/rank_progress_cost.py [--steps 6] [--config examples/qwen3_tiny.yaml]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import timeit
from pathlib import Path

from mf_parallel import rank_progress

ROOT = Path(__file__).resolve().parents[1]


def per_call(statement: str) -> float:
    """Seconds of one call, best of 5 rounds of 20000."""
    return min(timeit.repeat(statement, globals={"rank_progress": rank_progress},
                             number=20000, repeat=5)) / 20000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--config", default=str(ROOT / "examples" / "qwen3_tiny.yaml"))
    args = parser.parse_args()
    off_phase = per_call("rank_progress.phase('data')")
    off_collective = per_call("rank_progress.collective('all_reduce', 'data')")
    with tempfile.TemporaryDirectory() as scratch:
        scratch = Path(scratch)
        rank_progress.start_recording(0, str(scratch / "progress"))
        on_phase = per_call("rank_progress.phase('data')")
        on_collective = per_call("rank_progress.collective('all_reduce', 'data')")
        corpus = scratch / "tiny_text_document"
        subprocess.run([sys.executable, "-m", "mf_data", "preprocess", "--input",
                        str(ROOT / "examples" / "data" / "tiny.jsonl"), "--output-prefix",
                        str(corpus)], check=True, capture_output=True)
        from mf_train.launch.cli import run

        before = rank_progress.read(scratch / "progress", 0).beats
        output = scratch / "run"
        sets = [f"train_dataset.dataloader.config.data_path=['1','{corpus}']",
                f"training.steps={args.steps}", "checkpoint.enable_save=false"]
        assert run(["--config", args.config, "--output-dir", str(output),
                    *[arg for value in sets for arg in ("--set", value)]]) == 0
        beats = rank_progress.read(scratch / "progress", 0).beats - before
        lines = [json.loads(line) for line in (output / "metrics.jsonl").read_text().splitlines()]
        iterations = [line["time/iteration"] for line in lines if "event" not in line][1:]
    step = statistics.median(iterations)
    calls = beats / args.steps  # the build's records counted too: an upper bound
    cost = calls * max(on_phase, on_collective)
    print(f"one call: phase {off_phase * 1e6:.2f} us unrecorded, {on_phase * 1e6:.2f} us "
          f"recorded; collective {off_collective * 1e6:.2f} / {on_collective * 1e6:.2f} us")
    print(f"records per step (upper bound, the build's included): {calls:.0f}")
    print(f"median step (time/iteration, steps 2-{args.steps}): {step * 1e3:.1f} ms; "
          f"records: {cost * 1e6:.0f} us a step = {cost / step * 100:.3f} %")


if __name__ == "__main__":
    main()
