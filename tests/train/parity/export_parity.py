"""`mf-train export-hf` against Hugging Face transformers (`nox -s export_parity`; needs torch
and transformers): the tiny Qwen3 and DeepSeek-V3 examples are trained for 2 steps, exported,
loaded with `AutoModelForCausalLM.from_pretrained`, and their logits compared with
mf's own model loaded from the mf checkpoint (at most 1e-5 apart, float32, eager attention);
then `mf-train generate`'s greedy tokens on the checkpoint (`mf_train.export.generation`), with the
key/value cache and without, are compared with transformers' `generate` on the export, 32 new
tokens after an 8-token prompt (DeepSeek-V3, trained at 32 positions, is given 64 on both
sides for it; the Qwen3 starts from weights of std 0.1, not 0.02: at 0.02 its greedy tokens
are one token repeated, which would tell no two decoders apart)."""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch
from mindspore import Tensor
from transformers import AutoModelForCausalLM

from mf_config.validate import config_from_source, load_source
from mf_train.checkpoint import load_checkpoint
from mf_train.checkpoint.params import apply_model_params
from mf_train.export.generation import generate, load_model
from mf_train.launch.cli import run
from mf_train.models import build_model

ROOT = Path(__file__).resolve().parents[3]
EXAMPLES = {"qwen3": (ROOT / "examples" / "qwen3_tiny.yaml", ["model.initializer_range=0.1"]),
            "deepseek_v3": (ROOT / "examples" / "deepseek_v3_tiny.yaml",
                            ["model.seq_length=32", "model.max_position_embeddings=32"])}
INPUT_IDS = np.random.default_rng(5).integers(0, 256, (2, 16))
TOLERANCE = 1e-5
PROMPT = [int(i) for i in INPUT_IDS[0, :8]]
NEW_TOKENS = 32
LONGER = {"qwen3": {}, "deepseek_v3": {"seq_length": 64, "max_position_embeddings": 64}}
"""Model settings both sides generate with (the prompt and the new tokens need the positions)."""


def sets(values: list[str]) -> list[str]:
    return [arg for value in values for arg in ("--set", value)]


def compare(name: str, example: Path, shape: list[str], prefix: str, work: Path) -> float:
    """Largest |logit difference| between transformers on the export and mf on the checkpoint."""
    values = [f"train_dataset.dataloader.config.data_path=['1','{prefix}']",
              "training.steps=2",
              "train_dataset.dataloader.config.seq_length=32", "lr_scheduler.warmup_steps=1",
              f"checkpoint.save_path={work / name / 'ckpt'}", *shape]
    assert run(["--config", str(example), "--output-dir", str(work / name), *sets(values)]) == 0
    exported = work / f"{name}-hf"
    assert run(["export-hf", "--checkpoint", str(work / name / "ckpt"), "--config", str(example),
                "--output", str(exported), *sets(shape)]) == 0
    config = config_from_source(load_source(str(example), shape)).model
    model = build_model(config, seed=1)
    apply_model_params(model.parameters_and_names(),
                       load_checkpoint(work / name / "ckpt", load_optimizer=False).model_params)
    ours = model.logits(Tensor(INPUT_IDS.astype(np.int32))).asnumpy()
    hf = AutoModelForCausalLM.from_pretrained(exported, dtype=torch.float32,
                                              attn_implementation="eager").eval()
    with torch.no_grad():
        theirs = hf(torch.from_numpy(INPUT_IDS)).logits.numpy()
    return float(np.abs(ours - theirs).max())


def same_generation(name: str, example: Path, shape: list[str], work: Path) -> bool:
    """Whether mf's greedy tokens on the checkpoint, with its key/value cache and without, are
    transformers' greedy `generate` on the export."""
    longer = [f"model.{key}={value}" for key, value in LONGER[name].items()]
    model = load_model(work / name / "ckpt", str(example), [*shape, *longer])
    ours = generate(model, PROMPT, NEW_TOKENS)
    uncached = generate(model, PROMPT, NEW_TOKENS, use_cache=False)
    hf = AutoModelForCausalLM.from_pretrained(
        work / f"{name}-hf", dtype=torch.float32, attn_implementation="eager",
        **{key: value for key, value in LONGER[name].items() if key != "seq_length"}).eval()
    with torch.no_grad():
        out = hf.generate(torch.tensor([PROMPT]), do_sample=False, max_new_tokens=NEW_TOKENS,
                          min_new_tokens=NEW_TOKENS, pad_token_id=0)
    theirs = out[0, len(PROMPT):].tolist()
    print(f"{name}: mf generate {ours}\n{name}: without cache  {uncached}\n"
          f"{name}: transformers   {theirs}")
    return ours == uncached == theirs


def main() -> int:
    failed = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        prefix = str(work / "tiny_text_document")
        subprocess.run([sys.executable, "-m", "mf_data", "preprocess", "--input",
                        str(ROOT / "examples" / "data" / "tiny.jsonl"), "--output-prefix",
                        prefix], check=True, capture_output=True)
        for name, (example, shape) in EXAMPLES.items():
            difference = compare(name, example, shape, prefix, work)
            verdict = "ok" if difference <= TOLERANCE else "FAILED"
            print(f"{name}: max |mf - transformers| logits {difference:.2e} "
                  f"(limit {TOLERANCE:.0e}) {verdict}")
            if difference > TOLERANCE:
                failed.append(name)
            generated = same_generation(name, example, shape, work)
            print(f"{name}: greedy generation of {NEW_TOKENS} tokens "
                  f"{'ok' if generated else 'FAILED'}")
            if not generated:
                failed.append(f"{name} generate")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
