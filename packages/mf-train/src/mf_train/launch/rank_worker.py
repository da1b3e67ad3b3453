"""What msrun runs on each rank of `mf-train --nproc N`: validate, build, train.

Installed as the `mf-train-rank` console script, which the launcher gives msrun on every node.
Usage (by the launcher): mf-train-rank --config FILE --output-dir DIR [--set K=V ...]
The world size comes from msrun's environment (MS_WORKER_NUM: every node's ranks); every rank
validates the same configuration again (cheap), so a rank never trains on a config another
rank rejected.

A rank never outlives msrun: the kernel kills it when msrun dies (`die_with_parent`, Linux),
and a rank whose launcher is already gone when it starts exits at once. Which stop signals it
handles depends on what it is (`stop_signals`): a rank the launcher started stops at the
launcher's request (`LAUNCHER_STOP`); a rank started by hand stops on SIGTERM (after its
communication starts, MindSpore takes SIGINT), and SIGINT or SIGTERM while its modules import
ends it with one line (`script.stopped_while_starting`), as a SIGINT before training does;
msrun's scheduler (the same command, with `MS_ROLE=MS_SCHED`) handles none, so that ending
the job ends it at once.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys

from mf_train.launch.script import stopped_while_starting
from mf_train.launch.stop_signals import LAUNCHED, LAUNCHER_PID, LAUNCHER_STOP, StopSignals

PROGRAM = "mf-train-rank"


def main() -> int:
    """Entry point of the `mf-train-rank` script."""
    parent = os.getppid()
    by_hand = os.environ.get(LAUNCHED) != "1" and os.environ.get("MS_ROLE") != "MS_SCHED"
    with stopped_while_starting(PROGRAM) if by_hand else contextlib.nullcontext():
        from mf_parallel.parent_death import die_with_parent

        die_with_parent(signal.SIGKILL)
        if os.getppid() != parent or not _launcher_alive():
            return 1  # msrun or the launcher died before this rank started: nothing to join
        from mf_train.launch.cli import run_training
    if os.environ.get("MS_ROLE") != "MS_SCHED":  # the launcher reads where the rank is
        from mf_parallel.rank_progress import start_recording

        start_recording(int(os.environ.get("RANK_ID", "0")))
    try:
        return run_training(sys.argv[1:], world_size=int(os.environ["MS_WORKER_NUM"]),
                            signals=_stop_signals())
    except KeyboardInterrupt:  # by hand, before MindSpore's communication takes SIGINT
        print(f"{PROGRAM}: interrupted (SIGINT)", file=sys.stderr)
        return 128 + signal.SIGINT


def _launcher_alive() -> bool:
    """Whether the launcher that started this rank's job still runs (True when the job was
    started by hand: there is no launcher)."""
    import psutil

    pid = os.environ.get(LAUNCHER_PID)
    if pid is None:
        return True
    try:
        return psutil.Process(int(pid)).status() != psutil.STATUS_ZOMBIE
    except (psutil.Error, ValueError):
        return False


def _stop_signals() -> StopSignals:
    if os.environ.get("MS_ROLE") == "MS_SCHED":
        return StopSignals(())
    if os.environ.get(LAUNCHED) == "1":
        return StopSignals((LAUNCHER_STOP,), abort=None)
    return StopSignals((signal.SIGTERM,))


if __name__ == "__main__":
    raise SystemExit(main())
