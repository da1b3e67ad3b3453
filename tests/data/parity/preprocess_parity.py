"""``mf-data preprocess`` against Megatron's preprocessing, byte for byte.

Run by ``nox -s megatron_parity`` (torch, megatron-core 0.16.1 and transformers installed).
Megatron's side is benchmarks/preprocess_megatron.py: the algorithm of Megatron-LM's
``tools/preprocess_data.py`` (not in the wheel) on megatron-core's tokenizer and
``IndexedDatasetBuilder``. The corpus is benchmarks/preprocess_corpus.py's (the Python help
topics under three keys, one of them lists of paragraphs with empty ones, and an empty
document), the tokenizer a byte-level BPE trained on it, saved as a Hugging Face model
directory. For ``--append-eod`` on and off and 1 and 2 workers on each side, every key's
``.bin`` and ``.idx`` must be the same bytes; then the ``mf-data`` command itself, Megatron's
flags on a ``.jsonl.gz`` copy of the corpus, must write the same files.

Usage: python tests/data/parity/preprocess_parity.py
"""

from __future__ import annotations

import gzip
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "benchmarks"))

from preprocess_corpus import EOS, train_tokenizer, write_corpus  # noqa: E402
from preprocess_megatron import megatron_preprocess, save_tokenizer_directory  # noqa: E402

from mf_data.preprocess import megatron_prefixes, preprocess  # noqa: E402
from mf_data.text_tokenizer import tokenizer_of_type  # noqa: E402

KEYS = ["text", "title", "paragraphs"]


def same_files(ours: str, theirs: str) -> list[str]:
    """The differing files of two prefixes (empty: identical)."""
    return [suffix for suffix in (".bin", ".idx")
            if Path(ours + suffix).read_bytes() != Path(theirs + suffix).read_bytes()]


def main() -> int:
    failures = 0
    with tempfile.TemporaryDirectory(prefix="mf-preprocess-parity-") as directory:
        work = Path(directory)
        corpus = work / "corpus.jsonl"
        documents = write_corpus(corpus)
        model = work / "model"
        save_tokenizer_directory(train_tokenizer(work / "bpe.json"), model, EOS)
        tokenizer = tokenizer_of_type("HuggingFaceTokenizer", model)
        for append_eod in (True, False):
            for workers in (1, 2):
                case = f"append_eod={append_eod} workers={workers}"
                megatron_preprocess(str(corpus), str(work / f"m{workers}{append_eod}"), KEYS,
                                    str(model), append_eod, workers)
                outputs = megatron_prefixes(work / f"o{workers}{append_eod}", KEYS)
                preprocess(corpus, outputs, tokenizer, append_eod=append_eod, workers=workers,
                           progress=None)
                for key, ours in outputs.items():
                    theirs = f"{work}/m{workers}{append_eod}_{key}_document"
                    differing = same_files(ours, theirs)
                    failures += bool(differing)
                    verdict = "DIFFER " + " ".join(differing) if differing else "same"
                    print(f"{case} {key}: {verdict} "
                          f"({Path(ours + '.bin').stat().st_size:,} bytes of tokens)")
        with open(corpus, "rb") as plain, gzip.open(work / "corpus.jsonl.gz", "wb") as packed:
            shutil.copyfileobj(plain, packed)
        command = [sys.executable, "-m", "mf_data", "preprocess", "--input",
                   str(work / "corpus.jsonl.gz"), "--output-prefix", str(work / "cli"),
                   "--json-keys", *KEYS, "--tokenizer-type", "HuggingFaceTokenizer",
                   "--tokenizer-model", str(model), "--append-eod", "--workers", "2", "--quiet"]
        subprocess.run(command, check=True, timeout=600)
        for key in KEYS:
            differing = same_files(f"{work}/cli_{key}_document", f"{work}/m2True_{key}_document")
            failures += bool(differing)
            print(f"mf-data preprocess (.jsonl.gz, Megatron flags) {key}: "
                  f"{'DIFFER ' + ' '.join(differing) if differing else 'same'}")
    print(f"{documents} documents, tokenizer {tokenizer.name} (vocabulary "
          f"{tokenizer.vocab_size}, EOD {tokenizer.eod}): "
          f"{'all equal' if failures == 0 else f'{failures} differ'}")
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
