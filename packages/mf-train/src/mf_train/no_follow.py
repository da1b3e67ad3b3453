"""The files a run keeps open in the directories it owns (its lock files, metrics.jsonl) are
opened without following a symbolic link (`O_NOFOLLOW`), and must be plain files: a link
planted where such a file goes would otherwise have the run lock, or append to, whatever it
points to.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path


class LinkRefused(OSError):
    """A file the run would open is a symbolic link or not a plain file; the message says
    which and what to do, in one line."""


def open_no_follow(path: Path, flags: int) -> int:
    """Open `path` as `os.open` does (created with mode 0666 less the umask when `flags` has
    `O_CREAT`), but never through a symbolic link.

    Args:
        path: the file.
        flags: `os.O_*` flags (`O_NOFOLLOW` and `O_CLOEXEC` are added).

    Returns:
        The open file descriptor (not inherited by child processes unless passed to them).

    Raises:
        LinkRefused: `path` is a symbolic link, or something other than a plain file.
        OSError: any other reason it cannot be opened.
    """
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666)
    except OSError as exc:
        if exc.errno == errno.ELOOP or path.is_symlink():
            raise LinkRefused(f"{path} is a symbolic link, which mf-train never follows "
                              "there; remove it (the run creates a plain file)") from None
        raise
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise LinkRefused(f"{path} is not a plain file; remove it (the run creates a plain "
                          "file)")
    return fd
