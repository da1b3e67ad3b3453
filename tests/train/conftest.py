"""Fixtures shared by the trainer's tests."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def data_prefix(tmp_path_factory) -> str:
    """examples/data/tiny.jsonl preprocessed by `mf-data preprocess` (byte tokens, EOD 256):
    the prefix of its .bin/.idx pair."""
    prefix = tmp_path_factory.mktemp("data") / "tiny_text_document"
    subprocess.run([sys.executable, "-m", "mf_data", "preprocess", "--input",
                    str(ROOT / "examples" / "data" / "tiny.jsonl"), "--output-prefix",
                    str(prefix)], check=True, capture_output=True)
    return str(prefix)
