"""A run owns its output directory: one run at a time, and never another run's files.

`claim(output_dir, checkpoint)` is called before anything is trained (by the launcher for all
ranks under `--nproc`):

* It creates the directory (an unwritable one is one clear error) and takes an exclusive lock
  on `<output_dir>/.mf-run.lock`, held for the run's life. A second run into the directory
  fails at once, naming the holder's PID, host and start time. The lock is `flock`: the
  system releases it when the holder exits, also after `kill -9`, so a stale lock file never
  blocks anyone.
* It decides what the run does with what an earlier run left (as torchtitan does when its
  checkpoint folder holds checkpoints): when `checkpoint.load_path` is empty and the run's
  checkpoint directory holds a complete checkpoint, the run resumes from it, and says so
  loudly. An earlier run that left metrics but no checkpoint to resume from is refused (choose
  another `--output-dir`, or remove the old one), and so is a `load_path` elsewhere while the
  checkpoint directory holds another run's checkpoints (saving beside them would rotate them
  away and move their tracker back).

Checkpoints go to `<output_dir>/checkpoint` unless `checkpoint.save_path` says otherwise;
metrics.jsonl is only ever appended to.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import time
from pathlib import Path
from typing import IO

import attrs

from mf_config import CheckpointConfig

from .checkpoint import layout
from .monitor.metrics import FILE_NAME as METRICS

LOCK = ".mf-run.lock"
CHECKPOINT_DIR = "checkpoint"


class RunDirectoryError(RuntimeError):
    """The output directory cannot be used by this run; the message says why and what to do."""


@attrs.frozen
class Claim:
    """A run's hold on its output directory, and the checkpoint settings it runs with."""

    output_dir: Path
    checkpoint: CheckpointConfig
    """`save_path` resolved; `load_path` set when the run resumes an earlier one it found."""
    note: str | None
    """What the run does with an earlier run it found (to log), or None for a fresh start."""
    lock: IO[str] | None = attrs.field(eq=False, default=None)

    def release(self) -> None:
        """Let the next run in (the system also does it when this process exits)."""
        if self.lock is not None:
            self.lock.close()


def checkpoint_root(checkpoint: CheckpointConfig, output_dir: Path) -> Path:
    """Where checkpoints are saved: `checkpoint.save_path`, else `<output_dir>/checkpoint`."""
    return Path(checkpoint.save_path) if checkpoint.save_path else output_dir / CHECKPOINT_DIR


def claim(output_dir: str | os.PathLike[str], checkpoint: CheckpointConfig, *,
          lock: bool = True) -> Claim:
    """Claim `output_dir` for this run and decide how the run starts.

    Args:
        output_dir: the run's output directory (created when missing).
        checkpoint: the `checkpoint` section (where checkpoints go, what to load).
        lock: take the directory's lock (False: the launcher holds it for its ranks).

    Returns:
        The claim: the checkpoint section to run with (resuming the directory's own
        checkpoints when it has some) and a note saying what was decided.

    Raises:
        RunDirectoryError: another run holds the directory, or it holds a finished run's
            outputs that this run would overwrite, or it cannot be written.
    """
    directory = Path(output_dir)
    handle = _lock(directory) if lock else None
    try:
        checkpoint, note = _decide(directory, checkpoint)
    except RunDirectoryError:
        if handle is not None:
            handle.close()
        raise
    return Claim(directory, checkpoint, note, handle)


def _lock(directory: Path) -> IO[str]:
    try:
        directory.mkdir(parents=True, exist_ok=True)
        handle = open(directory / LOCK, "a+", encoding="utf-8")  # noqa: SIM115 - held for the run
    except OSError as exc:
        raise RunDirectoryError(f"cannot use {directory} as the output directory: "
                                f"{exc.strerror or exc}; choose a writable --output-dir") from None
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.seek(0)
        holder = handle.read().strip() or "another process"
        handle.close()
        raise RunDirectoryError(f"{directory} is in use by another run ({holder}); wait for it "
                                "to finish, or choose another --output-dir") from None
    handle.seek(0)
    handle.truncate()
    started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime())
    handle.write(f"PID {os.getpid()} on {socket.gethostname()}, started {started}\n")
    handle.flush()
    return handle


def _decide(directory: Path, checkpoint: CheckpointConfig) -> tuple[CheckpointConfig, str | None]:
    root = checkpoint_root(checkpoint, directory)
    resolved = attrs.evolve(checkpoint, save_path=str(root))
    complete = layout.complete_iterations(root)
    if checkpoint.load_path:
        if complete and not _inside(Path(checkpoint.load_path), root):
            raise RunDirectoryError(
                f"{root} holds checkpoints of an earlier run (newest: {complete[-1][1].name}), "
                f"and this run loads {checkpoint.load_path} and would save beside them, "
                "rotating them away; resume that run (leave checkpoint.load_path empty), or "
                "choose another --output-dir or checkpoint.save_path")
        return resolved, None
    if complete:
        newest = complete[-1][1]
        note = (f"{directory} holds an earlier run: resuming from its checkpoint {newest} "
                f"(choose another --output-dir to start afresh)")
        return attrs.evolve(resolved, load_path=str(root)), note
    steps = _logged_steps(directory / METRICS)
    if steps:
        raise RunDirectoryError(
            f"{directory} holds an earlier run ({METRICS} logs {steps} "
            f"step{'s' if steps != 1 else ''}) but no checkpoint "
            f"to resume from in {root}; choose another --output-dir, or remove {directory}")
    return resolved, None


def _inside(path: Path, root: Path) -> bool:
    path, root = path.resolve(), root.resolve()
    return path == root or root in path.parents


def _logged_steps(metrics: Path) -> int:
    """Step lines in an earlier run's metrics.jsonl (0 when there is none)."""
    if not metrics.is_file():
        return 0
    count = 0
    with open(metrics, encoding="utf-8") as lines:
        for line in lines:
            try:
                count += "event" not in json.loads(line)
            except ValueError:  # a line cut by a crash: not a step
                continue
    return count
