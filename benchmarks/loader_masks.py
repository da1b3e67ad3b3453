"""The loader's micro-batch with the compact document mask against the dense one, kept bool and
cast to int32 as the loader did before (the baseline), over a real preprocessed corpus.

A JSON-lines corpus of many short documents (random lowercase words, 20-430 bytes each, so a
sample of 2048 tokens holds about ten documents and one of 8192 about forty) is written and
turned into a Megatron dataset by `mf-data preprocess` (byte tokenizer, EOD 256), in a temporary
directory deleted at the end. The datasets are built from `train_dataset.dataloader` settings
as a training YAML gives them (`build_datasets`), with `reset_position_ids: true` and:

- compact: `create_compressed_eod_mask: true` (an `actual_seq_len` column of document ends,
  `eod_pad_length` S / 16), what a model with varlen attention reads;
- dense bool: `reset_attention_mask: true`, `create_attention_mask: true` (the block-diagonal
  `[b, 1, S, S]` mask), as the loader now hands it over;
- dense int32 (baseline): the same loader with the mask cast to int32 after stacking, in the
  loader's background thread, exactly as `BatchLoader.collate` did before the mask stayed bool;
- dense bool, context rank 0 of 2: the dense loader of one rank under context parallelism 2
  (causal split: its query rows only);
- no mask column: tokens, labels, loss_mask and position_ids only (the floor).

For each sequence length and case: the loader's time per micro-batch (the batches after the
first, as the trainer takes them), `collate` alone on samples built beforehand (stacking and
casting only), and the bytes of one batch. Cases are interleaved and their order rotated over
`--repeats`; best and median are printed, and the speed-up over the baseline (its median / the
case's).

Usage: python benchmarks/loader_masks.py [--seq 2048 8192] [--micro-batch 4] [--batches 8]
                                         [--repeats 3] [--keep]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from mf_config import DataloaderConfig
from mf_config.converter import converter
from mf_data.builder import build_datasets
from mf_data.context_split import ContextSplit
from mf_data.loader import BatchLoader

EOD = 256  # the byte tokenizer's (mf-data preprocess's default)
COLUMNS = ["input_ids", "labels", "loss_mask", "position_ids"]
BASELINE = "dense int32 (old loader, baseline)"


class Int32MaskLoader(BatchLoader):
    """The loader before the mask stayed bool: stacked, then the whole batch cast to int32."""

    def collate(self, samples: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
        batch = super().collate(samples)
        batch["attention_mask"] = batch["attention_mask"].astype(np.int32)
        return batch


@dataclass
class Case:
    """One loader setting: the sample flags, its columns, and how the loader is made."""

    name: str
    flags: dict[str, Any]
    columns: list[str]
    loader: type[BatchLoader] = BatchLoader
    context: ContextSplit | None = None
    times: list[float] = field(default_factory=list)
    collate_times: list[float] = field(default_factory=list)
    nbytes: int = 0


def cases(seq: int) -> list[Case]:
    compact = {"create_compressed_eod_mask": True, "eod_pad_length": seq // 16}
    dense = {"reset_attention_mask": True, "create_attention_mask": True}
    return [
        Case("compact (actual_seq_len)", compact, [*COLUMNS, "actual_seq_len"]),
        Case("dense bool", dense, [*COLUMNS, "attention_mask"]),
        Case(BASELINE, dense, [*COLUMNS, "attention_mask"], Int32MaskLoader),
        Case("dense bool, context rank 0 of 2", dense, [*COLUMNS, "attention_mask"],
             context=ContextSplit(2, 0)),
        Case("no mask column", {}, COLUMNS),
    ]


def write_corpus(directory: Path, tokens: int, seed: int = 0) -> str:
    """Short documents of random words as JSON lines, preprocessed by `mf-data preprocess`."""
    rng = np.random.default_rng(seed)
    words = ["".join(rng.choice(list("abcdefghijklmnopqrstuvwxyz"), int(n)))
             for n in rng.integers(2, 10, 2000)]
    jsonl, written = directory / "short_docs.jsonl", 0
    with jsonl.open("w") as out:
        while written < tokens:
            text = " ".join(rng.choice(words, int(rng.integers(20, 400)) // 6))
            out.write(json.dumps({"text": text}) + "\n")
            written += len(text) + 1
    prefix = str(directory / "short_docs_text_document")
    subprocess.run([sys.executable, "-m", "mf_data", "preprocess", "--input", str(jsonl),
                    "--output-prefix", prefix, "--quiet"], check=True, stdout=subprocess.DEVNULL)
    return prefix


def dataset(prefix: str, cache: Path, seq: int, samples: int, flags: dict[str, Any]) -> Any:
    """The training split as a YAML's `train_dataset.dataloader` section builds it."""
    section = converter.structure({
        "type": "BlendedMegatronDatasetDataLoader", "datasets_type": "GPTDataset",
        "sizes": [samples, 0, 0],
        "config": {"seq_length": seq, "split": "1, 0, 0", "eod": EOD, "pad": -1,
                   "data_path": ["1", prefix], "path_to_cache": str(cache),
                   "reset_position_ids": True, **flags}}, DataloaderConfig)
    return build_datasets(section)[0]


def time_loader(case: Case, data: Any, micro_batch: int, batches: int) -> float:
    """Seconds per micro-batch after the first, as the consumer receives them."""
    loader = case.loader(data, micro_batch_size=micro_batch, column_names=case.columns,
                         num_parallel_workers=1, prefetch_size=1, context=case.context)
    iterator = iter(loader)
    case.nbytes = sum(column.nbytes for column in next(iterator).values())
    start = time.perf_counter()
    for _ in range(batches):
        next(iterator)
    elapsed = time.perf_counter() - start
    iterator.close()
    return elapsed / batches


def time_collate(case: Case, data: Any, micro_batch: int) -> float:
    """Seconds of `collate` alone (stacking, splitting and casting) on prebuilt samples."""
    loader = case.loader(data, micro_batch_size=micro_batch, column_names=case.columns,
                         context=case.context)
    samples = [data[i] for i in range(micro_batch)]
    start = time.perf_counter()
    loader.collate(samples)
    return time.perf_counter() - start


def measure(seq: int, prefix: str, cache: Path, args: argparse.Namespace) -> list[Case]:
    samples = args.micro_batch * (args.batches + 1)
    rows = cases(seq)
    datasets = {json.dumps(case.flags, sort_keys=True): None for case in rows}
    for key in datasets:
        datasets[key] = dataset(prefix, cache, seq, samples, json.loads(key))
    for repeat in range(args.repeats):
        shift = repeat % len(rows)
        for case in rows[shift:] + rows[:shift]:
            data = datasets[json.dumps(case.flags, sort_keys=True)]
            case.times.append(time_loader(case, data, args.micro_batch, args.batches))
            case.collate_times.append(time_collate(case, data, args.micro_batch))
        print(f"\rseq {seq}: repeat {repeat + 1}/{args.repeats}", end="", file=sys.stderr,
              flush=True)
    print(file=sys.stderr)
    return rows


def show(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms" if seconds >= 0.01 else f"{seconds * 1000:.2f} ms"


def table(seq: int, rows: list[Case], micro_batch: int) -> None:
    base = next(case for case in rows if case.name == BASELINE)
    pick: Callable[[list[float]], float] = statistics.median
    print(f"\nseq {seq}, micro-batch {micro_batch}: best (median); speed-up = the baseline's "
          "median / the case's")
    print("| case | loader per batch | speed-up | collate alone | speed-up "
          "| bytes per batch |")
    print("|---|---|---|---|---|---|")
    for case in rows:
        print(f"| {case.name} | {show(min(case.times))} ({show(pick(case.times))}) "
              f"| {pick(base.times) / pick(case.times):.1f} "
              f"| {show(min(case.collate_times))} ({show(pick(case.collate_times))}) "
              f"| {pick(base.collate_times) / pick(case.collate_times):.1f} "
              f"| {case.nbytes / 2**20:,.2f} MiB |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seq", type=int, nargs="+", default=[2048, 8192])
    parser.add_argument("--micro-batch", type=int, default=4)
    parser.add_argument("--batches", type=int, default=8, help="timed batches per run")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--keep", action="store_true", help="keep the temporary corpus")
    args = parser.parse_args()
    directory = Path(tempfile.mkdtemp(prefix="mf-loader-masks-"))
    try:
        tokens = max(args.seq) * args.micro_batch * (args.batches + 2)
        prefix = write_corpus(directory, tokens)
        for seq in args.seq:
            table(seq, measure(seq, prefix, directory / "cache", args), args.micro_batch)
    finally:
        if args.keep:
            print(f"corpus kept in {directory}", file=sys.stderr)
        else:
            shutil.rmtree(directory)


if __name__ == "__main__":
    main()
