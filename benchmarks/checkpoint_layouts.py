"""Checkpoints of `mf-train` by layout: bytes on disk, save time and load time, side by side
for two revisions (the format that wrote one file of everything per rank against the sharded
one), and a 4-rank FSDP checkpoint loaded onto 2 ranks against re-reading it on 4.

The model is layout_memory.py's 127M-parameter Qwen3 (float32, AdamW, global batch 4, 2
steps, a synchronous save at step 2). For each layout one real `mf-train` run saves, and a
second resumes from its checkpoint (0 steps left: it builds, loads and stops):

- **bytes on disk**: every file of the checkpoint directory; **largest rank**: the largest
  sum of one rank's files (model, optimizer, RNG);
- **save s**: the save event's time minus the step-2 line's (metrics.jsonl; the save is
  synchronous, so it is the whole save: gather, write, checksums, commit);
- **load s**: the resumed run's start line minus its launch, less the same for the saving run
  (which built the same layout without loading): the time the load adds;
- **built GiB**, **built and loaded GiB**: the largest rank's peak at the start line of the
  saving run and of the resumed one (what loading adds to the build's peak).

Usage: python benchmarks/checkpoint_layouts.py [--revisions A,B] [--layouts ...]
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from layout_memory import prepare, remove_worktrees

LAYOUTS = {
    "one process": (1, []),
    "FSDP 2": (2, ["training.local_batch_size=2",
                   "parallelism.data_parallel_shard_strategy=optim_grads_params"]),
    "FSDP 4": (4, ["training.local_batch_size=1",
                   "parallelism.data_parallel_shard_strategy=optim_grads_params"]),
    "TP 2": (2, ["parallelism.tensor_parallel=2"]),
    "PP 2": (2, ["parallelism.pipeline_parallel=2"]),
}
"""Layout -> (ranks, settings)."""
SAVE = ["checkpoint.async_save=false", "checkpoint.save_interleaved_steps=2"]
MIB = 2**20


def launch(config: Path, output: Path, ranks: int, sets: list[str], env: dict[str, str],
           log: Path) -> float:
    """Run `mf-train`; the wall time of its launch (for the start line's delay)."""
    command = ["mf-train", "--config", str(config), "--output-dir", str(output),
               *(["--nproc", str(ranks), "--timeout", "1800"] if ranks > 1 else []),
               *[arg for item in sets for arg in ("--set", item)]]
    started = time.time()
    with log.open("w") as out:
        code = subprocess.run(command, stdout=out, stderr=subprocess.STDOUT, env=env).returncode
    if code != 0:
        raise SystemExit(f"{' '.join(command)} failed ({code}); see {log}")
    return started


def events(output: Path) -> list[dict]:
    return [json.loads(line) for line in (output / "metrics.jsonl").read_text().splitlines()]


def start_delay(output: Path, launched: float) -> float:
    start = next(e for e in events(output) if e.get("event") in ("start", "resume"))
    return start["time"] - launched


def built_peak(output: Path) -> float:
    """The largest rank's peak once built (and loaded, for a resumed run), GiB."""
    return next(e["build_peak_memory_gib"] for e in events(output)
                if e.get("event") in ("start", "resume"))


def save_seconds(output: Path) -> float:
    lines = events(output)
    step = next(e["time"] for e in lines if e.get("step") == 2 and "event" not in e)
    return next(e["time"] for e in lines if e.get("event") == "save") - step


def disk(directory: Path, ranks: int) -> tuple[int, int]:
    """Bytes of every file, and the largest rank's (its `-<rank>-<world>` files)."""
    files = [path for path in directory.iterdir() if path.is_file()]
    per_rank = [sum(path.stat().st_size for path in files
                    if f"-{rank:07d}-{ranks:07d}." in path.name)
                for rank in range(ranks)]
    return sum(path.stat().st_size for path in files), max(per_rank)


def resumed_load(config: Path, directory: Path, ranks: int, sets: list[str],
                 env: dict[str, str], output: Path) -> float:
    """The start-line delay of a run on `ranks` resuming from `directory` (0 steps left)."""
    load = [*sets, f"checkpoint.load_path={directory}", "checkpoint.enable_save=false"]
    return start_delay(output, launch(config, output, ranks, load, env,
                                      output.with_suffix(".log")))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--revisions", help="git revisions, comma-separated (default: the "
                                            "installed packages)")
    parser.add_argument("--layouts", default=",".join(LAYOUTS))
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="mf-checkpoint-layouts-"))
    config, codes, trees = prepare(tmp, args.revisions)
    rows, built, directories = [], {}, {}
    for name in args.layouts.split(","):
        ranks, sets = LAYOUTS[name]
        for code, env in codes:
            saved = tmp / f"{code}-{name.replace(' ', '')}"
            built[code, name] = start_delay(saved, launch(
                config, saved, ranks, [*sets, *SAVE], env, tmp / f"{saved.name}.log"))
            directory = directories[code, name] = saved / "checkpoint" / "iteration_00000002"
            load = resumed_load(config, directory, ranks, sets, env, tmp / f"{saved.name}-r")
            rows.append((code, name, *(n / MIB for n in disk(directory, ranks)),
                         save_seconds(saved), load - built[code, name],
                         built_peak(saved), built_peak(tmp / f"{saved.name}-r")))
            print(rows[-1], flush=True)
    code, env = codes[-1]
    if (code, "FSDP 4") in directories and (code, "FSDP 2") in directories:
        ranks, sets = LAYOUTS["FSDP 2"]
        load = resumed_load(config, directories[code, "FSDP 4"], ranks, sets, env,
                            tmp / f"{code}-FSDP4-on-2")
        rows.append((code, "FSDP 4 -> FSDP 2", None, None, None, load - built[code, "FSDP 2"],
                     built_peak(directories[code, "FSDP 2"].parents[1]),
                     built_peak(tmp / f"{code}-FSDP4-on-2")))
    remove_worktrees(trees)
    print("| code | layout | bytes on disk MiB | largest rank MiB | save s | load s | "
          "built GiB | built and loaded GiB |")
    print("|---|---|---|---|---|---|---|---|")
    for code, name, *values in rows:
        cells = ["-" if value is None else f"{value:.2f}" for value in values]
        print(f"| {code} | {name} | {' | '.join(cells)} |")
    shutil.rmtree(tmp)


if __name__ == "__main__":
    main()
