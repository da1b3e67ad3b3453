"""The typed settings of `BlendedMegatronDatasetDataLoader`, read from `train_dataset.dataloader`.

mf-config keeps the keys of an open section that it does not declare (`datasets_type`,
`sizes`, `config`) in `DataloaderConfig.extras`; this module gives them types, defaults and
bounds (MindFormers' names and defaults) and structures them with mf-config's own strict
converter, so a mistake reads like every other configuration error:
`train_dataset.dataloader.config.seq_length: expected an integer, got '4k' (a string)`.

No `from __future__ import annotations` here: cattrs reads the field types at run time.
"""

from typing import Any, Literal

import attrs

from mf_config import DataloaderConfig
from mf_config.converter import converter, problems
from mf_config.errors import Path, format_path
from mf_config.sections import Section, section, setting

from .errors import DataError

LOADER_TYPE = "BlendedMegatronDatasetDataLoader"
PATH = ("train_dataset", "dataloader")


@section
class MegatronDatasetSettings(Section):
    """`train_dataset.dataloader.config`: how the GPT samples are built."""

    seq_length: int = setting(None, "Tokens per sample (required).", gt=0)
    seed: int = setting(1234, "Seed of the document and sample shuffles.", ge=0)
    split: str = setting("1, 0, 0", "Train, valid, test proportions of each dataset.")
    data_path: list[str] = setting([], "Prefixes, or weight/prefix pairs, of .bin/.idx files.")
    train_data_path: list[str] = setting([], "Per-split blend for train (instead of split).")
    valid_data_path: list[str] = setting([], "Per-split blend for valid (instead of split).")
    test_data_path: list[str] = setting([], "Per-split blend for test (instead of split).")
    path_to_cache: str | None = setting(None, "Directory of the index caches.")
    mmap_bin_files: bool = setting(True, "Memory-map the .bin files.")
    num_dataset_builder_threads: int = setting(1, "Threads building the indices.", ge=1)
    reset_position_ids: bool = setting(False, "Restart position ids after each EOD.")
    reset_attention_mask: bool = setting(False, "Block-diagonal attention at EODs.")
    eod_mask_loss: bool = setting(False, "No loss on EOD input tokens.")
    create_attention_mask: bool = setting(True, "Emit the [1, S, S] attention mask.")
    create_compressed_eod_mask: bool = setting(False, "Emit actual_seq_len instead.")
    eod_pad_length: int = setting(128, "Length of actual_seq_len.", gt=0)
    eod: int = setting(-1, "End-of-document token id.")
    pad: int = setting(-1, "Padding token id; -1 for none.")
    allow_ambiguous_pad_tokens: bool = setting(False, "Keep a pad id equal to eod.")
    add_extra_token_to_sequence: bool = setting(True, "Read seq_length + 1 tokens per sample.")
    drop_last_partial_validation_sequence: bool = setting(True, "Drop a partial valid sample.")


@section
class MegatronLoaderSettings(Section):
    """The Megatron loader's own keys of `train_dataset.dataloader`."""

    datasets_type: Literal["GPTDataset"] = setting("GPTDataset", "The dataset class.")
    sizes: list[int | None] = setting(
        [], "Samples of train, valid and test; null: one epoch of that split (Megatron).")
    config: MegatronDatasetSettings = setting(None, "Dataset settings (required).")


_ALIASES = {"compressed_eod_mask_length": "eod_pad_length"}


def megatron_settings(dataloader: DataloaderConfig) -> MegatronLoaderSettings:
    """The Megatron loader settings of `dataloader`, checked; `DataError` lists every problem
    with its path."""
    if dataloader.type != LOADER_TYPE:
        raise DataError(f"{format_path((*PATH, 'type'))}: mf-data loads {LOADER_TYPE!r}, "
                        f"got {dataloader.type!r}")
    raw = dict(dataloader.extras)
    found: list[tuple[Path, str]] = []
    if not isinstance(raw.get("config"), dict):
        found.append(((*PATH, "config"), "required: a mapping with at least seq_length and "
                                         "data_path"))
    else:
        raw["config"] = _with_aliases(raw["config"], found)
        if raw["config"].get("seq_length") is None:
            found.append(((*PATH, "config", "seq_length"), "required: a positive integer"))
    if found:
        raise _error(found)
    try:
        settings = converter.structure(raw, MegatronLoaderSettings)
    except Exception as exc:  # cattrs' validation group: flattened into paths below
        raise _error(problems(exc, PATH)) from None
    found = _bound_problems(settings.config, (*PATH, "config")) + _size_problems(settings)
    if found:
        raise _error(found)
    return settings


def _with_aliases(config: dict[str, Any], found: list[tuple[Path, str]]) -> dict[str, Any]:
    config = dict(config)
    for alias, name in _ALIASES.items():
        if alias not in config:
            continue
        if name in config:
            found.append(((*PATH, "config", alias), f"is an alias of {name}; give only one"))
        config[name] = config.pop(alias)
    return config


def _bound_problems(settings: MegatronDatasetSettings, path: Path) -> list[tuple[Path, str]]:
    found = []
    for field in attrs.fields(type(settings)):
        value = getattr(settings, field.name)
        if not isinstance(value, int) or isinstance(value, bool):
            continue
        if "gt" in field.metadata and not value > field.metadata["gt"]:
            found.append(((*path, field.name), f"must be > {field.metadata['gt']}, got {value}"))
        if "ge" in field.metadata and not value >= field.metadata["ge"]:
            found.append(((*path, field.name), f"must be >= {field.metadata['ge']}, got {value}"))
    return found


def _size_problems(settings: MegatronLoaderSettings) -> list[tuple[Path, str]]:
    """Three entries, each a count >= 0 or null (Megatron's `Optional[int]`: one epoch of the
    split). Whether null suits the data (Megatron refuses it with weights) is the builder's
    check, which knows the blend."""
    sizes = settings.sizes
    if len(sizes) != 3:
        shown = ", ".join("null" if size is None else str(size) for size in sizes)
        return [((*PATH, "sizes"), "must be three sample counts [train, valid, test], each "
                                   f">= 0 or null (one epoch of that split), got [{shown}]")]
    return [((*PATH, "sizes", index), f"must be >= 0, or null for one epoch of that split, "
                                      f"got {size}")
            for index, size in enumerate(sizes) if size is not None and size < 0]


def _error(found: list[tuple[Path, str]]) -> DataError:
    lines = [f"{format_path(path)}: {message}" for path, message in found]
    return DataError("invalid data loader configuration:\n  " + "\n  ".join(lines))
