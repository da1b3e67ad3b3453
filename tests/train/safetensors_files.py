"""safetensors files written byte by byte, independently of the safetensors package and of
mf's writer: what the Hugging Face import tests (test_checkpoint.py, test_hf_fp8.py,
test_hf_streaming.py) read back."""

from __future__ import annotations

import json
import struct
from pathlib import Path


def write_safetensors_by_hand(path: Path, tensors: dict[str, tuple[str, tuple, bytes]]) -> None:
    """Write `tensors` (name: (dtype, shape, raw bytes)) to `path` in the format written out:
    u64 header length, JSON header (with `{"format": "pt"}` metadata), concatenated data."""
    header, data = {"__metadata__": {"format": "pt"}}, b""
    for name, (dtype, shape, payload) in tensors.items():
        header[name] = {"dtype": dtype, "shape": list(shape),
                        "data_offsets": [len(data), len(data) + len(payload)]}
        data += payload
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + data)
