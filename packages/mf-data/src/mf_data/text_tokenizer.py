"""Text to token ids for preprocessing: a dependency-free byte tokenizer, or a Hugging Face
``tokenizer.json`` through the optional ``tokenizers`` package (``pip install mf-data[hf]``)."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

from mf_data.errors import DataError

BYTE_VOCAB = 256
# End-of-sequence tokens of common Hugging Face tokenizers, tried in this order when the user
# gives no --eod and tokenizer_config.json (if any) names no eos_token.
EOS_CANDIDATES = ("</s>", "<|endoftext|>", "<|im_end|>", "<|end_of_text|>", "<eos>", "<|eot_id|>")


class TextTokenizer(Protocol):
    """What preprocessing needs: ids for a text, the EOD id and a vocabulary size (for the
    token dtype)."""

    name: str
    eod: int
    vocab_size: int

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: Sequence[int]) -> str: ...


class ByteTokenizer:
    """UTF-8 bytes as ids 0..255, EOD just above them (256 by default): needs no vocabulary
    file, so a corpus can be built and trained on with nothing downloaded."""

    def __init__(self, eod: int = BYTE_VOCAB) -> None:
        if eod < BYTE_VOCAB:
            raise DataError(f"byte tokenizer: EOD id {eod} collides with the byte ids "
                            f"0..{BYTE_VOCAB - 1}; use an id >= {BYTE_VOCAB}")
        self.eod = eod
        self.vocab_size = eod + 1
        self.name = "bytes (UTF-8)"

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: Sequence[int]) -> str:
        return bytes(i for i in ids if 0 <= i < BYTE_VOCAB).decode("utf-8", errors="replace")


def _import_tokenizers(path: str) -> Any:
    try:
        import tokenizers
    except ImportError:
        raise DataError(f"{path}: reading a Hugging Face tokenizer.json needs the 'tokenizers' "
                        f"package; install it with: pip install 'mf-data[hf]'") from None
    return tokenizers


def _configured_eos(tokenizer_path: str) -> str | None:
    """The eos_token named by a tokenizer_config.json beside the tokenizer.json, if any."""
    config = Path(tokenizer_path).with_name("tokenizer_config.json")
    try:
        token = json.loads(config.read_text(encoding="utf-8")).get("eos_token")
    except (OSError, ValueError, AttributeError):
        return None
    if isinstance(token, dict):
        token = token.get("content")
    return token if isinstance(token, str) else None


def _tokenizer_file(path: str) -> str:
    """``path`` itself, or the ``tokenizer.json`` in it when it is a directory (a Hugging Face
    model directory, as Megatron's ``--tokenizer-model`` takes)."""
    if not os.path.isdir(path):
        return path
    inside = os.path.join(path, "tokenizer.json")
    if not os.path.isfile(inside):
        raise DataError(f"{path}: no tokenizer.json in this directory; mf-data reads Hugging "
                        "Face fast tokenizers (tokenizer.json), not vocab/merges files or "
                        "sentencepiece models")
    return inside


class HuggingFaceTokenizer:
    """A Hugging Face ``tokenizer.json``. Special tokens from the post-processor (e.g. a BOS)
    are not added unless asked: a document is its text's tokens followed by EOD."""

    def __init__(self, path: str | os.PathLike, eod: int | None = None,
                 add_special_tokens: bool = False) -> None:
        self.path = _tokenizer_file(os.fspath(path))
        tokenizers = _import_tokenizers(self.path)
        if not os.path.isfile(self.path):
            raise DataError(f"{self.path}: tokenizer file not found")
        try:
            self._tokenizer = tokenizers.Tokenizer.from_file(self.path)
        except Exception as error:
            raise DataError(f"{self.path}: not a Hugging Face tokenizer.json ({error})") from None
        self._add_special_tokens = add_special_tokens
        vocab = self._tokenizer.get_vocab_size(with_added_tokens=True)
        self.eod = self._find_eod() if eod is None else eod
        if self.eod < 0:
            raise DataError(f"{self.path}: EOD id {self.eod} is negative; give an id >= 0")
        self.vocab_size = max(vocab, self.eod + 1)
        self.name = f"Hugging Face {os.path.basename(self.path)}"

    def _find_eod(self) -> int:
        configured = _configured_eos(self.path)
        candidates = ((configured,) if configured else ()) + EOS_CANDIDATES
        for token in candidates:
            token_id = self._tokenizer.token_to_id(token)
            if token_id is not None:
                return int(token_id)
        raise DataError(f"{self.path}: cannot find an end-of-document token (tried "
                        f"{', '.join(candidates)}); give its id with --eod")

    def encode(self, text: str) -> list[int]:
        return self._tokenizer.encode(text, add_special_tokens=self._add_special_tokens).ids

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        encodings = self._tokenizer.encode_batch(texts,
                                                 add_special_tokens=self._add_special_tokens)
        return [encoding.ids for encoding in encodings]

    def decode(self, ids: Sequence[int]) -> str:
        return self._tokenizer.decode(list(ids), skip_special_tokens=False)


TOKENIZER_TYPES = ("ByteTokenizer", "HuggingFaceTokenizer")
"""The values of ``--tokenizer-type``; Megatron's other types are refused by name."""


def unknown_type_message(kind: str) -> str:
    return (f"--tokenizer-type {kind}: not supported; allowed: {', '.join(TOKENIZER_TYPES)} "
            "(Megatron's BERT, GPT-2 BPE, SentencePiece, TikToken and Null types are not; a "
            "Hugging Face model directory with tokenizer.json covers most models)")


def tokenizer_of_type(kind: str, model: str | os.PathLike | None = None,
                      eod: int | None = None) -> ByteTokenizer | HuggingFaceTokenizer:
    """The tokenizer named by Megatron-style ``--tokenizer-type`` / ``--tokenizer-model``.

    Args:
        kind: ``ByteTokenizer`` (needs no model) or ``HuggingFaceTokenizer`` (needs one).
        model: a Hugging Face model directory holding ``tokenizer.json``, or that file.
        eod: the end-of-document id; None: the tokenizer's own.

    Raises:
        DataError: an unknown type (listing the allowed ones), a model missing or given where
            none is read, or the tokenizer cannot be loaded.
    """
    if kind not in TOKENIZER_TYPES:
        raise DataError(unknown_type_message(kind))
    if kind == "ByteTokenizer":
        if model is not None:
            raise DataError(f"--tokenizer-model {model}: the ByteTokenizer reads no model; "
                            "drop it, or use --tokenizer-type HuggingFaceTokenizer")
        return load_tokenizer(None, eod)
    if model is None:
        raise DataError("--tokenizer-type HuggingFaceTokenizer needs --tokenizer-model: a "
                        "Hugging Face model directory with tokenizer.json, or the file")
    return HuggingFaceTokenizer(model, eod)


def load_tokenizer(path: str | os.PathLike | None = None,
                   eod: int | None = None) -> ByteTokenizer | HuggingFaceTokenizer:
    """The tokenizer preprocessing uses, by what the command line gives.

    Args:
        path: a Hugging Face ``tokenizer.json``; None: the byte tokenizer (needs no files).
        eod: the end-of-document id; None: the tokenizer's own.

    Returns:
        The byte tokenizer when ``path`` is None, else the Hugging Face tokenizer at it.

    Raises:
        DataError: the tokenizer cannot be loaded (no file, not a tokenizer.json, no EOD
            token found, the `tokenizers` package missing).
    """
    if path is None:
        return ByteTokenizer() if eod is None else ByteTokenizer(eod)
    return HuggingFaceTokenizer(path, eod)
