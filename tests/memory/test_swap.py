"""Activation swap: bit-identical losses and gradients, hooks only on the named cells, bytes
counted per layer, and clear errors."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("mindspore")

import mindspore as ms
from mindspore import nn, ops

from mf_config import LayerSwap, OpSwap, SwapConfig
from mf_memory.layers import ContractError
from mf_memory.swap import ActivationSwap

sys.path.insert(0, str(Path(__file__).resolve().parent))
from decoder_model import batch, loss_and_grads, specs, tiny_model

ms.set_context(mode=ms.PYNATIVE_MODE)
ms.set_device("CPU")


def saved_bytes(model: nn.Cell, cell: nn.Cell) -> int:
    """Independent count: bytes of the distinct non-parameter tensors saved for backward while
    `cell` runs forward inside a whole-model step, seen by one plain saved_tensors_hooks pair
    around the step (`seen` holds them all, so an address means one tensor)."""
    inside, seen = [False], []
    handles = [cell.register_forward_pre_hook(lambda _c, _a: inside.__setitem__(0, True)),
               cell.register_forward_hook(lambda _c, _a, _o: inside.__setitem__(0, False))]
    params = {p.data_ptr() for p in model.get_parameters()}

    def pack(tensor: ms.Tensor) -> ms.Tensor:
        if inside[0] and tensor.data_ptr() not in params:
            seen.append(tensor)
        return tensor

    ids, labels = batch()

    def step(a: ms.Tensor, b: ms.Tensor) -> ms.Tensor:
        with ms.saved_tensors_hooks(pack, lambda tensor: tensor):
            return ops.cross_entropy(model(a).reshape(-1, 64), b.reshape(-1))

    ms.value_and_grad(step, None, model.trainable_params())(ids, labels)
    for handle in handles:
        handle.remove()
    unique = {(t.data_ptr(), tuple(t.shape), str(t.dtype), tuple(t.stride())): t.nbytes
              for t in seen}
    assert len(unique) < len(seen)  # some tensors are saved by two ops: packed, counted once
    return sum(unique.values())


@pytest.fixture(scope="module")
def reference() -> tuple[np.ndarray, list[np.ndarray]]:
    return loss_and_grads(tiny_model(num_layers=3))


CASES = {
    "layers": SwapConfig(enable=True, default_prefetch=1, layer_swap=[LayerSwap(layers=specs(
        "0", "2"))]),
    "ops": SwapConfig(enable=True, op_swap=[OpSwap(op_name="attention", layers=specs("1")),
                                            OpSwap(op_name="mlp", layers=specs("0-1"))]),
}


@pytest.mark.parametrize("case", CASES)
def test_swap_is_bit_identical(case, reference) -> None:
    model = tiny_model(num_layers=3)
    swap = ActivationSwap(model, CASES[case])
    for _ in range(2):  # hooks survive a step; every tensor comes back each step
        value, grads = loss_and_grads(model)
        np.testing.assert_array_equal(value, reference[0])
        for got, want in zip(grads, reference[1], strict=True):
            np.testing.assert_array_equal(got, want)
    assert swap.stats.bytes_offloaded > 0
    assert swap.stats.bytes_reloaded == swap.stats.bytes_offloaded
    assert swap.stats.tensors_reloaded == swap.stats.tensors_offloaded


def test_hooks_land_only_on_named_cells() -> None:
    model = tiny_model(num_layers=3)
    swap = ActivationSwap(model, CASES["ops"])
    assert swap.paths == ["layers[1].attention", "layers[0].mlp", "layers[1].mlp"]
    hooked = sorted(name for name, cell in model.cells_and_names() if cell._forward_pre_hook)
    assert hooked == ["decoder_layers.0.mlp", "decoder_layers.1.attention",
                      "decoder_layers.1.mlp"]
    swap.remove()
    assert not any(cell._forward_pre_hook or cell._backward_pre_hook
                   for _, cell in model.cells_and_names())


def test_layer_bytes_match_an_independent_count() -> None:
    model = tiny_model(num_layers=3)
    expected = [saved_bytes(model, model.decoder_layers[i]) for i in (0, 2)]
    swap = ActivationSwap(model, CASES["layers"])
    loss_and_grads(model)
    assert expected[0] > 0
    assert swap.stats.offloaded_by_layer[0] == expected[0]
    # Layer 2's input (the output of layer 1) is one tensor saved by two ops; the plain hooks
    # see one address, swap's pack sees two and copies it twice (2 x 16 x 32 float32).
    assert swap.stats.offloaded_by_layer[2] - expected[1] in (0, 2 * 16 * 32 * 4)
    # all of a layer's tensors came back, layer 0's by the prefetch when layer 2's backward began
    assert swap.stats.prefetched == swap.stats.tensors_reloaded


def test_op_bytes_match_an_independent_count() -> None:
    model = tiny_model(num_layers=2)
    expected = saved_bytes(model, model.decoder_layers[1].attention)
    swap = ActivationSwap(model, SwapConfig(enable=True, op_swap=[OpSwap(
        op_name="attention", layers=specs("1"))]))
    loss_and_grads(model)
    assert swap.stats.offloaded_by_layer == {1: expected}


def test_swap_with_full_recompute_swaps_only_the_kept_input(reference) -> None:
    from mf_config import RecomputeConfig
    from mf_memory.recompute import apply_recompute

    model = tiny_model(num_layers=3)
    apply_recompute(model, RecomputeConfig(mode="full", full_recompute_layer=specs("0-1")))
    swap = ActivationSwap(model, SwapConfig(enable=True, layer_swap=[LayerSwap(layers=specs(
        "0-2"))]))
    value, grads = loss_and_grads(model)
    np.testing.assert_array_equal(value, reference[0])
    for got, want in zip(grads, reference[1], strict=True):
        np.testing.assert_array_equal(got, want)
    layer_input = 2 * 16 * 32 * 4  # batch x seq x hidden float32
    assert swap.stats.offloaded_by_layer[0] == swap.stats.offloaded_by_layer[1] == layer_input
    assert swap.stats.offloaded_by_layer[2] > 10 * layer_input
    assert swap.stats.bytes_reloaded == swap.stats.bytes_offloaded


def test_disabled_or_empty_swaps_nothing() -> None:
    model = tiny_model(num_layers=2)
    for config in (SwapConfig(), SwapConfig(enable=True)):
        swap = ActivationSwap(model, config)
        loss_and_grads(model)
        assert swap.stats.bytes_offloaded == 0 and swap.paths == []
        swap.remove()


def test_cpu_warning_is_logged_once(caplog) -> None:
    import mf_memory.swap as swap_module

    swap_module._warned_cpu = False
    with caplog.at_level(logging.WARNING, logger="mf_memory.swap"):
        for _ in range(2):
            ActivationSwap(tiny_model(num_layers=1), SwapConfig(
                enable=True, layer_swap=[LayerSwap(layers=specs("0"))]))
    messages = [r.message for r in caplog.records if "saves none" in r.message]
    assert len(messages) == 1


def test_bad_entries_name_the_config_path() -> None:
    model = tiny_model(num_layers=2)
    with pytest.raises(ContractError, match=r"swap.layer_swap\[0\].layers: '1-2' names layer 2, "
                                            r"but this model has 2 decoder layers"):
        ActivationSwap(model, SwapConfig(enable=True, layer_swap=[LayerSwap(layers=specs(
            "1-2"))]))
    with pytest.raises(ContractError, match=r"swap.op_swap\[1\].op_name: layer 0 .* has no "
                                            r"sub-module 'ffn'"):
        ActivationSwap(model, SwapConfig(enable=True, op_swap=[
            OpSwap(op_name="mlp", layers=specs("0")), OpSwap(op_name="ffn", layers=specs("0"))]))
    with pytest.raises(ContractError, match=r"has no `decoder_layers`"):
        ActivationSwap(nn.Dense(2, 2), CASES["layers"])
