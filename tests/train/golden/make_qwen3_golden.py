"""Write qwen3_hf.npz: logits and loss of Hugging Face's Qwen3ForCausalLM (transformers, torch,
float32, eager attention) on the tiny models of qwen3_tiny.py, plus HF's weight names and
shapes, for test_qwen3_golden.py, which checks mf-train's Qwen3 against them without torch.

Run in a separate environment with torch and transformers (never the project's venv):
    python -m venv /work/hfvenv && /work/hfvenv/bin/pip install torch transformers numpy
    /work/hfvenv/bin/python tests/train/golden/make_qwen3_golden.py
Generated with torch 2.13.0+cpu, transformers 4.57.6.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import torch
import transformers
from transformers import Qwen3Config, Qwen3ForCausalLM

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from qwen3_tiny import VARIANTS, golden_batch, weight  # noqa: E402


def run(settings: dict) -> dict[str, np.ndarray]:
    config = Qwen3Config(**settings, attn_implementation="eager", torch_dtype="float32")
    model = Qwen3ForCausalLM(config).eval()
    state = model.state_dict()
    names = sorted(state)
    with torch.no_grad():
        for name in names:
            state[name].copy_(torch.from_numpy(weight(name, tuple(state[name].shape))))
        if settings["tie_word_embeddings"]:  # the tied head is the embedding, not its own draw
            names.remove("lm_head.weight")
            model.tie_weights()
        ids, labels = golden_batch()
        out = model(input_ids=torch.from_numpy(ids), labels=torch.from_numpy(labels))
    return {"logits": out.logits.numpy().astype(np.float32),
            "loss": np.float32(out.loss.item()),
            "names": np.array(names),
            "shapes": np.array(json.dumps([list(state[n].shape) for n in names]))}


def main() -> None:
    torch.manual_seed(0)
    arrays = {}
    for variant, settings in VARIANTS.items():
        arrays |= {f"{variant}/{key}": value for key, value in run(settings).items()}
    arrays["versions"] = np.array(f"torch {torch.__version__}, "
                                  f"transformers {transformers.__version__}")
    np.savez_compressed(HERE / "qwen3_hf.npz", **arrays)


if __name__ == "__main__":
    main()
