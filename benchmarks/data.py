"""mf-data against megatron-core 0.16.1, side by side in one process: index build, sample reads,
the batch loader.

Two synthetic corpora like those of shared/reference/megatron-datasets.md section 7:
``big_u16`` (133,456 documents of 1..3000 uint16 tokens, about 200M tokens, a real 400 MB
``.bin``; every document ends with EOD) and ``many_docs`` (2,000,000 sequences of 1..199 tokens;
only the ``.idx`` is real, the ``.bin`` is a sparse file, so it serves index timing only).
Split "969,30,1", the train split, seq_length 4096, seed 1234.

1. Index build: the ``GPTDataset`` constructor on a cache miss (building the document, sample
   and shuffle indices and writing the cache files), and the sample index alone
   (``build_sample_index`` against Megatron's C++ ``helpers.build_sample_idx``, same inputs) and
   the document index alone, for 1 epoch, 3 epochs (final epoch joint and separate) and 2M
   samples (many epochs, separate final epoch). Both sides' arrays are checked to be equal.
2. Random sample reads on ``big_u16``: the same random sample ids on both sides, for several
   mask settings (samples checked equal).
3. The loader: ``BatchLoader`` (micro-batch 4, default flags) batches per second, with
   torch's ``DataLoader`` over Megatron's dataset for orientation.

Each measurement is repeated (``--repeats``, default 3), the two sides interleaved and their
order alternated; the tables give the best and the median, and the speed-up of mf-data
(Megatron's time / ours, or our rate / Megatron's). Everything is written under a temporary
directory in /tmp, deleted at the end (``--keep`` keeps it).

Usage (needs torch and megatron-core: ``nox -s bench_data``):
  python benchmarks/data.py [--scale 0.25] [--repeats 3] [--sections index,reads,loader]
"""

from __future__ import annotations

import argparse
import gc
import os
import resource
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from mf_data.gpt_dataset import GPTDataset, GPTDatasetConfig
from mf_data.gpt_indices import (
    build_document_index,
    build_sample_index,
    num_epochs,
    separate_final_epoch,
    tokens_per_epoch,
)
from mf_data.indexed import IndexedDataset, write_index_file
from mf_data.loader import BatchLoader
from mf_data.split import parse_split, split_indices, split_matrix

SEQ_LENGTH = 4096
SPLIT = "969,30,1"
SEED = 1234
EOD = 1
TOKENIZER_IDS = {"class": "StandInTokenizer", "eod": EOD}
BIG_DOCUMENTS = 133_456
MANY_SEQUENCES = 2_000_000
MANY_EPOCH_SAMPLES = 2_000_000
MICRO_BATCH = 4
COLUMNS = ("input_ids", "labels", "loss_mask", "position_ids")
COLUMNS_WITH_MASK = (*COLUMNS, "attention_mask")


# --- measuring ------------------------------------------------------------------------------

@dataclass
class Measure:
    """One row: ``what`` measured ``repeats`` times on each side, as seconds or as a rate."""

    corpus: str
    case: str
    what: str
    ours: list[float] = field(default_factory=list)
    theirs: list[float] = field(default_factory=list)
    rate_unit: str | None = None  # None: values are seconds (lower is better)
    note: str = ""

    def best(self, values: list[float]) -> float:
        return max(values) if self.rate_unit else min(values)

    def speedup(self, pick: Callable[[list[float]], float]) -> float:
        ours, theirs = pick(self.ours), pick(self.theirs)
        return ours / theirs if self.rate_unit else theirs / ours

    def cells(self) -> list[str]:
        def show(values: list[float]) -> str:
            if not values:
                return "-"
            best, median = self.best(values), statistics.median(values)
            return f"{fmt(best, self.rate_unit)} ({fmt(median, self.rate_unit)})"

        ratio = "-"
        if self.ours and self.theirs:
            ratio = f"{self.speedup(self.best):.2f} ({self.speedup(statistics.median):.2f})"
        return [self.corpus, self.case, self.what, show(self.ours), show(self.theirs), ratio,
                self.note]


def fmt(value: float, rate_unit: str | None) -> str:
    if rate_unit:
        return f"{value:,.0f} {rate_unit}" if value >= 100 else f"{value:.1f} {rate_unit}"
    if value >= 1:
        return f"{value:.2f} s"
    return f"{value * 1000:.1f} ms" if value >= 0.01 else f"{value * 1000:.2f} ms"


def interleave(row: Measure, ours: Callable[[], float], theirs: Callable[[], float] | None,
               repeats: int) -> Measure:
    """Run both sides ``repeats`` times, alternating which goes first; each callable returns
    its own measured value (seconds, or a rate)."""
    for repeat in range(repeats):
        sides = [(row.ours, ours), (row.theirs, theirs)]
        for values, run in sides if repeat % 2 == 0 else sides[::-1]:
            if run is not None:
                values.append(run())
                gc.collect()
    return row


def print_table(title: str, rows: list[Measure]) -> None:
    print(f"\n### {title}\n")
    header = ["corpus", "case", "what", "mf-data best (median)", "Megatron best (median)",
              "speed-up best (median)", "note"]
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for row in rows:
        print("| " + " | ".join(row.cells()) + " |")
    print(flush=True)


def peak_rss_mib() -> tuple[float, float]:
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    return own, children


# --- corpora --------------------------------------------------------------------------------

@dataclass
class Corpus:
    name: str
    prefix: str
    real_bin: bool
    sequences: int
    tokens: int


def make_corpus(directory: Path, name: str, count: int, max_length: int, real_bin: bool,
                seed: int) -> Corpus:
    """``count`` one-sequence documents of 1..max_length uint16 tokens ending in EOD. With
    ``real_bin`` False the ``.bin`` is a sparse file of the right size (zeros)."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, max_length + 1, size=count).astype(np.int32)
    prefix = str(directory / name)
    total = int(lengths.sum(dtype=np.int64))
    temporary = f"{prefix}.bin.tmp"
    with open(temporary, "wb") as stream:
        if real_bin:
            for start in range(0, count, 8192):
                chunk = lengths[start:start + 8192]
                tokens = rng.integers(2, 32_000, size=int(chunk.sum()), dtype=np.uint16)
                tokens[np.cumsum(chunk) - 1] = EOD
                stream.write(tokens.tobytes())
        else:
            stream.truncate(total * 2)
    os.replace(temporary, f"{prefix}.bin")
    write_index_file(f"{prefix}.idx", np.uint16, lengths, np.arange(count + 1, dtype=np.int64))
    return Corpus(name, prefix, real_bin, count, total)


def warm_page_cache(path: str) -> None:
    with open(path, "rb") as stream:
        while stream.read(64 << 20):
            pass


def train_indices(sequences: int) -> np.ndarray:
    return split_indices(split_matrix(parse_split(SPLIT))[0], sequences)


def our_config(cache_dir: str, **flags: bool) -> GPTDatasetConfig:
    return GPTDatasetConfig(sequence_length=SEQ_LENGTH, eod=EOD, random_seed=SEED, split=SPLIT,
                            path_to_cache=cache_dir, tokenizer_identifiers=TOKENIZER_IDS,
                            **flags)


def their_config(megatron: Any, prefix: str, cache_dir: str, **flags: bool) -> Any:
    return megatron.config(prefix, SEQ_LENGTH, EOD, TOKENIZER_IDS, SPLIT, cache_dir, **flags)


class FreshDirs:
    """A new, not yet existing cache directory per call (so every build is a cache miss)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.count = 0

    def __call__(self) -> str:
        self.count += 1
        return str(self.root / f"cache-{self.count}")


# --- 1. index build -------------------------------------------------------------------------

def index_cases(train_tokens: int, scale: float) -> list[tuple[str, int | None]]:
    per_epoch = (train_tokens - 1) // SEQ_LENGTH
    many = max(1, round(MANY_EPOCH_SAMPLES * scale))
    return [("1 epoch", None), ("3 ep joint", 3 * per_epoch - 1),
            ("3 ep separate", 2 * per_epoch + per_epoch // 10), (f"n={many:,}", many)]


def bench_index(corpus: Corpus, megatron: Any, scale: float, repeats: int,
                fresh_dir: FreshDirs) -> list[Measure]:
    ours_indexed = IndexedDataset(corpus.prefix)
    their_indexed = megatron.open_indexed(corpus.prefix)
    indices = train_indices(len(ours_indexed))
    lengths = np.array(ours_indexed.sequence_lengths)  # in memory, for the helpers alone
    tokens = tokens_per_epoch(lengths, indices)
    rows: list[Measure] = []
    for case, num_samples in index_cases(tokens, scale):
        epochs = num_epochs(tokens, SEQ_LENGTH, num_samples, 1)
        separate = separate_final_epoch(epochs, tokens, SEQ_LENGTH, num_samples, 1)
        label = f"{case} (E={epochs}{', sep' if separate else ''})"
        built: dict[str, Any] = {}

        def ours_ctor(built: dict[str, Any] = built, num_samples: int | None = num_samples
                      ) -> float:
            cache = fresh_dir()
            config = our_config(cache)
            start = time.perf_counter()
            dataset = GPTDataset(ours_indexed, corpus.prefix, indices, num_samples, "train",
                                 config)
            elapsed = time.perf_counter() - start
            built.setdefault("ours", (dataset.document_index, dataset.sample_index,
                                      dataset.shuffle_index))
            shutil.rmtree(cache)
            return elapsed

        def their_ctor(built: dict[str, Any] = built, num_samples: int | None = num_samples
                       ) -> float:
            cache = fresh_dir()
            config = their_config(megatron, corpus.prefix, cache)
            start = time.perf_counter()
            dataset = megatron.train_dataset(their_indexed, corpus.prefix, indices,
                                             num_samples, config)
            elapsed = time.perf_counter() - start
            built.setdefault("theirs", (dataset.document_index, dataset.sample_index,
                                        dataset.shuffle_index))
            shutil.rmtree(cache)
            return elapsed

        ctor = interleave(Measure(corpus.name, label, "GPTDataset ctor, cache miss"),
                          ours_ctor, their_ctor, repeats)
        ours_arrays, their_arrays = built.pop("ours"), built.pop("theirs")
        equal = all(a.dtype == b.dtype and np.array_equal(a, b)
                    for a, b in zip(ours_arrays, their_arrays, strict=True))
        samples = len(ours_arrays[1]) - 1
        ctor.note = (f"{samples:,} samples, doc index {len(ours_arrays[0]):,}; "
                     f"indices {'equal' if equal else 'DIFFER'}")
        document_index = ours_arrays[0]
        del ours_arrays, their_arrays
        gc.collect()

        def ours_samples(document_index: np.ndarray = document_index, epochs: int = epochs
                         ) -> float:
            start = time.perf_counter()
            build_sample_index(lengths, document_index, SEQ_LENGTH, epochs, tokens, True, 1)
            return time.perf_counter() - start

        def their_samples(document_index: np.ndarray = document_index, epochs: int = epochs
                          ) -> float:
            start = time.perf_counter()
            megatron.build_sample_index(lengths, document_index, SEQ_LENGTH, epochs, tokens)
            return time.perf_counter() - start

        sample_row = interleave(Measure(corpus.name, label, "sample index alone"),
                                ours_samples, their_samples, repeats)
        del document_index

        def ours_documents(epochs: int = epochs, separate: bool = separate) -> float:
            start = time.perf_counter()
            build_document_index(indices, epochs, np.random.RandomState(SEED), separate)
            return time.perf_counter() - start

        def their_documents(epochs: int = epochs, separate: bool = separate) -> float:
            start = time.perf_counter()
            megatron.build_document_index(indices, epochs, SEED, separate)
            return time.perf_counter() - start

        document_row = interleave(Measure(corpus.name, label, "document index alone"),
                                  ours_documents, their_documents, repeats)
        rows += [ctor, sample_row, document_row]
        print(f"  {corpus.name} {label}: ctor {ctor.cells()[3]} vs {ctor.cells()[4]}",
              flush=True)
    return rows


# --- 2. sample reads ------------------------------------------------------------------------

@dataclass(frozen=True)
class ReadCase:
    name: str
    flags: dict[str, bool]
    ours_count: int
    their_count: int
    fresh: bool = False  # Megatron: forget the cached masks before every sample
    note: str = ""


NO_MASK = {"create_attention_mask": False}
ALL_RESETS = {"reset_position_ids": True, "reset_attention_mask": True, "eod_mask_loss": True,
              "create_attention_mask": False}
DOCUMENT_MASK = {"reset_attention_mask": True, "create_attention_mask": True}

READ_CASES = [
    ReadCase("default flags, no attention mask", NO_MASK, 3000, 3000,
             note="Megatron reuses the first sample's loss mask/position ids"),
    ReadCase("default flags, no attention mask", NO_MASK, 3000, 3000, fresh=True,
             note="Megatron's masks computed per sample"),
    ReadCase("default flags + create_attention_mask", {}, 3000, 3000,
             note="Megatron reuses its cached causal mask"),
    ReadCase("default flags + create_attention_mask", {}, 3000, 30, fresh=True,
             note="Megatron builds the causal mask per sample"),
    ReadCase("reset_position_ids + reset_attention_mask + eod_mask_loss", ALL_RESETS, 3000,
             1000),
    ReadCase("reset_attention_mask + create_attention_mask", DOCUMENT_MASK, 300, 30,
             note="block-diagonal mask"),
]


def same_sample(ours: dict[str, np.ndarray], theirs: dict[str, np.ndarray]) -> str:
    if ours.keys() != theirs.keys():
        return f"keys differ: {sorted(ours)} vs {sorted(theirs)}"
    for key in ours:
        if ours[key].dtype != theirs[key].dtype or not np.array_equal(ours[key], theirs[key]):
            return f"{key} differs"
    return "equal"


def bench_reads(corpus: Corpus, megatron: Any, repeats: int, fresh_dir: FreshDirs
                ) -> list[Measure]:
    warm_page_cache(f"{corpus.prefix}.bin")
    cache = fresh_dir()
    ours_indexed = IndexedDataset(corpus.prefix)
    their_indexed = megatron.open_indexed(corpus.prefix)
    indices = train_indices(len(ours_indexed))
    rows: list[Measure] = []
    ids: np.ndarray | None = None
    for case in READ_CASES:
        ours = GPTDataset(ours_indexed, corpus.prefix, indices, None, "train",
                          our_config(cache, **case.flags))
        theirs = megatron.train_dataset(their_indexed, corpus.prefix, indices, None,
                                        their_config(megatron, corpus.prefix, cache,
                                                     **case.flags))
        if ids is None:
            ids = np.random.default_rng(7).integers(1, len(ours), size=3000).tolist()
            text_row = bench_text(corpus, ours, theirs, megatron, ids, repeats)
        checks = {same_sample(ours[i], megatron.as_numpy(_fresh_sample(megatron, theirs, i)))
                  for i in ids[:3]}
        _ = (ours[0], theirs[0])  # warm-up; Megatron's (stateful) mask cache is filled from here
        ours_ids, their_ids = ids[:case.ours_count], ids[:case.their_count]

        def read_ours(dataset: GPTDataset = ours, chosen: list[int] = ours_ids) -> float:
            start = time.perf_counter()
            for index in chosen:
                dataset[index]
            return len(chosen) / (time.perf_counter() - start)

        def read_theirs(dataset: Any = theirs, chosen: list[int] = their_ids,
                        fresh: bool = case.fresh) -> float:
            start = time.perf_counter()
            for index in chosen:
                if fresh:
                    megatron.fresh_masks(dataset)
                dataset[index]
            return len(chosen) / (time.perf_counter() - start)

        what = "GPTDataset[i]" + (", Megatron masks fresh" if case.fresh else "")
        note = "; ".join(part for part in (case.note, f"{len(ours_ids)}/{len(their_ids)} "
                                           f"samples", f"samples {', '.join(sorted(checks))}")
                         if part)
        row = interleave(Measure(corpus.name, case.name, what, rate_unit="/s", note=note),
                         read_ours, read_theirs, repeats)
        rows.append(row)
        print(f"  {case.name}{' (fresh)' if case.fresh else ''}: {row.cells()[3]} vs "
              f"{row.cells()[4]}", flush=True)
        del ours, theirs
        gc.collect()
    shutil.rmtree(cache)
    return [text_row, *rows]


def _fresh_sample(megatron: Any, dataset: Any, index: int) -> dict[str, Any]:
    megatron.fresh_masks(dataset)
    sample = dataset[index]
    megatron.fresh_masks(dataset)
    return sample


def bench_text(corpus: Corpus, ours: GPTDataset, theirs: Any, megatron: Any, ids: list[int],
               repeats: int) -> Measure:
    """Reading a sample's token ids only (no tokens/labels/masks)."""
    equal = all(np.array_equal(ours.sample_text(i), megatron.sample_text(theirs, i))
                for i in ids[:20])

    def read_ours() -> float:
        start = time.perf_counter()
        for index in ids:
            ours.sample_text(index)
        return len(ids) / (time.perf_counter() - start)

    def read_theirs() -> float:
        start = time.perf_counter()
        for index in ids:
            megatron.sample_text(theirs, index)
        return len(ids) / (time.perf_counter() - start)

    return interleave(Measure(corpus.name, "token ids only", "sample_text / _query_...",
                              rate_unit="/s", note=f"{len(ids)} samples; "
                              f"{'equal' if equal else 'DIFFER'}"),
                      read_ours, read_theirs, repeats)


# --- 3. the loader --------------------------------------------------------------------------

def bench_loader(corpus: Corpus, megatron: Any, repeats: int, batches: int,
                 fresh_dir: FreshDirs) -> list[Measure]:
    warm_page_cache(f"{corpus.prefix}.bin")
    cache = fresh_dir()
    ours_indexed = IndexedDataset(corpus.prefix)
    their_indexed = megatron.open_indexed(corpus.prefix)
    indices = train_indices(len(ours_indexed))
    rows = []
    plans = [  # (case, flags, our workers, our columns, Megatron workers, batches)
        ("default flags, no attention mask", NO_MASK, 1, COLUMNS, 0, batches),
        ("default flags, no attention mask", NO_MASK, 2, COLUMNS, 2, batches),
        ("default flags + attention mask column", {}, 1, COLUMNS_WITH_MASK, 0,
         min(10, batches)),
    ]
    for case, flags, workers, columns, their_workers, count in plans:
        ours = GPTDataset(ours_indexed, corpus.prefix, indices, None, "train",
                          our_config(cache, **flags))
        theirs = megatron.train_dataset(their_indexed, corpus.prefix, indices, None,
                                        their_config(megatron, corpus.prefix, cache, **flags))

        def run_ours(dataset: GPTDataset = ours, workers: int = workers,
                     columns: tuple[str, ...] = columns, count: int = count) -> float:
            loader = BatchLoader(dataset, micro_batch_size=MICRO_BATCH, column_names=columns,
                                 num_parallel_workers=workers, prefetch_size=2)
            return _batches_per_second(iter(loader), count)

        def run_theirs(dataset: Any = theirs, workers: int = their_workers,
                       count: int = count) -> float:
            loader = megatron.data_loader(dataset, MICRO_BATCH, count + 1, workers)
            return _batches_per_second(iter(loader), count)

        what = (f"BatchLoader workers={workers} prefetch=2 / torch DataLoader "
                f"num_workers={their_workers}")
        row = interleave(Measure(corpus.name, case, what, rate_unit="batches/s",
                                 note=f"micro-batch {MICRO_BATCH} x {SEQ_LENGTH}, {count} "
                                      f"batches after the first"),
                         run_ours, run_theirs, repeats)
        rows.append(row)
        print(f"  {case}, workers {workers}: {row.cells()[3]} vs {row.cells()[4]}", flush=True)
        del ours, theirs
        gc.collect()
    shutil.rmtree(cache)
    return rows


def _batches_per_second(batches: Any, count: int) -> float:
    """Batches per second after the first batch (start-up of workers excluded)."""
    next(batches)
    start = time.perf_counter()
    for _ in range(count):
        next(batches)
    elapsed = time.perf_counter() - start
    close = getattr(batches, "close", None)
    if close is not None:
        close()
    del batches
    return count / elapsed


# --- main -----------------------------------------------------------------------------------

def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", type=float, default=1.0,
                        help="corpus sizes and the many-epoch sample count times this (1.0: "
                             "section 7's sizes)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--batches", type=int, default=1000,
                        help="loader batches per repeat (10 with the attention mask column)")
    parser.add_argument("--sections", default="index,reads,loader")
    parser.add_argument("--keep", action="store_true", help="keep the corpora and caches")
    args = parser.parse_args()
    sections = set(args.sections.split(","))

    import data_megatron as megatron  # torch and megatron-core: only when it runs

    work = Path(tempfile.mkdtemp(prefix="mf-bench-data-", dir="/tmp"))
    fresh_dir = FreshDirs(work)
    print(f"mf-data against {megatron.VERSION} (torch threads {megatron.torch_threads()}), "
          f"numpy {np.__version__}, {os.cpu_count()} CPUs; seq_length {SEQ_LENGTH}, split "
          f"{SPLIT}, train split; {args.repeats} repeats; work directory {work}", flush=True)
    try:
        start = time.perf_counter()
        big = make_corpus(work, "big_u16", round(BIG_DOCUMENTS * args.scale), 3000, True, 1)
        print(f"big_u16: {big.sequences:,} documents, {big.tokens / 1e6:.1f}M tokens, real "
              f".bin ({time.perf_counter() - start:.1f} s to write)", flush=True)
        results: list[tuple[str, list[Measure]]] = []
        if "index" in sections:
            many = make_corpus(work, "many_docs", round(MANY_SEQUENCES * args.scale), 199,
                               False, 2)
            print(f"many_docs: {many.sequences:,} sequences, {many.tokens / 1e6:.1f}M tokens, "
                  f"sparse .bin", flush=True)
            rows = []
            for corpus in (big, many):
                rows += bench_index(corpus, megatron, args.scale, args.repeats, fresh_dir)
            results.append(("Index build (times; speed-up = Megatron / mf-data)", rows))
            print(f"  peak RSS so far: {peak_rss_mib()[0]:,.0f} MiB", flush=True)
        if "reads" in sections:
            results.append(("Random sample reads, seq 4096 (rates; speed-up = mf-data / "
                            "Megatron)", bench_reads(big, megatron, args.repeats, fresh_dir)))
        if "loader" in sections:
            results.append(("Loader (batches/s; speed-up = mf-data / Megatron)",
                            bench_loader(big, megatron, args.repeats, args.batches,
                                         fresh_dir)))
        for title, rows in results:
            print_table(title, rows)
        own, children = peak_rss_mib()
        print(f"peak RSS: this process {own:,.0f} MiB, largest child {children:,.0f} MiB; "
              f"total {time.perf_counter() - start:.0f} s")
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
