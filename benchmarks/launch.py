"""What starting and ending a job costs: `mf-train` on one process against `--nproc 2` and
`--nproc 4`, side by side with earlier commits.

The tiny Qwen3 of examples/qwen3_tiny.yaml (global batch 4: local batch 4 / ranks, so 1, 2
or 4 ranks; the example's data-parallel strategy), 2 steps and its final checkpoint, on the
Python-docs corpus `nox -s train` builds. Each run is the
console script in a fresh process; from its wall clock and the timestamps of metrics.jsonl:

- **to start**: from the command to the `start` event (launch, imports, configuration, the
  model and optimizer built: the largest part of a short job);
- **steps**: from the `start` event to the last record (the two steps and the save);
- **to exit**: from the last record to the command's exit (the ranks' teardown, and with
  `--nproc` the end of msrun's scheduler and of the launcher);
- **wall**: the whole command.

`--revisions A,B` measures each git revision's packages (a temporary worktree first on
PYTHONPATH, as benchmarks/layout_memory.py does) instead of the installed ones, interleaved
round by round so that a busy machine affects each alike. Medians over `--rounds`, with the
range.

Usage: python benchmarks/launch.py [--ranks 1,2,4] [--rounds 3] [--revisions A,B]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from layout_memory import make_corpus, remove_worktrees, revision_env, scaled_example

PHASES = ("to start", "steps", "to exit", "wall")


def prepare(tmp: Path) -> Path:
    """examples/qwen3_tiny.yaml at 2 steps on the Python-docs corpus, preprocessed in `tmp`."""
    config = tmp / "qwen3_tiny.yaml"
    config.write_text(scaled_example("qwen3_tiny.yaml", make_corpus(tmp), {},
                                     {"steps: 50": "steps: 2"}))
    return config


def one_run(ranks: int, config: Path, output: Path, env: dict[str, str]) -> dict[str, float]:
    """One `mf-train` run of the tiny model on `ranks` processes: its phases (seconds)."""
    command = ["mf-train", "--config", str(config), "--output-dir", str(output),
               "--set", f"training.local_batch_size={4 // ranks}",
               "--set", "training.global_batch_size=4"]
    if ranks > 1:
        command += ["--nproc", str(ranks)]
    began = time.time()
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    ended = time.time()
    if done.returncode:
        raise SystemExit(f"{' '.join(command)} failed ({done.returncode}):\n{done.stderr[-2000:]}")
    records = [json.loads(line) for line in (output / "metrics.jsonl").read_text().splitlines()]
    start = next(r["time"] for r in records if r.get("event") == "start")
    last = max(r["time"] for r in records if "time" in r)
    return {"to start": start - began, "steps": last - start, "to exit": ended - last,
            "wall": ended - began}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", default="1,2,4")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--revisions", help="git revisions to measure, comma-separated "
                                            "(default: the installed packages)")
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="mf-launch-"))
    config = prepare(tmp)
    codes, trees = [("installed", None)], []
    if args.revisions:
        codes = []
        for revision in args.revisions.split(","):
            env, tree = revision_env(revision, tmp)
            codes.append((revision, env))
            trees.append(tree)
    ranks = [int(r) for r in args.ranks.split(",")]
    if any(n not in (1, 2, 4) for n in ranks) or args.rounds < 1:
        parser.error("--ranks takes 1, 2 or 4 (global batch 4), --rounds at least 1")
    times: dict[tuple[str, int], list[dict[str, float]]] = {}
    try:
        for round_ in range(args.rounds + 1):  # round 0 warms the caches (dataset index)
            for n in ranks:
                for code, env in codes:
                    output = tmp / f"run-{code}-{n}-{round_}"
                    phases = one_run(n, config, output, env or dict(os.environ))
                    shutil.rmtree(output)
                    if round_:
                        times.setdefault((code, n), []).append(phases)
                        print(code, n, {k: round(v, 2) for k, v in phases.items()}, flush=True)
    finally:
        remove_worktrees(trees)
    print("| code | ranks | " + " | ".join(f"{p} (s)" for p in PHASES) + " |")
    print("|---|---|" + "---|" * len(PHASES))
    for (code, n), runs in times.items():
        cells = []
        for phase in PHASES:
            values = [run[phase] for run in runs]
            cells.append(f"{statistics.median(values):.1f} ({min(values):.1f}-"
                         f"{max(values):.1f})")
        print(f"| {code} | {n} | " + " | ".join(cells) + " |")
    shutil.rmtree(tmp)


if __name__ == "__main__":
    main()
