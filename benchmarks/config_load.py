"""How long `mf-config validate` takes, side by side with plain YAML parsing of the same file.

Each measurement is a fresh process (import cost included, as a user pays it):
  baseline: python -c "import yaml; yaml.safe_load(open(FILE))"
  mf-config: mf-config validate FILE   (the console script beside this interpreter: import,
             load, structure, every rule, and the keys of the open sections against the
             settings the installed component packages declare)
  validate, no components: the same with the component packages' entry points hidden, as
             when mf-config is installed alone (their sections are then only noted)
  import mf_config: python -c "import mf_config" (the import alone, for orientation)
  dependencies: python -c "import yaml, attrs, cattrs" (the floor mf-config cannot go below)
The runs are interleaved so that machine noise hits all of them alike; the medians and their
ratio are printed. With `--instructions`, each command also runs once under valgrind's
callgrind, whose instruction count does not depend on what else the machine is doing (wall
times here move by 10-30 % from run to run); it leaves out the cost of reading files and
faulting pages in, so its ratios are lower than the wall-time ones.
Usage: python benchmarks/config_load.py [FILE] [--runs N] [--instructions]
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_FILE = ROOT / "examples" / "spec_skeleton.yaml"


def commands(file: Path) -> dict[str, list[str]]:
    py = sys.executable
    script = Path(py).parent / "mf-config"
    validate = [str(script)] if script.exists() else [py, "-m", "mf_config"]
    alone = ("import mf_config.components as c; c._ENTRY_POINTS.update((k, ()) for k in "
             "c.KINDS); from mf_config.cli import main; raise SystemExit(main(['validate', "
             f"{str(file)!r}]))")
    return {
        "yaml.safe_load (baseline)": [
            py, "-c", f"import yaml; yaml.safe_load(open({str(file)!r}))"],
        "mf-config validate": [*validate, "validate", str(file)],
        "validate, no components": [py, "-c", alone],
        "import mf_config": [py, "-c", "import mf_config"],
        "import yaml, attrs, cattrs": [py, "-c", "import yaml, attrs, cattrs"],
        "python -c pass": [py, "-c", "pass"],
    }


def wall(command: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - start


def instructions(command: list[str]) -> int:
    """Instructions the command executes, counted by callgrind."""
    result = subprocess.run(["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null",
                             *command], check=True, capture_output=True, text=True)
    match = re.search(r"Collected : (\d+)", result.stderr)
    assert match, result.stderr
    return int(match.group(1))


def print_instructions(runs: dict[str, list[str]]) -> None:
    counts = {name: instructions(command) for name, command in runs.items()}
    baseline = counts["yaml.safe_load (baseline)"]
    print(f"{'command':<28}{'instructions':>14}{'x baseline':>12}")
    for name, count in counts.items():
        print(f"{name:<28}{count / 1e6:>13.0f}M{count / baseline:>12.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("file", nargs="?", type=Path, default=DEFAULT_FILE)
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--instructions", action="store_true",
                        help="also count instructions with valgrind's callgrind")
    args = parser.parse_args()
    runs = commands(args.file)
    for command in runs.values():  # warm the page cache and the .pyc files
        wall(command)
    times: dict[str, list[float]] = {name: [] for name in runs}
    for index in range(args.runs):
        for name, command in runs.items():
            times[name].append(wall(command))
        print(f"\rrun {index + 1}/{args.runs}", end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)
    baseline = statistics.median(times["yaml.safe_load (baseline)"])
    print(f"file: {args.file.name}, {args.runs} runs each, median wall time of a fresh process")
    fastest = min(times["yaml.safe_load (baseline)"])
    print(f"{'command':<28}{'median ms':>10}{'min ms':>9}{'x baseline':>12}{'x (min)':>9}")
    for name, values in times.items():
        median = statistics.median(values)
        print(f"{name:<28}{median * 1000:>10.1f}{min(values) * 1000:>9.1f}"
              f"{median / baseline:>12.2f}{min(values) / fastest:>9.2f}")
    if args.instructions:
        print_instructions(runs)


if __name__ == "__main__":
    main()
