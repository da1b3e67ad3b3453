"""The tiny Qwen3 of the Hugging Face golden test: its configuration and its weights, drawn
by name, so that `make_qwen3_golden.py` (torch, transformers) and `test_qwen3_golden.py`
(MindSpore) build the same model without sharing a weight file. Pure numpy."""

from __future__ import annotations

import zlib

import numpy as np

BASE = {"vocab_size": 64, "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 12,
        "rms_norm_eps": 1e-6, "rope_theta": 500.0, "max_position_embeddings": 64}
VARIANTS = {"untied_bias": BASE | {"tie_word_embeddings": False, "attention_bias": True},
            "tied": BASE | {"tie_word_embeddings": True, "attention_bias": False}}
BATCH, SEQ = 2, 8


def weight(name: str, shape: tuple[int, ...]) -> np.ndarray:
    """Norm weights 1 + 0.3 N(0, 1), everything else 0.2 N(0, 1), from a stream per name."""
    rng = np.random.default_rng([2024, zlib.crc32(name.encode())])
    draw = rng.standard_normal(shape)
    value = 1.0 + 0.3 * draw if name.endswith("norm.weight") else 0.2 * draw
    return value.astype(np.float32)


def golden_batch() -> tuple[np.ndarray, np.ndarray]:
    """(input_ids, labels) as Hugging Face takes them: labels unshifted (HF shifts)."""
    rng = np.random.default_rng(3)
    ids = rng.integers(0, BASE["vocab_size"], (BATCH, SEQ)).astype(np.int64)
    labels = rng.integers(0, BASE["vocab_size"], (BATCH, SEQ)).astype(np.int64)
    return ids, labels
