"""Runs on every rank under msrun: several `mf-train` runs of the job's world size, one after
the other in the same process (the list is a JSON file: `[{"output": DIR, "argv": [...]}]`).

Usage: trainer_suite.py RUNS_JSON

One job for many runs instead of one `mf-train --nproc N` each: each msrun job costs 10-20 s
before its first step (msrun, a scheduler and every rank import MindSpore, then wait for the
cluster), more than a run of the tests' tiny models takes. Each run is `mf_train.launch.cli`'s
`run_training`, what `mf-train-rank` runs on a rank (MindSpore's communication starts once,
each run's plan makes the groups it needs); each run's log lines go to its own
`<output>/logs/worker_<rank>.log` too, as msrun's log of a job of its own. A run's exit
status is written to `<output>/suite_status.json` as soon as it ends; a failing run ends
the job (its peers would otherwise wait in a collective until the deadline).
"""

import json
import logging
import sys
from pathlib import Path

from mindspore import communication

from mf_train.launch.cli import run_training


def main() -> int:
    runs = json.loads(Path(sys.argv[1]).read_text())
    communication.init()  # once for every run (init_communication then reuses it)
    world, rank = communication.get_group_size(), communication.get_rank()
    # as run_training would: INFO to the job's log (which a run's own handler joins below)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    for entry in runs:
        output = Path(entry["output"])
        (output / "logs").mkdir(parents=True, exist_ok=True)
        log = logging.FileHandler(output / "logs" / f"worker_{rank}.log")  # as msrun's
        log.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
        logging.getLogger().addHandler(log)
        try:
            status = run_training(entry["argv"], world_size=world)
        finally:
            logging.getLogger().removeHandler(log)
            log.close()
        if rank == 0:
            (output / "suite_status.json").write_text(json.dumps({"status": status}))
        if status != 0:
            print(f"trainer_suite: {output} ended with status {status}", file=sys.stderr)
            return status
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
