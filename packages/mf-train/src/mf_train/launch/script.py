"""The `mf-train` console script: a stop signal while the launcher's own modules import (about
two seconds: mf-config, mf-data, mf-parallel, the checkpoint readers) ends it with one line,
not a KeyboardInterrupt traceback.

Python raises KeyboardInterrupt for SIGINT from its start; `cli` installs the run's stop
handlers (`stop_signals`) only once it is imported. Until then, this module's handler answers
SIGINT, SIGTERM and SIGHUP: nothing has been read or written yet, so it says so and exits
with 128 + the signal's number. Past that, a SIGINT that reaches a command without its own handling
(`mf-train export-hf`) is one line and status 130. `mf-train-rank` started by hand does the
same (`rank_worker`). No import here but the standard library's.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from collections.abc import Iterator
from types import FrameType


def main() -> int:
    """Entry point of the `mf-train` script (`cli.run`, once imported)."""
    with stopped_while_starting("mf-train"):
        from .cli import run
    try:
        return run()
    except KeyboardInterrupt:  # a training run handles SIGINT itself: `mf-train export-hf`
        print("mf-train: interrupted (SIGINT)", file=sys.stderr)
        return 128 + signal.SIGINT


@contextlib.contextmanager
def stopped_while_starting(program: str) -> Iterator[None]:
    """Inside the block (the program's imports), SIGINT, SIGTERM and SIGHUP end the process at once
    with one line on stderr and status 128 + the signal's number; the handlers before the
    block are back after it."""

    def stop(signum: int, _frame: FrameType | None) -> None:
        os.write(2, f"{program}: stopped by {signal.Signals(signum).name} while starting; "
                    "nothing was run or written\n".encode())
        os._exit(128 + signum)

    previous = {signum: signal.signal(signum, stop)
                for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
