"""An mf checkpoint as a Hugging Face model directory (`mf-train export-hf`).

The checkpoint's pieces say where every range of every tensor lies (`checkpoint.pieces`),
whatever layout saved it: each tensor is read whole from them, the weights tensor
parallelism split per tensor place, and those are concatenated along each parameter's split
axis (`gather_hf_state`, the inverse of the import's name table). A checkpoint of an earlier
format (one file per rank) is refused, naming the command that converts it.

The Hugging Face names, shapes and the fused parameters' parts come from the model's own
`weight_maps()` (the table the import uses); `config.json` is the model section's settings
under their Hugging Face names, with mf's own keys left out and the defaults made explicit.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs
import numpy as np

from mf_config import ConfigError
from mf_config.validate import config_from_source, load_source
from mf_config.yaml_source import UnreadableFile

from ..checkpoint import layout
from ..checkpoint.hf_write import check_output, parse_size, write_hf_directory
from ..checkpoint.pieces import PieceIndex
from ..checkpoint.reader import conversion
from .errors import ExportError

MF_ONLY = frozenset({"compute_dtype", "params_dtype", "seq_length", "use_flash_attention",
                     "moe_router_enable_expert_bias", "moe_router_bias_update_rate",
                     "torch_dtype", "dtype", "transformers_version"})
"""Model settings that are mf's (or that the export rewrites), not `config.json` keys."""


def export_hf(checkpoint: str | os.PathLike[str], config_file: str | os.PathLike[str] | None,
              output: str | os.PathLike[str], *, dtype: str | None = None,
              max_shard_size: str | int = "5GB", force: bool = False,
              overrides: Sequence[str] = (),
              tokenizer: str | os.PathLike[str] | None = None) -> Path:
    """Write the model of an mf checkpoint as a Hugging Face directory.

    Args:
        checkpoint: a save root (its newest complete iteration) or one iteration directory.
        config_file: the training configuration of the run (its model and parallelism);
            None: the one saved with the checkpoint.
        output: the directory to write (replaced only with `force` when not empty).
        dtype: float32, bfloat16 or float16 (default: the model's `params_dtype`).
        max_shard_size: above this the weights are split into several files.
        overrides: `--set` overrides applied to the configuration.
        tokenizer: a Hugging Face tokenizer directory whose files (`TOKENIZER_FILES`) are
            copied beside the weights, so that transformers loads the tokenizer from the
            export too; None: none.

    Returns:
        The directory written.

    Raises:
        ExportError, CheckpointError: what cannot be exported and why.
    """
    from ..models import build_model  # MindSpore

    check_output(output, force)
    parse_size(max_shard_size)
    copies = tokenizer_files(tokenizer) if tokenizer is not None else []
    directory = layout.find_checkpoint(checkpoint)
    if directory is None:
        raise ExportError(f"{checkpoint} holds no complete checkpoint")
    common = layout.read_common(directory)
    config_file = config_file or _saved_config(directory, common)
    try:
        config = config_from_source(load_source(str(config_file), list(overrides)))
    except (ConfigError, UnreadableFile) as exc:
        raise ExportError(f"{config_file}: {exc}") from None
    model = build_model(config.model, seed=0)
    weights = pieces_weights(directory, common, model)
    dtype = dtype or str(model.settings.params_dtype)
    return write_hf_directory(output, weights, hf_config(config.model, model.settings, dtype),
                              dtype=dtype, max_shard_size=max_shard_size, force=force,
                              copies=copies)


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   "vocab.json", "merges.txt", "tokenizer.model", "added_tokens.json")
"""The files of a Hugging Face tokenizer directory (fast and slow tokenizers)."""


def tokenizer_files(directory: str | os.PathLike[str]) -> list[Path]:
    """The tokenizer files in `directory`; ExportError when it holds none."""
    directory = Path(directory)
    if not directory.is_dir():
        raise ExportError(f"--tokenizer {directory}: not a directory (give a Hugging Face "
                          "tokenizer directory, with tokenizer.json or tokenizer_config.json)")
    found = [directory / name for name in TOKENIZER_FILES if (directory / name).is_file()]
    if not any(path.name in ("tokenizer.json", "tokenizer_config.json") for path in found):
        raise ExportError(f"--tokenizer {directory}: no tokenizer.json or "
                          "tokenizer_config.json there")
    return found


def _saved_config(directory: Path, common: dict[str, Any]) -> Path:
    """The configuration file saved with the checkpoint, or ExportError asking for one."""
    if layout.read_run_config(directory, common) is None:
        raise ExportError(f"{directory} was saved without its configuration (by an earlier "
                          "mf): pass the run's train.yaml with --config FILE")
    return directory / layout.RUN_CONFIG


def pieces_weights(directory: Path, common: dict[str, Any],
                   model: Any) -> dict[str, np.ndarray]:
    """The whole model's weights under their Hugging Face names, from a sharded checkpoint
    (format 3): each tensor read whole, as one process holds it, from the pieces that hold it
    (`RecutIndex` gathers the weights tensor parallelism split, whatever layout saved them:
    the configuration's parallelism is not needed). A checkpoint of format 1 or 2 (an
    earlier mf's, one file per rank) is refused, naming the command that converts it."""
    from ..models.hf_weights import HFWeightsError, gather_hf_state
    from .tensor_recut import RecutIndex

    if int(common.get("version", 1)) < layout.SHARDED_VERSION:
        raise ExportError(f"{directory} is in format {common.get('version', 1)} (an earlier "
                          f"mf's), which is read only to convert it: "
                          f"{conversion(directory, common)}; then read the new checkpoint")
    entries = model.weight_maps()
    index = RecutIndex(PieceIndex(directory, common, "model"), entries)
    wanted = {entry.ours for entry in entries}
    unmapped = sorted(index.names() - wanted)
    if unmapped:
        raise ExportError(f"{directory}: parameters without a Hugging Face name: "
                          + ", ".join(unmapped))
    missing = sorted(name for name in wanted if not index.has(name))
    if missing:
        raise ExportError(f"{directory}: does not hold the model's " + ", ".join(missing)
                          + " (saved from another model?)")
    with index:
        whole = {name: index.read_whole(name) for name in sorted(wanted)}
    try:
        return gather_hf_state(entries, [whole])
    except HFWeightsError as exc:
        raise ExportError(f"{directory}: {exc}") from None


def hf_config(model_config: Any, settings: Any, dtype: str) -> dict[str, Any]:
    """`config.json`: the architecture, the model type, every setting under its Hugging Face
    name (head width and key/value heads resolved, not left to transformers' defaults) and
    `dtype` (transformers 4.56 on; 5.x deprecates `torch_dtype`).

    No `null` where transformers types a number: transformers 5 refuses a config.json with
    one (its strict config dataclasses). Qwen3's `max_window_layers` left unset is written as
    `num_hidden_layers` (no layer uses sliding-window attention, as mf runs it); a `null`
    stays only where transformers' field is optional and `null` is what mf means
    (`sliding_window`, `layer_types`, DeepSeek-V3's `q_lora_rank`, token ids)."""
    values = {name: value for name, value in attrs.asdict(settings, recurse=False).items()
              if name not in MF_ONLY}
    if "head_dim" in values and values["head_dim"] is None and hasattr(settings, "head_size"):
        values["head_dim"] = settings.head_size()
    if values.get("num_key_value_heads") is None and hasattr(settings, "kv_heads"):
        values["num_key_value_heads"] = settings.kv_heads()
    if "max_window_layers" in values and values["max_window_layers"] is None:
        values["max_window_layers"] = values["num_hidden_layers"]
    architecture = model_config.architecture()
    return {"architectures": [architecture] if architecture else None,
            "model_type": model_config.model_type, **_plain(values), "dtype": dtype}


def _plain(values: dict[str, Any]) -> dict[str, Any]:
    """JSON-ready values (numpy scalars as Python numbers)."""
    return {name: value.item() if isinstance(value, np.generic) else value
            for name, value in values.items()}
