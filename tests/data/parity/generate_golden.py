"""Parity of mf_data with real megatron-core 0.16.1, and the golden fixtures taken from it.

Run by ``nox -s megatron_parity`` (which installs torch and megatron-core; the normal test suite
never imports them). Steps:

1. Corpora. Each corpus of cases.py (fixed numpy seeds; several sequences per document, length-1
   sequences, tokens equal to the pad id) is written by Megatron's ``IndexedDatasetBuilder``
   and by ``mf_data.indexed.IndexedDatasetBuilder``: the ``.bin``/``.idx`` bytes must be equal,
   our reader must read Megatron's files and Megatron's reader ours, sequence for sequence.
2. Cases. For every case of cases.py (single corpus and blends with weights, exhaustive and
   sized-unweighted; one epoch, several epochs with the final epoch joint or separate;
   add_extra_token_to_sequence on and off; every mask flag; pad distinct / equal to EOD with
   ambiguous pads allowed or not / absent; train, valid and test splits; null sizes; blends per
   split) Megatron's ``BlendedMegatronDatasetBuilder`` builds all three splits. The index
   arrays (document, sample, shuffle; dataset and dataset-sample index of blends, and every
   constituent's indices) and every field of the samples are recorded (`ours.py` says which
   samples), together with the cache descriptions. ``--check`` builds the same with mf_data
   (ours.py) and compares dtype, shape and values bit for bit. ``--write`` stores the Megatron
   side as compressed ``.npz`` under tests/data/golden/ with Megatron's corpora, which
   tests/data/test_megatron_golden.py checks without torch or Megatron.
3. Refusals. Every case of ``cases.REFUSED`` (null sizes next to weights) must make Megatron
   raise, and mf_data raise a ``DataError`` at the case's path; ``--write`` records Megatron's
   message in the manifest.

Megatron's stateful loss mask (shared/reference/megatron-datasets.md section 4): when none of
reset_position_ids / reset_attention_mask / eod_mask_loss is set, a GPTDataset caches the masks
of the first sample it serves and pad-masks that cached loss mask in place, so later samples
inherit loss_mask = 0 wherever the first-fetched sample had label == pad. We do not reproduce
that defect. Every Megatron sample here is taken from a fresh mask state: the script sets
``masks_and_position_ids_are_cached = False`` on the GPTDataset (on each constituent of a blend)
before each ``__getitem__``, which is exactly a new instance as far as the masks go (that flag is
the only state). ``check_loss_mask_defect`` also shows the defect once with a stateful
instance, and that it differs from the fresh result exactly where the first sample's labels
are pad.

Process group: Megatron's BlendedDataset calls ``torch.distributed.get_rank()`` on a cache miss
when ``path_to_cache`` is set. We want its cache files (their names are md5 hashes of the
descriptions, which ours must equal), so the script initialises a one-process gloo group
through a ``file://`` rendezvous in a temporary directory (no network) and sets
``path_to_cache``.

Prefixes are given to Megatron relative to the working directory (the script chdirs into the
corpus directory), so the descriptions, which contain the prefix string, do not depend on
where the files live.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import os
import shutil
import sys
import tempfile
import time
import warnings
from collections import OrderedDict
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
GOLDEN_DIR = HERE.parent / "golden"


def _load(name: str) -> Any:
    spec = importlib.util.spec_from_file_location(f"mf_parity_{name}", HERE / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


cases = _load("cases")
ours = _load("ours")


# --- Megatron side -----------------------------------------------------------------------------

class StandInTokenizer:
    """The attributes Megatron's GPT dataset reads from a tokenizer: eod, pad (optional, a
    missing one means -1), eos (absent here), vocab_size (None: no dtype hint) and
    unique_identifiers (serialised into the cache description)."""

    def __init__(self, spec: Any) -> None:
        self.eod = spec.eod
        if spec.pad is not None:
            self.pad = spec.pad
        self.vocab_size = None
        self.unique_identifiers = OrderedDict(spec.identifiers())


def init_process_group(directory: str) -> None:
    import torch.distributed as dist

    if not dist.is_initialized():
        dist.init_process_group("gloo", init_method=f"file://{directory}/rendezvous", rank=0,
                                world_size=1)


def write_megatron_corpora(directory: Path) -> None:
    import torch
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

    for name, spec in cases.CORPORA.items():
        builder = IndexedDatasetBuilder(str(directory / f"{name}.bin"),
                                        dtype=getattr(np, spec.dtype))
        for tokens, lengths in cases.corpus_documents(spec):
            builder.add_document(torch.from_numpy(tokens), lengths)
        builder.finalize(str(directory / f"{name}.idx"))


def megatron_build(case: Any, cache_dir: str) -> list[Any]:
    """All three splits of a case from Megatron's builder (run in the corpus directory)."""
    from megatron.core.datasets.blended_megatron_dataset_builder import (
        BlendedMegatronDatasetBuilder,
    )
    from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig
    from megatron.core.datasets.utils import get_blend_from_list

    per_split = None
    if case.per_split is not None:
        per_split = [None if blend is None else get_blend_from_list(list(blend))
                     for blend in case.per_split]
    config = GPTDatasetConfig(
        blend=get_blend_from_list(list(case.data_path)) if case.data_path else None,
        blend_per_split=per_split,
        path_to_cache=cache_dir,
        tokenizer=StandInTokenizer(case.tokenizer),
        **case.sample_options(),
    )
    sizes = cases.resolved_sizes(case, corpus_lengths())
    return BlendedMegatronDatasetBuilder(GPTDataset, sizes, lambda: True, config).build()


_LENGTHS: dict[str, np.ndarray] = {}


def corpus_lengths() -> dict[str, np.ndarray]:
    if not _LENGTHS:
        for name, spec in cases.CORPORA.items():
            _LENGTHS[name] = np.array([length for _, lengths in cases.corpus_documents(spec)
                                       for length in lengths], dtype=np.int64)
    return _LENGTHS


def _constituents(dataset: Any) -> list[Any]:
    return list(dataset.datasets) if hasattr(dataset, "datasets") else [dataset]


def megatron_sample(dataset: Any, index: int | None) -> dict[str, np.ndarray]:
    """One sample from a fresh mask state (see the module docstring), as numpy arrays."""
    for constituent in _constituents(dataset):
        constituent.masks_and_position_ids_are_cached = False
    sample = dataset[index]
    return {key: np.asarray(value.numpy() if hasattr(value, "numpy") else value)
            for key, value in sample.items()}


def megatron_refusal(case: Any, cache_dir: str) -> str | None:
    """Megatron's error for a case it refuses, on one line (None if it builds the case)."""
    try:
        megatron_build(case, cache_dir)
    except (AssertionError, ValueError, TypeError, RuntimeError) as error:
        return " ".join(f"{type(error).__name__}: {error}".split())
    return None


def check_refusals(work: Path, args: argparse.Namespace) -> tuple[dict[str, str], list[str]]:
    """Megatron's message per refused case, and what is wrong (a case built, or ours refusing
    elsewhere than the case's path)."""
    messages: dict[str, str] = {}
    problems: list[str] = []
    for refused in cases.REFUSED:
        case = refused.case
        if args.case and case.name not in args.case:
            continue
        cache = work / "cache" / case.name
        theirs = megatron_refusal(case, str(cache / "megatron"))
        line = f"{case.name}: Megatron refuses: {theirs}"
        if theirs is None:
            problems.append(f"{case.name}: Megatron builds it; it is listed as refused")
        else:
            messages[case.name] = theirs
        if args.check:
            mine = ours.refusal(case, Path("."), str(cache / "ours"))
            if mine is None or f"{refused.path}: " not in mine:
                problems.append(f"{case.name}: ours should refuse at {refused.path}, got {mine!r}")
            line += " -> " + ("REFUSED" if mine and f"{refused.path}: " in mine else "MISMATCH")
        print(line, flush=True)
    return messages, problems


def megatron_record(case: Any, datasets: list[Any], limit: int | None) -> dict[str, np.ndarray]:
    return ours.record_datasets(datasets, megatron_sample, limit)


def check_loss_mask_defect(directory: str) -> str:
    """Show Megatron's stateful loss mask once: it must differ from the fresh one exactly at
    the first-fetched sample's pad labels."""
    case = next(c for c in cases.CASES if c.name == "padded_default_flags")
    train = megatron_build(case, directory)[0]
    padded = [index for index in range(len(train))
              if np.any(megatron_sample(train, index)["labels"] == 0)]
    order = [padded[0]] + [index for index in range(12) if index != padded[0]]
    fresh = [megatron_sample(train, index) for index in order]
    train.masks_and_position_ids_are_cached = False
    stateful = [{k: v.numpy() for k, v in train[index].items()} for index in order]
    first_pad = fresh[0]["labels"] == 0  # pad labels are zeroed after masking
    first_pad &= stateful[0]["loss_mask"] == 0
    differing = 0
    for got, want in zip(stateful[1:], fresh[1:], strict=True):
        expected = want["loss_mask"].copy()
        expected[first_pad] = 0
        assert np.array_equal(got["loss_mask"], expected), "defect not as documented"
        differing += int(not np.array_equal(got["loss_mask"], want["loss_mask"]))
    return (f"stateful loss-mask defect reproduced: {differing} of {len(order) - 1} later "
            f"samples differ from fresh, only at the {int(first_pad.sum())} pad label "
            f"position(s) of the first fetched sample")


# --- corpus parity -----------------------------------------------------------------------------

def check_corpora(megatron_dir: Path, ours_dir: Path) -> list[str]:
    """Bytes equal both ways; each reader reads the other's files."""
    from megatron.core.datasets.indexed_dataset import IndexedDataset as MegatronIndexed

    from mf_data.indexed import IndexedDataset as OurIndexed

    ours.write_corpora(ours_dir)
    problems = []
    for name in cases.CORPORA:
        for suffix in (".bin", ".idx"):
            theirs = (megatron_dir / f"{name}{suffix}").read_bytes()
            mine = (ours_dir / f"{name}{suffix}").read_bytes()
            if theirs != mine:
                problems.append(f"corpus {name}{suffix}: bytes differ ({len(theirs)} vs "
                                f"{len(mine)})")
        for writer_dir in (megatron_dir, ours_dir):
            theirs = MegatronIndexed(str(writer_dir / name))
            mine = OurIndexed(writer_dir / name)
            if not readers_agree(theirs, mine):
                problems.append(f"corpus {name} written by {writer_dir.name}: readers disagree")
    return problems


def readers_agree(theirs: Any, mine: Any) -> bool:
    """Same index arrays and dtype, same tokens for whole sequences and for offset slices."""
    index = theirs.index
    if not (np.array_equal(index.sequence_lengths, mine.sequence_lengths)
            and np.array_equal(index.sequence_pointers, mine.sequence_pointers)
            and np.array_equal(index.document_indices, mine.document_indices)
            and np.dtype(index.dtype) == mine.dtype and len(theirs) == len(mine)):
        return False
    for number in range(len(mine)):
        length = int(mine.sequence_lengths[number])
        offset, count = length // 3, max(0, length - length // 3 - 1)
        if not (np.array_equal(theirs.get(number), mine.get(number))
                and np.array_equal(theirs.get(number, offset, count),
                                   mine.get(number, offset, count))):
            return False
    return True


# --- comparison --------------------------------------------------------------------------------

def compare(name: str, want: dict[str, np.ndarray], got: dict[str, np.ndarray]) -> list[str]:
    problems = []
    for key in sorted(set(want) | set(got)):
        if key not in got:
            problems.append(f"{name}: {key} missing from ours")
            continue
        if key not in want:
            problems.append(f"{name}: {key} only in ours")
            continue
        problems.extend(f"{name}: {message}" for message in ours.array_difference(
            key, want[key], got[key]))
    return problems


def run(args: argparse.Namespace) -> int:
    warnings.filterwarnings("ignore")
    import logging

    logging.disable(logging.WARNING)
    work = Path(tempfile.mkdtemp(prefix="mf-megatron-parity-"))
    try:
        return run_in(work, args)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


def run_in(work: Path, args: argparse.Namespace) -> int:
    started = time.perf_counter()
    corpus_dir = work / "megatron_corpora"
    corpus_dir.mkdir()
    init_process_group(str(work))
    write_megatron_corpora(corpus_dir)
    problems: list[str] = []
    if args.check:
        problems += check_corpora(corpus_dir, work / "ours_corpora")
    os.chdir(corpus_dir)
    records: dict[str, dict[str, np.ndarray]] = {}
    summary = []
    for case in cases.CASES:
        if args.case and case.name not in args.case:
            continue
        case_started = time.perf_counter()
        cache = work / "cache" / case.name
        datasets = megatron_build(case, str(cache / "megatron"))
        want = megatron_record(case, datasets, args.limit)
        want.update(ours.cache_listing(cache / "megatron", "megatron"))
        records[case.name] = want
        line = f"{case.name}: {ours.describe_record(want)}"
        if args.check:
            got = ours.record_case(case, Path("."), str(cache / "ours"), args.limit)
            got.update(ours.cache_listing(cache / "ours", "ours"))
            found = compare(case.name, ours.without_cache(want), ours.without_cache(got))
            found += ours.cache_differences(case.name, want, got)
            problems += found
            line += " -> " + ("MATCH" if not found else f"{len(found)} MISMATCH(ES)")
        summary.append(f"{line} [{time.perf_counter() - case_started:.1f}s]")
        print(summary[-1], flush=True)
    refusals, found = check_refusals(work, args)
    problems += found
    if not args.case:
        print(check_loss_mask_defect(str(work / "cache" / "defect")))
    if args.write:
        write_goldens(corpus_dir, records, refusals, args.golden_limit)
    print(f"total {time.perf_counter() - started:.1f}s, {len(records)} cases")
    for problem in problems[:200]:
        print("PROBLEM", problem)
    if len(problems) > 200:
        print(f"... and {len(problems) - 200} more problems")
    return 1 if problems else 0


def write_goldens(corpus_dir: Path, records: dict[str, dict[str, np.ndarray]],
                  refusals: dict[str, str], limit: int) -> None:
    """Megatron's corpora and, per case, its arrays (samples cut to the golden selection)."""
    import megatron.core
    import torch

    if GOLDEN_DIR.exists():
        shutil.rmtree(GOLDEN_DIR)
    (GOLDEN_DIR / "corpora").mkdir(parents=True)
    corpora = {}
    for name in cases.CORPORA:
        for suffix in (".bin", ".idx"):
            data = (corpus_dir / f"{name}{suffix}").read_bytes()
            (GOLDEN_DIR / "corpora" / f"{name}{suffix}").write_bytes(data)
            corpora[f"{name}{suffix}"] = hashlib.sha256(data).hexdigest()
    for name, record in records.items():
        selected = ours.golden_selection(record, limit)
        np.savez_compressed(GOLDEN_DIR / f"{name}.npz", **selected)
    manifest = {
        "megatron_core": megatron.core.__version__,
        "torch": torch.__version__,
        "numpy": np.__version__,
        "golden_sample_limit": limit,
        "corpora_sha256": corpora,
        "cases": {case.name: case.as_dict() for case in cases.CASES if case.name in records},
        "refused": {refused.case.name: {"case": refused.case.as_dict(), "path": refused.path,
                                        "megatron": refusals[refused.case.name]}
                    for refused in cases.REFUSED if refused.case.name in refusals},
    }
    (GOLDEN_DIR / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    total = sum(path.stat().st_size for path in GOLDEN_DIR.rglob("*") if path.is_file())
    print(f"goldens written to {GOLDEN_DIR}: {total / 1024:.1f} KiB")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="compare mf_data with Megatron")
    parser.add_argument("--write", action="store_true", help="write tests/data/golden/")
    parser.add_argument("--limit", type=int, default=4000,
                        help="samples compared per split (default 4000; all if fewer)")
    parser.add_argument("--golden-limit", type=int, default=96,
                        help="samples per split kept in the goldens (plus a spread beyond)")
    parser.add_argument("--case", action="append", help="run only this case (repeatable)")
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory")
    args = parser.parse_args()
    if not (args.check or args.write):
        parser.error("give --check and/or --write")
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
