"""Megatron's .idx/.bin format: exact bytes, round trips for every dtype, reads and errors."""

from __future__ import annotations

import os
import struct
from pathlib import Path

import numpy as np
import pytest

from mf_data.errors import DataError
from mf_data.indexed import DType, IndexedDataset, IndexedDatasetBuilder, write_indexed

MAGIC = b"MMIDIDX\x00\x00"
# Megatron's codes (indexed_dataset.py DType), written out independently of the module.
CODES = {1: "uint8", 2: "int8", 3: "int16", 4: "int32", 5: "int64", 6: "float64",
         7: "float32", 8: "uint16"}


def hand_index(code: int, lengths: list[int], pointers: list[int], documents: list[int],
               version: int = 1, magic: bytes = MAGIC) -> bytes:
    n, d = len(lengths), len(documents)
    return (struct.pack("<9sQBQQ", magic, version, code, n, d)
            + struct.pack(f"<{n}i", *lengths) + struct.pack(f"<{n}q", *pointers)
            + struct.pack(f"<{d}q", *documents))


def write_pair(prefix: Path, index: bytes, data: bytes) -> None:
    Path(f"{prefix}.idx").write_bytes(index)
    Path(f"{prefix}.bin").write_bytes(data)


def test_dtype_codes_match_megatron() -> None:
    for code, name in CODES.items():
        assert DType.dtype_of(code) == np.dtype(name)
        assert DType.code_of(np.dtype(name)) == code
        assert DType.code_of(getattr(np, name)) == code
        assert DType.code_of(name) == code
    with pytest.raises(DataError, match="token dtype code 9: unknown"):
        DType.dtype_of(9)
    with pytest.raises(DataError, match="token dtype uint32: not supported"):
        DType.code_of(np.uint32)
    assert DType.optimal(65499) == np.uint16
    assert DType.optimal(65500) == np.int32


def test_tiny_index_bytes_are_exactly_megatrons(tmp_path: Path) -> None:
    write_indexed(tmp_path / "tiny", [[1, 2, 3], [4, 5]], dtype=np.uint16)
    expected_idx = (b"MMIDIDX\x00\x00" + struct.pack("<Q", 1) + struct.pack("<B", 8)
                    + struct.pack("<Q", 2) + struct.pack("<Q", 3)
                    + struct.pack("<ii", 3, 2) + struct.pack("<qq", 0, 6)
                    + struct.pack("<qqq", 0, 1, 2))
    assert (tmp_path / "tiny.idx").read_bytes() == expected_idx
    assert len(expected_idx) == 34 + 12 * 2 + 8 * 3
    assert (tmp_path / "tiny.bin").read_bytes() == struct.pack("<5H", 1, 2, 3, 4, 5)
    # No temporary file is left behind.
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tiny.bin", "tiny.idx"]


def test_int32_default_and_empty_corpus(tmp_path: Path) -> None:
    write_indexed(tmp_path / "a", [[7]])
    assert (tmp_path / "a.idx").read_bytes() == hand_index(4, [1], [0], [0, 1])
    assert (tmp_path / "a.bin").read_bytes() == struct.pack("<i", 7)
    write_indexed(tmp_path / "empty", [])
    assert (tmp_path / "empty.idx").read_bytes() == hand_index(4, [], [], [0])
    dataset = IndexedDataset(tmp_path / "empty")
    assert len(dataset) == 0 and dataset.document_count == 0


@pytest.mark.parametrize("code", sorted(CODES))
@pytest.mark.parametrize("mmap", [True, False])
def test_round_trip_every_dtype(tmp_path: Path, code: int, mmap: bool) -> None:
    dtype = np.dtype(CODES[code])
    rng = np.random.default_rng(code)
    if dtype.kind == "f":
        documents = [rng.standard_normal(n).astype(dtype) for n in (5, 1, 0, 9)]
    else:
        info = np.iinfo(dtype)
        documents = [rng.integers(info.min, info.max, n, dtype=dtype, endpoint=True)
                     for n in (5, 1, 0, 9)]
        documents[0][:2] = [info.min, info.max]
    write_indexed(tmp_path / "c", documents, dtype=dtype)
    raw = (tmp_path / "c.idx").read_bytes()
    assert raw[17] == code
    dataset = IndexedDataset(tmp_path / "c", mmap=mmap)
    assert dataset.dtype == dtype
    assert dataset.sequence_lengths.dtype == np.int32
    assert dataset.sequence_pointers.dtype == np.int64
    assert dataset.document_indices.dtype == np.int64
    assert dataset.sequence_lengths.tolist() == [5, 1, 0, 9]
    assert dataset.sequence_pointers.tolist() == [0, 5 * dtype.itemsize, 6 * dtype.itemsize,
                                                  6 * dtype.itemsize]
    assert dataset.document_indices.tolist() == [0, 1, 2, 3, 4]
    for i, document in enumerate(documents):
        got = dataset.get(i)
        assert got.dtype == dtype
        np.testing.assert_array_equal(got, document)
    assert (tmp_path / "c.bin").read_bytes() == b"".join(d.tobytes() for d in documents)


def test_get_with_offset_and_length(tmp_path: Path) -> None:
    write_indexed(tmp_path / "g", [[10, 11, 12, 13, 14], [20, 21]], dtype=np.int64)
    dataset = IndexedDataset(tmp_path / "g")
    assert dataset.get(0, offset=2).tolist() == [12, 13, 14]
    assert dataset.get(0, offset=1, length=3).tolist() == [11, 12, 13]
    assert dataset.get(0, offset=5).tolist() == []
    assert dataset.get(1, offset=1, length=1).tolist() == [21]
    assert dataset.get(-1).tolist() == [20, 21]
    assert dataset[0].tolist() == [10, 11, 12, 13, 14]
    with pytest.raises(DataError, match=r"sequence 0 has 5 tokens; offset 3 and length 3"):
        dataset.get(0, offset=3, length=3)
    with pytest.raises(DataError, match=r"offset -1"):
        dataset.get(0, offset=-1)


def test_reads_a_hand_written_pair_with_multi_sequence_documents(tmp_path: Path) -> None:
    # Document 0 = sequences 0,1; document 1 = sequences 2,3,4 (int16, code 3).
    tokens = [[1, 2], [3], [4, 5, 6], [], [7]]
    lengths = [len(t) for t in tokens]
    pointers = [0, 4, 6, 12, 12]
    write_pair(tmp_path / "h", hand_index(3, lengths, pointers, [0, 2, 5]),
               struct.pack("<7h", 1, 2, 3, 4, 5, 6, 7))
    dataset = IndexedDataset(tmp_path / "h")
    assert len(dataset) == 5 and dataset.document_count == 2
    assert [dataset.get(i).tolist() for i in range(5)] == tokens
    assert dataset.sequence_modes is None


def test_builder_multi_sequence_documents_match_hand_bytes(tmp_path: Path) -> None:
    bin_path = tmp_path / "m.bin"
    builder = IndexedDatasetBuilder(bin_path, dtype=np.uint8)
    builder.add_document([1, 2, 3, 4, 5, 6], lengths=[2, 4])
    builder.add_item([7])
    builder.add_item(np.array([8, 9]))
    builder.end_document()
    assert not bin_path.exists()  # nothing at the final name before finalize
    builder.finalize(tmp_path / "m.idx")
    assert (tmp_path / "m.idx").read_bytes() == hand_index(1, [2, 4, 1, 2], [0, 2, 6, 7],
                                                            [0, 2, 4])
    assert bin_path.read_bytes() == bytes(range(1, 10))
    dataset = IndexedDataset(tmp_path / "m")
    assert dataset.document_indices.tolist() == [0, 2, 4]
    assert dataset.get(1).tolist() == [3, 4, 5, 6]


def test_multimodal_modes_are_exposed(tmp_path: Path) -> None:
    index = hand_index(4, [1, 1], [0, 4], [0, 2]) + bytes([0, 1])
    write_pair(tmp_path / "mm", index, struct.pack("<2i", 5, 6))
    dataset = IndexedDataset(tmp_path / "mm")
    assert dataset.sequence_modes.tolist() == [0, 1]
    assert dataset.get(1).tolist() == [6]


def test_builder_rejects_bad_tokens_and_leaves_nothing(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"token ids 0\.\.70000 do not fit uint16"):
        write_indexed(tmp_path / "bad", [[1], [0, 70000]], dtype=np.uint16)
    with pytest.raises(DataError, match="do not add up"):
        IndexedDatasetBuilder(tmp_path / "x.bin").add_document([1, 2, 3], [1, 1])
    with pytest.raises(DataError, match="cannot be stored as int32"):
        IndexedDatasetBuilder(tmp_path / "y.bin").add_item([1.5])
    builder = IndexedDatasetBuilder(tmp_path / "z.bin")
    builder.discard()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".bad")] == []
    assert not (tmp_path / "bad.bin").exists() and not (tmp_path / "bad.idx").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".z.bin")]


# --- errors ---------------------------------------------------------------------------------

def test_missing_files_say_which_and_the_prefix(tmp_path: Path) -> None:
    prefix = tmp_path / "p"
    write_indexed(prefix, [[1, 2]])
    os.remove(f"{prefix}.bin")
    with pytest.raises(DataError, match=rf"^{prefix}\.bin: data file missing for indexed "
                                        rf"dataset prefix '{prefix}'"):
        IndexedDataset(prefix)
    os.remove(f"{prefix}.idx")
    with pytest.raises(DataError, match=rf"^{prefix}\.idx: index file missing"):
        IndexedDataset(prefix)


def test_wrong_magic(tmp_path: Path) -> None:
    write_pair(tmp_path / "w", hand_index(4, [1], [0], [0, 1], magic=b"NOTANIDX\x00"),
               b"\x00" * 4)
    with pytest.raises(DataError, match=r"w\.idx: not a Megatron index: magic b'NOTANIDX"):
        IndexedDataset(tmp_path / "w")


def test_unsupported_version(tmp_path: Path) -> None:
    write_pair(tmp_path / "v", hand_index(4, [1], [0], [0, 1], version=2), b"\x00" * 4)
    with pytest.raises(DataError, match=r"v\.idx: unsupported index version 2; only version 1"):
        IndexedDataset(tmp_path / "v")


def test_unknown_dtype_code(tmp_path: Path) -> None:
    write_pair(tmp_path / "u", hand_index(9, [1], [0], [0, 1]), b"\x00" * 4)
    with pytest.raises(DataError, match=r"u\.idx: token dtype code 9: unknown; allowed: 1 uint8"):
        IndexedDataset(tmp_path / "u")


@pytest.mark.parametrize("cut", [10, 33, 34, 60, 81])
def test_truncated_index(tmp_path: Path, cut: int) -> None:
    write_indexed(tmp_path / "t", [[1, 2, 3], [4, 5]])
    raw = (tmp_path / "t.idx").read_bytes()
    assert len(raw) == 82
    (tmp_path / "t.idx").write_bytes(raw[:cut])
    message = r"t\.idx: truncated index: " + str(cut) + " bytes"
    with pytest.raises(DataError, match=message):
        IndexedDataset(tmp_path / "t")


@pytest.mark.parametrize("mmap", [True, False])
def test_data_file_smaller_than_the_index_says(tmp_path: Path, mmap: bool) -> None:
    write_indexed(tmp_path / "s", [[1, 2, 3], [4, 5]])
    raw = (tmp_path / "s.bin").read_bytes()
    (tmp_path / "s.bin").write_bytes(raw[:-1])
    with pytest.raises(DataError, match=r"s\.bin: sizes disagree: the data file has 19 bytes "
                                        r"but .*s\.idx points up to byte 20"):
        IndexedDataset(tmp_path / "s", mmap=mmap)
    (tmp_path / "s.bin").write_bytes(b"")
    with pytest.raises(DataError, match="sizes disagree: the data file has 0 bytes"):
        IndexedDataset(tmp_path / "s", mmap=mmap)


def test_sequence_count_disagrees_with_document_indices(tmp_path: Path) -> None:
    write_pair(tmp_path / "d", hand_index(4, [1, 1], [0, 4], [0, 1]), b"\x00" * 8)
    with pytest.raises(DataError, match=r"d\.idx: sequence count 2 disagrees with the document "
                                        r"indices, which run from 0 to 1"):
        IndexedDataset(tmp_path / "d")


def test_get_index_out_of_range(tmp_path: Path) -> None:
    write_indexed(tmp_path / "r", [[1], [2]])
    dataset = IndexedDataset(tmp_path / "r")
    with pytest.raises(DataError, match=r"r: sequence index 2 out of range; the dataset has 2 "
                                        r"sequences"):
        dataset.get(2)
    with pytest.raises(DataError, match="sequence index -3 out of range"):
        dataset.get(-3)


def test_an_index_whose_dtype_byte_was_changed_names_both_files(tmp_path: Path) -> None:
    """uint16 tokens described as uint8: the .bin holds twice the bytes the .idx describes.
    Read as they are, every token would be misread (and training would run on them)."""
    write_indexed(tmp_path / "c", [[1, 2, 300], [4, 5]], dtype=np.uint16)
    raw = bytearray((tmp_path / "c.idx").read_bytes())
    assert raw[17] == 8  # uint16
    raw[17] = 1  # uint8
    (tmp_path / "c.idx").write_bytes(bytes(raw))
    with pytest.raises(DataError) as caught:
        IndexedDataset(tmp_path / "c")
    assert str(caught.value) == (
        f"{tmp_path}/c.bin: sizes disagree: the data file has 10 bytes but {tmp_path}/c.idx "
        "describes 5 tokens of uint8 (1 byte each) = 5 bytes (the data holds 2 bytes per "
        "token, as int16 or uint16 would: the index's dtype does not match the data's); the "
        "two files do not belong together: write both again (mf-data preprocess)")


def test_a_data_file_longer_than_the_index_says(tmp_path: Path) -> None:
    write_indexed(tmp_path / "l", [[1, 2, 3], [4, 5]])
    with open(tmp_path / "l.bin", "ab") as data:
        data.write(b"\0" * 3)
    with pytest.raises(DataError, match=r"l\.bin: sizes disagree: the data file has 23 bytes "
                                        r"but .*l\.idx describes 5 tokens of int32 \(4 bytes "
                                        r"each\) = 20 bytes; the two files"):
        IndexedDataset(tmp_path / "l")


def test_pointers_that_do_not_follow_the_lengths(tmp_path: Path) -> None:
    write_pair(tmp_path / "p", hand_index(4, [1, 1], [4, 0], [0, 1, 2]), b"\x00" * 8)
    with pytest.raises(DataError, match=r"p\.idx: sequence 0 starts at byte 4 of .*p\.bin, "
                                        r"but the lengths before it put it at byte 0"):
        IndexedDataset(tmp_path / "p")
