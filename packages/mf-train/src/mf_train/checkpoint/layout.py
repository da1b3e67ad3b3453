"""Where a checkpoint lives on disk, and which directories count as complete.

    <save_path>/
      latest_checkpointed_iteration.txt          the newest committed step, e.g. "8"
      iteration_00000008/
        common.json                              run state, world size, every file's size
                                                 and SHA-256, and its own content's SHA-256
        {prefix}-model-0000000-0000002.safetensors   rank 0 of 2: the model's pieces it owns
        {prefix}-opt-0000000-0000002.safetensors     its optimizer pieces (unless no_save_optim)
        {prefix}-rng-0000000-0000002.json            rank 0's random generator states
        {prefix}-sums-0000000-0000002.json           rank 0's files' sizes and SHA-256
        ... the same four files for rank 1
      iteration_00000008.tmp-<token>/            a save in progress: never loaded
      iteration_00000004.del-<pid>/              a checkpoint being deleted: never loaded

Format version 3 stores tensors as pieces (`pieces`: ranges of model-wide tensors, each
written once, indexed in `common.json`), so a checkpoint loads onto any layout; versions 1
and 2 held, per rank, what that rank held, and load onto their own layout only.

The directory and tracker names are MindFormers' (`iteration_{:08d}`,
`latest_checkpointed_iteration.txt`), and so are the file names (`{prefix}-model-{rank:07d}-
{world:07d}`, `-opt-` for the optimizer). A directory under its final name is complete by
construction: it is renamed into place only after every rank's files and `common.json` are
written. `check_complete` still verifies that each file `common.json` lists is present with
its recorded size, which also catches a directory damaged by hand. The SHA-256 of each file
(format version 2; version 1 recorded sizes only) is checked when a rank reads its files
(`reader`), so bytes changed at the same size are found too; `candidates` lists what a resume
falls back to.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
from pathlib import Path
from typing import Any

from .atomic import owned
from .errors import CheckpointError, CorruptCheckpointError

LOG = logging.getLogger(__name__)

TRACKER = "latest_checkpointed_iteration.txt"
COMMON = "common.json"
SELF_SUM = "sha256"
"""The key of `common.json` holding the SHA-256 of the rest of it (`common_digest`): an
edited `common.json` (another `consumed_samples`, say) is found as a damaged piece is."""
RUN_CONFIG = "config.yaml"
"""The effective configuration (after `--set`) of the run that saved the checkpoint."""
TMP_MARK = ".tmp-"
DEL_MARK = ".del-"
FORMAT = "mf-checkpoint"
FORMAT_VERSION = 3
SHARDED_VERSION = 3
"""The first version that stores pieces."""
_SUMS_FILE = re.compile(r"(?:.+-)?sums-\d{7}-\d{7}\.json")
"""A rank's checksum file (`rank_file(prefix, "sums", ...)`)."""
_FINAL = re.compile(r"iteration_(\d{8,})")
_LEFTOVER = re.compile(r"iteration_\d{8,}(?:" + re.escape(TMP_MARK) + "|" + re.escape(DEL_MARK)
                       + r").+")


def iteration_name(step: int) -> str:
    """`iteration_00000008` for step 8."""
    return f"iteration_{step:08d}"


def parse_iteration(name: str) -> int | None:
    """The step of a complete directory's name; None for anything else (tmp, del, other)."""
    match = _FINAL.fullmatch(name)
    return int(match.group(1)) if match else None


def is_leftover(name: str) -> bool:
    """Whether `name` is a save's temporary directory or a deletion's (`iteration_00000008
    .tmp-<token>`, `.del-<pid>`), left behind when its process was killed."""
    return _LEFTOVER.fullmatch(name) is not None


def written_by_mf(directory: Path) -> bool:
    """Whether `directory` holds a checkpoint mf-train wrote, complete or not: its
    `common.json` names this format, or it holds the mark of a save or a deletion
    (`atomic.OWNED`), or its ranks' checksum files (its `common.json` garbled). A save never
    replaces, and rotation never deletes, a directory that does not (a user's
    `iteration_00000001/notes.txt`, or `iteration_00000001.tmp-mine/`), nor a symbolic link
    (what it points to is not the save path's to delete)."""
    if directory.is_symlink():
        return False
    if owned(directory):
        return True
    try:
        read_common(directory, verify=False)
    except CheckpointError:
        # a garbled or lost common.json: still mf-train's when its ranks' checksum files,
        # named as only mf-train names them, are there (the resume then falls back from it)
        return any(_SUMS_FILE.fullmatch(entry.name) for entry in directory.iterdir()
                   if entry.is_file() and not entry.is_symlink())
    return True


def rank_file(prefix: str, kind: str, rank: int, world_size: int) -> str:
    """File name of one rank's `kind` ("model", "opt", "rng" or "sums") part."""
    extension = "json" if kind in ("rng", "sums") else "safetensors"
    stem = f"{kind}-{rank:07d}-{world_size:07d}.{extension}"
    return f"{prefix}-{stem}" if prefix else stem


def expected_files(prefix: str, world_size: int, with_optimizer: bool) -> list[str]:
    """Every rank file a complete checkpoint of `world_size` ranks holds (the `sums` files,
    which carry the others' checksums to rank 0, not included)."""
    kinds = ("model", "opt", "rng") if with_optimizer else ("model", "rng")
    return [rank_file(prefix, kind, rank, world_size)
            for rank in range(world_size) for kind in kinds]


def recorded(entry: Any) -> tuple[int, str | None]:
    """(size, SHA-256 or None) of a `common.json` files entry: `{"bytes": n, "sha256": h}`,
    or a bare size (format version 1)."""
    if isinstance(entry, dict):
        return int(entry["bytes"]), entry.get("sha256")
    return int(entry), None


def read_common(directory: Path, *, verify: bool = True) -> dict[str, Any]:
    """`common.json` of a checkpoint directory, or CheckpointError saying what is wrong; with
    `verify`, `CorruptCheckpointError` when its content differs from the SHA-256 it records
    of itself (a checkpoint saved before mf recorded one is taken as it is)."""
    path = directory / COMMON
    if not path.is_file():
        raise CheckpointError(f"{directory} is not a complete checkpoint: {COMMON} is missing")
    try:
        common = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"{path}: cannot read it as JSON ({exc})") from None
    if not isinstance(common, dict) or common.get("format") != FORMAT:
        raise CheckpointError(f"{path}: not an mf checkpoint (expected \"format\": \"{FORMAT}\")")
    if verify and SELF_SUM in common and common[SELF_SUM] != common_digest(common):
        raise CorruptCheckpointError(f"{path}: its content does not match the SHA-256 it "
                                     "records (edited or damaged after it was written)")
    return common


def common_digest(common: dict[str, Any]) -> str:
    """The SHA-256 of `common.json`'s content but its own `SELF_SUM` (keys sorted, compact
    JSON: the same whatever the file's layout)."""
    rest = {key: value for key, value in common.items() if key != SELF_SUM}
    return hashlib.sha256(json.dumps(rest, sort_keys=True, separators=(",", ":"))
                          .encode("utf-8")).hexdigest()


def read_run_config(directory: Path, common: dict[str, Any]) -> str | None:
    """The effective configuration saved with a checkpoint (YAML text; its SHA-256 checked
    against `common.json`), or None for a checkpoint saved without one (by mf before it
    saved configurations, or by a `CheckpointManager` given none)."""
    record = common.get("config")
    if not isinstance(record, dict):
        return None
    path = directory / str(record.get("file", RUN_CONFIG))
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise CheckpointError(f"{path}: unreadable ({exc.strerror or exc})") from None
    if hashlib.sha256(data).hexdigest() != record.get("sha256"):
        raise CheckpointError(f"{path}: damaged (its SHA-256 differs from {COMMON}'s)")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise CheckpointError(f"{path}: not UTF-8 text") from None


def check_complete(directory: Path) -> list[str]:
    """Problems that make `directory` an incomplete checkpoint (empty list: complete)."""
    try:
        common = read_common(directory)
    except CheckpointError as exc:
        return [str(exc)]
    problems = []
    for name, entry in sorted(common.get("files", {}).items()):
        size, _ = recorded(entry)
        path = directory / name
        if not path.is_file():
            problems.append(f"{path}: missing")
        elif path.stat().st_size != size:
            problems.append(f"{path}: {path.stat().st_size} bytes, {COMMON} records {size}")
    return problems


def iteration_dirs(root: Path) -> list[tuple[int, Path]]:
    """(step, path) of every directory under `root` with a final iteration name, by step."""
    if not root.is_dir():
        return []
    found = [(parse_iteration(entry.name), entry) for entry in root.iterdir() if entry.is_dir()]
    return sorted((step, path) for step, path in found if step is not None)


def complete_iterations(root: Path) -> list[tuple[int, Path]]:
    """(step, path) of the complete checkpoints under `root`, oldest first."""
    return [(step, path) for step, path in iteration_dirs(root) if not check_complete(path)]


def tracked(root: Path) -> int | None:
    """The step the tracker names; a garbled tracker is set aside with one warning (None: the
    newest complete checkpoint is taken). A tracker edited to name another complete
    iteration is followed: that is how a MindFormers user picks the checkpoint to resume."""
    try:
        return read_tracker(root)
    except CheckpointError as exc:
        _warn_once(f"{exc}; it is set aside: loading the newest complete checkpoint (the next "
                   "save rewrites it)")
        return None


def read_tracker(root: Path) -> int | None:
    """The step `latest_checkpointed_iteration.txt` names, or None when there is no tracker."""
    path = root / TRACKER
    if not path.is_file():
        return None
    text = path.read_text(encoding="utf-8").strip()
    if not text.isdigit():
        raise CheckpointError(f"{path}: expected an iteration number, got {text[:40]!r}")
    return int(text)


def find_checkpoint(load_path: str | os.PathLike[str]) -> Path | None:
    """The complete checkpoint directory `load_path` designates, or None when it is a
    directory holding none yet (a fresh `save_path`).

    `load_path` is either one checkpoint directory (named `iteration_XXXXXXXX`, or holding
    a `common.json` wherever it was copied; loaded only if complete) or a save root: there
    the tracker's iteration is taken when complete; otherwise (a save killed between
    renaming its directory and writing the tracker, or a damaged directory) the newest
    complete one, with a warning. Temporary (`.tmp-`) and deleted (`.del-`) directories
    are never loaded.
    """
    path = Path(load_path)
    if not path.exists():
        raise CheckpointError(f"checkpoint path {path} does not exist")
    if TMP_MARK in path.name or DEL_MARK in path.name:
        raise CheckpointError(
            f"{path} is an unfinished or discarded save and is never loaded; load "
            f"{path.parent} to get its newest complete checkpoint")
    if parse_iteration(path.name) is not None or (path / COMMON).is_file():
        problems = check_complete(path)
        if problems:
            raise CheckpointError(f"{path} is not a complete checkpoint:\n  "
                                  + "\n  ".join(problems))
        return path
    if not path.is_dir():
        raise CheckpointError(f"checkpoint path {path} is not a directory")
    return _newest_in_root(path)


def candidates(root: Path) -> list[Path]:
    """The complete checkpoints under a save root, in the order a resume tries them: the
    tracker's first, then the others newest first."""
    complete = [path for _, path in reversed(complete_iterations(root))]
    step = tracked(root)
    first = root / iteration_name(step) if step is not None else None
    return sorted(complete, key=lambda path: path != first)


def _newest_in_root(root: Path) -> Path | None:
    step = tracked(root)
    problems = ["missing"]
    if step is not None:
        candidate = root / iteration_name(step)
        problems = check_complete(candidate) if candidate.is_dir() else problems
        if not problems:
            return candidate
    complete = complete_iterations(root)
    if not complete:
        if step is not None:
            raise CheckpointError(f"{root / TRACKER} names iteration {step}, but {root} "
                                  "holds no complete checkpoint")
        return None
    newest = complete[-1][1]
    if step is not None:
        _warn_once(f"{root / TRACKER} names iteration {step}, which is not usable "
                   f"({'; '.join(problems)}); loading the newest complete checkpoint {newest}")
    return newest


_WARNED: set[str] = set()


def _warn_once(message: str) -> None:
    """Log `message` as a warning the first time this process meets it (a resume looks for
    its checkpoint more than once: to compare settings, then to load)."""
    if message not in _WARNED:
        _WARNED.add(message)
        LOG.warning("%s", message)
