"""The corpora and the case matrix of the Megatron parity check (numpy and stdlib only).

Shared by generate_golden.py (which runs real megatron-core 0.16.1) and
tests/data/test_megatron_golden.py (which runs without torch or Megatron). Corpora come from
fixed ``numpy.random.RandomState`` seeds (its streams are frozen across numpy versions), so
the documents can be regenerated exactly wherever the goldens are checked.

Token conventions of the stand-in tokenizer: EOD = 2, PAD = 1 (or PAD = EOD, or no PAD at all),
ordinary tokens from 3 upward.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

EOD = 2
PAD = 1
SPLIT_NAMES = ("train", "valid", "test")


@dataclass(frozen=True)
class CorpusSpec:
    """A small corpus: documents of one or more sequences, written as Megatron's builder does."""

    seed: int
    documents: int
    max_sequences: int  # sequences per document: 1..max_sequences
    max_length: int  # sequence lengths: 1..max_length, and every 5th sequence has length 1
    dtype: str
    vocab: int
    inner_eod: float  # chance that an ordinary token is an EOD (several EODs per sample)
    pad_tokens: float  # chance that an ordinary token equals PAD (real data that looks like pad)


CORPORA: dict[str, CorpusSpec] = {
    # one sequence per document, int32
    "plain": CorpusSpec(seed=1101, documents=110, max_sequences=1, max_length=40, dtype="int32",
                        vocab=5000, inner_eod=0.03, pad_tokens=0.0),
    # several sequences per document (GPTDataset works on sequences), uint16
    "multi": CorpusSpec(seed=1202, documents=45, max_sequences=4, max_length=30, dtype="uint16",
                        vocab=60000, inner_eod=0.05, pad_tokens=0.0),
    # real tokens equal to the pad id, int32
    "padded": CorpusSpec(seed=1303, documents=80, max_sequences=2, max_length=35, dtype="int32",
                         vocab=300, inner_eod=0.04, pad_tokens=0.08),
}


def corpus_documents(spec: CorpusSpec) -> list[tuple[np.ndarray, list[int]]]:
    """Each document's tokens and its sequence lengths; every document ends with EOD."""
    rng = np.random.RandomState(spec.seed)
    documents = []
    sequence_number = 0
    for _ in range(spec.documents):
        count = int(rng.randint(1, spec.max_sequences + 1))
        lengths = []
        for _ in range(count):
            sequence_number += 1
            length = 1 if sequence_number % 5 == 0 else int(rng.randint(1, spec.max_length + 1))
            lengths.append(length)
        total = sum(lengths)
        tokens = rng.randint(3, spec.vocab, size=total).astype(np.int64)
        tokens[rng.random_sample(total) < spec.inner_eod] = EOD
        tokens[rng.random_sample(total) < spec.pad_tokens] = PAD
        tokens[-1] = EOD
        documents.append((tokens, lengths))
    return documents


@dataclass(frozen=True)
class TokenizerSpec:
    """What the stand-in tokenizer exposes: Megatron reads eod, pad (if present) and eos."""

    eod: int = EOD
    pad: int | None = PAD  # None: the tokenizer has no pad attribute (Megatron uses -1)

    def identifiers(self) -> dict[str, Any]:
        ids: dict[str, Any] = {"class": "StandInTokenizer", "eod": self.eod}
        if self.pad is not None:
            ids["pad"] = self.pad
        return ids


@dataclass(frozen=True)
class Case:
    """One run of Megatron's BlendedMegatronDatasetBuilder (all three splits)."""

    name: str
    data_path: tuple[str, ...]  # MindFormers' data_path with corpus names for prefixes
    split: str | None  # None with per_split (Megatron requires it then)
    # Per split: an int, None (one epoch), or ("epochs", E, "joint"|"separate"): the sample count
    # that gives exactly E epochs of that split with the final epoch merged or kept separate.
    sizes: tuple[Any, Any, Any]
    # A blend per split (train_data_path, valid_data_path, test_data_path; None: not given)
    # instead of data_path and split: Megatron's blend_per_split.
    per_split: tuple[tuple[str, ...] | None, ...] | None = None
    seq_length: int = 16
    random_seed: int = 1234
    add_extra_token_to_sequence: bool = True
    reset_position_ids: bool = False
    reset_attention_mask: bool = False
    eod_mask_loss: bool = False
    create_attention_mask: bool = True
    drop_last_partial_validation_sequence: bool = True
    allow_ambiguous_pad_tokens: bool = False
    tokenizer: TokenizerSpec = field(default_factory=TokenizerSpec)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def sample_options(self) -> dict[str, Any]:
        """The GPTDatasetConfig keywords Megatron's and mf-data's configs share."""
        return {"random_seed": self.random_seed, "sequence_length": self.seq_length,
                "split": self.split, **{name: getattr(self, name) for name in SAMPLE_FLAGS}}


SAMPLE_FLAGS = ("reset_position_ids", "reset_attention_mask", "eod_mask_loss",
                "create_attention_mask", "drop_last_partial_validation_sequence",
                "add_extra_token_to_sequence", "allow_ambiguous_pad_tokens")


PAD_IS_EOD = TokenizerSpec(eod=EOD, pad=EOD)
NO_PAD = TokenizerSpec(eod=EOD, pad=None)

CASES: list[Case] = [
    Case("plain_one_epoch", ("plain",), "80,15,5", (None, None, None)),
    Case("plain_3ep_joint_resetpos", ("plain",), "80,15,5", (("epochs", 3, "joint"), 20, None),
         reset_position_ids=True, random_seed=7),
    Case("plain_3ep_separate_noextra", ("plain",), "80,15,5",
         (("epochs", 3, "separate"), None, 7), add_extra_token_to_sequence=False,
         reset_attention_mask=True),
    Case("plain_many_epochs_no_mask", ("plain",), "90,10", (("epochs", 9, "separate"), 30, None),
         create_attention_mask=False, seq_length=24),
    Case("plain_train_only", ("plain",), "100,0,0", (("epochs", 2, "joint"), None, None),
         seq_length=8, create_attention_mask=False),
    Case("plain_no_pad_token", ("plain",), "70,20,10", (None, None, None),
         tokenizer=NO_PAD, add_extra_token_to_sequence=False, create_attention_mask=False),
    Case("plain_valid_partial", ("plain",), "60,30,10", (None, None, None),
         drop_last_partial_validation_sequence=False, seq_length=20),
    Case("plain_valid_partial_noextra", ("plain",), "60,30,10", (None, None, 3),
         drop_last_partial_validation_sequence=False, add_extra_token_to_sequence=False,
         eod_mask_loss=True, create_attention_mask=False),
    Case("plain_long_sequences", ("plain",), "90,8,2", (None, None, None), seq_length=96,
         create_attention_mask=False),
    Case("multi_all_masks", ("multi",), "85,10,5", (("epochs", 2, "separate"), None, None),
         reset_position_ids=True, reset_attention_mask=True, eod_mask_loss=True),
    Case("multi_noextra_eodmask", ("multi",), "85,10,5", (("epochs", 4, "joint"), 25, 9),
         add_extra_token_to_sequence=False, eod_mask_loss=True, create_attention_mask=False,
         drop_last_partial_validation_sequence=False, random_seed=99),
    Case("padded_distinct_pad", ("padded",), "80,15,5", (("epochs", 2, "joint"), None, None),
         eod_mask_loss=True, reset_position_ids=True, create_attention_mask=False),
    Case("padded_default_flags", ("padded",), "80,15,5", (None, None, None)),
    Case("padded_noextra_default_flags", ("padded",), "80,15,5", (None, 12, None),
         add_extra_token_to_sequence=False),
    Case("padded_pad_is_eod_allowed", ("padded",), "80,15,5", (None, None, None),
         tokenizer=PAD_IS_EOD, allow_ambiguous_pad_tokens=True,
         add_extra_token_to_sequence=False),
    Case("padded_pad_is_eod_allowed_masks", ("padded",), "80,15,5", (("epochs", 2, "separate"),
         None, None), tokenizer=PAD_IS_EOD, allow_ambiguous_pad_tokens=True,
         reset_attention_mask=True, eod_mask_loss=True),
    Case("padded_pad_is_eod_rejected", ("padded",), "80,15,5", (None, None, None),
         tokenizer=PAD_IS_EOD, allow_ambiguous_pad_tokens=False),
    Case("plain_40_epochs_short", ("plain",), "80,15,5", (("epochs", 40, "separate"), 900, 100),
         seq_length=8, create_attention_mask=False, random_seed=2024),
    Case("blend_weights", ("0.3", "plain", "0.7", "multi"), "80,15,5", (300, 40, 20)),
    Case("blend_three_noextra_masks", ("2", "plain", "1", "multi", "1", "padded"), "80,15,5",
         (400, 50, 25), add_extra_token_to_sequence=False, reset_position_ids=True,
         reset_attention_mask=True, eod_mask_loss=True, seq_length=12, random_seed=5),
    Case("blend_exhaustive", ("plain", "multi", "padded"), "80,15,5", (None, None, None),
         create_attention_mask=False),
    Case("blend_unweighted_sized", ("plain", "multi"), "80,15,5", (50, 10, 1000),
         create_attention_mask=False),
    Case("blend_large_uneven", ("0.6", "plain", "0.3", "multi", "0.1", "padded"), "80,15,5",
         (3000, 300, 90), seq_length=8, eod_mask_loss=True, reset_position_ids=True,
         create_attention_mask=False, random_seed=31),
    Case("blend_single_weighted", ("1", "padded"), "80,15,5", (100, 10, 5),
         eod_mask_loss=True, create_attention_mask=False),
    # Null sizes (one epoch) where Megatron allows them. Single prefix: also a split whose
    # share holds no sequence (a dataset of 0 samples).
    Case("plain_null_train_empty_valid", ("plain",), "99.9,0.1,0", (None, None, 0),
         create_attention_mask=False),
    # Unweighted blend of two prefixes (an even list, which Megatron first tries as weights):
    # exhaustive where null, min(size, total) where sized.
    Case("blend_unweighted_null_mixed", ("plain", "padded"), "80,15,5", (None, 10, None),
         create_attention_mask=False, add_extra_token_to_sequence=False),
    # Blends per split: weights need a size, but a null is fine for a split whose own blend
    # has none, or that has no blend at all.
    Case("per_split_weighted_train_null_valid", (), None, (100, None, None),
         per_split=(("0.3", "plain", "0.7", "multi"), ("multi",), None),
         create_attention_mask=False, eod_mask_loss=True),
    Case("per_split_unweighted_null", (), None, (None, 30, 1000),
         per_split=(("plain", "multi"), ("padded", "multi"), ("plain", "padded")),
         create_attention_mask=False),
    # One weighted prefix per split: a GPTDataset of the size asked (the data_path route
    # would make it a one-dataset blend).
    Case("per_split_single_weighted", (), None, (50, None, 0),
         per_split=(("1", "padded"), ("plain",), None), create_attention_mask=False),
]


@dataclass(frozen=True)
class Refused:
    """A case Megatron refuses; ours must refuse it too, with an error at ``path``."""

    case: Case
    path: str


REFUSED: list[Refused] = [
    Refused(Case("refuse_weighted_null_valid", ("0.3", "plain", "0.7", "multi"), "80,15,5",
                 (100, None, 20)), "train_dataset.dataloader.sizes[1]"),
    # Even for a split the split string leaves empty.
    Refused(Case("refuse_weighted_null_empty_split", ("0.3", "plain", "0.7", "multi"),
                 "100,0,0", (100, 0, None)), "train_dataset.dataloader.sizes[2]"),
    Refused(Case("refuse_single_weighted_null", ("1", "plain"), "80,15,5", (None, 5, 5)),
            "train_dataset.dataloader.sizes[0]"),
    Refused(Case("refuse_per_split_weighted_null", (), None, (None, None, None),
                 per_split=(("plain",), ("0.5", "plain", "0.5", "multi"), None)),
            "train_dataset.dataloader.sizes[1]"),
    Refused(Case("refuse_per_split_single_weighted_null", (), None, (None, 0, 0),
                 per_split=(("1", "plain"), None, None)), "train_dataset.dataloader.sizes[0]"),
]


def tokens_per_epoch(lengths: np.ndarray, split: str, split_index: int) -> int:
    """Tokens of one split of a single corpus (Megatron's split bookends, independently)."""
    weights = [float(x) for x in split.replace(",", " ").split()]
    weights += [0.0] * (3 - len(weights))
    total = sum(weights)
    edges = [0.0]
    for weight in weights:
        edges.append(edges[-1] + weight / total)
    count = len(lengths)
    begin = round(edges[split_index] * count)
    end = round(edges[split_index + 1] * count)
    return int(lengths[begin:end].sum())


def resolve_size(size: Any, tokens: int, seq_length: int, extra: int) -> int | None:
    """An ("epochs", E, mode) size as a sample count; ints and None pass through."""
    if not isinstance(size, (tuple, list)):
        return size
    _, epochs, mode = size
    if mode == "joint":  # every sample of E epochs: the final epoch is nearly full
        return (epochs * tokens - extra) // seq_length
    return ((epochs - 1) * tokens - extra) // seq_length + 1  # one sample into epoch E


def resolved_sizes(case: Case, corpus_lengths: dict[str, np.ndarray]) -> list[int | None]:
    """The three split sizes handed to the builder (symbolic sizes need a single corpus)."""
    sizes = []
    for index, size in enumerate(case.sizes):
        if isinstance(size, (tuple, list)):
            (corpus,) = case.data_path
            tokens = tokens_per_epoch(corpus_lengths[corpus], case.split, index)
            size = resolve_size(size, tokens, case.seq_length,
                                int(case.add_extra_token_to_sequence))
        sizes.append(size)
    return sizes


def data_path_with_prefixes(case: Case, prefix_of: dict[str, str]) -> list[str]:
    """The case's data_path with corpus names replaced by file prefixes (weights kept)."""
    return [prefix_of.get(entry, entry) for entry in case.data_path]


def epochs_of(tokens: int, seq_length: int, extra: int, num_samples: int | None) -> int:
    """Megatron's epoch count (for the report only)."""
    if num_samples is None or tokens == 0:
        return 1
    return max(1, math.ceil((num_samples * seq_length + extra) / tokens))
