"""The mf_data side of the Megatron parity check, and the record both sides are compared by.

numpy, the standard library and mf_data only: tests/data/test_megatron_golden.py uses it without
torch or Megatron. ``record_case`` builds a case of cases.py the way Megatron's
``BlendedMegatronDatasetBuilder`` does (split bookends, blend sizes with the surplus, sized or
exhaustive blends) from mf_data's modules; ``record_datasets`` turns the three split datasets of
either side into a flat dict of arrays.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from mf_data.builder import SplitBuilder
from mf_data.indexed import IndexedDataset, IndexedDatasetBuilder

SPLIT_NAMES = ("train", "valid", "test")
SAMPLE_FIELDS = ("dataset_id", "tokens", "labels", "loss_mask", "position_ids", "attention_mask")
GOLDEN_SPREAD = 32  # samples beyond the first ones kept in a golden, evenly spread


def _cases() -> Any:
    name = "mf_parity_cases"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, Path(__file__).parent / "cases.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


# --- corpora -----------------------------------------------------------------------------------

def write_corpora(directory: Path) -> None:
    """Every corpus of cases.py written by mf_data's builder (add_document per document)."""
    cases = _cases()
    directory.mkdir(parents=True, exist_ok=True)
    for name, spec in cases.CORPORA.items():
        builder = IndexedDatasetBuilder(directory / f"{name}.bin", dtype=np.dtype(spec.dtype))
        for tokens, lengths in cases.corpus_documents(spec):
            builder.add_document(tokens, lengths)
        builder.finalize(directory / f"{name}.idx")


# --- our datasets, built as Megatron's builder builds them ---------------------------------------

def our_config(case: Any, cache_dir: str | None) -> Any:
    """mf_data's GPTDatasetConfig for a case (the tokenizer's ids go in as Megatron's do)."""
    from mf_data.gpt_dataset import GPTDatasetConfig

    tokenizer = case.tokenizer
    return GPTDatasetConfig(
        eod=tokenizer.eod,
        pad=-1 if tokenizer.pad is None else tokenizer.pad,
        path_to_cache=cache_dir,
        tokenizer_identifiers=tokenizer.identifiers(),
        **case.sample_options(),
    )


def build_case(case: Any, corpus_dir: Path, cache_dir: str | None) -> list[Any]:
    """The three split datasets (or None) of a case, from mf_data's builder (prefixes stay
    relative, as on Megatron's side, which runs inside the corpus directory)."""
    cases = _cases()
    lengths = {name: IndexedDataset(corpus_dir / name).sequence_lengths for name in cases.CORPORA}
    sizes = cases.resolved_sizes(case, lengths)
    builder = SplitBuilder(our_config(case, cache_dir), root=corpus_dir)
    if case.per_split is not None:
        return list(builder.build_per_split([list(blend or ()) for blend in case.per_split],
                                            sizes))
    return list(builder.build(list(case.data_path), case.split, sizes))


def refusal(case: Any, corpus_dir: Path, cache_dir: str | None) -> str | None:
    """Our error for a case Megatron refuses (None if we build it)."""
    from mf_data.errors import DataError

    try:
        build_case(case, corpus_dir, cache_dir)
    except DataError as error:
        return str(error)
    return None


def our_sample(dataset: Any, index: int | None) -> dict[str, np.ndarray]:
    return {key: np.asarray(value) for key, value in dataset[index].items()}


def record_case(case: Any, corpus_dir: Path, cache_dir: str | None, limit: int | None,
                sample_ids: dict[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
    return record_datasets(build_case(case, corpus_dir, cache_dir), our_sample, limit,
                           sample_ids)


# --- the record ----------------------------------------------------------------------------------

def _gpt_indices(dataset: Any) -> dict[str, np.ndarray]:
    return {"document_index": np.asarray(dataset.document_index),
            "sample_index": np.asarray(dataset.sample_index),
            "shuffle_index": np.asarray(dataset.shuffle_index)}


def _description(dataset: Any) -> np.ndarray:
    return np.array(getattr(dataset, "unique_description", ""))


def record_datasets(datasets: list[Any], sample: Callable[[Any, int | None], dict[str, np.ndarray]],
                    limit: int | None, sample_ids: dict[str, np.ndarray] | None = None
                    ) -> dict[str, np.ndarray]:
    """Index arrays, descriptions and samples ``0 .. min(len, limit) - 1`` of each split (or
    the samples ``sample_ids[split]``)."""
    record: dict[str, np.ndarray] = {}
    for name, dataset in zip(SPLIT_NAMES, datasets, strict=True):
        if dataset is None:
            record[f"{name}/kind"] = np.array("none")
            continue
        record[f"{name}/length"] = np.array(len(dataset), dtype=np.int64)
        record[f"{name}/description"] = _description(dataset)
        if hasattr(dataset, "dataset_index"):
            record[f"{name}/kind"] = np.array("blend")
            record[f"{name}/dataset_index"] = np.asarray(dataset.dataset_index)
            record[f"{name}/dataset_sample_index"] = np.asarray(dataset.dataset_sample_index)
            for number, part in enumerate(dataset.datasets):
                record[f"{name}/c{number}/length"] = np.array(len(part), dtype=np.int64)
                record[f"{name}/c{number}/description"] = _description(part)
                for key, value in _gpt_indices(part).items():
                    record[f"{name}/c{number}/{key}"] = value
        else:
            record[f"{name}/kind"] = np.array("gpt")
            record.update({f"{name}/{key}": value
                           for key, value in _gpt_indices(dataset).items()})
            if len(dataset):  # the batch-padding sample (idx None) exists for GPT only
                for key, value in sample(dataset, None).items():
                    record[f"{name}/padding/{key}"] = value
        if sample_ids is not None:
            ids = np.asarray(sample_ids[name], dtype=np.int64)
        else:
            count = len(dataset) if limit is None else min(len(dataset), limit)
            ids = np.arange(count, dtype=np.int64)
        rows = [sample(dataset, int(index)) for index in ids]
        record[f"{name}/sample_ids"] = ids
        for field in SAMPLE_FIELDS:
            values = [row[field] for row in rows if field in row]
            if values and len(values) == len(rows):
                record[f"{name}/sample/{field}"] = np.stack(values)
            elif values:
                record[f"{name}/sample/{field}"] = np.array(f"present in {len(values)} rows")
    return record


def golden_selection(record: dict[str, np.ndarray], limit: int) -> dict[str, np.ndarray]:
    """A record with the samples cut to the first ``limit`` plus GOLDEN_SPREAD spread beyond."""
    picks: dict[str, np.ndarray] = {}
    for name in SPLIT_NAMES:
        ids = record.get(f"{name}/sample_ids")
        if ids is None:
            continue
        first = np.arange(min(limit, len(ids)), dtype=np.int64)
        extra = max(len(ids) - limit, 0)
        spread = limit + np.unique(np.linspace(0, extra - 1, min(GOLDEN_SPREAD, extra))
                                   .astype(np.int64))
        picks[name] = np.concatenate([first, spread]) if extra else first
    return select_samples(record, picks)


def select_samples(record: dict[str, np.ndarray], ids_by_split: dict[str, np.ndarray]
                   ) -> dict[str, np.ndarray]:
    """Keep only the given sample ids of a full record (to compare with a golden)."""
    out = {}
    for key, value in record.items():
        name = key.split("/")[0]
        if key == f"{name}/sample_ids" or ("/sample/" in key and value.ndim > 0):
            out[key] = value[ids_by_split[name]] if name in ids_by_split else value
        else:
            out[key] = value
    return out


def describe_record(record: dict[str, np.ndarray]) -> str:
    parts = []
    for name in SPLIT_NAMES:
        kind = str(record[f"{name}/kind"])
        if kind == "none":
            parts.append(f"{name}=none")
        else:
            parts.append(f"{name}={kind}:{int(record[f'{name}/length'])}")
    return " ".join(parts)


def array_difference(key: str, want: np.ndarray, got: np.ndarray) -> list[str]:
    """Empty when dtype, shape and every value are equal; else what differs, precisely."""
    if want.dtype != got.dtype:
        if want.dtype.kind in "US" and got.dtype.kind in "US":
            pass
        else:
            return [f"{key}: dtype {got.dtype} (ours) != {want.dtype} (Megatron)"]
    if want.shape != got.shape:
        return [f"{key}: shape {got.shape} (ours) != {want.shape} (Megatron)"]
    if want.dtype.kind in "US":
        if str(want) != str(got):
            return [f"{key}: text differs: ours {str(got)[:300]!r} vs Megatron "
                    f"{str(want)[:300]!r}"]
        return []
    equal = (want == got) if want.dtype.kind != "f" else (
        (want == got) | (np.isnan(want) & np.isnan(got)))
    if np.all(equal):
        return []
    where = np.argwhere(~np.asarray(equal))
    first = tuple(int(i) for i in where[0])
    return [f"{key}: {len(where)} value(s) differ; first at {first}: ours {got[first]!r} vs "
            f"Megatron {want[first]!r}"]


# --- cache files ---------------------------------------------------------------------------------

def cache_listing(directory: Path, who: str) -> dict[str, np.ndarray]:
    """Names of the cache files of one side and the text of their descriptions."""
    if not directory.is_dir():
        return {f"cache/{who}/files": np.array("")}
    names = sorted(os.listdir(directory))
    out = {f"cache/{who}/files": np.array("\n".join(names))}
    for name in names:
        if name.endswith("-description.txt"):
            out[f"cache/{who}/{name}"] = np.array((directory / name).read_text())
    return out


def without_cache(record: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {key: value for key, value in record.items() if not key.startswith("cache/")}


def cache_differences(case_name: str, want: dict[str, np.ndarray],
                      got: dict[str, np.ndarray]) -> list[str]:
    """Our cache file names and descriptions must be Megatron's (same md5 names)."""
    theirs = str(want.get("cache/megatron/files", ""))
    mine = str(got.get("cache/ours/files", ""))
    if theirs == mine:
        return []
    only_theirs = sorted(set(theirs.split("\n")) - set(mine.split("\n")))
    only_mine = sorted(set(mine.split("\n")) - set(theirs.split("\n")))
    problems = [f"{case_name}: cache files differ; only Megatron: {only_theirs[:6]}; only "
                f"ours: {only_mine[:6]}"]
    for name in only_theirs:
        if not name.endswith("-description.txt"):
            continue
        kind = name.split("-")[1]
        split = name.split("-")[2]
        ours_match = [key for key in got if key.startswith("cache/ours/")
                      and f"-{kind}-{split}-description" in key]
        theirs_text = str(want[f"cache/megatron/{name}"])
        for key in ours_match:
            mine_text = str(got[key])
            problems.append(f"{case_name}: {kind} {split} description differs from Megatron's: "
                            f"{_first_line_difference(theirs_text, mine_text)}")
    return problems


def _first_line_difference(theirs: str, mine: str) -> str:
    for number, (a, b) in enumerate(zip(theirs.splitlines(), mine.splitlines(),
                                        strict=False)):
        if a != b:
            return f"line {number + 1}: Megatron {a.strip()!r} vs ours {b.strip()!r}"
    return f"length {len(theirs.splitlines())} vs {len(mine.splitlines())} lines"


def record_to_json(record: dict[str, np.ndarray]) -> str:
    """A short JSON overview of a record (for debugging)."""
    return json.dumps({key: (value.tolist() if value.size < 8 else f"{value.dtype}{value.shape}")
                       for key, value in record.items()}, indent=1)
