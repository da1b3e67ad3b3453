"""The `mf-train` console script: a stop signal while the launcher's own modules import (about
two seconds: mf-config, mf-data, mf-parallel, the checkpoint readers) ends it with one line,
not a KeyboardInterrupt traceback.

Python raises KeyboardInterrupt for SIGINT from its start; `cli` installs the run's stop
handlers (`stop_signals`) only once it is imported. Until then, this module's handler answers
SIGINT and SIGTERM: nothing has been read or written yet, so it says so and exits with 128 +
the signal's number. Past that, a SIGINT that reaches a command without its own handling
(`mf-train export-hf`) is one line and status 130. No import here but the standard
library's.
"""

from __future__ import annotations

import os
import signal
import sys
from types import FrameType


def main() -> int:
    """Entry point of the `mf-train` script (`cli.run`, once imported)."""
    previous = {signum: signal.signal(signum, _stopped_while_starting)
                for signum in (signal.SIGINT, signal.SIGTERM)}
    from .cli import run

    for signum, handler in previous.items():
        signal.signal(signum, handler)
    try:
        return run()
    except KeyboardInterrupt:  # a training run handles SIGINT itself: `mf-train export-hf`
        print("mf-train: interrupted (SIGINT)", file=sys.stderr)
        return 128 + signal.SIGINT


def _stopped_while_starting(signum: int, _frame: FrameType | None) -> None:
    os.write(2, f"mf-train: stopped by {signal.Signals(signum).name} while starting; nothing "
                "was run or written\n".encode())
    os._exit(128 + signum)
