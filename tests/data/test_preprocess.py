"""JSON Lines -> .bin/.idx: tokenizers, exact output, errors with file:line, atomic output."""

from __future__ import annotations

import io
import json
import re
import struct
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mf_data.errors import DataError
from mf_data.indexed import IndexedDataset, write_indexed
from mf_data.preprocess import ProgressPrinter, preprocess_jsonl
from mf_data.text_tokenizer import ByteTokenizer, HuggingFaceTokenizer, load_tokenizer


def write_jsonl(path: Path, records: list[object]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


def files_in(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


# --- byte tokenizer --------------------------------------------------------------------------

def test_byte_tokenizer() -> None:
    tokenizer = ByteTokenizer()
    assert (tokenizer.eod, tokenizer.vocab_size) == (256, 257)
    assert tokenizer.encode("Grüße") == [71, 114, 0xC3, 0xBC, 0xC3, 0x9F, 101]
    assert tokenizer.decode([*tokenizer.encode("Grüße"), 256]) == "Grüße"
    assert ByteTokenizer(eod=300).vocab_size == 301
    with pytest.raises(DataError, match=r"EOD id 10 collides with the byte ids 0\.\.255"):
        ByteTokenizer(eod=10)
    assert isinstance(load_tokenizer(), ByteTokenizer)
    assert load_tokenizer(None, 999).eod == 999


# --- preprocess output -----------------------------------------------------------------------

def test_preprocess_bytes_exact_output(tmp_path: Path) -> None:
    source = write_jsonl(tmp_path / "in.jsonl", [{"text": "ab", "id": 1}, {"text": "Ü"}])
    summary = preprocess_jsonl(source, tmp_path / "out" / "c", ByteTokenizer(), progress=None)
    assert (summary.documents, summary.sequences, summary.tokens) == (2, 2, 6)
    assert summary.dtype == np.uint16
    # Independent expectation: bytes then EOD 256, as little-endian uint16.
    assert (tmp_path / "out" / "c.bin").read_bytes() == struct.pack("<6H", 97, 98, 256, 0xC3,
                                                                    0x9C, 256)
    idx = (tmp_path / "out" / "c.idx").read_bytes()
    assert idx == (b"MMIDIDX\x00\x00" + struct.pack("<QBQQ", 1, 8, 2, 3)
                   + struct.pack("<2i2q3q", 3, 3, 0, 6, 0, 1, 2))
    assert files_in(tmp_path / "out") == ["c.bin", "c.idx"]


def test_a_token_beyond_the_models_vocabulary_is_found_at_preprocessing(tmp_path) -> None:
    """With the model's vocabulary given, an id beyond it (here the EOD 256 of a 256-token
    model) names the first document holding one, and nothing is written; without, the
    trainer would find it only when it reads that sample."""
    source = write_jsonl(tmp_path / "in.jsonl", [{"text": ""}, {"text": "ab"}, {"text": "c"}])
    with pytest.raises(DataError) as exc:
        preprocess_jsonl(source, tmp_path / "out" / "c", ByteTokenizer(), progress=None,
                         vocab_size=256)
    assert str(exc.value) == (
        f"{source}: document 2 ('text') has token id 256, outside the model's vocabulary "
        "(--model-vocab-size 256: ids 0 to 255); use the model's tokenizer, or give the model a "
        "larger vocabulary")
    assert not (tmp_path / "out").exists()
    with pytest.raises(DataError, match=r"document 3 \('text'\) has token id 99"):
        preprocess_jsonl(source, tmp_path / "c", ByteTokenizer(), progress=None,
                         vocab_size=99, append_eod=False)  # "c" is byte 99
    summary = preprocess_jsonl(source, tmp_path / "c", ByteTokenizer(), progress=None,
                               vocab_size=257)
    assert summary.tokens == 5


def test_preprocess_equals_write_indexed_of_the_same_documents(tmp_path: Path) -> None:
    texts = [f"document {i} " + "x" * (i % 37) for i in range(600)]  # > 2 encode batches
    source = write_jsonl(tmp_path / "in.jsonl", [{"text": t} for t in texts])
    preprocess_jsonl(source, tmp_path / "a", ByteTokenizer(), dtype="int32", progress=None)
    write_indexed(tmp_path / "b", [[*t.encode(), 256] for t in texts], dtype=np.int32)
    for suffix in (".bin", ".idx"):
        assert (tmp_path / f"a{suffix}").read_bytes() == (tmp_path / f"b{suffix}").read_bytes()


def test_lists_empty_texts_blank_lines_and_other_key(tmp_path: Path) -> None:
    source = tmp_path / "in.jsonl"
    source.write_text('{"body": ["ab", "", "c"]}\n\n   \n{"body": ""}\n{"body": "d"}',
                      encoding="utf-8")  # no newline at the end either
    summary = preprocess_jsonl(source, tmp_path / "c", ByteTokenizer(), json_key="body",
                               progress=None)
    assert (summary.documents, summary.empty_documents, summary.sequences) == (3, 1, 3)
    dataset = IndexedDataset(tmp_path / "c")
    # Parts that tokenize to nothing are dropped; the empty document holds no sequence.
    assert [dataset.get(i).tolist() for i in range(len(dataset))] == [[97, 98], [99, 256],
                                                                      [100, 256]]
    assert dataset.document_indices.tolist() == [0, 2, 2, 3]


def test_dtype_choice(tmp_path: Path) -> None:
    source = write_jsonl(tmp_path / "in.jsonl", [{"text": "a"}])
    assert preprocess_jsonl(source, tmp_path / "big", ByteTokenizer(eod=70000),
                            progress=None).dtype == np.int32
    assert IndexedDataset(tmp_path / "big").get(0).tolist() == [97, 70000]
    assert preprocess_jsonl(source, tmp_path / "i64", ByteTokenizer(), dtype=np.int64,
                            progress=None).dtype == np.int64
    with pytest.raises(DataError, match="--dtype uint8: holds ids up to 255 but the "
                                        "tokenizer's ids reach 256"):
        preprocess_jsonl(source, tmp_path / "u8", ByteTokenizer(), dtype="uint8", progress=None)


# --- errors ----------------------------------------------------------------------------------

@pytest.mark.parametrize(("line", "message"), [
    ('{"text": "ok"', r"in\.jsonl:3: not valid JSON: Expecting ',' delimiter at column 14"),
    ('{"txt": "x", "n": 2}', r"in\.jsonl:3: no key 'text' \(keys present: 'txt', 'n'\); "
                             r"choose the key with --json-keys"),
    ('["text"]', r"in\.jsonl:3: expected a JSON object with key 'text', got list"),
    ('{"text": 5}', r"in\.jsonl:3: 'text' must be a string or a list of strings, got int"),
])
def test_bad_line_names_file_and_line_and_leaves_nothing(tmp_path: Path, line: str,
                                                         message: str) -> None:
    source = tmp_path / "in.jsonl"
    source.write_text('{"text": "a"}\n{"text": "b"}\n' + line + "\n", encoding="utf-8")
    with pytest.raises(DataError, match=message):
        preprocess_jsonl(source, tmp_path / "c", ByteTokenizer(), progress=None)
    assert files_in(tmp_path) == ["in.jsonl"]


def test_not_utf8_and_missing_input(tmp_path: Path) -> None:
    source = tmp_path / "in.jsonl"
    source.write_bytes(b'{"text": "\xff"}\n')
    with pytest.raises(DataError, match=r"in\.jsonl:1: not UTF-8 text"):
        preprocess_jsonl(source, tmp_path / "c", ByteTokenizer(), progress=None)
    with pytest.raises(DataError, match=r"nope\.jsonl: input file not found"):
        preprocess_jsonl(tmp_path / "nope.jsonl", tmp_path / "c", ByteTokenizer(), progress=None)


def test_failed_run_keeps_the_previous_output(tmp_path: Path) -> None:
    good = write_jsonl(tmp_path / "good.jsonl", [{"text": "old"}])
    preprocess_jsonl(good, tmp_path / "c", ByteTokenizer(), progress=None)
    before = (tmp_path / "c.bin").read_bytes(), (tmp_path / "c.idx").read_bytes()
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "new"}\n{oops}\n', encoding="utf-8")
    with pytest.raises(DataError, match=r"bad\.jsonl:2"):
        preprocess_jsonl(bad, tmp_path / "c", ByteTokenizer(), progress=None)
    assert ((tmp_path / "c.bin").read_bytes(), (tmp_path / "c.idx").read_bytes()) == before
    assert files_in(tmp_path) == ["bad.jsonl", "c.bin", "c.idx", "good.jsonl"]


# --- inputs with nothing to train on ----------------------------------------------------------

NO_DOCUMENTS = "give one JSON object per line, its text under 'text'; nothing was written"
NO_TOKENS = ("a dataset needs at least one token (is 'text' the key that holds the text? see "
             "--json-keys); nothing was written")


@pytest.mark.parametrize(("text", "problem"), [
    ("", f"no documents (the file is empty); {NO_DOCUMENTS}"),
    ("\n   \n\r\n", f"no documents (only blank lines); {NO_DOCUMENTS}"),
    ('{"text": ""}\n', f"no tokens: 'text' is empty or tokenizes to nothing in its only "
                       f"document; {NO_TOKENS}"),
    ('{"text": ""}\n\n{"text": ["", ""]}\n{"text": []}\n',
     f"no tokens: 'text' is empty or tokenizes to nothing in all 3 documents; {NO_TOKENS}"),
])
def test_no_tokens_at_all_is_an_error_and_writes_nothing(tmp_path: Path, text: str,
                                                         problem: str) -> None:
    source = tmp_path / "in.jsonl"
    source.write_text(text, encoding="utf-8")
    with pytest.raises(DataError) as error:
        preprocess_jsonl(source, tmp_path / "out" / "deeper" / "c", ByteTokenizer(),
                         progress=None)
    assert str(error.value) == f"{source}: {problem}"
    assert files_in(tmp_path) == ["in.jsonl"]  # no .bin, .idx, temporary or directory


def test_no_tokens_keeps_the_previous_output(tmp_path: Path) -> None:
    preprocess_jsonl(write_jsonl(tmp_path / "good.jsonl", [{"text": "old"}]), tmp_path / "c",
                     ByteTokenizer(), progress=None)
    before = (tmp_path / "c.bin").read_bytes(), (tmp_path / "c.idx").read_bytes()
    (tmp_path / "empty.jsonl").write_text("", encoding="utf-8")
    with pytest.raises(DataError, match=r"empty\.jsonl: no documents \(the file is empty\)"):
        preprocess_jsonl(tmp_path / "empty.jsonl", tmp_path / "c", ByteTokenizer(), progress=None)
    assert ((tmp_path / "c.bin").read_bytes(), (tmp_path / "c.idx").read_bytes()) == before
    assert files_in(tmp_path) == ["c.bin", "c.idx", "empty.jsonl", "good.jsonl"]


def test_text_that_tokenizes_to_nothing_counts_as_empty(tmp_path: Path) -> None:
    # A word-level tokenizer splitting on whitespace makes no token of blanks.
    tokenizer = load_tokenizer(word_level_tokenizer(tmp_path / "tokenizer.json",
                                                    {"[UNK]": 0, "a": 1, "</s>": 2}))
    source = write_jsonl(tmp_path / "in.jsonl", [{"text": "   "}, {"text": ["\t", " \n "]}])
    with pytest.raises(DataError) as error:
        preprocess_jsonl(source, tmp_path / "c", tokenizer, progress=None)
    assert str(error.value) == (f"{source}: no tokens: 'text' is empty or tokenizes to nothing "
                                f"in all 2 documents; {NO_TOKENS}")
    assert files_in(tmp_path) == ["in.jsonl", "tokenizer.json"]


LINES = st.one_of(
    st.sampled_from(["", "  ", "\t"]),  # blank: not a document
    st.sampled_from(['{"text": ""}', '{"text": []}', '{"text": ["", ""]}']),  # no tokens
    st.text("ab ", min_size=1, max_size=5).map(lambda t: json.dumps({"text": t})),
)


@settings(max_examples=60, deadline=None)
@given(lines=st.lists(LINES, max_size=8))
def test_a_dataset_is_written_exactly_when_some_document_has_tokens(lines: list[str]) -> None:
    with tempfile.TemporaryDirectory() as directory:
        folder = Path(directory)
        source = folder / "in.jsonl"
        source.write_text("\n".join(lines), encoding="utf-8")
        texts = [json.loads(line)["text"] for line in lines if line.strip()]
        parts = [[t] if isinstance(t, str) else t for t in texts]
        tokens = sum(len(part.encode()) for document in parts for part in document)
        if tokens == 0:
            nothing = f"^{re.escape(str(source))}: no (documents|tokens)"
            with pytest.raises(DataError, match=nothing):
                preprocess_jsonl(source, folder / "out" / "c", ByteTokenizer(), progress=None)
            assert files_in(folder) == ["in.jsonl"]
            return
        summary = preprocess_jsonl(source, folder / "out" / "c", ByteTokenizer(), progress=None)
        # Megatron keeps the empty documents of a non-empty input as documents with no sequence.
        empty = sum(1 for document in parts if not "".join(document))
        assert (summary.documents, summary.empty_documents) == (len(texts), empty)
        assert summary.tokens == tokens + len(texts) - empty  # one EOD per non-empty document
        assert files_in(folder / "out") == ["c.bin", "c.idx"]


# --- progress --------------------------------------------------------------------------------

def test_progress_printer_throttles_and_always_prints_the_last_line() -> None:
    now = [0.0]
    stream = io.StringIO()
    printer = ProgressPrinter(stream, total_bytes=200, every_seconds=5.0, clock=lambda: now[0])
    now[0] = 1.0
    printer.update(10, 100, 50)  # too soon: nothing
    now[0] = 6.0
    printer.update(3000, 40000, 100)
    now[0] = 7.0
    printer.update(3500, 45000, 150)  # too soon again
    printer.update(4000, 50000, 200, final=True)
    assert stream.getvalue().splitlines() == [
        "preprocess: 3,000 documents, 40,000 tokens, 50.0% of input, 500 docs/s",
        "preprocess: 4,000 documents, 50,000 tokens, 100.0% of input, 571 docs/s",
    ]


def test_preprocess_reports_progress(tmp_path: Path) -> None:
    source = write_jsonl(tmp_path / "in.jsonl", [{"text": "x"}] * 300)
    stream = io.StringIO()
    preprocess_jsonl(source, tmp_path / "c", ByteTokenizer(), progress=stream,
                     progress_seconds=0.0)
    lines = stream.getvalue().splitlines()
    assert lines[0].startswith("preprocess: 256 documents, 512 tokens,")
    assert lines[-1].startswith("preprocess: 300 documents, 600 tokens, 100.0% of input")


# --- Hugging Face tokenizer.json -------------------------------------------------------------

def word_level_tokenizer(path: Path, vocab: dict[str, int]) -> Path:
    tokenizers = pytest.importorskip("tokenizers")
    tokenizer = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    tokenizer.save(str(path))
    return path


def test_hf_word_level_eos_found_and_used(tmp_path: Path) -> None:
    path = word_level_tokenizer(tmp_path / "tokenizer.json",
                                {"[UNK]": 0, "hello": 1, "world": 2, "<|endoftext|>": 3})
    tokenizer = load_tokenizer(path)
    assert isinstance(tokenizer, HuggingFaceTokenizer)
    assert (tokenizer.eod, tokenizer.vocab_size) == (3, 4)
    assert tokenizer.encode("hello world zzz") == [1, 2, 0]
    source = write_jsonl(tmp_path / "in.jsonl", [{"text": "world hello"}, {"text": "hello"}])
    summary = preprocess_jsonl(source, tmp_path / "c", tokenizer, progress=None)
    assert summary.dtype == np.uint16
    dataset = IndexedDataset(tmp_path / "c")
    assert [dataset.get(i).tolist() for i in range(2)] == [[2, 1, 3], [1, 3]]


def test_hf_eod_explicit_config_or_error(tmp_path: Path) -> None:
    path = word_level_tokenizer(tmp_path / "tokenizer.json", {"[UNK]": 0, "a": 1, "<end>": 2})
    with pytest.raises(DataError, match=r"tokenizer\.json: cannot find an end-of-document token "
                                        r"\(tried </s>, .*\); give its id with --eod"):
        load_tokenizer(path)
    assert load_tokenizer(path, eod=1).eod == 1
    assert load_tokenizer(path, eod=70000).vocab_size == 70001
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(
        {"eos_token": {"content": "<end>", "special": True}}), encoding="utf-8")
    assert load_tokenizer(path).eod == 2


def test_hf_trained_bpe_matches_the_library(tmp_path: Path) -> None:
    tokenizers = pytest.importorskip("tokenizers")
    bpe = tokenizers.Tokenizer(tokenizers.models.BPE(unk_token="<unk>"))
    bpe.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel()
    bpe.decoder = tokenizers.decoders.ByteLevel()
    corpus = ["the quick brown fox", "jumps over the lazy dog", "the dog sleeps"]
    bpe.train_from_iterator(corpus, tokenizers.trainers.BpeTrainer(
        vocab_size=120, special_tokens=["<unk>", "</s>"],
        initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet()))
    bpe.save(str(tmp_path / "bpe.json"))
    tokenizer = load_tokenizer(tmp_path / "bpe.json")
    assert tokenizer.eod == bpe.token_to_id("</s>") == 1
    source = write_jsonl(tmp_path / "in.jsonl", [{"text": t} for t in corpus])
    preprocess_jsonl(source, tmp_path / "c", tokenizer, progress=None)
    dataset = IndexedDataset(tmp_path / "c")
    for i, text in enumerate(corpus):
        expected = [*bpe.encode(text, add_special_tokens=False).ids, 1]
        assert dataset.get(i).tolist() == expected
        assert tokenizer.decode(dataset.get(i)[:-1].tolist()).strip() == text


def test_hf_bad_file_and_missing_package(tmp_path: Path,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    garbage = tmp_path / "tokenizer.json"
    garbage.write_text("{not json", encoding="utf-8")
    if "tokenizers" in sys.modules or _importable("tokenizers"):
        with pytest.raises(DataError, match=r"tokenizer\.json: not a Hugging Face tokenizer"):
            load_tokenizer(garbage)
        with pytest.raises(DataError, match=r"missing\.json: tokenizer file not found"):
            load_tokenizer(tmp_path / "missing.json")
    monkeypatch.setitem(sys.modules, "tokenizers", None)  # import now raises ImportError
    with pytest.raises(DataError, match=r"needs the 'tokenizers' package; install it with: "
                                        r"pip install 'mf-data\[hf\]'"):
        load_tokenizer(garbage)


def _importable(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(name) is not None
