"""FP8 (e4m3fn) weights for the Hugging Face DeepSeek-V3 import tests (test_hf_fp8.py,
test_hf_streaming.py): random FP8 bytes, their decoding written from the format's fields (not
mf's table), and the config.json that gives a checkpoint's block size."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

NAN_BYTES = (0x7F, 0xFF)
"""The two e4m3fn bytes that decode to NaN (e4m3fn has no infinity)."""


def write_fp8_config(directory: Path, block: list[int]) -> None:
    """A DeepSeek-V3 config.json in `directory`: one multi-token-prediction layer, FP8 weights
    in blocks of `block` (rows, columns)."""
    (directory / "config.json").write_text(json.dumps({
        "model_type": "deepseek_v3", "num_nextn_predict_layers": 1,
        "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3",
                                "quant_method": "fp8", "weight_block_size": block}}))


def e4m3fn_reference(raw: np.ndarray) -> np.ndarray:
    """e4m3fn bytes decoded to float32, vectorised from the fields: (-1)^s * 2^(e-7) *
    (1 + m/8), subnormal 2^-6 * m/8."""
    raw = raw.astype(np.int64)
    sign = np.where(raw & 0x80, -1.0, 1.0)
    exponent, mantissa = (raw >> 3) & 0xF, raw & 0x7
    value = np.where(exponent == 0, np.ldexp(mantissa / 8.0, -6),
                     np.ldexp(1.0 + mantissa / 8.0, exponent - 7))
    value = np.where((exponent == 15) & (mantissa == 7), np.nan, value)
    return (sign * value).astype(np.float32)


def random_fp8(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """Random e4m3fn bytes (uint8) of `shape`, the NaN bytes replaced by 1.0 (0x38)."""
    raw = rng.integers(0, 256, shape, dtype=np.uint8)
    raw[np.isin(raw, NAN_BYTES)] = 0x38
    return raw
