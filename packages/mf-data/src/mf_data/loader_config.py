"""The typed settings of `BlendedMegatronDatasetDataLoader`, read from `train_dataset.dataloader`.

mf-config keeps the keys of an open section that it does not declare (`datasets_type`,
`sizes`, `config`) in `DataloaderConfig.extras`; this module gives them types, defaults and
bounds (MindFormers' names and defaults), and mf-config's `structure_settings` structures them,
so a mistake reads like every other configuration error:
`train_dataset.dataloader.config.seq_length: expected an integer, got '4k' (a string)`.
The module imports neither numpy nor MindSpore: mf-data declares `MegatronLoaderSettings`
through the `mf_config.dataloaders` entry point, and `mf-config validate` checks a file
against it (with line numbers); `megatron_settings` runs the same checks when datasets are
built.

No `from __future__ import annotations` here: cattrs reads the field types at run time.
"""

from typing import Literal

from mf_config import ConfigError, DataloaderConfig
from mf_config.component_settings import structure_settings
from mf_config.errors import Path, format_path
from mf_config.sections import MAX_DIMENSION, MAX_SEED, Section, declared_fields, section, setting

from .errors import DataError

LOADER_TYPE = "BlendedMegatronDatasetDataLoader"
PATH = ("train_dataset", "dataloader")


@section
class MegatronDatasetSettings(Section):
    """`train_dataset.dataloader.config`: how the GPT samples are built."""

    seq_length: int | None = setting(None, "Tokens per sample (required).", gt=0,
                                     le=MAX_DIMENSION)
    seed: int = setting(1234, "Seed of the document and sample shuffles.", ge=0, le=MAX_SEED)
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
    eod_pad_length: int | None = setting(None, "Length of actual_seq_len (default 128).", gt=0,
                                         le=MAX_DIMENSION)
    compressed_eod_mask_length: int | None = setting(
        None, "MindFormers' older name of eod_pad_length; give only one.", gt=0,
        le=MAX_DIMENSION)
    eod: int = setting(-1, "End-of-document token id.", ge=-1, le=MAX_DIMENSION)
    pad: int = setting(-1, "Padding token id; -1 for none.", ge=-1, le=MAX_DIMENSION)
    allow_ambiguous_pad_tokens: bool = setting(False, "Keep a pad id equal to eod.")
    add_extra_token_to_sequence: bool = setting(True, "Read seq_length + 1 tokens per sample.")
    drop_last_partial_validation_sequence: bool = setting(True, "Drop a partial valid sample.")

    def pad_length(self) -> int:
        """`eod_pad_length` under either of its names (128 when neither is given)."""
        return self.eod_pad_length or self.compressed_eod_mask_length or 128

    def problems(self, path: Path) -> list[tuple[Path, str]]:
        found = []
        if self.seq_length is None:
            found.append(((*path, "seq_length"), "required: a positive integer"))
        if self.eod_pad_length is not None and self.compressed_eod_mask_length is not None:
            found.append(((*path, "compressed_eod_mask_length"), "is an alias of "
                          "eod_pad_length; give only one"))
        return found


@section
class MegatronLoaderSettings(Section):
    """The Megatron loader's own keys of `train_dataset.dataloader`."""

    datasets_type: Literal["GPTDataset"] = setting("GPTDataset", "The dataset class.")
    sizes: list[int | None] = setting(
        [], "Samples of train, valid and test; null: one epoch of that split (Megatron).")
    config: MegatronDatasetSettings | None = setting(None, "Dataset settings (required).")

    def problems(self, path: Path) -> list[tuple[Path, str]]:
        if self.config is None:
            found = [((*path, "config"), "required: a mapping with at least seq_length and "
                                         "data_path")]
        else:
            found = self.config.problems((*path, "config"))
        return found + _size_problems(self.sizes, path)


def megatron_settings(dataloader: DataloaderConfig) -> MegatronLoaderSettings:
    """The Megatron loader's typed settings, checked as `mf-config validate` checks them.

    Args:
        dataloader: the `train_dataset.dataloader` section.

    Returns:
        Its keys as `MegatronLoaderSettings`.

    Raises:
        DataError: the type is not `BlendedMegatronDatasetDataLoader`, or listing every
            problem in the keys, each with its path.
    """
    if dataloader.type != LOADER_TYPE:
        raise DataError(f"{format_path((*PATH, 'type'))}: mf-data loads {LOADER_TYPE!r}, "
                        f"got {dataloader.type!r}")
    try:
        return structure_settings(MegatronLoaderSettings, dataloader.extras, PATH,
                                  owner=f"data loader type {LOADER_TYPE!r}",
                                  also_allowed=declared_fields(DataloaderConfig))
    except ConfigError as exc:
        lines = [f"{issue.path}: {issue.message}" for issue in exc.errors]
        raise DataError("invalid data loader configuration:\n  " + "\n  ".join(lines)) from None


def _size_problems(sizes: list[int | None], path: Path) -> list[tuple[Path, str]]:
    """Three entries, each a count >= 0 or null (Megatron's `Optional[int]`: one epoch of the
    split). Whether null suits the data (Megatron refuses it with weights) is the builder's
    check, which knows the blend."""
    if len(sizes) != 3:
        shown = ", ".join("null" if size is None else str(size) for size in sizes)
        return [((*path, "sizes"), "must be three sample counts [train, valid, test], each "
                                   f">= 0 or null (one epoch of that split), got [{shown}]")]
    return [((*path, "sizes", index), f"must be >= 0, or null for one epoch of that split, "
                                      f"got {size}")
            for index, size in enumerate(sizes) if size is not None and size < 0]
