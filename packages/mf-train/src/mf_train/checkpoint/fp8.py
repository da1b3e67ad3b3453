"""FP8 (e4m3fn) weights with 128 x 128 block scales, as DeepSeek-V3 publishes its checkpoint.

DeepSeek-V3's Hugging Face checkpoint stores most linear weights as safetensors dtype
`F8_E4M3` (float8 e4m3fn) and, beside each such `<name>`, a float32 `<name>_scale_inv` of shape
`[ceil(rows / 128), ceil(cols / 128)]`: the weight's value is `fp8 * scale_inv` of its block
(DeepSeek's `weight_dequant`; the block is config.json's
`quantization_config.weight_block_size`, [128, 128]). Training needs the dequantised values:
the reader checks every weight's scales from the headers (`check_scales`), then turns the raw
bytes of the region a rank reads into float32 with their blocks' scales
(`dequantize_region`); the scales are consumed, not loaded as weights.

numpy has no float8. An e4m3fn byte is: sign bit, 4 exponent bits (bias 7), 3 mantissa bits;
exponent 0 is subnormal (`mantissa / 8 * 2**-6`); there is no infinity, and only
`S.1111.111` (0x7f, 0xff) is NaN, which leaves 448 (0x7e) the largest value. All 256 values are
exact in float32, so decoding is one lookup in `E4M3FN`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from .errors import CheckpointError

SCALE_SUFFIX = "_scale_inv"
DEFAULT_BLOCK = (128, 128)


def _e4m3fn_table() -> np.ndarray:
    """The float32 value of each of the 256 e4m3fn bytes (module docstring)."""
    table = np.empty(256, np.float32)
    for byte in range(256):
        sign = -1.0 if byte & 0x80 else 1.0
        exponent, mantissa = (byte >> 3) & 0xF, byte & 0x7
        if exponent == 0xF and mantissa == 0x7:
            table[byte] = np.nan
        elif exponent == 0:
            table[byte] = sign * mantissa / 8 * 2.0 ** -6
        else:
            table[byte] = sign * (1 + mantissa / 8) * 2.0 ** (exponent - 7)
    return table


E4M3FN = _e4m3fn_table()
"""`E4M3FN[byte]`: the float32 value of an e4m3fn byte."""


def decode_e4m3fn(raw: np.ndarray) -> np.ndarray:
    """float32 values of e4m3fn bytes (a `uint8` array), same shape."""
    return E4M3FN[np.asarray(raw).view(np.uint8)]


def weight_block_size(checkpoint: str | Path) -> tuple[int, int]:
    """The FP8 block of a checkpoint: `quantization_config.weight_block_size` of the
    `config.json` in its directory (beside the file, for a single file), else 128 x 128.

    Raises:
        CheckpointError: config.json is unreadable or its block size is not two positive ints.
    """
    path = Path(checkpoint)
    config = (path if path.is_dir() else path.parent) / "config.json"
    if not config.is_file():
        return DEFAULT_BLOCK
    try:
        quantization = json.loads(config.read_text(encoding="utf-8")).get(
            "quantization_config") or {}
    except (OSError, ValueError, AttributeError) as exc:
        raise CheckpointError(f"{config}: unreadable ({exc!r})") from None
    block = quantization.get("weight_block_size", list(DEFAULT_BLOCK))
    if not (isinstance(block, list) and len(block) == 2
            and all(isinstance(b, int) and b > 0 for b in block)):
        raise CheckpointError(f"{config}: quantization_config.weight_block_size must be two "
                              f"positive ints, got {block!r}")
    return block[0], block[1]


def check_scales(fp8: Mapping[str, tuple[int, ...]], scales: Mapping[str, tuple[int, ...]],
                 block: tuple[int, int]) -> None:
    """Check, from the headers alone, that every FP8 weight has block scales of its shape.

    Args:
        fp8: HF name -> shape of each `F8_E4M3` weight.
        scales: HF name -> shape of each `<weight>_scale_inv` tensor.
        block: rows and columns of one scale block.

    Raises:
        CheckpointError: an FP8 weight without its scales or not a matrix, scales of the wrong
            shape, or scales for no FP8 weight.
    """
    orphans = sorted(set(scales) - {name + SCALE_SUFFIX for name in fp8})
    if orphans:
        raise CheckpointError("block scales for no FP8 (F8_E4M3) weight: "
                              + ", ".join(orphans[:10]))
    for name, shape in sorted(fp8.items()):
        scale = scales.get(name + SCALE_SUFFIX)
        if scale is None:
            raise CheckpointError(f"{name}: an FP8 (F8_E4M3) weight without "
                                  f"{name}{SCALE_SUFFIX}; its values cannot be recovered")
        if len(shape) != 2:
            raise CheckpointError(f"{name}: FP8 weights must be matrices for block scales, "
                                  f"got shape {shape}")
        rows, cols = shape
        expected = (math.ceil(rows / block[0]), math.ceil(cols / block[1]))
        if tuple(scale) != expected:
            raise CheckpointError(f"{name}{SCALE_SUFFIX}: shape {tuple(scale)}, expected "
                                  f"{expected} for a {rows}x{cols} weight in "
                                  f"{block[0]}x{block[1]} blocks")


def dequantize_region(raw: np.ndarray, scale_inv: np.ndarray, block: tuple[int, int],
                      start: tuple[int, int] = (0, 0)) -> np.ndarray:
    """float32 values of a region of an FP8 weight: each byte times its block's scale.

    Args:
        raw: the region's e4m3fn bytes, `[rows, cols]`.
        scale_inv: the whole weight's block scales (checked by `check_scales`).
        block: rows and columns of one scale block.
        start: the region's first row and column in the whole weight.
    """
    rows = (start[0] + np.arange(raw.shape[0])) // block[0]
    cols = (start[1] + np.arange(raw.shape[1])) // block[1]
    scale = np.asarray(scale_inv, np.float32)[np.ix_(rows, cols)]
    return decode_e4m3fn(raw) * scale
