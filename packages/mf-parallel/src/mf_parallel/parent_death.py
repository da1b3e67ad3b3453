"""A process that ends when the process that started it dies: `die_with_parent`.

A job's processes form a chain: the launcher starts msrun, msrun starts the scheduler and the
workers. When a link dies without cleaning up (`kill -9` of the launcher), the processes below
it would otherwise go on with no parent: msrun and the ranks training, unwatched. Linux ends
them instead: `prctl(PR_SET_PDEATHSIG, sig)` has the kernel send `sig` to a process as soon as
its parent dies, whatever the process is doing (a rank blocked in MindSpore's C++ code holds
the interpreter's lock, so no thread of its own could notice).

The setting survives `exec`, so a command can be started with it:
`python -m mf_parallel.parent_death SIGNAL PARENT_PID COMMAND [ARG ...]` sets it, then becomes
COMMAND (the launcher starts msrun this way, with SIGINT: msrun then kills its workers and
scheduler before it exits). Elsewhere than Linux nothing is set.

Pure Python: it never imports MindSpore.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import signal
import sys
from collections.abc import Sequence

_PR_SET_PDEATHSIG = 1


def die_with_parent(sig: int) -> bool:
    """Have the kernel send `sig` to this process when its parent dies.

    Args:
        sig: the signal to receive (SIGKILL: end at once; SIGINT: let the process clean up).

    Returns:
        Whether it is set (False off Linux, or when the C library refuses). The parent may
        have died already: a caller that needs one checks `os.getppid()` afterwards.
    """
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        return libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def command(sig: int, argv: Sequence[str]) -> list[str]:
    """The command line that runs `argv` so that it receives `sig` when this process dies.

    Args:
        sig: the signal the command gets when this process (its parent) dies.
        argv: the command and its arguments.

    Returns:
        `python -m mf_parallel.parent_death SIG <this pid> *argv` (`main`).
    """
    return [sys.executable, "-m", "mf_parallel.parent_death", signal.Signals(sig).name,
            str(os.getpid()), *argv]


def main(argv: list[str]) -> None:
    """`SIGNAL PARENT_PID COMMAND [ARG ...]`: set `die_with_parent(SIGNAL)`, then exec COMMAND
    (found on PATH) in this process. Exits with status 1 at once when the parent, PARENT_PID,
    is already gone (it died before the setting took effect)."""
    if len(argv) < 3:
        print("usage: python -m mf_parallel.parent_death SIGNAL PARENT_PID COMMAND [ARG ...]",
              file=sys.stderr)
        raise SystemExit(2)
    die_with_parent(signal.Signals[argv[0]])
    if os.getppid() != int(argv[1]):
        raise SystemExit(1)
    os.execvp(argv[2], argv[2:])


if __name__ == "__main__":
    main(sys.argv[1:])
