"""Megatron-compatible on-disk cache of the three GPT indices.

Files are named and written as megatron-core 0.16.1 names them (gpt_dataset.py,
megatron_dataset.py): ``{md5 of description}-GPTDataset-{split}-{affix}`` with affixes
``description.txt``, ``document_index.npy``, ``sample_index.npy`` and ``shuffle_index.npy``,
plain ``numpy.save`` files. The description is Megatron's ``json.dumps(unique_identifiers,
indent=4)``, key for key.

The tokenizer: Megatron serialises ``config.tokenizer.unique_identifiers`` there. mf-data has no
tokenizer object, so the default stand-in is ``None`` (``"tokenizer": null``), which is what
MindFormers writes when no tokenizer is configured. Pass Megatron's tokenizer identifiers (a
dict) as ``tokenizer`` to get Megatron's exact description, hash and file names, and so share a
cache directory with Megatron.

Unlike Megatron, every file goes to a temporary name and is renamed into place, and the
description is written last: a crash never leaves a set of files that looks complete. A cached
set is used only if its description matches and all three arrays load and agree in shape;
otherwise it is rebuilt, and the reason is logged. A set that loads but whose values cannot
be the dataset's indices (`gpt_indices.index_problem`: a sample outside the data, rows that
move backwards) is refused instead, naming the file: its description matched, so it was
written for other data under the same prefix (the description does not see the files'
contents) or damaged, and the user should know before deleting it to rebuild.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from mf_data.atomic_files import save_array_atomically, write_atomically
from mf_data.errors import DataError
from mf_data.gpt_indices import GPTIndices

logger = logging.getLogger(__name__)

DATASET_CLASS = "GPTDataset"
_AFFIXES = ("description.txt", "document_index.npy", "sample_index.npy", "shuffle_index.npy")


class CachePaths(NamedTuple):
    description: str
    document_index: str
    sample_index: str
    shuffle_index: str


def describe(dataset_path: str, num_samples: int | None, index_split: str, random_seed: int,
             sequence_length: int, split: str | None, split_matrix: list[Any] | None,
             tokenizer: Any = None) -> str:
    """Megatron's ``unique_description`` of a GPTDataset, in its key order.

    ``split_matrix`` as built by ``mf_data.split.split_matrix`` (tuples print as lists, an
    empty split as null); both are None for a blend per split, as in Megatron. ``tokenizer`` is
    anything JSON can encode (see the module docstring).
    """
    identifiers = {
        "class": DATASET_CLASS,
        "dataset_path": dataset_path,
        "num_samples": num_samples,
        "index_split": index_split,
        "random_seed": random_seed,
        "sequence_length": sequence_length,
        "split": split,
        "split_matrix": split_matrix,
        "tokenizer": tokenizer,
    }
    return json.dumps(identifiers, indent=4, default=_unique_identifiers)


def _unique_identifiers(value: Any) -> Any:
    """Megatron's ``default=`` hook: objects serialise through their ``unique_identifiers``."""
    try:
        return value.unique_identifiers
    except AttributeError:
        raise TypeError(f"{type(value).__name__} is not JSON serialisable and has no "
                        f"unique_identifiers") from None


def description_hash(description: str) -> str:
    return hashlib.md5(description.encode("utf-8"), usedforsecurity=False).hexdigest()


def default_cache_dir(prefix: str | os.PathLike) -> str:
    """Megatron's default: ``os.path.join(prefix, "cache", "GPTDataset_indices")``, i.e. a
    directory named after the dataset prefix (beside its .bin/.idx)."""
    return os.path.join(os.fspath(prefix), "cache", f"{DATASET_CLASS}_indices")


def cache_paths(cache_dir: str | os.PathLike, description: str, index_split: str) -> CachePaths:
    base = f"{description_hash(description)}-{DATASET_CLASS}-{index_split}"
    return CachePaths(*(os.path.join(os.fspath(cache_dir), f"{base}-{affix}")
                        for affix in _AFFIXES))


Check = Callable[[GPTIndices], tuple[str, str] | None]
"""(indices) -> (the array's field name, what is wrong) or None: `gpt_indices.index_problem`
bound to the dataset."""


def load_indices(paths: CachePaths, description: str,
                 check: Check | None = None) -> GPTIndices | None:
    """The cached indices (memory-mapped, read-only), or None with the reason logged.

    Raises:
        DataError: `check` finds values that cannot be the dataset's indices; names the
            file and says to delete the cache to rebuild it.
    """
    missing = [path for path in paths if not os.path.isfile(path)]
    if missing:
        stem = os.path.basename(paths.description).removesuffix("description.txt")
        logger.info("GPT index cache miss: building %s (%s*, %d of %d files missing)",
                    os.path.dirname(paths.description), stem, len(missing), len(paths))
        return None
    try:
        stored = Path(paths.description).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        logger.warning("GPT index cache: cannot read %s (%s); rebuilding",
                       paths.description, error)
        return None
    if stored != description:
        logger.warning("GPT index cache: %s describes different indices; rebuilding",
                       paths.description)
        return None
    try:
        indices = GPTIndices(*(np.load(path, mmap_mode="r", allow_pickle=False)
                               for path in paths[1:]))
    except (OSError, ValueError, EOFError) as error:
        logger.warning("GPT index cache: cannot load %s (%s); rebuilding", paths.sample_index,
                       error)
        return None
    problem = _shape_problem(indices)
    if problem:
        logger.warning("GPT index cache: %s in %s; rebuilding", problem, paths.sample_index)
        return None
    found = check(indices) if check is not None else None
    if found is not None:
        field, problem = found
        path = getattr(paths, field)
        others = os.path.join(os.path.dirname(path),
                              os.path.basename(paths.description).replace(_AFFIXES[0], "*"))
        raise DataError(f"{path}: {problem}: this GPT index cache does not fit the dataset "
                        f"(written for other data under the same prefix, or damaged); delete "
                        f"its files ({others}) to rebuild it")
    logger.info("GPT index cache hit: %s", paths.description)
    return indices


def _shape_problem(indices: GPTIndices) -> str | None:
    document_index, sample_index, shuffle_index = indices
    if document_index.ndim != 1:
        return f"document index has shape {document_index.shape}, expected 1-D"
    if sample_index.ndim != 2 or sample_index.shape[1] != 2 or sample_index.shape[0] < 1:
        return f"sample index has shape {sample_index.shape}, expected (samples + 1, 2)"
    if shuffle_index.shape != (sample_index.shape[0] - 1,):
        return (f"shuffle index has shape {shuffle_index.shape}, expected "
                f"({sample_index.shape[0] - 1},)")
    return None


def save_indices(paths: CachePaths, description: str, indices: GPTIndices) -> None:
    """Write the arrays, then the description, each atomically."""
    os.makedirs(os.path.dirname(paths.description) or ".", exist_ok=True)
    for path, array in zip(paths[1:], indices, strict=True):
        save_array_atomically(path, array)
    write_atomically(paths.description,
                      lambda stream: stream.write(description.encode("utf-8")))


def load_or_build(cache_dir: str | os.PathLike | None, description: str, index_split: str,
                  build: Callable[[], GPTIndices],
                  check: Check | None = None) -> tuple[GPTIndices, bool]:
    """Cached indices if valid, else ``build()`` (saved to the cache when there is one).

    ``cache_dir`` None or "" means no cache, as Megatron's falsy ``path_to_cache``. ``check``
    looks at the values of cached indices (see `load_indices`). Returns the indices and
    whether they were built anew.
    """
    if not cache_dir:
        return build(), True
    paths = cache_paths(cache_dir, description, index_split)
    cached = load_indices(paths, description, check)
    if cached is not None:
        return cached, False
    indices = build()
    try:
        save_indices(paths, description, indices)
    except OSError as error:
        raise DataError(f"path_to_cache: cannot write the GPT index cache in {cache_dir} "
                        f"({error}); give a writable directory, or '' for no cache") from error
    return indices, True
