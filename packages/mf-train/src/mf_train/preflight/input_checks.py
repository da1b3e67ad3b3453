"""The files a run reads, checked before anything is built: `check_inputs(config, source)`.

A valid configuration can still name files that are not there. Training would find out only
when it reads them: the dataset after the whole model is built, the checkpoint when it loads.
`mf-train` checks them in the launching process, before msrun starts a rank, and the trainer
again before it builds the model. The checks look at the file system and read each dataset's
index (no MindSpore, no token read: the `.idx` is 12 bytes per sequence, whatever the size of
the `.bin`), so they cost milliseconds. Every problem is one `ConfigIssue` at the value that
names the file (its line in the YAML file, or the `--set` that wrote it), saying what is
missing or wrong and what is accepted:

* `train_dataset.dataloader.config.data_path` (and `train_data_path`, `valid_data_path`,
  `test_data_path`) of `BlendedMegatronDatasetDataLoader`: each prefix, weighted or not, must
  have both `PREFIX.idx` (a Megatron index) and `PREFIX.bin`, and the pair must agree as
  mf-data's `IndexedDataset` checks it when it opens them: the header, the counts, and a
  `.bin` of exactly the bytes the index describes (its sequence lengths times the token
  dtype's size; a `.bin` of another size, such as an index whose dtype byte was changed,
  would be read as other tokens). A relative prefix is read from the working directory and
  `~` is expanded, as mf-data's builder reads it. A list the builder cannot parse (a weight
  without its prefix, say) is reported here too.
* `checkpoint.load_path`, when given: it must exist, as a directory (an mf save path, one of
  its `iteration_XXXXXXXX` directories, or a Hugging Face directory) or a `.safetensors`
  file. Empty starts from scratch, or resumes the run's own checkpoints (`run_directory`),
  and a directory without a complete checkpoint yet is still a fresh start (with a warning
  when loading): both stay allowed. What is inside the directory is checked when it is loaded.

The configuration names no other input file: the tokenizer ran when the data was
preprocessed (`mf-data preprocess`), and the other paths (`checkpoint.save_path`,
`path_to_cache`, `monitor.tensorboard.output_dir`, `profiler.output_path`) are written. The
token ids themselves are checked against `model.vocab_size` as the samples are read
(`mf_data.gpt_dataset`: one maximum per sample), not by `check_inputs`: that would read the
whole corpus before every start. `scan_token_ids` does read it, when asked (`mf-train
--scan-tokens`).
"""

from __future__ import annotations

import os
from pathlib import Path as FilePath

from mf_config import TrainConfig
from mf_config.component_settings import settings_error
from mf_config.components import model_shape
from mf_config.errors import Path
from mf_config.yaml_source import Source
from mf_data.blending import parse_blend
from mf_data.errors import DataError
from mf_data.indexed import INDEX_MAGIC, IndexedDataset, data_path, index_path
from mf_data.loader_config import LOADER_TYPE, PATH, megatron_settings
from mf_data.token_scan import first_outside

DATA_FIELDS = ("data_path", "train_data_path", "valid_data_path", "test_data_path")
"""The loader's settings that list dataset prefixes (`mf_data.builder` reads them)."""
MAKE_DATA = ("give the prefix of a Megatron .bin/.idx pair, as `mf-data preprocess "
             "--output-prefix PREFIX` writes it")
CHECKPOINTS = ("give an mf checkpoint (a save_path directory or one of its "
               "iteration_XXXXXXXX directories) or Hugging Face weights (a .safetensors file "
               "or a directory of them), or leave it empty to start from scratch")


def check_inputs(config: TrainConfig, source: Source | None = None) -> None:
    """Check that every file the configuration reads at start is there.

    Args:
        config: the validated configuration.
        source: the YAML source, for each problem's file and line.

    Raises:
        ConfigError: listing every missing or unusable input, each at the value naming it.
    """
    found = _data_problems(config) + _checkpoint_problems(config)
    if found:
        raise settings_error(found, source)


def scan_token_ids(config: TrainConfig, source: Source | None = None) -> None:
    """Read every dataset the run trains on whole (`mf_data.token_scan`: memory-mapped) and
    refuse one holding a token id outside `model.vocab_size` (`mf-train --scan-tokens`).

    Raises:
        ConfigError: at each dataset prefix holding one, naming the sequence and the id.
    """
    shape = model_shape(config.model, source)
    if shape is None:
        return
    found = []
    for where, prefix in _data_prefixes(config)[0]:
        outside = first_outside(os.path.expanduser(prefix), shape.vocab_size)
        if outside is not None:
            sequence, token = outside
            found.append((where, f"{_shown(data_path(prefix))}: sequence {sequence} holds token "
                                 f"id {token}, outside the model's vocabulary: model.vocab_size "
                                 f"is {shape.vocab_size} (ids 0 to {shape.vocab_size - 1}); make "
                                 "the data with the model's tokenizer, or give the model a "
                                 "larger vocabulary"))
    if found:
        raise settings_error(found, source)


def _data_prefixes(config: TrainConfig,
                   ) -> tuple[list[tuple[Path, str]], list[tuple[Path, str]]]:
    """Each dataset prefix the loader reads, at the value naming it, and the lists it cannot
    parse, each with why (none for another loader, or settings it will refuse itself)."""
    dataloader = config.train_dataset.dataloader
    if dataloader.type != LOADER_TYPE:  # another loader reads its own settings
        return [], []
    try:
        settings = megatron_settings(dataloader).config
    except DataError:  # not valid settings: the loader says why when it is built
        return [], []
    found: list[tuple[Path, str]] = []
    unparsed: list[tuple[Path, str]] = []
    for field in DATA_FIELDS if settings is not None else ():
        entries = getattr(settings, field)
        if not entries:
            continue
        where: Path = (*PATH, "config", field)
        try:
            prefixes, weights = parse_blend(entries)
        except DataError as exc:
            unparsed.append((where, str(exc)))
            continue
        # a weighted list is weight, prefix, weight, prefix, ...
        found += [((*where, number if weights is None else 2 * number + 1), prefix)
                  for number, prefix in enumerate(prefixes)]
    return found, unparsed


def _data_problems(config: TrainConfig) -> list[tuple[Path, str]]:
    prefixes, found = _data_prefixes(config)
    for where, prefix in prefixes:
        problem = _dataset_problem(prefix)
        if problem is not None:
            found.append((where, problem))
    return found


def _dataset_problem(prefix: str) -> str | None:
    """What is wrong with the dataset at `prefix`, or None when both files are there."""
    path = os.path.expanduser(prefix)
    index, data, shown = index_path(path), data_path(path), _shown(path)
    have_index, have_data = os.path.isfile(index), os.path.isfile(data)
    if not have_index and not have_data:
        bare = next((path[: -len(end)] for end in (".idx", ".bin") if path.endswith(end)), None)
        if bare is not None and os.path.isfile(index_path(bare)):
            return f"{shown}: give the prefix without its extension: {bare}"
        return f"no dataset at {shown}: neither its .idx nor its .bin exists; {MAKE_DATA}"
    if not have_index or not have_data:
        missing, there = (index, data) if have_data else (data, index)
        return (f"{missing} is missing ({there} is there); a dataset needs both "
                f"{prefix}.idx and {prefix}.bin")
    try:
        with open(index, "rb") as file:
            magic = file.read(len(INDEX_MAGIC))
    except OSError as exc:
        return f"{index} cannot be read: {exc.strerror or exc}"
    if magic != INDEX_MAGIC:
        return (f"{index} is not a Megatron index (it does not start with {INDEX_MAGIC!r}); "
                f"{MAKE_DATA}")
    try:
        IndexedDataset(path)
    except DataError as exc:  # names the file, says what disagrees
        return str(exc)
    except OSError as exc:
        return f"{data} cannot be read: {exc.strerror or exc}"
    return None


def _checkpoint_problems(config: TrainConfig) -> list[tuple[Path, str]]:
    load_path = config.checkpoint.load_path
    if not load_path:
        return []
    path, where = FilePath(load_path), ("checkpoint", "load_path")
    if not path.exists():
        return [(where, f"{_shown(load_path)} does not exist; {CHECKPOINTS}")]
    if not path.is_dir() and path.suffix != ".safetensors":
        return [(where, f"{_shown(load_path)} is neither a directory nor a .safetensors "
                        f"file; {CHECKPOINTS}")]
    return []


def _shown(path: str) -> str:
    """`path`, with where a relative path was looked for (the working directory)."""
    if os.path.isabs(path):
        return path
    return f"{path} (in the working directory: {os.path.abspath(path)})"
