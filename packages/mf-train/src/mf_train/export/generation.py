"""Text from a trained model (`mf-train generate`): the model of a checkpoint on one process,
a prompt, and one token after another until `max_new_tokens` or the end of document.

- The model: from an mf checkpoint (a save root or one `iteration_XXXXXXXX` directory, saved
  by any layout: its weights are read whole as `export-hf` reads them, with the configuration
  saved beside them or the one given), or from a Hugging Face directory (`config.json` and
  safetensors, such as `export-hf` writes).
- Each token: the logits of the last position, then greedy (`temperature` 0, the default) or
  sampled at `temperature` from the `top_k` most likely tokens and the smallest set of them
  whose probability reaches `top_p`, from a generator seeded with `seed` (`choose`). A model
  with a `decode(input_ids, cache)` keeps per layer what its attention needs of each position
  (`models.kv_cache`: Qwen3's keys and values, DeepSeek-V3's MLA compressed latent and rope
  key), so a new token costs one position's forward; a model without one (or `use_cache`
  false) runs the whole sequence again for each token.
- Generation stops at the tokenizer's end-of-document id (not included in the output).

Bad input (no checkpoint there, a prompt id outside the vocabulary, a prompt and
`max_new_tokens` longer than the model's positions) is a `GenerateError` with one line.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from mindspore import Tensor

from mf_config import ConfigError, ModelConfig
from mf_config.validate import config_from_source, load_source
from mf_config.yaml_source import UnreadableFile

from ..checkpoint import layout
from ..checkpoint.errors import CheckpointError
from ..models.kv_cache import KVCache

LOG = logging.getLogger(__name__)


class GenerateError(ValueError):
    """Input `mf-train generate` cannot use, with the reason (one line)."""


@dataclass(frozen=True)
class Sampling:
    """How each token is chosen from the logits: greedy when `temperature` is 0."""

    temperature: float = 0.0
    top_k: int = 0
    """Keep the `top_k` most likely tokens (0: all)."""
    top_p: float = 1.0
    """Keep the smallest set of most likely tokens whose probability reaches `top_p`."""
    seed: int = 0

    def problems(self) -> list[str]:
        found = []
        if self.temperature < 0:
            found.append(f"--temperature must be >= 0 (0: greedy), got {self.temperature}")
        if self.top_k < 0:
            found.append(f"--top-k must be >= 0 (0: every token), got {self.top_k}")
        if not 0 < self.top_p <= 1:
            found.append(f"--top-p must be in (0, 1], got {self.top_p}")
        return found


def choose(logits: np.ndarray, sampling: Sampling, rng: np.random.Generator) -> int:
    """The next token from one position's logits `[vocabulary]`."""
    if sampling.temperature == 0:
        return int(np.argmax(logits))
    scores = logits.astype(np.float64) / sampling.temperature
    if 0 < sampling.top_k < scores.size:
        kth = np.partition(scores, -sampling.top_k)[-sampling.top_k]
        scores = np.where(scores < kth, -np.inf, scores)
    probs = np.exp(scores - scores.max())
    probs /= probs.sum()
    if sampling.top_p < 1:
        order = np.argsort(-probs, kind="stable")
        before = np.cumsum(probs[order]) - probs[order]  # probability of the tokens ahead
        dropped = order[before >= sampling.top_p]
        probs[dropped] = 0.0
        probs /= probs.sum()
    return int(rng.choice(probs.size, p=probs))


def position_limit(model: Any) -> int:
    """The most positions the model takes: `seq_length` when set, else
    `max_position_embeddings` (what its forward accepts)."""
    settings = model.settings
    return settings.seq_length or settings.max_position_embeddings


def caches(model: Any) -> bool:
    """Whether the model decodes with a key/value cache (`decode`)."""
    return callable(getattr(model, "decode", None))


def generate(model: Any, prompt: Sequence[int], max_new_tokens: int,
             sampling: Sampling = Sampling(), eod: int | None = None,
             use_cache: bool = True) -> list[int]:
    """The tokens the model continues `prompt` with.

    Args:
        model: a whole model on this process (`build_model`, weights loaded).
        prompt: the token ids to continue (at least one).
        max_new_tokens: at most this many new tokens.
        sampling: greedy or sampled (`Sampling`).
        eod: stop when this id is chosen (it is not returned); None: never.
        use_cache: keep keys and values per layer when the model can (`caches`).

    Returns:
        The new token ids.

    Raises:
        GenerateError: the prompt is empty, has an id outside the vocabulary, or with
            `max_new_tokens` does not fit the model's positions.
    """
    vocab = model.settings.vocab_size
    if not prompt:
        raise GenerateError("the prompt is empty: give at least one token")
    outside = [i for i in prompt if not 0 <= i < vocab]
    if outside:
        raise GenerateError(f"prompt id {outside[0]} is outside the model's vocabulary "
                            f"(0..{vocab - 1})")
    limit = position_limit(model)
    if len(prompt) + max_new_tokens > limit:
        raise GenerateError(f"the prompt ({len(prompt)} tokens) and --max-new-tokens "
                            f"({max_new_tokens}) need {len(prompt) + max_new_tokens} "
                            f"positions; the model takes {limit} (model.seq_length, else "
                            "max_position_embeddings)")
    rng = np.random.default_rng(sampling.seed)
    ids, new = list(prompt), []
    cache = KVCache() if use_cache and caches(model) else None
    step = list(prompt)
    for _ in range(max_new_tokens):
        batch = Tensor(np.asarray([step if cache is not None else ids], np.int32))
        logits = model.decode(batch, cache) if cache is not None else model.logits(batch)
        token = choose(logits[0, -1].asnumpy().astype(np.float32), sampling, rng)
        if token == eod:
            break
        new.append(token)
        ids.append(token)
        step = [token]
    return new


# ------------------------------------------------------------------ loading


def load_model(checkpoint: str | os.PathLike[str], config_file: str | None = None,
               overrides: Sequence[str] = ()) -> Any:
    """The whole model of an mf checkpoint or a Hugging Face directory, on this process.

    Raises:
        GenerateError: nothing loadable there, or weights that do not fit the model.
    """
    from ..checkpoint.hf import HFCheckpoint, is_hf_checkpoint
    from ..models import build_model
    from ..models.hf_weights import HFWeightsError, load_hf_state

    path = Path(checkpoint)
    if not path.exists():
        raise GenerateError(f"--checkpoint {path}: does not exist")
    try:
        if is_hf_checkpoint(path):
            model = build_model(hf_model_config(path, overrides), seed=0)
            load_hf_state(model, HFCheckpoint(path))
            return model
        directory = layout.find_checkpoint(path)
        if directory is None:
            raise GenerateError(f"--checkpoint {path}: holds neither a complete mf checkpoint "
                                "nor Hugging Face weights (config.json and safetensors)")
        model_config = _mf_model_config(directory, config_file, overrides)
        model = build_model(model_config, seed=0)
        load_hf_state(model, _mf_weights(directory, model))
        return model
    except (CheckpointError, HFWeightsError, ConfigError) as exc:
        raise GenerateError(f"--checkpoint {path}: {exc}") from None


def hf_model_config(directory: Path, overrides: Sequence[str] = ()) -> ModelConfig:
    """The model section of a Hugging Face directory's `config.json` (its keys map over as
    `model:` keys)."""
    path = directory / "config.json"
    if not path.is_file():
        raise GenerateError(f"{directory}: no config.json beside the weights")
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as exc:
        raise GenerateError(f"{path}: not JSON: {exc}") from None
    if overrides:
        raise GenerateError(f"--set {overrides[0]}: a Hugging Face directory's settings are "
                            "its config.json (--set applies to an mf checkpoint's "
                            "configuration)")
    extras = {key: value for key, value in raw.items()
              if key not in ("model_type", "architectures")}
    return ModelConfig(model_type=raw.get("model_type"), architectures=raw.get("architectures"),
                       extras=extras)


def _mf_model_config(directory: Path, config_file: str | None,
                     overrides: Sequence[str]) -> ModelConfig:
    from .hf_export import ExportError, _saved_config

    try:
        source = config_file or _saved_config(directory, layout.read_common(directory))
        return config_from_source(load_source(str(source), list(overrides))).model
    except (ExportError, UnreadableFile) as exc:
        raise GenerateError(str(exc)) from None


def _mf_weights(directory: Path, model: Any) -> dict[str, np.ndarray]:
    """The model's weights under their Hugging Face names, read whole from the checkpoint
    as `export-hf` reads them (any saving layout)."""
    from .hf_export import ExportError, pieces_weights

    try:
        return pieces_weights(directory, layout.read_common(directory), model)
    except ExportError as exc:
        raise GenerateError(str(exc)) from None
