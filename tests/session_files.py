"""Files one pytest session makes once and every test process shares.

Under pytest-xdist each worker process has a base temporary directory of its own, inside one
that they share (`session_directory`); `shared_directory` makes a directory there once, a file
lock keeping two workers from making it at once. The trainer's run cache (tests/train/runs.py)
and mf-parallel's runtime suite (tests/parallel/rank_jobs.py) build on these two.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path

from filelock import FileLock


def session_directory(tmp_path_factory) -> Path:
    """A directory every process of this pytest session sees."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def shared_directory(directory: Path, make: Callable[[Path], object]) -> Path:
    """`directory`, made by `make(directory)` unless a process of this session (an xdist
    worker, or this one) has made it already; a file lock beside it keeps two processes from
    making it at once. A directory left half made by a failed `make` is made again."""
    done = directory.with_name(directory.name + ".done")
    with FileLock(str(directory.with_name(directory.name + ".lock"))):
        if not done.exists():
            shutil.rmtree(directory, ignore_errors=True)
            make(directory)
            done.touch()
    return directory
