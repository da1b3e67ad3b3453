"""The Megatron loader's settings, typed and checked from `train_dataset.dataloader`."""

from __future__ import annotations

import pytest

from mf_config.converter import converter
from mf_config.sections import DataloaderConfig
from mf_data.errors import DataError
from mf_data.loader_config import megatron_settings


def dataloader(**extras) -> DataloaderConfig:
    raw = {"type": "BlendedMegatronDatasetDataLoader", **extras}
    return converter.structure(raw, DataloaderConfig)


SPEC_EXAMPLE = {  # the spec's skeleton
    "datasets_type": "GPTDataset", "sizes": [1000, 0, 0],
    "config": {"seq_length": 4096, "split": "1, 0, 0", "eod": 1, "pad": -1,
               "create_attention_mask": False, "create_compressed_eod_mask": False,
               "data_path": ["1", "/path/megatron_data_text_document"]}}


def test_the_spec_example() -> None:
    settings = megatron_settings(dataloader(**SPEC_EXAMPLE))
    assert settings.sizes == [1000, 0, 0]
    config = settings.config
    assert (config.seq_length, config.eod, config.pad, config.seed) == (4096, 1, -1, 1234)
    assert config.data_path == ["1", "/path/megatron_data_text_document"]
    assert config.create_attention_mask is False
    assert config.add_extra_token_to_sequence is True  # MindFormers' default
    assert config.pad_length() == 128


def test_compressed_eod_mask_length_is_an_alias() -> None:
    extras = {**SPEC_EXAMPLE, "config": {**SPEC_EXAMPLE["config"],
                                         "compressed_eod_mask_length": 64}}
    assert megatron_settings(dataloader(**extras)).config.pad_length() == 64
    extras["config"]["eod_pad_length"] = 32
    with pytest.raises(DataError, match=r"config\.compressed_eod_mask_length: is an alias of "
                                        r"eod_pad_length; give only one"):
        megatron_settings(dataloader(**extras))


def test_null_sizes_mean_one_epoch_and_pass_through() -> None:
    """Megatron's builder takes `Optional[int]` sizes: null is one epoch of that split."""
    settings = megatron_settings(dataloader(**{**SPEC_EXAMPLE, "sizes": [None, 0, None]}))
    assert settings.sizes == [None, 0, None]


@pytest.mark.parametrize(("change", "message"), [
    ({"config": None}, r"train_dataset\.dataloader\.config: required"),
    ({"config": {"data_path": ["p"]}},
     r"train_dataset\.dataloader\.config\.seq_length: required: a positive integer"),
    ({"config": {"seq_length": "4k"}},
     r"config\.seq_length: expected an integer or null, got '4k' \(a string\)"),
    ({"config": {"seq_length": 0}}, r"config\.seq_length: must be positive, got 0"),
    ({"config": {"seq_length": 8, "eod_pad_length": 0}},
     r"config\.eod_pad_length: must be positive"),
    ({"config": {"seq_length": 8, "seed": 2**32}},
     r"config\.seed: must be <= 4294967295, got 4294967296"),
    ({"config": {"seq_length": 8, "eod": 2**31}}, r"config\.eod: must be <= 2147483647"),
    ({"config": {"seq_length": 8, "seq_lenght": 9}},
     r"config\.seq_lenght: Unknown configuration keys .* did you mean 'seq_length'\?"),
    ({"sizes": [10, 0]}, r"dataloader\.sizes: must be three sample counts"),
    ({"sizes": [10, -1, 0]},
     r"dataloader\.sizes\[1\]: must be >= 0, or null for one epoch of that split, got -1"),
    ({"sizes": [10, None]}, r"dataloader\.sizes: must be three sample counts \[train, valid, "
                            r"test\], each >= 0 or null \(one epoch of that split\), got "
                            r"\[10, null\]"),
    ({"sizes": [10, "all", None]}, r"dataloader\.sizes\[1\]: expected an integer or null, got "
                                   r"'all' \(a string\)"),
    ({"datasets_type": "BertDataset"}, r"dataloader\.datasets_type: .*'GPTDataset'"),
])
def test_problems_name_their_path(change, message) -> None:
    extras = {**SPEC_EXAMPLE, **change}
    with pytest.raises(DataError, match=message):
        megatron_settings(dataloader(**extras))


def test_every_problem_is_listed_at_once() -> None:
    extras = {"sizes": [1], "config": {"seq_length": 8, "seed": -1, "eod": "x"}}
    with pytest.raises(DataError) as error:
        megatron_settings(dataloader(**extras))
    text = str(error.value)
    assert "config.eod: expected an integer" in text
    # Type errors are reported first; bounds and sizes once the types are right.
    extras["config"]["eod"] = 2
    with pytest.raises(DataError) as error:
        megatron_settings(dataloader(**extras))
    assert "config.seed: must be >= 0, got -1" in str(error.value)
    assert "dataloader.sizes: must be three" in str(error.value)


def test_other_loader_types_are_refused() -> None:
    other = converter.structure({"type": "HFDataLoader"}, DataloaderConfig)
    with pytest.raises(DataError, match=r"dataloader\.type: mf-data loads "
                                        r"'BlendedMegatronDatasetDataLoader', got 'HFDataLoader'"):
        megatron_settings(other)
