"""The mf-data command, run as a user runs it: `python -m mf_data ...` in a subprocess."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from mf_data.corpus_stats import LengthBucket, corpus_stats, format_stats
from mf_data.indexed import IndexedDataset, write_indexed


def mf_data(*args: str | Path, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "mf_data", *map(str, args)], cwd=cwd,
                          capture_output=True, text=True, timeout=60)


def write_jsonl(path: Path, texts: list[str]) -> Path:
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts), encoding="utf-8")
    return path


def test_new_user_flow_preprocess_then_inspect(tmp_path: Path) -> None:
    write_jsonl(tmp_path / "docs.jsonl", ["hello", "hi", "a longer document here"])
    made = mf_data("preprocess", "--input", "docs.jsonl", "--output-prefix", "data/docs",
                   cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    assert made.stdout.startswith("wrote data/docs.bin and data/docs.idx: 3 documents, "
                                  "3 sequences, 32 tokens (uint16; tokenizer bytes (UTF-8), "
                                  "EOD 256) in ")
    assert made.stderr.startswith("preprocess: 3 documents, 32 tokens, 100.0% of input")
    assert sorted(p.name for p in (tmp_path / "data").iterdir()) == ["docs.bin", "docs.idx"]

    shown = mf_data("inspect", "data/docs", cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    bar = "#" * 40
    # Lengths 6, 3, 23 (text bytes + EOD); .idx = 34 + 12*3 + 8*4 bytes, .bin = 32 * 2 bytes.
    assert shown.stdout == "\n".join([
        "prefix     data/docs",
        "files      .idx 102 bytes, .bin 64 bytes",
        "dtype      uint16",
        "documents  3",
        "sequences  3",
        "tokens     32",
        "length     min 3, mean 10.7, max 23 tokens per sequence",
        "sequence lengths (log2 buckets)",
        "          tokens             sequences",
        f"           2 - 3                     1  {bar}",
        f"           4 - 7                     1  {bar}",
        "           8 - 15                    0",
        f"          16 - 31                    1  {bar}",
    ]) + "\n"
    assert shown.stderr == ""

    as_json = mf_data("inspect", tmp_path / "data" / "docs", "--json")
    assert as_json.returncode == 0, as_json.stderr
    stats = json.loads(as_json.stdout)
    assert {k: stats[k] for k in ("documents", "sequences", "tokens", "dtype", "min_length",
                                  "max_length")} == {"documents": 3, "sequences": 3,
                                                     "tokens": 32, "dtype": "uint16",
                                                     "min_length": 3, "max_length": 23}
    assert stats["mean_length"] == pytest.approx(32 / 3)
    assert [(b["low"], b["high"], b["count"]) for b in stats["histogram"]] == [
        (2, 3, 1), (4, 7, 1), (8, 15, 0), (16, 31, 1)]


def test_data_errors_exit_1_with_a_message_and_no_traceback(tmp_path: Path) -> None:
    missing = mf_data("inspect", tmp_path / "nothing")
    assert missing.returncode == 1
    assert missing.stdout == ""
    assert missing.stderr == (f"mf-data: error: {tmp_path}/nothing.idx: index file missing for "
                              f"indexed dataset prefix '{tmp_path}/nothing'; both "
                              f"{tmp_path}/nothing.idx and {tmp_path}/nothing.bin must exist\n")

    (tmp_path / "bad.jsonl").write_text('{"text": "fine"}\n{"body": "x"}\n', encoding="utf-8")
    bad = mf_data("preprocess", "--input", "bad.jsonl", "--output-prefix", "out", "--quiet",
                  cwd=tmp_path)
    assert bad.returncode == 1
    assert bad.stderr == ("mf-data: error: bad.jsonl:2: no key 'text' (keys present: 'body'); "
                          "choose the key with --json-keys\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.jsonl"]


@pytest.mark.parametrize(("content", "problem"), [
    ("", "no documents (the file is empty); give one JSON object per line, its text under "
         "'text'"),
    ('{"text": ""}\n{"text": ""}\n', "no tokens: 'text' is empty or tokenizes to nothing in "
                                     "all 2 documents; a dataset needs at least one token (is "
                                     "'text' the key that holds the text? see --json-keys)"),
])
def test_preprocess_of_nothing_exits_1_and_writes_nothing(tmp_path: Path, content: str,
                                                          problem: str) -> None:
    (tmp_path / "empty.jsonl").write_text(content, encoding="utf-8")
    result = mf_data("preprocess", "--input", "empty.jsonl", "--output-prefix", "data/empty",
                     cwd=tmp_path)
    assert (result.returncode, result.stdout) == (1, "")
    assert result.stderr == f"mf-data: error: empty.jsonl: {problem}; nothing was written\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty.jsonl"]


@pytest.mark.parametrize(("args", "complaint"), [
    ((), "the following arguments are required: COMMAND"),
    (("preprocess", "--output-prefix", "x"), "the following arguments are required: --input"),
    (("preprocess", "--input", "a", "--output-prefix", "x", "--eod", "-1"),
     "argument --eod: must be >= 0, got -1"),
    (("preprocess", "--input", "a", "--output-prefix", "x", "--dtype", "uint32"),
     "argument --dtype: invalid choice: 'uint32'"),
    (("inspect",), "the following arguments are required: PREFIX"),
    (("frobnicate",), "argument COMMAND: invalid choice: 'frobnicate'"),
])
def test_usage_errors_exit_2(args: tuple[str, ...], complaint: str) -> None:
    result = mf_data(*args)
    assert result.returncode == 2
    assert complaint in result.stderr
    assert "Traceback" not in result.stderr


def test_options_json_key_dtype_eod_and_help(tmp_path: Path) -> None:
    (tmp_path / "in.jsonl").write_text('{"body": "ab"}\n', encoding="utf-8")
    made = mf_data("preprocess", "--input", "in.jsonl", "--output-prefix", "c", "--json-key",
                   "body", "--dtype", "int32", "--eod", "1000", "--quiet", cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    assert made.stderr == ""
    assert (tmp_path / "c.bin").read_bytes() == (b"a\0\0\0" b"b\0\0\0" +
                                                 (1000).to_bytes(4, "little"))
    usage = mf_data("--help")
    assert usage.returncode == 0
    assert "preprocess" in usage.stdout and "inspect" in usage.stdout


def test_console_script_is_installed() -> None:
    script = Path(sys.executable).with_name("mf-data")
    assert script.exists(), "reinstall: pip install -e packages/mf-data"
    result = subprocess.run([str(script), "inspect", "--help"], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0
    assert "PREFIX" in result.stdout


def test_hugging_face_tokenizer_through_the_cli(tmp_path: Path) -> None:
    tokenizers = pytest.importorskip("tokenizers")
    vocab = {"[UNK]": 0, "hello": 1, "world": 2}
    tokenizer = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    tokenizer.save(str(tmp_path / "tokenizer.json"))
    write_jsonl(tmp_path / "in.jsonl", ["hello world", "world"])
    no_eod = mf_data("preprocess", "--input", "in.jsonl", "--output-prefix", "c",
                     "--tokenizer", "tokenizer.json", cwd=tmp_path)
    assert no_eod.returncode == 1
    assert "give its id with --eod" in no_eod.stderr
    made = mf_data("preprocess", "--input", "in.jsonl", "--output-prefix", "c", "--tokenizer",
                   "tokenizer.json", "--eod", "0", "--quiet", cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    assert "tokenizer Hugging Face tokenizer.json, EOD 0" in made.stdout
    assert (tmp_path / "c.bin").read_bytes() == bytes([1, 0, 2, 0, 0, 0, 2, 0, 0, 0])


def test_corpus_stats_buckets_zero_lengths_and_empty_corpus(tmp_path: Path) -> None:
    write_indexed(tmp_path / "z", [[], [1], [1] * 7, [1] * 8, [1] * 1000], dtype=np.uint8)
    stats = corpus_stats(IndexedDataset(tmp_path / "z"))
    assert (stats.documents, stats.sequences, stats.tokens) == (5, 5, 1016)
    assert (stats.min_length, stats.max_length) == (0, 1000)
    assert stats.mean_length == pytest.approx(1016 / 5)
    assert stats.histogram[:4] == (LengthBucket(0, 0, 1), LengthBucket(1, 1, 1),
                                   LengthBucket(2, 3, 0), LengthBucket(4, 7, 1))
    assert stats.histogram[-1] == LengthBucket(512, 1023, 1)
    assert sum(b.count for b in stats.histogram) == 5
    assert "         512 - 1,023                 1  " in format_stats(stats)

    write_indexed(tmp_path / "e", [])
    empty = corpus_stats(IndexedDataset(tmp_path / "e"))
    assert (empty.sequences, empty.tokens, empty.histogram) == (0, 0, ())
    assert format_stats(empty).splitlines()[-1] == (
        "length     min 0, mean 0.0, max 0 tokens per sequence")


def test_ctrl_c_during_preprocess_is_one_line_and_leaves_no_file(tmp_path: Path) -> None:
    """Ctrl-C reaches the terminal's whole process group, the encoding workers included: one
    line, status 130, and neither the outputs nor their temporary files are left."""
    write_jsonl(tmp_path / "in.jsonl", [f"document {i} " + "words " * 300 for i in range(20000)])
    job = subprocess.Popen([sys.executable, "-m", "mf_data", "preprocess", "--input", "in.jsonl",
                            "--output-prefix", "out", "--workers", "2"], cwd=tmp_path,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while not any(path.stat().st_size for path in tmp_path.glob(".out.bin.*.tmp")):
            assert job.poll() is None and time.monotonic() < deadline, "no encoding seen"
            time.sleep(0.01)
        os.killpg(job.pid, signal.SIGINT)  # the first chunks are written: workers are up
        _, err = job.communicate(timeout=120)
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
            job.wait()
    assert job.returncode == 130, err
    assert err.strip().splitlines()[-1] == "mf-data: interrupted (SIGINT); nothing was written"
    assert "Traceback" not in err
    assert sorted(path.name for path in tmp_path.iterdir()) == ["in.jsonl"]
