"""Preprocessing throughput: ``mf-data preprocess`` against Megatron's, tokens per second, with 1
and 2 worker processes, side by side in one run.

Both sides read the same JSON Lines corpus (benchmarks/preprocess_corpus.py: the Python help
topics, ``--copies`` times, one dataset per key; ``--keys``) and tokenize it with the same
byte-level BPE (a Hugging Face model directory) into ``{prefix}_{key}_document.bin/.idx``.
Megatron's side is benchmarks/preprocess_megatron.py: Megatron-LM's ``tools/preprocess_data.py``
algorithm on megatron-core 0.16.1's tokenizer (transformers' ``AutoTokenizer`` underneath) and
``IndexedDatasetBuilder``; ``preprocess_data.py`` itself is not in the megatron-core wheel. The
time is the whole run: loading the tokenizer, starting the workers, reading, tokenizing and
writing. Both sides' files are checked to be the same bytes. Each case is repeated
(``--repeats``), the two sides interleaved and their order alternated; the table gives the best
and the median.

Usage (needs torch, megatron-core and transformers: ``nox -s bench_data``):
  python benchmarks/data_preprocess.py [--copies 20] [--repeats 5] [--keys text]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from preprocess_corpus import EOS, train_tokenizer, write_corpus

from mf_data.preprocess import megatron_prefixes, preprocess
from mf_data.text_tokenizer import tokenizer_of_type


def run_ours(corpus: Path, prefix: Path, keys: list[str], model: Path, workers: int) -> float:
    """Seconds for mf-data, tokenizer load included."""
    started = time.perf_counter()
    tokenizer = tokenizer_of_type("HuggingFaceTokenizer", model)
    preprocess(corpus, megatron_prefixes(prefix, keys), tokenizer, workers=workers,
               progress=None)
    return time.perf_counter() - started


def run_theirs(corpus: Path, prefix: Path, keys: list[str], model: Path, workers: int) -> float:
    from preprocess_megatron import megatron_preprocess

    started = time.perf_counter()
    megatron_preprocess(str(corpus), str(prefix), keys, str(model), True, workers)
    return time.perf_counter() - started


def same_output(ours: Path, theirs: Path, keys: list[str]) -> bool:
    return all(Path(f"{ours}_{key}_document{suffix}").read_bytes()
               == Path(f"{theirs}_{key}_document{suffix}").read_bytes()
               for key in keys for suffix in (".bin", ".idx"))


def tokens_written(prefix: Path, keys: list[str]) -> int:
    return sum(Path(f"{prefix}_{key}_document.bin").stat().st_size // 2 for key in keys)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--copies", type=int, default=20, help="corpus size in topic copies")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--keys", nargs="+", default=["text"])
    args = parser.parse_args()
    # Imported here, not at the top: mf-data's workers are spawned processes, which import
    # this script again; at the top, every worker would import torch and megatron-core too.
    from preprocess_megatron import save_tokenizer_directory

    with tempfile.TemporaryDirectory(prefix="mf-bench-preprocess-") as directory:
        work = Path(directory)
        corpus = work / "corpus.jsonl"
        documents = write_corpus(corpus, copies=args.copies)
        model = work / "model"
        save_tokenizer_directory(train_tokenizer(work / "bpe.json"), model, EOS)
        rows = []
        for workers in (1, 2):
            ours: list[float] = []
            theirs: list[float] = []
            for repeat in range(args.repeats):
                sides = [(ours, run_ours, work / "ours"), (theirs, run_theirs, work / "theirs")]
                for times, run, prefix in sides if repeat % 2 == 0 else sides[::-1]:
                    times.append(run(corpus, prefix, args.keys, model, workers))
            if not same_output(work / "ours", work / "theirs", args.keys):
                raise SystemExit(f"workers={workers}: the two sides wrote different files")
            rows.append((workers, ours, theirs))
        tokens = tokens_written(work / "ours", args.keys)
        print(f"corpus: {documents:,} documents, {corpus.stat().st_size / 1e6:.1f} MB, "
              f"keys {', '.join(args.keys)}; {tokens:,} tokens written (EOD included), "
              "outputs identical on both sides\n")
        print("| workers | mf-data tokens/s | Megatron tokens/s | mf / Megatron |")
        print("|---|---|---|---|")
        for workers, ours, theirs in rows:
            def rate(times: list[float], pick: object) -> float:
                return tokens / pick(times)  # type: ignore[operator]

            best = rate(ours, min) / rate(theirs, min)
            median = rate(ours, statistics.median) / rate(theirs, statistics.median)
            print(f"| {workers} | {rate(ours, min):,.0f} ({rate(ours, statistics.median):,.0f}) "
                  f"| {rate(theirs, min):,.0f} ({rate(theirs, statistics.median):,.0f}) "
                  f"| {best:.2f} ({median:.2f}) |")
        print("\nbest (median) of", args.repeats, "runs each")


if __name__ == "__main__":
    main()
