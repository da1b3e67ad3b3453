"""Saving checkpoints: when, where, atomically, optionally in the background, keeping the
newest `save_max`.

One save of step N, world of W ranks:
  1. rank 0 creates `iteration_N.tmp-<token>` (removing a leftover of a killed save); barrier.
  2. each rank writes its model, optimizer and rng files into it, each atomically
     (`.part` file, fsync, rename), so no rank ever sees another's half-written file.
     The model and optimizer files hold the pieces this rank owns (`pieces`: ranges of
     model-wide tensors, each written by one rank). Each rank then writes its `sums` file:
     the size and SHA-256 of each file it wrote, and the pieces each holds.
  3. barrier; rank 0 checks every rank's files are there with the sizes their `sums` files
     give (and that no rank found a NaN or an infinity in what it wrote: a state that is not
     finite is thrown away, never committed, so it can neither replace nor rotate away a
     finite checkpoint), writes `common.json` (each file's size and SHA-256), renames the
     directory to `iteration_N`, then replaces the tracker, then deletes what `save_max` no
     longer keeps (each by renaming it to `.del-<pid>` first); barrier.
A process killed anywhere leaves the previous complete checkpoint (and the tracker naming
it) or the new one: the new directory gets its final name only once it is whole, and the
tracker only ever names a directory that already has its final name.

`async_save`: step 2 (and step 3 on a single rank) runs in a background thread on private
copies of the arrays, taken before `save` returns, so training continues during the write.
With several ranks, step 3 needs a barrier, and collectives must not run from a side thread
(they would interleave with the training step's), so it runs in `wait()`, which the next
`save` calls first; call `wait()` once more after the last step. The training loop calls
`poll()` after every step: it returns the saves committed since the last call (only those are
reported as saved) and raises as soon as a background write has failed, naming the newest
complete checkpoint left.
"""

from __future__ import annotations

import dataclasses
import errno
import json
import logging
import os
import shutil
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from mf_config import CheckpointConfig
from mf_config.component_settings import settings_error
from mf_config.yaml_source import Source

from . import layout
from .atomic import (
    OWNED,
    Streamed,
    file_digest,
    fsync_dir,
    make_owned_dir,
    remove_tree,
    write_json,
    write_safetensors_streamed,
    write_text,
)
from .errors import CheckpointError
from .params import storable
from .pieces import Deferred, Piece, streamed, whole_piece
from .progress import RunProgress
from .rng import capture_rng_state

Barrier = Callable[[], None]
LOG = logging.getLogger(__name__)


def _reached(stage: str) -> None:
    """Called as a save passes each stage ("rank_files", "common", "renamed", "tracker",
    "rotated"); does nothing. Tests replace it to stop a save at a known point."""


@dataclass
class _Job:
    """Everything one save writes, detached from the training state."""

    step: int
    tmp_dir: Path
    model: dict[Piece, np.ndarray]
    optimizer: dict[Piece, np.ndarray] | None
    rng: dict[str, Any]
    common: dict[str, Any]
    started: float = field(default_factory=time.perf_counter)
    written: int = 0
    """Bytes of this rank's files."""


class CheckpointManager:
    """Writes `checkpoint.save_path/iteration_XXXXXXXX/` checkpoints for one rank.

    Every rank calls `save` at the same steps.

    Args:
        config: the `checkpoint` section (with `save_path` set).
        rank: this rank.
        world_size: the number of ranks.
        barrier: waits for all ranks (required when `world_size > 1`; e.g.
            `mf_train.step.world_group.barrier`).
        source: the YAML source, for error lines.
        run_config: the run's effective configuration as YAML, saved beside each
            checkpoint (`layout.RUN_CONFIG`) so readers (`export-hf`, a resumed run) need
            not be given it.
    """

    def __init__(self, config: CheckpointConfig, rank: int = 0, world_size: int = 1,
                 barrier: Barrier | None = None, source: Source | None = None,
                 run_config: str | None = None):
        _check_config(config, source)
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is outside world_size {world_size}")
        if world_size > 1 and barrier is None:
            raise ValueError(f"saving from {world_size} ranks needs a barrier callable")
        self.config = config
        self.rank = rank
        self.world_size = world_size
        self.root = Path(config.save_path)
        self.run_config = run_config
        self._barrier = barrier or (lambda: None)
        self._last_saved: int | None = None
        self._thread: threading.Thread | None = None
        self._error: tuple[int, BaseException] | None = None
        self._pending: _Job | None = None
        self._committed: list[tuple[int, Path]] = []

    # ----- the training loop's interface -----

    def should_save(self, step: int, last: bool = False) -> bool:
        """Whether to save after update `step` (1-based): every `save_interleaved_steps`
        and at the end (`last`), never twice for one step, never when `enable_save` is off."""
        if not self.config.enable_save or step < 1 or step == self._last_saved:
            return False
        return last or step % self.config.save_interleaved_steps == 0

    def save(self, step: int, model_params: Mapping[Piece | str, np.ndarray],
             optimizer_state: Mapping[Piece | str, np.ndarray] | None, state: RunProgress, *,
             owned: bool = False) -> None:
        """Write the checkpoint of step `step`: the pieces this rank owns of the model and
        the optimizer state (`pieces.Piece` keys; a name stands for the whole tensor, for a
        single process). `state.rng` None: this rank's generator states are captured now.
        Returns once written, or, with `async_save`, once the arrays are copied (the write
        continues in the background). `owned`: the arrays are private copies nothing else
        will change (as `model_pieces` and `state_pieces` return), so an asynchronous save
        need not copy them again."""
        self.wait()
        if step < 1:
            raise ValueError(f"checkpoint step must be >= 1, got {step}")
        if not self.config.save_path:
            raise ValueError("checkpoint.save_path is empty: nowhere to save")
        job = self._job(step, model_params, optimizer_state, state, owned)
        self._prepare(job)
        self._last_saved = step
        if not self.config.async_save:
            error = None
            try:
                self._write_rank_files(job)
            except Exception as exc:  # reported after the barriers, so no rank is left waiting
                error = exc
            self._finish(job, error)
            return
        self._pending = job if self.world_size > 1 else None
        self._thread = threading.Thread(target=self._background, args=(job,),
                                        name=f"mf-checkpoint-{step}")
        self._thread.start()

    def wait(self) -> None:
        """Finish the save in flight (join its thread; with several ranks, commit it); raise
        `CheckpointError` if it failed. A no-op when nothing is in flight."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        failed, self._error = self._error, None
        job, self._pending = self._pending, None
        if job is not None:
            self._finish(job, failed[1] if failed else None)
        elif failed is not None:
            step, error = failed
            raise CheckpointError(f"the asynchronous save of checkpoint step {step} to "
                                  f"{self.root} failed: {error}; {self.last_good()}") from error

    def poll(self) -> list[tuple[int, Path]]:
        """The saves committed since the last call, as (step, directory); `CheckpointError`
        as soon as a background write has failed (on this rank). Never blocks on a write
        still running."""
        if self._thread is not None and not self._thread.is_alive():
            self._thread.join()
            self._thread = None
            if self._error is not None and self._pending is None:
                self.wait()  # raises, naming the newest complete checkpoint
            if self._error is not None:
                step, error = self._error
                raise CheckpointError(f"the asynchronous save of checkpoint step {step} to "
                                      f"{self.root} failed on rank {self.rank}: {error}; "
                                      f"{self.last_good()}") from error
        committed, self._committed = self._committed, []
        return committed

    def last_good(self) -> str:
        """Where the newest complete checkpoint is, for error messages."""
        complete = layout.complete_iterations(self.root)
        if not complete:
            return f"no complete checkpoint is left in {self.root}"
        return f"the newest complete checkpoint is {complete[-1][1]}"

    # ----- steps of one save -----

    def _job(self, step: int, model_params: Mapping[Piece | str, np.ndarray],
             optimizer_state: Mapping[Piece | str, np.ndarray] | None, state: RunProgress,
             owned: bool) -> _Job:
        copy = self.config.async_save and not owned
        optimizer = None
        if not self.config.no_save_optim:
            if optimizer_state is None:
                raise ValueError("checkpoint.no_save_optim is False but no optimizer state was "
                                 "given to save")
            optimizer = _storable_pieces(optimizer_state, copy)
        name = layout.iteration_name(step)
        token = str(os.getpid()) if self.world_size == 1 else f"ranks{self.world_size}"
        return _Job(step=step, tmp_dir=self.root / f"{name}{layout.TMP_MARK}{token}",
                    model=_storable_pieces(model_params, copy),
                    optimizer=optimizer,
                    rng=state.rng if state.rng is not None else capture_rng_state(),
                    common=state.common())

    def _prepare(self, job: _Job) -> None:
        """Step 1. Every rank passes the barrier, then fails alone if the directory is not
        there (rank 0 could not create it), before any further barrier."""
        error = None
        if self.rank == 0:
            try:
                self.root.mkdir(parents=True, exist_ok=True)
                if job.tmp_dir.exists() or job.tmp_dir.is_symlink():
                    if not layout.written_by_mf(job.tmp_dir):
                        raise CheckpointError(f"{job.tmp_dir} is not a save mf-train began; "
                                              "it is kept: move it elsewhere")
                    remove_tree(job.tmp_dir, layout.DEL_MARK)
                make_owned_dir(job.tmp_dir)
            except (OSError, CheckpointError) as exc:
                error = exc
        self._barrier()
        if error is not None or not job.tmp_dir.is_dir():
            raise CheckpointError(f"cannot create the checkpoint directory {job.tmp_dir}"
                                  + (f": {error}" if error else " (rank 0 failed to)"))

    def _file(self, job: _Job, kind: str) -> Path:
        name = layout.rank_file(self.config.prefix, kind, self.rank, self.world_size)
        return job.tmp_dir / name

    def _write_rank_files(self, job: _Job) -> None:
        """Step 2 for this rank; a full disk (or quota) is said with the directory, what this
        rank's files need and what is free there."""
        try:
            self._write_rank_files_to(job)
        except OSError as exc:
            if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
                raise
            try:
                free = f"{shutil.disk_usage(job.tmp_dir).free / 2**20:.1f} MiB"
            except OSError:
                free = "unknown"
            raise CheckpointError(
                f"no space left in {job.tmp_dir} ({exc.strerror or exc}): this rank's files "
                f"of the checkpoint need {_stored_bytes(job) / 2**20:.1f} MiB, free there: "
                f"{free}; free some space and run the same command") from exc

    def _write_rank_files_to(self, job: _Job) -> None:
        metadata = {"format": layout.FORMAT}  # one key: safetensors orders several randomly
        held: dict[Path, list[list[Any]]] = {}
        kinds = [("model", job.model)] + ([] if job.optimizer is None else
                                         [("opt", job.optimizer)])
        digests, nonfinite = {}, NonFinite()
        for kind, pieces in kinds:
            path = self._file(job, kind)
            digests[path] = write_safetensors_streamed(
                path, [nonfinite.watched(tensor) for tensor in streamed(pieces)], metadata)
            held[path] = [piece.record() for piece in pieces]
        written = [*held, self._file(job, "rng")]
        write_json(written[-1], job.rng)
        sums = {path.name: {"bytes": path.stat().st_size,
                            "sha256": digests.get(path) or file_digest(path),
                            **({"pieces": held[path]} if path in held else {})}
                for path in written}
        job.written = sum(entry["bytes"] for entry in sums.values())
        if nonfinite.keys:  # found by rank 0 before it commits (`_commit`)
            sums[NONFINITE] = nonfinite.keys
        write_json(self._file(job, "sums"), sums)
        _reached("rank_files")

    def _background(self, job: _Job) -> None:
        try:
            self._write_rank_files(job)
            if self.world_size == 1:
                self._commit(job)
                self._done(job)
        except BaseException as exc:  # raised again by the next poll(), save() or wait()
            self._error = (job.step, exc)

    def _finish(self, job: _Job, error: BaseException | None) -> None:
        """Step 3 on every rank: all barriers are reached even when something failed, so a
        failing rank cannot leave the others waiting."""
        self._barrier()
        if self.rank == 0 and error is None:
            try:
                self._commit(job)
            except Exception as exc:
                error = exc
        self._barrier()
        if error is not None:
            raise CheckpointError(f"saving checkpoint step {job.step} to {self.root} failed "
                                  f"on rank {self.rank}: {error}; {self.last_good()}"
                                  ) from error
        self._done(job)

    def _done(self, job: _Job) -> None:
        path = self.root / layout.iteration_name(job.step)
        if not (path / layout.COMMON).is_file():  # not committed: its state was not finite
            return
        self._committed.append((job.step, path))
        LOG.info("saved checkpoint step %d to %s in %.2f s (this rank wrote %.1f MiB)",
                 job.step, path, time.perf_counter() - job.started, job.written / 2**20)

    def _commit(self, job: _Job) -> None:
        """Rank 0: make the temporary directory the complete `iteration_N` and track it."""
        with_optimizer = job.optimizer is not None
        names = layout.expected_files(self.config.prefix, self.world_size, with_optimizer)
        files = _recorded_files(job.tmp_dir, self.config.prefix, self.world_size)
        missing = [name for name in names if name not in files]
        if missing:
            raise CheckpointError(f"{job.tmp_dir}: rank files missing, not committed: "
                                  + ", ".join(missing))
        nonfinite = _nonfinite_keys(job.tmp_dir, self.config.prefix, self.world_size)
        if nonfinite:  # a diverged state never replaces, nor rotates away, a finite one
            remove_tree(job.tmp_dir, layout.DEL_MARK)
            LOG.warning("checkpoint step %d not saved: its state is not finite (%s%s); the "
                        "checkpoints in %s are kept", job.step, ", ".join(nonfinite[:3]),
                        ", ..." if len(nonfinite) > 3 else "", self.root)
            return
        saved_config = {}
        if self.run_config is not None:
            write_text(job.tmp_dir / layout.RUN_CONFIG, self.run_config)
            saved_config = {"config": {"file": layout.RUN_CONFIG,
                                       "sha256": file_digest(job.tmp_dir / layout.RUN_CONFIG)}}
        common = {**job.common, **saved_config, "format": layout.FORMAT,
                  "version": layout.FORMAT_VERSION, "world_size": self.world_size,
                  "prefix": self.config.prefix, "has_optimizer": with_optimizer, "files": files}
        write_json(job.tmp_dir / layout.COMMON,
                   {**common, layout.SELF_SUM: layout.common_digest(common)})
        (job.tmp_dir / OWNED).unlink()  # common.json marks it now: the layout MindFormers has
        fsync_dir(job.tmp_dir)
        _reached("common")
        final = self.root / layout.iteration_name(job.step)
        if final.exists() or final.is_symlink():
            if not layout.written_by_mf(final):  # never remove what mf-train did not write
                raise CheckpointError(f"{final} is not a checkpoint mf-train wrote; it is kept, "
                                      "and this save is not committed: move it elsewhere")
            remove_tree(final, layout.DEL_MARK)
        os.rename(job.tmp_dir, final)
        fsync_dir(self.root)
        _reached("renamed")
        write_text(self.root / layout.TRACKER, str(job.step))
        fsync_dir(self.root)
        _reached("tracker")
        self._rotate(job.step)
        _reached("rotated")

    def _rotate(self, kept_step: int) -> None:
        """Keep the newest `save_max` iteration directories (always the one just written);
        delete leftovers of killed saves and deletions. Only what mf-train wrote is deleted
        (`layout.is_leftover`, `layout.written_by_mf`: a leftover holds the mark a save or a
        deletion leaves, `atomic.OWNED`): anything else there is kept."""
        for entry in self.root.iterdir():
            if layout.is_leftover(entry.name) and entry.is_dir() and layout.written_by_mf(entry):
                remove_tree(entry, layout.DEL_MARK)
        others = [path for step, path in layout.iteration_dirs(self.root)
                  if step != kept_step and layout.written_by_mf(path)]
        keep_others = self.config.save_max - 1
        for path in others[:max(len(others) - keep_others, 0)]:
            remove_tree(path, layout.DEL_MARK)


def _storable_pieces(arrays: Mapping[Piece | str, np.ndarray | Deferred], copy: bool,
                     ) -> dict[Piece, np.ndarray | Deferred]:
    """`arrays` as the checkpoint stores them (`params.storable`), keyed by piece (a name
    key: the whole tensor). With `copy` (an asynchronous save) deferred values are read
    now: the training step must not change them under the writer."""
    pieces: dict[Piece, np.ndarray | Deferred] = {}
    for key, value in arrays.items():
        if isinstance(value, Deferred):
            if not isinstance(key, Piece):
                raise ValueError(f"{key}: a deferred value needs a Piece key")
            pieces[key] = storable(key.key, value.read(), False) if copy else value
            continue
        piece = key if isinstance(key, Piece) else whole_piece(key, np.shape(value))
        pieces[piece] = storable(piece.key, value, copy)
    return pieces


def _stored_bytes(job: _Job) -> int:
    """The bytes of the tensors this rank's files of `job` hold (their headers left out)."""
    kinds = [job.model] + ([] if job.optimizer is None else [job.optimizer])
    return sum(tensor.numel * tensor.dtype.itemsize
               for pieces in kinds for tensor in streamed(pieces))


NONFINITE = "nonfinite"
"""The key of a `sums` file listing the tensors whose values are not all finite."""


class NonFinite:
    """The keys of the floating-point tensors written with a NaN or an infinity."""

    def __init__(self) -> None:
        self.keys: list[str] = []

    def watched(self, tensor: Streamed) -> Streamed:
        """`tensor`, its values checked as the writer reads them."""
        def read() -> np.ndarray:
            values = tensor.read()
            if values.dtype.kind == "f" and not np.isfinite(values).all():
                self.keys.append(tensor.key)
            return values

        return dataclasses.replace(tensor, read=read)


def _nonfinite_keys(directory: Path, prefix: str, world_size: int) -> list[str]:
    """The tensors some rank wrote with values not finite (their `sums` files say)."""
    found: list[str] = []
    for rank in range(world_size):
        sums = directory / layout.rank_file(prefix, "sums", rank, world_size)
        found += json.loads(sums.read_text(encoding="utf-8")).get(NONFINITE, [])
    return found


def _recorded_files(directory: Path, prefix: str, world_size: int) -> dict[str, Any]:
    """Every rank's files as its `sums` file records them ({"bytes", "sha256"}), each checked
    to be there at that size, plus the `sums` files themselves; `CheckpointError` otherwise."""
    files: dict[str, Any] = {}
    for rank in range(world_size):
        sums = directory / layout.rank_file(prefix, "sums", rank, world_size)
        if not sums.is_file():
            raise CheckpointError(f"{sums}: missing (rank {rank} did not finish), not "
                                  "committed")
        for name, entry in json.loads(sums.read_text(encoding="utf-8")).items():
            if name == NONFINITE:
                continue
            path = directory / name
            if not path.is_file() or path.stat().st_size != entry["bytes"]:
                raise CheckpointError(f"{path}: missing or not {entry['bytes']} bytes as rank "
                                      f"{rank} wrote it, not committed")
            files[name] = entry
        files[sums.name] = {"bytes": sums.stat().st_size, "sha256": file_digest(sums)}
    return files


def _check_config(config: CheckpointConfig, source: Source | None) -> None:
    problems = []
    if config.enable_save and not config.save_path:
        problems.append((("checkpoint", "save_path"),
                         "save_path must be provided for saving checkpoints (an empty string "
                         "is allowed only with checkpoint.enable_save: False)"))
    prefix = config.prefix
    if "/" in prefix or os.sep in prefix or prefix in (".", ".."):
        problems.append((("checkpoint", "prefix"),
                         f"{prefix!r} must be a file name prefix, without path separators"))
    if problems:
        raise settings_error(problems, source)
