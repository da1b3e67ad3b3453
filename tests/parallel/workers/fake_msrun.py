"""msrun's part as the watch sees it, without MindSpore and without msrun's timing: start two
"workers" (writing to LOG_DIR/worker_<r>.log) and a `tail -f` of each log, then act as MODE
says and sleep (a scheduler waiting), so that the test decides what the watch can see.

Usage: fake_msrun.py LOG_DIR MODE

Each worker lives 3 s, so that the watch (every 0.2 s) finds it even on a busy machine.
Modes: `zombies` (each worker exits 0; neither is reaped: the watch sees their statuses);
`reaped` (each worker exits 0, is reaped at once and the tails are ended: as msrun after
its workers succeeded); `reaped-failed` (as `reaped`, but worker 1 exits with status 3 and
its status is logged as msrun logs it before the tails are ended); `tails-died` (the
tails end while the workers still run: a job is not ended for that).
"""

import logging
import os
import subprocess
import sys
import time
from pathlib import Path

log_dir, mode = Path(sys.argv[1]), sys.argv[2]
workers = []
for rank in (0, 1):
    code = 3 if mode == "reaped-failed" and rank == 1 else 0
    log = open(log_dir / f"worker_{rank}.log", "w")  # noqa: SIM115 (the child's stdout)
    workers.append(subprocess.Popen(
        [sys.executable, "-c", f"import time, sys; time.sleep(3); sys.exit({code})"],
        stdout=log))
tails = [subprocess.Popen(["tail", "-f", str(log_dir / f"worker_{rank}.log")])
         for rank in (0, 1)]
if mode == "tails-died":
    for tail in tails:
        os.kill(tail.pid, 9)
if mode.startswith("reaped"):
    logging.basicConfig(format="[%(levelname)s] ME(%(process)d:0,MainProcess):%(message)s",
                        stream=sys.stdout)
    for worker in workers:
        if worker.wait():
            logging.error(f"[_api.py:365] Worker process {worker.pid} exit with exception. "
                          f"Error code: {worker.returncode}.")
            sys.stdout.flush()
    for tail in tails:
        os.kill(tail.pid, 9)  # not reaped: msrun leaves them zombies
time.sleep(600)
