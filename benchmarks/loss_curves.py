"""The loss of the tiny Qwen3 example under several parallel layouts, step by step, written
into `benchmarks/results.json` (`loss_curves`) for `benchmarks/charts.py`.

Each layout is a real `mf-train` run (msrun ranks on CPU) of `examples/qwen3_tiny.yaml` on the
demo corpus that `nox -s train` builds (`output/data/`); every layout should give the one
process's losses. `python benchmarks/loss_curves.py --steps 20` (about 3 minutes on 2 cores).
"""

from __future__ import annotations

import argparse
import json
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results.json"

LAYOUTS: dict[str, tuple[int, list[str]]] = {
    "one process": (1, []),
    "FSDP 2": (2, ["parallelism.data_parallel_shard_strategy=optim_grads_params"]),
    "tensor parallel 2": (2, ["parallelism.tensor_parallel=2"]),
    "pipeline 2 (1F1B)": (2, ["parallelism.pipeline_parallel=2"]),
}
"""Layout name -> (ranks, `--set` overrides)."""


def losses(output: Path) -> list[float]:
    """The loss of every step in a run's metrics.jsonl, in step order."""
    steps = {}
    for line in (output / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        if "loss" in record and "event" not in record:
            steps[record["step"]] = record["loss"]
    return [steps[step] for step in sorted(steps)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--output", default="output/loss_curves")
    args = parser.parse_args()
    curves = {}
    for name, (nproc, settings) in LAYOUTS.items():
        output = ROOT / args.output / name.split(" (")[0].replace(" ", "_")
        command = ["mf-train", "--config", "examples/qwen3_tiny.yaml", "--output-dir",
                   str(output), "--nproc", str(nproc), "--set", f"training.steps={args.steps}",
                   "--set", "checkpoint.save_interleaved_steps=1000"]
        for setting in settings:
            command += ["--set", setting]
        subprocess.run(command, cwd=ROOT, check=True)
        curves[name] = losses(output)
        print(name, curves[name][:3], "...", curves[name][-1])
    results = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    results["loss_curves"] = {
        "title": "The loss of every layout, step by step",
        "what": f"examples/qwen3_tiny.yaml on the demo corpus, {args.steps} steps, each layout "
                "a real mf-train run (ranks on CPU).",
        "command": f"python benchmarks/loss_curves.py --steps {args.steps}",
        "config": "examples/qwen3_tiny.yaml", "layouts": curves}
    RESULTS.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
