"""How fast `mf-train --scan-tokens` reads a dataset (`mf_data.token_scan.first_outside`).

Writes a 512 MiB dataset (128 Mi int32 token ids below 151,936, sequences of 4096) beside
itself in a temporary directory, then scans it three times against a 151,936-token
vocabulary (every id inside: the whole file is read) and prints each time and rate. The file
was just written, so its pages are in the page cache: the rate is numpy's over mapped memory;
a corpus read cold from disk goes at the disk's rate instead.

Run: python benchmarks/token_scan.py
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import numpy as np

from mf_data.indexed import IndexedDatasetBuilder, index_path
from mf_data.token_scan import first_outside

TOKENS = 128 * 2**20
SEQUENCE = 4096
VOCABULARY = 151_936


def main() -> None:
    with tempfile.TemporaryDirectory() as directory:
        prefix = str(Path(directory) / "big")
        rng = np.random.default_rng(0)
        with IndexedDatasetBuilder(prefix + ".bin", np.int32) as builder:
            per = 16 * 2**20
            for _ in range(0, TOKENS, per):
                count = per // SEQUENCE
                builder.add_documents(rng.integers(0, VOCABULARY, per, dtype=np.int32),
                                      [SEQUENCE] * count, [1] * count)
            builder.finalize(index_path(prefix))
        for run in range(3):
            start = time.perf_counter()
            found = first_outside(prefix, VOCABULARY)
            seconds = time.perf_counter() - start
            assert found is None
            print(f"scan {run + 1}: {seconds:.3f} s, {TOKENS * 4 / seconds / 2**30:.2f} GiB/s")


if __name__ == "__main__":
    main()
