"""The layer contract: finding decoder layers, sub-modules and layer specs, with clear errors."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytest.importorskip("mindspore")

from mindspore import nn

from mf_config import LayerSpec
from mf_memory.layers import ContractError, decoder_layers, layer_offset, resolve_module, select

sys.path.insert(0, str(Path(__file__).resolve().parent))
from decoder_model import tiny_model


@pytest.fixture(scope="module")
def model():
    return tiny_model(num_layers=3)


def test_layers_and_offset(model) -> None:
    layers = decoder_layers(model)
    assert layers == list(model.decoder_layers) and len(layers) == 3
    assert layer_offset(model) == 0


def test_model_without_decoder_layers() -> None:
    with pytest.raises(ContractError, match=r"Dense has no `decoder_layers`"):
        decoder_layers(nn.Dense(2, 2))


def test_resolve_dotted_path(model) -> None:
    layer = model.decoder_layers[1]
    assert resolve_module(layer, "attention.qkv", "x") is layer.attention.qkv
    assert resolve_module(layer, "mlp", "x") is layer.mlp


def test_unknown_path_names_config_layer_and_children(model) -> None:
    with pytest.raises(ContractError) as info:
        resolve_module(model.decoder_layers[2], "attention.qkvz", 'recompute.select_module["a"]',
                       2)
    message = str(info.value)
    assert message.startswith('recompute.select_module["a"]: layer 2')
    assert "'attention.qkvz'" in message and "attention has no cell 'qkvz'" in message
    assert "'qkv', 'q_norm', 'k_norm', 'out'" in message


def test_attribute_that_is_not_a_cell(model) -> None:
    with pytest.raises(ContractError, match=r"attention has no cell 'scale'"):
        resolve_module(model.decoder_layers[0], "attention.scale", "w")


def test_select_maps_specs_to_layers(model) -> None:
    chosen = select(model, [LayerSpec(0, 0), LayerSpec(2, 2)], "w")
    assert [(i, layer) for i, layer in chosen] == [(0, model.decoder_layers[0]),
                                                   (2, model.decoder_layers[2])]


def test_select_out_of_range(model) -> None:
    with pytest.raises(ContractError, match=r"swap: '1-3' names layer 3, but this model has 3 "
                                            r"decoder layers \(global layer ids 0 to 2\)"):
        select(model, [LayerSpec(1, 3)], "swap")


def test_offset_stage_uses_global_ids() -> None:
    stage = tiny_model(num_layers=2)
    stage.layer_offset = 4
    assert [i for i, _ in select(stage, [LayerSpec(4, 5)], "w")] == [4, 5]
    with pytest.raises(ContractError, match=r"global layer ids 4 to 5"):
        select(stage, [LayerSpec(0, 0)], "w")


def test_interleaved_stage_names_its_layers_by_global_id() -> None:
    """An interleaved pipeline stage holds runs of layers that are not contiguous (`layer_ids`)."""
    stage = tiny_model(num_layers=2)
    stage.layer_ids = [0, 2]
    assert [i for i, _ in select(stage, [LayerSpec(2, 2), LayerSpec(0, 0)], "w")] == [2, 0]
    with pytest.raises(ContractError, match=r"names layer 1, but this model has 2 decoder layers "
                                            r"\(global layer ids 0, 2\)"):
        select(stage, [LayerSpec(0, 1)], "recompute")
    stage.layer_ids = [2, 0]
    with pytest.raises(ContractError, match=r"layer_ids must give one increasing"):
        select(stage, [LayerSpec(0, 0)], "w")


def test_a_pipeline_stage_skips_the_layers_other_stages_hold() -> None:
    """Layer specs are global: on a stage holding layers 2-3 of 4, '0-2' selects layer 2 only,
    and a layer beyond the whole model is still an error."""
    stage = tiny_model(num_layers=2)
    stage.layer_ids, stage.model_layers = [2, 3], 4
    assert [i for i, _ in select(stage, [LayerSpec(0, 2)], "recompute")] == [2]
    with pytest.raises(ContractError, match=r"names layer 4, but this model has 2"):
        select(stage, [LayerSpec(3, 4)], "recompute")
