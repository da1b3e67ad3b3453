"""Activation swap: tensors saved for backward inside chosen layers or modules go to host memory
during forward and come back before backward needs them.

MindSpore PyNative has no built-in activation offload (`Cell.offload()` does nothing, and
`Cell.register_saved_tensors_hooks` is skipped on the ordinary call path), so swap is built on
`mindspore.saved_tensors_hooks`: a forward pre-hook of each selected cell enters the hooks and
its forward hook exits them. Pack copies the tensor to the host (pinned memory on Ascend and
GPU, asynchronously there) and keeps only the host copy; unpack returns a device copy. When
layer i's backward begins (its backward pre-hook), the saved tensors of layer i and of the next
`default_prefetch` swapped layers below it are brought back, so the copies overlap with
compute where the backend copies asynchronously. Parameters saved by an op are left alone:
they stay on the device anyway. A tensor saved by several ops (RMSNorm's input is kept by the
square and by the product) is copied once: during a cell's forward, packs are matched by
address, shape, dtype and strides, and the device tensors are held until that forward ends so
that no address is reused meanwhile. On CPU the "host" is the same memory: swap then moves bytes but
saves none, which is logged once.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

import attrs
import mindspore as ms
import numpy as np
from mindspore import nn

from mf_config import SwapConfig

from .layers import layer_path, resolve_module, select

LOG = logging.getLogger(__name__)
ASYNC_BACKENDS = {"Ascend", "GPU"}
_warned_cpu = False


@attrs.define
class SwapStats:
    """Bytes and tensors moved; `offloaded_by_layer` is keyed by global layer index."""

    tensors_offloaded: int = 0
    bytes_offloaded: int = 0
    tensors_reloaded: int = 0
    bytes_reloaded: int = 0
    prefetched: int = 0
    offloaded_by_layer: dict[int, int] = attrs.field(factory=dict)


class _Swapped:
    """One saved tensor: its host copy, and its device copy once reloaded."""

    __slots__ = ("device", "host", "layer", "nbytes")

    def __init__(self, host: ms.Tensor, layer: int, nbytes: int):
        self.host, self.layer, self.nbytes = host, layer, nbytes
        self.device: ms.Tensor | None = None


class ActivationSwap:
    """Offload the activations of the config's layers and modules of `model` to host memory
    during forward, and bring them back (with prefetch) before backward needs them.

    `paths` lists what is swapped (`layers[0]`, `layers[1].attention`); `stats` counts bytes.
    `remove()` takes every hook off again.

    Args:
        model: a model with the layer contract (`decoder_layers`, optional `layer_offset`).
        config: the config's `swap` section (`layer_swap`, `op_swap`, `default_prefetch`);
            nothing is hooked unless `enable`.

    Raises:
        ContractError: an entry names a layer or module the model does not have.
    """

    def __init__(self, model: nn.Cell, config: SwapConfig):
        self.config = config
        self.stats = SwapStats()
        self.backend = ms.get_context("device_target")
        self.paths: list[str] = []
        self._handles: list[Any] = []
        self._pending: dict[int, list[_Swapped]] = {}
        self._contexts: list[Any] = []
        self._packed: list[dict[tuple[Any, ...], tuple[ms.Tensor, _Swapped]]] = []
        if not config.enable:
            return
        targets = list(self._targets(model, config))
        self.layers = sorted({index for index, _, _ in targets})
        self._param_ptrs = {p.data_ptr() for p in model.get_parameters()}
        for index, path, cell in targets:
            self.paths.append(path)
            self._hook_forward(index, cell)
        for index, layer in select(model, _all_layers(model), "swap"):
            self._handles.append(layer.register_backward_pre_hook(self._backward_begins(index)))
        _warn_if_cpu(self.backend)

    @staticmethod
    def _targets(model: nn.Cell, config: SwapConfig) -> Iterable[tuple[int, str, nn.Cell]]:
        whole = set()
        for number, entry in enumerate(config.layer_swap or []):
            for index, layer in select(model, entry.layers, f"swap.layer_swap[{number}].layers"):
                whole.add(index)
                yield index, layer_path(index), layer
        for number, entry in enumerate(config.op_swap or []):
            where = f"swap.op_swap[{number}]"
            for index, layer in select(model, entry.layers, f"{where}.layers"):
                module = resolve_module(layer, entry.op_name, f"{where}.op_name", index)
                if index not in whole:  # inside a swapped layer it is swapped already
                    yield index, layer_path(index, entry.op_name), module

    def _hook_forward(self, index: int, cell: nn.Cell) -> None:
        def enter(_cell: nn.Cell, _args: Any) -> None:
            hooks = ms.saved_tensors_hooks(lambda t: self._pack(t, index), self._unpack)
            hooks.__enter__()
            self._contexts.append(hooks)
            self._packed.append({})

        def leave(_cell: nn.Cell, _args: Any, _out: Any) -> None:
            self._contexts.pop().__exit__(None, None, None)
            self._packed.pop()

        self._handles.append(cell.register_forward_pre_hook(enter))
        self._handles.append(cell.register_forward_hook(leave))

    def _pack(self, tensor: ms.Tensor, layer: int) -> Any:
        if tensor.data_ptr() in self._param_ptrs:
            return tensor
        key = (tensor.data_ptr(), tuple(tensor.shape), str(tensor.dtype), tuple(tensor.stride()))
        packed = self._packed[-1] if self._packed else {}
        if key in packed:
            return packed[key][1]
        nbytes = tensor.nbytes
        swapped = _Swapped(self._to_host(tensor), layer, nbytes)
        packed[key] = (tensor, swapped)
        self._pending.setdefault(layer, []).append(swapped)
        self.stats.tensors_offloaded += 1
        self.stats.bytes_offloaded += nbytes
        self.stats.offloaded_by_layer[layer] = self.stats.offloaded_by_layer.get(layer, 0) + nbytes
        return swapped

    def _unpack(self, packed: Any) -> ms.Tensor:
        if not isinstance(packed, _Swapped):
            return packed
        if packed.device is None:
            self._reload(packed)
        return packed.device

    def _backward_begins(self, index: int) -> Any:
        def prefetch(_cell: nn.Cell, _grad: Any) -> None:
            below = [layer for layer in reversed(self.layers) if layer < index]
            for layer in [index, *below[:self.config.default_prefetch]]:
                for swapped in self._pending.pop(layer, []):
                    if swapped.device is None:
                        self._reload(swapped)
                        self.stats.prefetched += 1
        return prefetch

    def _to_host(self, tensor: ms.Tensor) -> ms.Tensor:
        if self.backend in ASYNC_BACKENDS:
            return tensor.move_to("CPU", blocking=False)
        return ms.Tensor(np.array(tensor.asnumpy(), copy=True))  # a real copy, not a view

    def _reload(self, swapped: _Swapped) -> None:
        if self.backend in ASYNC_BACKENDS:
            swapped.device = swapped.host.move_to(self.backend, blocking=False)
        else:
            swapped.device = ms.Tensor(np.array(swapped.host.asnumpy(), copy=True))
        self.stats.tensors_reloaded += 1
        self.stats.bytes_reloaded += swapped.nbytes

    def remove(self) -> None:
        """Take the hooks off the model."""
        for handle in self._handles:
            handle.remove()
        self._handles.clear()


def apply_swap(model: nn.Cell, config: SwapConfig) -> ActivationSwap:
    """`ActivationSwap(model, config)`: hooks installed, returned for its `stats`."""
    return ActivationSwap(model, config)


def _all_layers(model: nn.Cell) -> list[Any]:
    from mf_config import LayerSpec

    from .layers import layer_ids

    return [LayerSpec(index, index) for index in layer_ids(model)]


def _warn_if_cpu(backend: str) -> None:
    global _warned_cpu
    if backend == "CPU" and not _warned_cpu:
        _warned_cpu = True
        LOG.warning("swap on the CPU backend: activations are copied to host memory, which is "
                    "the same memory here, so swap moves bytes but saves none")
