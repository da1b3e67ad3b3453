"""A run ends when its owner says so: SIGINT (Ctrl-C), SIGTERM and SIGHUP (the terminal
closed) ask it to stop.

The first signal is only recorded (`StopSignals.requested`): the training loop acts on it at
its next step boundary, where all ranks agree to stop at the same step, save a checkpoint and
end (`Trainer.train`); the process then prints one line saying where it saved and exits with
status 128 + the signal's number (130 for SIGINT, 143 for SIGTERM). A second signal aborts at
once (`abort_now`): one line, the same status, nothing saved (the newest complete checkpoint
stays: checkpoints are written atomically).

Under `mf-train --nproc N` the launcher receives the signals and forwards its own,
`LAUNCHER_STOP` (SIGUSR1), to every rank (`mf_parallel.launch.Forward`): after their
communication starts, MindSpore's own handler takes SIGINT in a rank (and breaks its
connections), and SIGTERM stays what ends a rank at once when the launcher ends the job.

Handlers are installed with `SA_RESTART` (`signal.siginterrupt(sig, False)`), so a system call
that MindSpore's C++ code was making when the signal came is resumed rather than failed.
Pure Python: no MindSpore here.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable, Sequence
from pathlib import Path
from types import FrameType
from typing import Any

STOP = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
"""The signals that stop a run (a single process, the launcher)."""
LAUNCHER_STOP = signal.SIGUSR1
"""What the launcher sends its ranks to ask them to stop at the next step boundary."""
LAUNCHED = "MF_TRAIN_LAUNCHED"
"""Set for the ranks the launcher starts: it holds the run's locks for them, and reports a
stop (they exit with status 0 once stopped)."""
EXIT_AT = "MF_TRAIN_EXIT_AT"
"""`--exit-duration`'s end as Unix seconds, which the launcher gives its ranks (so that every
rank and every restart counts from the launcher's start)."""
LAUNCHER_PID = "MF_TRAIN_LAUNCHER_PID"
"""The launcher's PID, for its ranks: a rank that starts after its launcher died exits at once
(`rank_worker`)."""


def status(signum: int) -> int:
    """The exit status of a run stopped by `signum` (the shell's convention: 128 + number)."""
    return 128 + signum


def name(signum: int) -> str:
    """`SIGINT` for 2."""
    return signal.Signals(signum).name


def abort_now(signum: int, checkpoints: Path | None = None) -> None:
    """Say so in one line, with whether a checkpoint is left in `checkpoints` (`aborted_line`),
    and exit at once with `status(signum)`, saving nothing (written with `os.write`: the main
    thread may be in the middle of a print when the handler runs)."""
    os.write(2, f"mf-train: {aborted_line(signum, checkpoints)}\n".encode())
    os._exit(status(signum))


def aborted_line(signum: int, checkpoints: Path | None) -> str:
    """`second SIGINT: stopped at once, nothing saved; the newest complete checkpoint is
    .../iteration_00000004 (run the same command to resume from it)`, or that there is none
    (the same command then starts afresh); `checkpoints` None: not known yet."""
    head = f"second {name(signum)}: stopped at once, nothing saved"
    if checkpoints is None:
        return head
    from ..checkpoint.layout import complete_iterations  # pure Python, on first use

    complete = complete_iterations(checkpoints)
    if not complete:
        return (f"{head}; no checkpoint was saved in {checkpoints} (run the same command to "
                "start afresh)")
    return (f"{head}; the newest complete checkpoint is {complete[-1][1]} (run the same "
            "command to resume from it)")


def _leave_the_terminal() -> None:
    """After SIGHUP, the output that went to the terminal goes to /dev/null: writing to a
    terminal that hung up fails (EIO), which would end the run before it saves. The run's log
    file keeps every line."""
    null = os.open(os.devnull, os.O_WRONLY)
    try:
        for fd in (1, 2):
            if os.isatty(fd):
                os.dup2(null, fd)
    finally:
        os.close(null)


class StopSignals:
    """Records the first stop signal; hands the second to `abort`. A context manager: the
    handlers are installed on entry (from the main thread) and the previous ones put back on
    exit, unless a stop was requested (then the process is ending: see `_exit_quietly`).

    Args:
        signals: the signals to handle (empty: none, e.g. in msrun's scheduler process).
        abort: called with a second signal's number and `checkpoints` (default
            `abort_now`); None: every
            signal is only recorded (the launcher's ranks: the launcher ends the job itself
            on a second signal).
    """

    def __init__(self, signals: Sequence[int] = STOP, *,
                 abort: Callable[[int], Any] | None = abort_now):
        self.signals = tuple(signals)
        self.abort = abort
        self.requested: int | None = None
        """The first stop signal received, or None."""
        self.aborted = False
        """Whether `abort` was called (it is called once: later signals are ignored, so that
        they cannot interrupt what it set going)."""
        self._previous: dict[int, Any] = {}
        self.checkpoints: Path | None = None
        """Where the run saves, once known: what a second signal's line speaks of."""

    def __call__(self) -> bool:
        """Whether a stop was requested (what the training loop asks at each step boundary)."""
        return self.requested is not None

    def __enter__(self) -> StopSignals:
        for sig in self.signals:
            self._previous[sig] = signal.signal(sig, self._handle)
            signal.siginterrupt(sig, False)
        return self

    def __exit__(self, *exc: object) -> None:
        stopping = self.requested is not None and self.abort is not None
        for sig, previous in self._previous.items():
            if stopping:  # the process ends: another signal now exits at once, without a word
                signal.signal(sig, self._exit_quietly)
            else:
                signal.signal(sig, signal.SIG_DFL if previous is None else previous)
        self._previous.clear()

    def _exit_quietly(self, signum: int, frame: FrameType | None) -> None:
        """After a stop, the run has said where it stopped: a signal while the process exits
        (MindSpore's teardown takes about a second) ends it at once with the stop's status,
        rather than with a KeyboardInterrupt traceback."""
        os._exit(status(self.requested or signum))

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if signum == signal.SIGHUP:
            _leave_the_terminal()
        if self.requested is None:
            self.requested = signum
        elif self.abort is not None and not self.aborted:
            self.aborted = True
            self.abort(signum, self.checkpoints)
