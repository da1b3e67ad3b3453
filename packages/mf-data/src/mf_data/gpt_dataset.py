"""Megatron's GPTDataset: fixed-length samples cut from shuffled sequences of an indexed dataset.

Index building (mf_data.gpt_indices), the cache (mf_data.index_cache) and every sample equal
megatron-core 0.16.1's ``GPTDataset``, with one deliberate difference: Megatron caches the loss
mask of the first sample it returns when none of reset_position_ids, reset_attention_mask and
eod_mask_loss is set, pad-masks that cached tensor in place, and starts every later sample from
it, so later samples inherit zeros wherever the first sample's labels were padding (always the
last position when add_extra_token_to_sequence is off). That is a defect; here every sample's
masks are computed afresh. A sample differs from Megatron's only at positions where the
first-fetched sample's label was the pad id and its own is not.

Other points:
- Samples are numpy arrays, not torch tensors: tokens, labels and position_ids int64,
  loss_mask float32, attention_mask bool ``[1, L, L]`` (True = masked), as Megatron's dtypes.
  tokens and labels are separate arrays (Megatron's share one buffer). Without
  reset_attention_mask the attention mask is the same for every sample; it is returned as one
  shared read-only array (Megatron also returns one cached tensor there).
- ``create_compressed_eod_mask`` (a MindFormers extension) adds ``actual_seq_len`` (int32,
  from the input tokens before pad ids are zeroed) and, as in MindFormers, takes precedence over
  ``create_attention_mask``: no dense mask is built then.
- Pad id: ``config.pad``; if it equals ``config.eod`` it is ambiguous, and like Megatron (whose
  special tokens are the tokenizer's eos/eod) the pad becomes -1 with a warning, unless
  ``allow_ambiguous_pad_tokens``, in which case EOD tokens are zeroed and loss-masked too.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any

import numpy as np
from numpy.lib.stride_tricks import as_strided

from mf_data.errors import DataError
from mf_data.gpt_indices import GPTIndices, build_gpt_indices, index_problem
from mf_data.index_cache import default_cache_dir, describe, description_hash, load_or_build
from mf_data.indexed import IndexedDataset
from mf_data.split import SPLIT_NAMES, parse_split, split_matrix

logger = logging.getLogger(__name__)

_NO_PAD = -1


@dataclass(frozen=True, kw_only=True)
class GPTDatasetConfig:
    """What shapes the samples (Megatron's ``GPTDatasetConfig`` fields of the same names)."""

    sequence_length: int
    eod: int
    random_seed: int = 1234
    # None: the datasets draw from whole files (Megatron's blend per split, which requires its
    # config's split to be None), so the cache description has split and split_matrix null.
    split: str | None = "969, 30, 1"
    add_extra_token_to_sequence: bool = True
    reset_position_ids: bool = False
    reset_attention_mask: bool = False
    eod_mask_loss: bool = False
    create_attention_mask: bool = True
    create_compressed_eod_mask: bool = False
    eod_pad_length: int = 128
    pad: int = _NO_PAD
    allow_ambiguous_pad_tokens: bool = False
    drop_last_partial_validation_sequence: bool = True
    path_to_cache: str | None = None
    # Megatron's tokenizer ``unique_identifiers`` for the cache description (None = null).
    tokenizer_identifiers: Any = field(default=None, hash=False)
    # The model's vocabulary: every token id read must be in [0, vocab_size) (None: not
    # checked). Not Megatron's, and not in the cache description: it changes no index.
    vocab_size: int | None = None

    def __post_init__(self) -> None:
        _require_int("sequence_length", self.sequence_length, minimum=1)
        _require_int("eod", self.eod)
        _require_int("pad", self.pad)
        _require_int("random_seed", self.random_seed, minimum=0, maximum=2**32 - 1)
        _require_int("eod_pad_length", self.eod_pad_length, minimum=1)
        if self.vocab_size is not None:
            _require_int("vocab_size", self.vocab_size, minimum=1)
        if self.split is not None:
            parse_split(self.split)

    @property
    def split_vector(self) -> list[float] | None:
        return None if self.split is None else parse_split(self.split)

    @property
    def split_matrix(self) -> list[tuple[float, float] | None] | None:
        return None if self.split is None else split_matrix(parse_split(self.split))

    @property
    def extra_tokens(self) -> int:
        return int(bool(self.add_extra_token_to_sequence))


def _require_int(name: str, value: Any, minimum: int | None = None,
                 maximum: int | None = None) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise DataError(f"{name}: {value!r} is not an integer")
    if minimum is not None and value < minimum:
        raise DataError(f"{name}: {value}; it must be at least {minimum}")
    if maximum is not None and value > maximum:
        raise DataError(f"{name}: {value}; it must be at most {maximum}")


def resolve_pad(config: GPTDatasetConfig) -> int:
    """The pad id samples use: ``config.pad``, or -1 when it would be confused with EOD."""
    if config.pad != _NO_PAD and config.pad == config.eod and not config.allow_ambiguous_pad_tokens:
        logger.warning("pad id %d equals the eod id; using %d (no pad id) instead. Set "
                       "allow_ambiguous_pad_tokens to keep it", config.pad, _NO_PAD)
        return _NO_PAD
    return config.pad


class GPTDataset:
    """Samples of ``sequence_length`` tokens (plus labels and masks) from ``indexed``.

    The indices are loaded from the cache when its description matches, else built (and saved).

    Args:
        indexed: the tokens.
        dataset_path: the prefix as configured (it goes into the cache description).
        indices: the sequence ids this split exposes.
        num_samples: how many samples to provide; None: one epoch.
        index_split: one of "train", "valid", "test".
        config: what shapes the samples.

    Raises:
        DataError: ``index_split`` is not a split name.
    """

    def __init__(self, indexed: IndexedDataset, dataset_path: str, indices: np.ndarray,
                 num_samples: int | None, index_split: str, config: GPTDatasetConfig) -> None:
        if index_split not in SPLIT_NAMES:
            raise DataError(f"index_split: {index_split!r}; allowed: {', '.join(SPLIT_NAMES)}")
        self.dataset = indexed
        self.dataset_path = dataset_path
        self.indices = np.asarray(indices)
        self.num_samples = num_samples
        self.index_split = index_split
        self.config = config
        self.pad = resolve_pad(config)
        self.unique_description = describe(
            dataset_path, num_samples, index_split, config.random_seed, config.sequence_length,
            config.split, config.split_matrix, config.tokenizer_identifiers)
        self.unique_description_hash = description_hash(self.unique_description)
        cache_dir = config.path_to_cache
        if cache_dir is None:
            cache_dir = default_cache_dir(indexed.prefix)
        built, self.built_anew_on_cache_miss = load_or_build(
            cache_dir, self.unique_description, index_split, self._build_indices,
            check=lambda cached: index_problem(cached, indexed.sequence_lengths, self.indices))
        # Plain ndarray views of the (possibly memory-mapped) arrays: cheaper to index.
        self.document_index = np.asarray(built.document_index)
        self.sample_index = np.asarray(built.sample_index)
        self.shuffle_index = np.asarray(built.shuffle_index)
        self._masks = _SampleMasks(config, self.pad)
        self._check_ids = _ids_can_leave(indexed.dtype, config.vocab_size)

    def _build_indices(self) -> GPTIndices:
        drop_last = True
        if self.index_split == "valid":
            drop_last = self.config.drop_last_partial_validation_sequence
        return build_gpt_indices(self.dataset.sequence_lengths, self.indices, self.num_samples,
                                 self.config.sequence_length, self.config.random_seed,
                                 self.config.extra_tokens, drop_last)

    def __len__(self) -> int:
        return self.sample_index.shape[0] - 1

    def __getitem__(self, idx: int | None) -> dict[str, np.ndarray]:
        """Sample ``idx`` (through the shuffle index); None is a batch-padding sample: sample 0
        with a zero loss mask."""
        text = self.sample_text(0 if idx is None else idx)
        return self._masks.build(text, padding=idx is None, sample=idx)

    def sample_text(self, idx: int) -> np.ndarray:
        """The ``sequence_length + x`` token ids of sample ``idx`` as int64, pad-filled."""
        length = len(self)
        if not -length <= idx < length:
            raise IndexError(f"sample {idx} out of range; the dataset has {length} samples")
        position = int(self.shuffle_index[idx])
        (first, first_offset), (last, last_offset) = (
            self.sample_index[position:position + 2].tolist())
        extra = self.config.extra_tokens
        text = np.empty(self.config.sequence_length + extra, dtype=np.int64)
        get, document_index = self.dataset.get, self.document_index
        if first == last:
            part = get(int(document_index[first]), first_offset,
                       last_offset - first_offset + extra)
            filled = len(part)
            text[:filled] = part
        else:
            filled = 0
            for position in range(first, last + 1):
                offset = first_offset if position == first else 0
                size = None if position < last else last_offset + extra
                part = get(int(document_index[position]), offset, size)
                text[filled:filled + len(part)] = part
                filled += len(part)
        if self._check_ids and filled:
            self._check_vocabulary(text[:filled], idx, first, last)
        if filled < len(text):
            text[filled:] = self.pad
        return text

    def _check_vocabulary(self, tokens: np.ndarray, idx: int, first: int, last: int) -> None:
        """Every id of the sample is in the model's vocabulary, else an error naming the file,
        the sequence, the id and the vocabulary size (the embedding's gather would fail on it
        inside a training step, naming nothing)."""
        vocab_size = self.config.vocab_size
        assert vocab_size is not None
        if int(tokens.view(np.uint64).max()) < vocab_size:  # one pass: negatives wrap high
            return
        low, high = int(tokens.min()), int(tokens.max())
        bad = low if low < 0 else high
        sequences = [int(self.document_index[position]) for position in range(first, last + 1)]
        sequence = next(s for s in sequences if bad in np.asarray(self.dataset.get(s)))
        raise DataError(f"{self.dataset.data_file}: token id {bad} (sequence {sequence}, in "
                        f"sample {idx} of the {self.index_split} split) is outside the model's "
                        f"vocabulary: model.vocab_size is {vocab_size} (ids 0 to "
                        f"{vocab_size - 1}); make the data with the model's tokenizer, or give "
                        f"the model a vocabulary of at least {bad + 1}")


def _ids_can_leave(dtype: np.dtype, vocab_size: int | None) -> bool:
    """Whether tokens of `dtype` can fall outside `[0, vocab_size)`: not when unsigned and no
    larger than the vocabulary (uint16 tokens for a 151,936-token model need no check)."""
    if vocab_size is None:
        return False
    return dtype.kind != "u" or int(np.iinfo(dtype).max) >= vocab_size


class _SampleMasks:
    """Turns a sample's token ids into Megatron's tokens, labels and masks, vectorised."""

    def __init__(self, config: GPTDatasetConfig, pad: int) -> None:
        self.config = config
        self.pad = pad
        self.eod = config.eod
        self.extra = config.extra_tokens
        size = config.sequence_length
        self.size = size
        self.positions = np.arange(size, dtype=np.int64)
        self.needs_eod = (config.eod_mask_loss or config.reset_position_ids
                          or config.create_compressed_eod_mask
                          or (config.reset_attention_mask and config.create_attention_mask))
        # Strictly-upper-triangular pattern (True = masked) as a zero-copy strided view of 2L
        # booleans: row r starts at pattern[L - 1 - r].
        pattern = np.zeros(2 * size, dtype=bool)
        pattern[size:] = True
        self.causal = as_strided(pattern[size - 1:], shape=(size, size), strides=(-1, 1),
                                 writeable=False)
        self._shared_causal: np.ndarray | None = None

    def build(self, text: np.ndarray, padding: bool, sample: int | None) -> dict[str, np.ndarray]:
        """Megatron's ``__getitem__`` after the text is read (``padding``: zero loss mask)."""
        tokens, labels = self._tokens_and_labels(text)
        eods = np.flatnonzero(tokens == self.eod) if self.needs_eod else None
        loss_mask = self._loss_mask(labels, eods, padding)
        if self.config.reset_position_ids:
            position_ids = self._reset_positions(eods)
        else:
            position_ids = self.positions.copy()
        attention_mask = self._attention_mask(eods)
        actual_seq_len = None
        if self.config.create_compressed_eod_mask:
            actual_seq_len = self._actual_seq_len(eods, sample)
        # Pad ids become 0 so the embedding can look them up; the masks above saw them first.
        tokens[tokens == self.pad] = 0
        labels[labels == self.pad] = 0
        result = {"tokens": tokens, "labels": labels}
        if attention_mask is not None:
            result["attention_mask"] = attention_mask
        result["loss_mask"] = loss_mask
        result["position_ids"] = position_ids
        if actual_seq_len is not None:
            result["actual_seq_len"] = actual_seq_len
        return result

    def _tokens_and_labels(self, text: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Inputs and next-token targets as separate arrays. Without the extra token the last
        label is the pad id."""
        if self.extra:
            return text[:-1], text[1:].copy()
        labels = np.empty(self.size, dtype=np.int64)
        labels[:-1] = text[1:]
        labels[-1] = self.pad
        return text, labels

    def _loss_mask(self, labels: np.ndarray, eods: np.ndarray | None,
                   padding: bool) -> np.ndarray:
        """1.0 except where the label is the pad id and, with eod_mask_loss, where the input
        token is EOD; all zeros for a batch-padding sample."""
        if padding:
            return np.zeros(self.size, dtype=np.float32)
        keep = labels != self.pad
        if self.config.eod_mask_loss:
            keep[eods] = False
        return keep.astype(np.float32)

    def _attention_mask(self, eods: np.ndarray | None) -> np.ndarray | None:
        config = self.config
        if config.create_compressed_eod_mask or not config.create_attention_mask:
            return None
        if config.reset_attention_mask:
            return self._document_mask(eods)
        return self._causal_mask()

    def _reset_positions(self, eods: np.ndarray) -> np.ndarray:
        """Positions restart at 0 after every EOD: ``k - (index of the last EOD before k + 1)``."""
        starts = eods + 1
        starts = starts[starts < self.size]
        segment_start = np.zeros(self.size, dtype=np.int64)
        segment_start[starts] = starts
        np.maximum.accumulate(segment_start, out=segment_start)
        return np.subtract(self.positions, segment_start, out=segment_start)

    def _causal_mask(self) -> np.ndarray:
        if self._shared_causal is None:
            mask = np.ascontiguousarray(self.causal)[None]
            mask.flags.writeable = False
            self._shared_causal = mask
        return self._shared_causal

    def _document_mask(self, eods: np.ndarray) -> np.ndarray:
        """Block-diagonal causal mask ``[1, L, L]``: token r sees c iff c <= r and no EOD lies
        in ``[c, r)``. Written block by block (two slice assignments per document, copied from
        the strided causal pattern), so each byte is written once; even with an EOD on every
        token this beats a broadcast comparison, which touches the whole matrix three times."""
        size = self.size
        starts = eods + 1
        starts = starts[starts < size]
        mask = np.empty((size, size), dtype=bool)
        bounds = [0, *starts.tolist(), size]
        for begin, end in pairwise(bounds):
            mask[begin:end, :begin] = True
            mask[begin:end, begin:] = self.causal[:end - begin, :size - begin]
        return mask[None]

    def _actual_seq_len(self, eods: np.ndarray, sample: int | None) -> np.ndarray:
        """Ends of the documents in the sample (position after each EOD, not counting an EOD
        in the last position), padded with L to ``eod_pad_length``: MindFormers' compressed
        EOD mask."""
        ends = eods[eods < self.size - 1] + 1
        limit = self.config.eod_pad_length
        if len(ends) > limit:
            raise DataError(f"eod_pad_length: Number of EOD tokens ({len(ends)}) exceeds "
                            f"eod_pad_length ({limit}) in sample {sample}; raise "
                            f"eod_pad_length to at least {len(ends)}")
        actual = np.full(limit, self.size, dtype=np.int32)
        actual[:len(ends)] = ends
        return actual

