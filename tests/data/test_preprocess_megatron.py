"""`mf-data preprocess` with Megatron-LM's preprocess_data.py flags: several JSON keys named as
Megatron names them, --append-eod, worker processes, tokenizer types, gzip input, and the
Megatron flags that change nothing here (a warning) or would change the output (refused)."""

from __future__ import annotations

import gzip
import json
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from mf_data.errors import DataError
from mf_data.indexed import IndexedDatasetBuilder, write_indexed
from mf_data.megatron_flags import FLAGS
from mf_data.preprocess import megatron_prefixes, preprocess, preprocess_jsonl
from mf_data.text_tokenizer import ByteTokenizer, tokenizer_of_type


def mf_data(*args: str | Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "mf_data", *map(str, args)], cwd=cwd,
                          capture_output=True, text=True, timeout=120)


def write_jsonl(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


def read(prefix: Path | str) -> tuple[bytes, bytes]:
    return Path(f"{prefix}.bin").read_bytes(), Path(f"{prefix}.idx").read_bytes()


def corpus(count: int) -> list[dict]:
    """Documents of every shape: strings, lists with empty parts, empty texts, non-ASCII."""
    records = []
    for i in range(count):
        words = " ".join(["hello", "world", "Grüße"][j % 3] for j in range(i % 23))
        records.append({"text": words, "parts": [f"p{i}", "", "world"][: i % 4],
                        "id": i})
    return records


def model_directory(path: Path) -> Path:
    """A Hugging Face model directory: a word-level tokenizer.json and a tokenizer_config.json
    naming its eos token, as Megatron's --tokenizer-model takes."""
    tokenizers = pytest.importorskip("tokenizers")
    vocab = {"[UNK]": 0, "hello": 1, "world": 2, "<eos>": 3}
    tokenizer = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    path.mkdir()
    tokenizer.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<eos>"}),
                                                encoding="utf-8")
    return path


# --- several keys, EOD ------------------------------------------------------------------------

def test_json_keys_write_one_dataset_per_key_named_as_megatron(tmp_path: Path) -> None:
    records = [{"text": "ab", "title": ["x", "", "yz"]}, {"text": "", "title": "q"}]
    source = write_jsonl(tmp_path / "in.jsonl", records)
    made = mf_data("preprocess", "--input", source, "--output-prefix", "out/c", "--json-keys",
                   "text", "title", "--quiet", cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [
        "c_text_document.bin", "c_text_document.idx", "c_title_document.bin",
        "c_title_document.idx"]
    # Independent expectation for 'title': document 1 is sequences "x" and "yz"+EOD (the empty
    # part dropped), document 2 is "q"+EOD.
    assert (tmp_path / "out/c_title_document.bin").read_bytes() == struct.pack(
        "<6H", 120, 121, 122, 256, 113, 256)
    assert (tmp_path / "out/c_title_document.idx").read_bytes() == (
        b"MMIDIDX\x00\x00" + struct.pack("<QBQQ", 1, 8, 3, 3)
        + struct.pack("<3i3q3q", 1, 3, 2, 0, 2, 8, 0, 2, 3))
    # 'text': the empty second document has no sequence (Megatron keeps it as a document).
    assert (tmp_path / "out/c_text_document.bin").read_bytes() == struct.pack("<3H", 97, 98, 256)
    assert (tmp_path / "out/c_text_document.idx").read_bytes()[-24:] == struct.pack("<3q", 0, 1,
                                                                                     1)
    assert megatron_prefixes("a/b", ["text"]) == {"text": "a/b_text_document"}


def test_no_append_eod_is_megatrons_default_output(tmp_path: Path) -> None:
    source = write_jsonl(tmp_path / "in.jsonl", [{"text": "ab"}, {"text": ["c", "de"]}])
    made = mf_data("preprocess", "--input", source, "--output-prefix", "c", "--json-keys",
                   "text", "--no-append-eod", "--quiet", cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    assert "no EOD" in made.stdout
    builder_prefix = tmp_path / "expected"
    with IndexedDatasetBuilder(f"{builder_prefix}.bin", np.uint16) as builder:
        builder.add_document([97, 98], [2])
        builder.add_document([99, 100, 101], [1, 2])
        builder.finalize(f"{builder_prefix}.idx")
    assert read(tmp_path / "c_text_document") == read(builder_prefix)
    # The default (and --append-eod) ends each document with EOD, as mf-data always did.
    preprocess_jsonl(source, tmp_path / "eod", ByteTokenizer(), progress=None)
    write_indexed(tmp_path / "eod_expected", [[97, 98, 256], [99, 100, 101, 256]], np.uint16)
    assert read(tmp_path / "eod")[0] == read(tmp_path / "eod_expected")[0]


# --- worker processes ---------------------------------------------------------------------------

def test_two_workers_write_the_same_bytes_as_one(tmp_path: Path) -> None:
    source = write_jsonl(tmp_path / "in.jsonl", corpus(1500))  # 6 chunks of 256 lines
    outputs = {n: megatron_prefixes(tmp_path / f"w{n}", ["text", "parts"]) for n in (1, 2)}
    summaries = {n: preprocess(source, outputs[n], ByteTokenizer(), workers=n, progress=None)
                 for n in (1, 2)}
    assert [s.tokens for s in summaries[1]] == [s.tokens for s in summaries[2]]
    for key in ("text", "parts"):
        assert read(outputs[1][key]) == read(outputs[2][key])
    # And the one-worker output is what write_indexed makes of the expected documents.
    texts = [r["text"] for r in corpus(1500)]
    write_indexed(tmp_path / "expected", [[*t.encode(), 256] for t in texts if t], np.uint16)
    assert read(outputs[1]["text"])[0] == read(tmp_path / "expected")[0]


def test_two_workers_with_a_hugging_face_model_through_the_cli(tmp_path: Path) -> None:
    model = model_directory(tmp_path / "model")
    write_jsonl(tmp_path / "in.jsonl", corpus(700))
    for workers in ("1", "2"):
        made = mf_data("preprocess", "--input", "in.jsonl", "--output-prefix", f"w{workers}",
                       "--json-keys", "text", "parts", "--tokenizer-type",
                       "HuggingFaceTokenizer", "--tokenizer-model", model, "--append-eod",
                       "--workers", workers, "--quiet", cwd=tmp_path)
        assert made.returncode == 0, made.stderr
        assert "tokenizer Hugging Face tokenizer.json, EOD 3" in made.stdout
    for key in ("text", "parts"):
        assert read(tmp_path / f"w1_{key}_document") == read(tmp_path / f"w2_{key}_document")
    # Independent expectation: whitespace words to ids ("Grüße" unknown: 0), EOD 3 after each
    # document that has words.
    words = {"hello": 1, "world": 2}
    expected = [token for record in corpus(700) if record["text"]
                for token in [*(words.get(w, 0) for w in record["text"].split()), 3]]
    tokens = np.frombuffer(read(tmp_path / "w2_text_document")[0], np.uint16)
    assert tokens.tolist() == expected


def test_a_bad_line_in_a_worker_names_file_and_line_and_writes_nothing(tmp_path: Path) -> None:
    lines = [json.dumps(r) for r in corpus(900)]
    lines[700] = '{"text": 5}'
    (tmp_path / "in.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"in\.jsonl:701: 'text' must be a string or a list of "
                                        r"strings, got int"):
        preprocess(tmp_path / "in.jsonl", {"text": str(tmp_path / "out" / "c")}, ByteTokenizer(),
                   workers=2, progress=None)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.jsonl"]


# --- gzip input and empty input ------------------------------------------------------------------

def test_gzip_input_gives_the_same_dataset(tmp_path: Path) -> None:
    source = write_jsonl(tmp_path / "in.jsonl", corpus(300))
    with gzip.open(tmp_path / "in.jsonl.gz", "wb") as packed:
        packed.write(source.read_bytes())
    preprocess_jsonl(source, tmp_path / "plain", ByteTokenizer(), progress=None)
    preprocess_jsonl(tmp_path / "in.jsonl.gz", tmp_path / "packed", ByteTokenizer(),
                     progress=None)
    assert read(tmp_path / "plain") == read(tmp_path / "packed")


@pytest.mark.parametrize(("content", "problem"), [
    (b"not gzip at all", r"cannot decompress the gzip input \(Not a gzipped file"),
    (gzip.compress(b'{"text": "abc"}\n' * 100, mtime=0)[:-12],
     r"cannot decompress the gzip input \(Compressed file ended"),
    (gzip.compress(b"", mtime=0), r"no documents \(the file decompresses to nothing\)"),
], ids=["not gzip", "truncated", "empty"])  # the same ids in every process (pytest-xdist)
def test_bad_or_empty_gzip_names_the_file(tmp_path: Path, content: bytes, problem: str) -> None:
    (tmp_path / "in.jsonl.gz").write_bytes(content)
    with pytest.raises(DataError, match=rf"in\.jsonl\.gz: {problem}"):
        preprocess_jsonl(tmp_path / "in.jsonl.gz", tmp_path / "c", ByteTokenizer(),
                         progress=None)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.jsonl.gz"]


def test_gzip_without_the_gz_name_is_named_as_such(tmp_path: Path) -> None:
    (tmp_path / "in.jsonl").write_bytes(gzip.compress(b'{"text": "abc"}\n'))
    with pytest.raises(DataError, match=r"in\.jsonl:1: not UTF-8 text: the file is "
                                        r"gzip-compressed; a gzip input must be named \.gz"):
        preprocess_jsonl(tmp_path / "in.jsonl", tmp_path / "c", ByteTokenizer(), progress=None)


def test_empty_input_with_megatron_flags_names_the_file(tmp_path: Path) -> None:
    (tmp_path / "empty.jsonl").write_text("", encoding="utf-8")
    result = mf_data("preprocess", "--input", "empty.jsonl", "--output-prefix", "c",
                     "--json-keys", "text", "title", "--workers", "2", cwd=tmp_path)
    assert result.returncode == 1
    assert result.stderr == ("mf-data: error: empty.jsonl: no documents (the file is empty); "
                             "give one JSON object per line, its text under 'text'; nothing "
                             "was written\n")
    write_jsonl(tmp_path / "untitled.jsonl", [{"text": "a", "title": ""}])
    result = mf_data("preprocess", "--input", "untitled.jsonl", "--output-prefix", "c",
                     "--json-keys", "text", "title", cwd=tmp_path)
    assert result.returncode == 1
    assert "untitled.jsonl: no tokens: 'title' is empty or tokenizes to nothing" in result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty.jsonl", "untitled.jsonl"]


# --- tokenizer types -------------------------------------------------------------------------

def test_tokenizer_types(tmp_path: Path) -> None:
    model = model_directory(tmp_path / "model")
    hf = tokenizer_of_type("HuggingFaceTokenizer", model)
    assert (hf.eod, hf.encode("world hello x")) == (3, [2, 1, 0])
    assert tokenizer_of_type("HuggingFaceTokenizer", model / "tokenizer.json").eod == 3
    assert isinstance(tokenizer_of_type("ByteTokenizer"), ByteTokenizer)
    with pytest.raises(DataError, match=r"--tokenizer-type GPT2BPETokenizer: not supported; "
                                        r"allowed: ByteTokenizer, HuggingFaceTokenizer"):
        tokenizer_of_type("GPT2BPETokenizer", model)
    (tmp_path / "bare").mkdir()
    with pytest.raises(DataError, match=r"bare: no tokenizer\.json in this directory"):
        tokenizer_of_type("HuggingFaceTokenizer", tmp_path / "bare")


@pytest.mark.parametrize(("args", "status", "complaint"), [
    (("--tokenizer-type", "SentencePieceTokenizer"), 2,
     "--tokenizer-type SentencePieceTokenizer: not supported; allowed: ByteTokenizer, "
     "HuggingFaceTokenizer"),
    (("--tokenizer-model", "model"), 2, "--tokenizer-model needs --tokenizer-type"),
    (("--tokenizer", "t.json", "--tokenizer-type", "HuggingFaceTokenizer"), 2,
     "give one form, not both"),
    (("--tokenizer-type", "HuggingFaceTokenizer"), 1,
     "--tokenizer-type HuggingFaceTokenizer needs --tokenizer-model"),
    (("--tokenizer-type", "ByteTokenizer", "--tokenizer-model", "model"), 1,
     "the ByteTokenizer reads no model"),
    (("--workers", "0"), 2, "argument --workers: must be >= 1, got 0"),
    (("--json-keys", "text", "text"), 2, "--json-keys text text: a key is repeated"),
    (("--json-keys", "text", "--json-key", "text"), 2, "not allowed with argument"),
])
def test_tokenizer_and_worker_usage_errors(tmp_path: Path, args: tuple[str, ...], status: int,
                                           complaint: str) -> None:
    write_jsonl(tmp_path / "in.jsonl", [{"text": "a"}])
    result = mf_data("preprocess", "--input", "in.jsonl", "--output-prefix", "c", *args,
                     cwd=tmp_path)
    assert result.returncode == status
    assert complaint in result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.jsonl"]


# --- Megatron flags without an effect -----------------------------------------------------------

WARNED = [("--keep-newlines",), ("--lang", "english"), ("--partitions", "1"),
          ("--keep-sequential-samples",), ("--log-interval", "1000"),
          ("--dataset-impl", "mmap"), ("--rank", "1"),
          ("--make-vocab-size-divisible-by", "128"), ("--tensor-model-parallel-size", "2")]
REFUSED = [(("--split-sentences",), "--split-sentences: mf-data does not split sentences"),
           (("--partitions", "4"), "--partitions 4: not supported, use --workers"),
           (("--dataset-impl", "lazy"), "--dataset-impl lazy: mf-data writes the mmap format"),
           (("--vocab-file", "v.txt"), "--vocab-file v.txt: mf-data reads no separate "
                                       "vocabulary files"),
           (("--merge-file", "m.txt"), "--merge-file m.txt: mf-data reads no separate"),
           (("--vocab-size", "100"), "--vocab-size 100: it sizes Megatron's Null and TikToken")]


def test_every_megatron_flag_is_tested() -> None:
    tested = {args[0] for args in WARNED} | {args[0] for args, _ in REFUSED}
    assert tested == set(FLAGS)


@pytest.mark.parametrize("flag", WARNED, ids=lambda flag: flag[0])
def test_flags_without_effect_warn_once_and_change_nothing(tmp_path: Path,
                                                           flag: tuple[str, ...]) -> None:
    write_jsonl(tmp_path / "in.jsonl", [{"text": "ab"}, {"text": "a\nb"}])
    plain = mf_data("preprocess", "--input", "in.jsonl", "--output-prefix", "plain", "--quiet",
                    cwd=tmp_path)
    flagged = mf_data("preprocess", "--input", "in.jsonl", "--output-prefix", "flagged",
                      "--quiet", *flag, cwd=tmp_path)
    assert (plain.returncode, flagged.returncode) == (0, 0), flagged.stderr
    assert plain.stderr == ""
    warning = f"mf-data preprocess: warning: {' '.join(flag)} has no effect: "
    assert flagged.stderr.count("warning") == 1
    assert flagged.stderr.startswith(warning)
    assert read(tmp_path / "plain") == read(tmp_path / "flagged")


@pytest.mark.parametrize(("flag", "complaint"), REFUSED, ids=lambda value: str(value))
def test_flags_that_would_change_the_output_are_refused(tmp_path: Path, flag: tuple[str, ...],
                                                        complaint: str) -> None:
    write_jsonl(tmp_path / "in.jsonl", [{"text": "ab"}])
    result = mf_data("preprocess", "--input", "in.jsonl", "--output-prefix", "c", *flag,
                     cwd=tmp_path)
    assert result.returncode == 2
    assert f"mf-data preprocess: error: {complaint}" in result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.jsonl"]


# --- the builder's bulk write --------------------------------------------------------------------

def test_add_documents_equals_add_document_per_document(tmp_path: Path) -> None:
    documents = [([1, 2, 3], [1, 2]), ([], []), ([4], [1]), ([5, 6], [2])]
    with IndexedDatasetBuilder(tmp_path / "one.bin", np.int32) as builder:
        for tokens, lengths in documents:
            builder.add_document(tokens, lengths)
        builder.finalize(tmp_path / "one.idx")
    with IndexedDatasetBuilder(tmp_path / "bulk.bin", np.int32) as builder:
        builder.add_documents([1, 2, 3], [1, 2], [2, 0])
        builder.add_documents([4, 5, 6], [1, 2], [1, 1])
        with pytest.raises(DataError, match="do not match 2 tokens"):
            builder.add_documents([7, 8], [1], [1])
        builder.finalize(tmp_path / "bulk.idx")
    assert read(tmp_path / "one") == read(tmp_path / "bulk")
