"""Megatron's preprocessing, for benchmarks/data_preprocess.py and
tests/data/parity/preprocess_parity.py: the algorithm of Megatron-LM's ``tools/preprocess_data.py``
run on megatron-core 0.16.1's own parts.

``tools/preprocess_data.py`` is not in the megatron-core wheel (it lives in the Megatron-LM
repository's ``tools/``, which is not packaged), so it cannot be imported. What it does is
short, and this module does the same with megatron-core's pieces: the tokenizer from
``megatron.core.tokenizers``' ``build_tokenizer`` (type HuggingFaceTokenizer, which loads the
model directory with transformers' ``AutoTokenizer``), a ``multiprocessing.Pool`` of ``workers``
(the default ``fork`` start) each building its own tokenizer, the input lines fed through
``imap`` 32 at a time, and per line and key: the text (a string, or a list of strings), each
string's ids from ``tokenizer.tokenize``, empty ones dropped, EOD appended to a non-empty document
with ``append_eod``; the main process adds each document to megatron-core's
``IndexedDatasetBuilder`` (dtype ``DType.optimal_dtype(vocab_size)``) of
``{output_prefix}_{key}_document``. Needs torch, megatron-core and transformers.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import warnings
from pathlib import Path

with warnings.catch_warnings():  # "Transformer Engine and Apex are not installed"
    warnings.simplefilter("ignore")
    from megatron.core.datasets.indexed_dataset import DType, IndexedDatasetBuilder
    from megatron.core.tokenizers.text.utils.build_tokenizer import build_tokenizer


def tokenizer_arguments(model_directory: str) -> argparse.Namespace:
    """The parsed arguments ``build_tokenizer`` reads, as preprocess_data.py's defaults give
    them for ``--tokenizer-type HuggingFaceTokenizer --tokenizer-model DIR``."""
    return argparse.Namespace(
        tokenizer_type="HuggingFaceTokenizer", tokenizer_model=model_directory,
        vocab_file=None, merge_file=None, tokenizer_special_tokens=None,
        tokenizer_hf_use_fast=True, trust_remote_code=False,
        tokenizer_hf_include_special_tokens=False, tokenizer_metadata=None,
        vocab_size=None)


class _Encoder:
    """One JSON line to each key's ids and sequence lengths (built in every worker)."""

    tokenizer = None

    def __init__(self, model_directory: str, json_keys: list[str], append_eod: bool) -> None:
        self.model_directory, self.json_keys, self.append_eod = (model_directory, json_keys,
                                                                 append_eod)

    def initializer(self) -> None:
        _Encoder.tokenizer = build_tokenizer(tokenizer_arguments(self.model_directory))

    def encode(self, line: str) -> tuple[dict[str, list[int]], dict[str, list[int]]]:
        record = json.loads(line)
        ids, lengths = {}, {}
        for key in self.json_keys:
            text = record[key]
            sentences = text if isinstance(text, list) else [text]
            document: list[int] = []
            sentence_lengths: list[int] = []
            for sentence in sentences:
                sentence_ids = _Encoder.tokenizer.tokenize(sentence)
                if len(sentence_ids) > 0:
                    document.extend(sentence_ids)
                    sentence_lengths.append(len(sentence_ids))
            if len(document) > 0 and self.append_eod:
                document.append(_Encoder.tokenizer.eod)
                sentence_lengths[-1] += 1
            ids[key], lengths[key] = document, sentence_lengths
        return ids, lengths


def megatron_preprocess(input_path: str, output_prefix: str, json_keys: list[str],
                        model_directory: str, append_eod: bool, workers: int) -> int:
    """Write ``{output_prefix}_{key}_document.bin/.idx`` for each key; returns the tokens
    written (all keys)."""
    encoder = _Encoder(model_directory, json_keys, append_eod)
    tokenizer = build_tokenizer(tokenizer_arguments(model_directory))
    builders = {key: IndexedDatasetBuilder(f"{output_prefix}_{key}_document.bin",
                                           dtype=DType.optimal_dtype(tokenizer.vocab_size))
                for key in json_keys}
    tokens = 0
    with open(input_path, encoding="utf-8") as lines, \
            multiprocessing.get_context("fork").Pool(workers,
                                                     initializer=encoder.initializer) as pool:
        for ids, lengths in pool.imap(encoder.encode, lines, 32):
            for key in json_keys:
                builders[key].add_document(ids[key], lengths[key])
                tokens += len(ids[key])
    for key, builder in builders.items():
        builder.finalize(f"{output_prefix}_{key}_document.idx")
    return tokens


def save_tokenizer_directory(tokenizer_json: Path, directory: Path, eos_token: str) -> None:
    """A Hugging Face model directory that both transformers' ``AutoTokenizer`` (Megatron's
    side) and mf-data read: tokenizer.json, tokenizer_config.json, special_tokens_map.json."""
    from transformers import PreTrainedTokenizerFast

    wrapped = PreTrainedTokenizerFast(tokenizer_file=str(tokenizer_json), eos_token=eos_token)
    wrapped.save_pretrained(str(directory))
