"""FP8 (e4m3fn) weights with 128 x 128 block scales, as DeepSeek-V3 publishes its checkpoint.

DeepSeek-V3's Hugging Face checkpoint stores most linear weights as safetensors dtype
`F8_E4M3` (float8 e4m3fn) and, beside each such `<name>`, a float32 `<name>_scale_inv` of shape
`[ceil(rows / 128), ceil(cols / 128)]`: the weight's value is `fp8 * scale_inv` of its block
(DeepSeek's `weight_dequant`; the block is config.json's
`quantization_config.weight_block_size`, [128, 128]). Training needs the dequantised values, so
the reader keeps FP8 tensors as their raw bytes (in the `FP8_E4M3` marker dtype, one byte per
value) and `dequantize_fp8` turns each into float32 with its scales, which it consumes.

numpy has no float8. An e4m3fn byte is: sign bit, 4 exponent bits (bias 7), 3 mantissa bits;
exponent 0 is subnormal (`mantissa / 8 * 2**-6`); there is no infinity, and only
`S.1111.111` (0x7f, 0xff) is NaN, which leaves 448 (0x7e) the largest value. All 256 values are
exact in float32, so decoding is one lookup in `E4M3FN`.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from .errors import CheckpointError

LOG = logging.getLogger(__name__)

FP8_E4M3 = np.dtype([("e4m3fn", "u1")])
"""The raw bytes of an `F8_E4M3` safetensors tensor, marked as such until dequantised."""
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
    """float32 values of e4m3fn bytes (`uint8` or `FP8_E4M3` array), same shape."""
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


def dequantize_fp8(tensors: Mapping[str, np.ndarray], block: tuple[int, int] = DEFAULT_BLOCK,
                   ) -> dict[str, np.ndarray]:
    """The tensors with every FP8 weight dequantised to float32 and its `_scale_inv` consumed.

    Args:
        tensors: HF name -> array, FP8 weights in the `FP8_E4M3` dtype (as `hf.py` reads them).
        block: rows and columns of one scale block.

    Returns:
        A new dict without the `_scale_inv` tensors; other tensors as they were.

    Raises:
        CheckpointError: an FP8 tensor without its scales, scales of the wrong shape or for
            no FP8 tensor, or an FP8 tensor that is not a matrix.
    """
    fp8 = sorted(name for name, value in tensors.items() if value.dtype == FP8_E4M3)
    scales = {name for name in tensors if name.endswith(SCALE_SUFFIX)}
    orphans = sorted(scales - {name + SCALE_SUFFIX for name in fp8})
    if orphans:
        raise CheckpointError("block scales for no FP8 (F8_E4M3) weight: "
                              + ", ".join(orphans[:10]))
    out = {name: value for name, value in tensors.items() if name not in scales}
    for name in fp8:
        out[name] = dequantize_blocks(name, tensors[name], tensors.get(name + SCALE_SUFFIX), block)
    if fp8:
        LOG.info("dequantised %d FP8 (e4m3fn) weights to float32 with their %dx%d block scales "
                 "(%d _scale_inv tensors consumed)", len(fp8), *block, len(fp8))
    return out


def dequantize_blocks(name: str, raw: np.ndarray, scale_inv: np.ndarray | None,
                      block: tuple[int, int]) -> np.ndarray:
    """One FP8 weight `[rows, cols]` times its block's scale, as float32."""
    if scale_inv is None:
        raise CheckpointError(f"{name}: an FP8 (F8_E4M3) weight without {name}{SCALE_SUFFIX}; "
                              "its values cannot be recovered")
    if raw.ndim != 2:
        raise CheckpointError(f"{name}: FP8 weights must be matrices for block scales, got "
                              f"shape {raw.shape}")
    rows, cols = raw.shape
    expected = (math.ceil(rows / block[0]), math.ceil(cols / block[1]))
    if tuple(scale_inv.shape) != expected:
        raise CheckpointError(f"{name}{SCALE_SUFFIX}: shape {tuple(scale_inv.shape)}, expected "
                              f"{expected} for a {rows}x{cols} weight in {block[0]}x{block[1]} "
                              "blocks")
    scale = np.repeat(np.repeat(np.asarray(scale_inv, np.float32), block[0], 0), block[1], 1)
    return decode_e4m3fn(raw) * scale[:rows, :cols]
