"""A run owns the directories it writes: one run at a time, and never another run's files.

`claim(output_dir, checkpoint)` is called before anything is trained (by the launcher for all
ranks under `--nproc`):

* It creates the output directory and the checkpoint directory (an unwritable one is one
  clear error) and takes an exclusive lock on `.mf-run.lock` in each, held for the run's life,
  and in the TensorBoard and profiler directories when they lie elsewhere: every directory
  the run writes is covered, so two runs with different output directories but
  one `checkpoint.save_path` cannot both run (the second would resume from the first's
  checkpoints as they are written). A second run into a directory in use fails at once, naming
  the holder's PID, host and start time. The lock is `flock`: the system releases it when every
  process holding it has exited, also after `kill -9`, so a stale lock file never blocks
  anyone. The launcher of `--nproc` passes its locks to msrun, so they stay held as long as the
  job's processes run. A lock file (and metrics.jsonl, logs/train.log) is never opened
  through a symbolic link (`no_follow`): a link there is refused, and so is one at or inside
  a directory the run, MindSpore or msrun writes (logs, TensorBoard events, profiles, MoE
  counts, hang reports), before anything writes through it.
* It decides what the run does with what an earlier run left (as torchtitan does when its
  checkpoint folder holds checkpoints): when `checkpoint.load_path` is empty and the run's
  checkpoint directory holds a complete checkpoint, the run resumes from it, and says so
  loudly. An earlier run that left metrics but no checkpoint to resume from (it failed, hung
  or was stopped before its first save) is started afresh, and says so, when the directory
  holds nothing but what a run writes: the same command runs again. Beside other files it is
  refused (choose another `--output-dir`, or remove the old one), and so is a `load_path`
  elsewhere while the checkpoint directory holds another run's checkpoints (saving beside
  them would rotate them away and move their tracker back).
* A `checkpoint.load_path` at a directory holding no checkpoint is refused (a wrong
  directory would have the run train from scratch), unless it is the run's own save path.
* A run never removes what it did not write: a directory in the checkpoint directory named as
  a checkpoint (`iteration_00000001`) that mf-train did not write (no `common.json` of its
  format) would be replaced by that step's save or rotated away, so the run is refused, naming
  it.

Checkpoints go to `<output_dir>/checkpoint` unless `checkpoint.save_path` says otherwise;
metrics.jsonl is only ever appended to.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import time
from collections.abc import Sequence
from pathlib import Path
from typing import IO

import attrs

from mf_config import CheckpointConfig, ConfigError
from mf_config.yaml_source import load_text

from ..checkpoint import layout
from ..checkpoint.errors import CheckpointError
from ..checkpoint.hf import is_hf_checkpoint
from ..monitor.metrics import FILE_NAME as METRICS
from ..no_follow import LinkRefused, open_no_follow

LOCK = ".mf-run.lock"
CHECKPOINT_DIR = "checkpoint"
TRAIN_LOG = "logs/train.log"
"""A single process's log (ranks started by msrun log to `logs/worker_<rank>.log`)."""
APPENDED = (METRICS, TRAIN_LOG)
"""The files of the output directory a run appends to: never through a symbolic link."""
HANG_DIR = "hang"
"""Where the launcher writes each rank's stacks and records when the job hangs."""
WRITTEN_DIRS = ("logs", "tensorboard", "moe_tokens", "profile", HANG_DIR)
"""The directories a run writes in its output directory (by default), it or MindSpore and
msrun: never a symbolic link, and no symbolic link inside (`_refuse_links`)."""
RUN_WRITES = frozenset({METRICS, LOCK, CHECKPOINT_DIR, *WRITTEN_DIRS})
"""The names a run creates in its output directory (by default): an earlier run's directory
holding nothing else, and no checkpoint, is started afresh (nothing of it is overwritten:
metrics.jsonl and the logs are appended to)."""


class RunDirectoryError(RuntimeError):
    """The output directory cannot be used by this run; the message says why and what to do."""


@attrs.frozen
class Claim:
    """A run's hold on the directories it writes, and the checkpoint settings it runs with."""

    output_dir: Path
    checkpoint: CheckpointConfig
    """`save_path` resolved; `load_path` set when the run resumes an earlier one it found."""
    note: str | None
    """What the run does with an earlier run it found (to log), or None for a fresh start."""
    locks: tuple[IO[str], ...] = attrs.field(eq=False, default=())
    """The open lock files (none when the launcher holds them for this rank)."""

    def release(self) -> None:
        """Let the next run in (the system also does it when this process exits)."""
        for lock in self.locks:
            lock.close()

    def lock_fds(self) -> tuple[int, ...]:
        """The lock files' descriptors, for a child process to hold them too."""
        return tuple(lock.fileno() for lock in self.locks if not lock.closed)


def checkpoint_root(checkpoint: CheckpointConfig, output_dir: Path) -> Path:
    """Where checkpoints are saved: `checkpoint.save_path`, else `<output_dir>/checkpoint`."""
    return Path(checkpoint.save_path) if checkpoint.save_path else output_dir / CHECKPOINT_DIR


def claim(output_dir: str | os.PathLike[str], checkpoint: CheckpointConfig, *,
          lock: bool = True, also: Sequence[tuple[Path, str]] = ()) -> Claim:
    """Claim the directories this run writes and decide how the run starts.

    Args:
        output_dir: the run's output directory (created when missing).
        checkpoint: the `checkpoint` section (where checkpoints go, what to load).
        lock: lock the output directory and, when saving, the checkpoint directory (False:
            the launcher holds the locks for its ranks).
        also: other directories the run writes, each with the option that names it
            (`monitor.tensorboard.output_dir`, `profiler.output_path`): locked too when they
            lie outside the output directory.

    Returns:
        The claim: the checkpoint section to run with (resuming the directory's own
        checkpoints when it has some) and a note saying what was decided.

    Raises:
        RunDirectoryError: another run holds one of the directories, or they hold an
            earlier run's outputs or a user's files that this run would overwrite, or they
            cannot be written.
    """
    directory = Path(output_dir)
    owned: list[IO[str]] = []
    try:
        _refuse_links(directory, also)  # before a lock file is created through one
        if lock:
            for path, option in _written(directory, checkpoint, also):
                owned.append(_lock(path, option))
        checkpoint, note = _decide(directory, checkpoint)
    except RunDirectoryError:
        for handle in owned:
            handle.close()
        raise
    return Claim(directory, checkpoint, note, tuple(owned))


def _written(directory: Path, checkpoint: CheckpointConfig,
             also: Sequence[tuple[Path, str]]) -> list[tuple[Path, str]]:
    """Each directory the run writes, once, with the option that chooses it: the output
    directory, the checkpoint directory when saving, and those of `also` outside the output
    directory (its lock covers what lies inside)."""
    found = [(directory, "--output-dir")]
    if checkpoint.enable_save:
        root = checkpoint_root(checkpoint, directory)
        if root.resolve() != directory.resolve():
            found.append((root, "checkpoint.save_path"))
    for path, option in also:
        if not any(path.resolve() == held.resolve() for held, _ in found) and \
                not path.resolve().is_relative_to(directory.resolve()):
            found.append((path, option))
    return found


WHAT = {"--output-dir": "the output directory", "checkpoint.save_path": "the checkpoint directory",
        "monitor.tensorboard.output_dir": "the TensorBoard directory",
        "profiler.output_path": "the profiler's directory"}
"""How a lock's error names the directory the option chooses."""


def _lock(directory: Path, option: str) -> IO[str]:
    """Create `directory` and hold `<directory>/.mf-run.lock` (exclusive, not blocking);
    `option` is what the user changes to choose another directory."""
    path = directory / LOCK
    what = WHAT.get(option, "a directory of the run")
    try:
        directory.mkdir(parents=True, exist_ok=True)
        handle = os.fdopen(open_no_follow(path, os.O_RDWR | os.O_CREAT), "r+", encoding="utf-8")
    except LinkRefused as exc:
        raise RunDirectoryError(str(exc)) from None
    except OSError as exc:
        raise RunDirectoryError(f"cannot use {directory} as {what}: {exc.strerror or exc}; "
                                f"choose a writable {option}") from None
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = handle.read().strip() or "another process"
        handle.close()
        raise RunDirectoryError(f"{directory} is in use by another run ({holder}); wait for it "
                                f"to finish, or choose another {option}") from None
    handle.seek(0)
    handle.truncate()
    started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime())
    handle.write(f"PID {os.getpid()} on {socket.gethostname()}, started {started}\n")
    handle.flush()
    return handle


def _refuse_links(directory: Path, elsewhere: Sequence[tuple[Path, str]]) -> None:
    """A symbolic link where the run, MindSpore or msrun writes is refused: at a file the run
    appends to (`APPENDED`), at a directory it writes (`WRITTEN_DIRS`) or anywhere inside one,
    and in the directories `elsewhere` (TensorBoard's, the profiler's when configured, which
    may themselves be links the user chose) where the run writes: TensorBoard's event files,
    the profiler's `rank_<r>` trees. Those writers (tensorboardX, MindSpore's profiler,
    msrun's scheduler.log, the hang reports) would follow it, and write over or append to
    whatever it points to."""
    for name, what in [*((name, "appends to a plain file") for name in APPENDED),
                       *((name, "creates a directory") for name in WRITTEN_DIRS)]:
        if (directory / name).is_symlink():
            raise RunDirectoryError(f"{directory / name} is a symbolic link, which mf-train "
                                    f"never follows there; remove it (the run {what})")
    trees = [directory / name for name in WRITTEN_DIRS]
    for root, option in elsewhere:
        written = _OPTION_WRITES.get(option, "*")
        trees.extend(root.glob(written) if root.is_dir() else [])
    for tree in trees:
        link = _link_in(tree)
        if link is not None:
            raise RunDirectoryError(
                f"{link} is a symbolic link where the run writes, which mf-train never "
                "follows; remove it (the run and MindSpore create plain files there)")


_OPTION_WRITES = {"monitor.tensorboard.output_dir": "events.out.tfevents.*",
                  "profiler.output_path": "rank_*"}
"""What the run writes in a directory an option names (a glob): only there are links looked
for, the rest of a directory the user chose is theirs."""


def _link_in(tree: Path) -> Path | None:
    """`tree` if it is a symbolic link, else the first one below it (never followed)."""
    if tree.is_symlink():
        return tree
    for parent, dirs, files in os.walk(tree):  # lists links, never follows them
        for name in sorted([*dirs, *files]):
            if os.path.islink(os.path.join(parent, name)):
                return Path(parent, name)
    return None


def _decide(directory: Path, checkpoint: CheckpointConfig) -> tuple[CheckpointConfig, str | None]:
    root = checkpoint_root(checkpoint, directory)
    resolved = attrs.evolve(checkpoint, save_path=str(root))
    if checkpoint.enable_save:
        _refuse_foreign(root)
    complete = layout.complete_iterations(root)
    if checkpoint.load_path:
        if complete and not _inside(Path(checkpoint.load_path), root):
            newest = complete[-1][1]
            if _started_from(newest, checkpoint.load_path):
                return attrs.evolve(resolved, load_path=str(root)), (
                    f"{directory} holds this run's checkpoints (it started from "
                    f"{checkpoint.load_path}): resuming from {newest}")
            raise RunDirectoryError(
                f"{root} holds checkpoints of an earlier run (newest: {complete[-1][1].name}), "
                f"and this run loads {checkpoint.load_path} and would save beside them, "
                "rotating them away; resume that run (leave checkpoint.load_path empty), or "
                "choose another --output-dir or checkpoint.save_path")
        _refuse_empty_load_path(Path(checkpoint.load_path), root)
        return resolved, None
    if complete:
        newest = complete[-1][1]
        note = (f"{directory} holds an earlier run: resuming from its checkpoint {newest} "
                f"(choose another --output-dir to start afresh)")
        return attrs.evolve(resolved, load_path=str(root)), note
    return resolved, _fresh_start_note(directory, root)


def _fresh_start_note(directory: Path, root: Path) -> str | None:
    """What a run says when it starts afresh over an earlier run that failed (or was stopped)
    before its first checkpoint: that run's metrics lines stay, superseded by this run's
    (`monitor.metrics`' rewind event), as do its TensorBoard events (hidden by a purge)."""
    steps = _logged_steps(directory / METRICS)
    if not steps:
        return None
    logged = f"{METRICS} logs {steps} step{'s' if steps != 1 else ''}"
    written = RUN_WRITES | {root.name} if root.parent.resolve() == directory.resolve() \
        else RUN_WRITES
    others = sorted(entry.name for entry in directory.iterdir() if entry.name not in written)
    if others:
        raise RunDirectoryError(
            f"{directory} holds an earlier run ({logged}) but no checkpoint to resume "
            f"from in {root}, beside files no run wrote ({', '.join(others[:3])}); "
            f"choose another --output-dir, or remove {directory}")
    return (f"{directory} holds an earlier run that saved no checkpoint ({logged}): starting "
            f"afresh; its lines stay in {METRICS}, before this run's")


def _started_from(checkpoint: Path, load_path: str) -> bool:
    """Whether the run that saved `checkpoint` started from `load_path` too (its saved
    configuration names the same file or directory): the same command run again after a stop,
    which continues that run from its own checkpoints, as torchtitan's `initial_load_path`
    only applies while the checkpoint folder is empty."""
    try:
        text = layout.read_run_config(checkpoint, layout.read_common(checkpoint))
    except CheckpointError:
        return False
    if text is None:
        return False
    try:
        saved = load_text(text).data.get("checkpoint", {}).get("load_path")
    except (ConfigError, AttributeError):
        return False
    return bool(saved) and _same_path(str(saved), load_path)


def _same_path(first: str, second: str) -> bool:
    return os.path.realpath(os.path.expanduser(first)) == os.path.realpath(
        os.path.expanduser(second))


def _refuse_foreign(root: Path) -> None:
    """Refuse a checkpoint directory holding a directory named as a checkpoint that mf-train
    did not write: a save of that step would replace it, and rotation would delete it."""
    for _, path in layout.iteration_dirs(root):
        if not layout.written_by_mf(path):
            raise RunDirectoryError(
                f"{path} is not a checkpoint mf-train wrote (it has no {layout.COMMON} of "
                f"its format), and saving into {root} could replace or delete it; move it "
                "elsewhere, or choose another checkpoint.save_path")


def _refuse_empty_load_path(path: Path, root: Path) -> None:
    """Refuse a `checkpoint.load_path` that is a directory holding no checkpoint (no complete
    `iteration_*`, no Hugging Face weights): a mistyped or wrong directory would have the run
    train from scratch. Asked for, it is allowed: a load_path at the run's own save path (the
    MindFormers way to resume whenever there is something to resume) starts from scratch
    while that holds nothing."""
    if _inside(path, root) or not path.is_dir() or is_hf_checkpoint(path):
        return
    try:
        found = layout.find_checkpoint(path)
    except CheckpointError:
        return  # a damaged or unusable one: the resume says what is wrong with it
    if found is None:
        raise RunDirectoryError(
            f"checkpoint.load_path {path} holds no checkpoint (no complete iteration_* "
            "directory, no Hugging Face weights); point it at one, leave it empty to start "
            f"from scratch, or set it to this run's checkpoint.save_path ({root}) to start "
            "from scratch now and resume from there later")


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
