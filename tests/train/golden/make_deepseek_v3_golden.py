"""Regenerate deepseek_v3_hf.npz: Hugging Face transformers' DeepseekV3ForCausalLM logits for the
tiny configurations of ../deepseek_v3_reference.py, on its seeded random weights.

Runs in a separate environment with torch and transformers (never in the project's venv):

    python3.11 -m venv /work/hfvenv
    /work/hfvenv/bin/pip install "torch==2.13.0+cpu" "transformers==4.57.6" "numpy<2"
    /work/hfvenv/bin/python tests/train/golden/make_deepseek_v3_golden.py

The file holds, per configuration NAME, `NAME.input_ids` and `NAME.logits` (float32
`[2, 8, 64]`); the weights are not stored: `random_hf_state(config, seed=0)` rebuilds them.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import torch
import transformers
from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
from deepseek_v3_reference import CONFIGS, batch, random_hf_state  # noqa: E402

MF_ONLY_KEYS = ("aux_loss_alpha",)


def hf_logits(config: dict, input_ids: np.ndarray) -> np.ndarray:
    hf_config = DeepseekV3Config(
        **{key: value for key, value in config.items() if key not in MF_ONLY_KEYS},
        attn_implementation="eager", torch_dtype="float32")
    torch.manual_seed(0)
    model = DeepseekV3ForCausalLM(hf_config).eval()
    state = {name: torch.from_numpy(value) for name, value in random_hf_state(config).items()}
    missing, unexpected = model.load_state_dict(state, strict=False)
    tied = ["lm_head.weight"] if config["tie_word_embeddings"] else []
    if sorted(missing) != tied or unexpected:
        raise SystemExit(f"weights do not fit: missing {missing}, unexpected {unexpected}")
    model.tie_weights()
    with torch.no_grad():
        return model(torch.from_numpy(input_ids.astype(np.int64))).logits.numpy()


def main() -> None:
    arrays = {}
    for name, config in CONFIGS.items():
        input_ids, _, _ = batch()
        arrays[f"{name}.input_ids"] = input_ids
        arrays[f"{name}.logits"] = hf_logits(config, input_ids).astype(np.float32)
    out = HERE / "deepseek_v3_hf.npz"
    np.savez_compressed(out, **arrays)
    print(f"wrote {out} (transformers {transformers.__version__}, torch {torch.__version__})")


if __name__ == "__main__":
    main()
