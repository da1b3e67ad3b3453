"""Recompute (activation checkpointing) of whole layers or named modules, and recompute of the
activations that tensor-parallel communication gathers, in MindSpore PyNative mode.

`apply_recompute` marks cells with `Cell.recompute()`: their forward runs without keeping
intermediate activations, and runs again in backward (measured bit-identical gradients, see
shared/reference/mindspore-cpu.md). A cell can be marked once: a second `apply_recompute`
over the same cell, or over a module inside (or around) an already recomputed one, raises
`RecomputeError` instead of silently nesting recomputations.

`apply_recompute_comm` targets the gather/copy cells of mf-parallel's tensor-parallel layers
(`GatherFromSequenceRegion`, `CopyToTensorRegion`): the gathered activation is what the
column-parallel matmul keeps for its weight gradient. The cell is wrapped in a
`RecomputedComm`; while its parent runs forward, a `saved_tensors_hooks` pack replaces the
saved gathered tensor by its (smaller) input, and unpack runs the communication again in
backward. `Cell.recompute()` cannot be used there: it bypasses the cells' own `bprop` (the
conjugate collective), and MindSpore ignores forward hooks on cells with a `bprop`.
Limitation: saved-tensor hooks do not stack, so inside a parent whose communication is
recomputed, an enclosing swap does not see the tensors that parent saves.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import mindspore as ms
from mindspore import nn, ops

from mf_config import LayerSpec, RecomputeCommConfig, RecomputeConfig

from .layers import ContractError, layer_path, resolve_module, select


class RecomputeError(ContractError):
    """A recompute request that cannot be applied to this model as asked."""


def is_recomputed(cell: nn.Cell) -> bool:
    """Whether `cell` itself is marked for recomputation (not merely inside a marked cell)."""
    return cell._recompute_cell is not None


def apply_recompute(model: nn.Cell, config: RecomputeConfig) -> list[str]:
    """Mark the layers or modules the config names with `Cell.recompute()`, trading their
    saved activations for a second forward in backward.

    Args:
        model: a model with the layer contract (`decoder_layers`, optional `layer_offset`).
        config: the config's `recompute` section (`full` layers or `select` modules).

    Returns:
        The marked cells' paths (`layers[0]`, `layers[0].mlp`); empty for mode `None`.

    Raises:
        RecomputeError: a missing or unknown entry, or a cell marked already (itself, inside
            or around a marked one).
    """
    targets = _recompute_targets(model, config)
    chosen = {id(cell) for _, cell in targets}
    for path, cell in targets:
        _check_free(path, cell, chosen)
    for _, cell in targets:
        cell.recompute()
    return [path for path, _ in targets]


def _recompute_targets(model: nn.Cell, config: RecomputeConfig) -> list[tuple[str, nn.Cell]]:
    if config.mode == "None":
        return []
    if config.mode == "full":
        if not config.full_recompute_layer:
            raise RecomputeError("recompute.full_recompute_layer: mode 'full' needs a list of "
                                 "layer specs, such as ['0-3']")
        return [(layer_path(index), layer) for index, layer in
                select(model, config.full_recompute_layer, "recompute.full_recompute_layer")]
    if config.mode == "select":
        if not config.select_module:
            raise RecomputeError("recompute.select_module: mode 'select' needs a mapping from "
                                 "module path to layer specs, such as {'attention': ['0-1']}")
        return [(layer_path(index, module), target) for index, module, _, _, target
                in _selected_modules(model, config.select_module, "recompute.select_module")]
    raise RecomputeError(f"recompute.mode: {config.mode!r} is not a mode; use 'None', 'full' "
                         "or 'select'")


def _selected_modules(model: nn.Cell, select_module: dict[str, list[LayerSpec]],
                      key: str) -> Iterator[tuple[int, str, str, nn.Cell, nn.Cell]]:
    """(layer index, module path, config key of the entry, layer, module) for each layer the
    `select_module` mapping names, in mapping then layer order; `key` is the mapping's config
    key (`recompute.select_module`), for the errors."""
    for module, specs in select_module.items():
        where = f"{key}[{module!r}]"
        for index, layer in select(model, specs, where):
            yield index, module, where, layer, resolve_module(layer, module, where, index)


def _check_free(path: str, cell: nn.Cell, chosen: set[int]) -> None:
    if cell._has_config_recompute:
        raise RecomputeError(f"recompute: {path} is already recomputed, itself or inside a "
                             "recomputed module (was recompute applied twice?); a module is "
                             "recomputed once")
    for name, inner in cell.cells_and_names():
        if name and (is_recomputed(inner) or id(inner) in chosen):
            raise RecomputeError(f"recompute: {path} contains {name!r}, which is recomputed "
                                 "too; recompute either the module or its part, not both")


# --- communication recompute -------------------------------------------------------------

def _comm_classes() -> tuple[type, ...]:
    from mf_parallel.runtime.tensor_parallel import CopyToTensorRegion, GatherFromSequenceRegion

    return (GatherFromSequenceRegion, CopyToTensorRegion)


class RecomputedComm(nn.Cell):
    """A gather/copy cell whose output is not kept for backward but gathered again.

    Forward is the wrapped cell's (with its own bprop). The output is noted so that the
    parent's saved-tensor hook can recognise it among the tensors saved for backward.
    """

    def __init__(self, comm: nn.Cell):
        super().__init__()
        self.comm = comm
        self.recomputes = 0
        self._noted: dict[tuple[int, tuple[int, ...]], tuple[ms.Tensor, ms.Tensor]] = {}

    def construct(self, x: ms.Tensor) -> ms.Tensor:
        out = self.comm(x)
        self._noted[_key(out)] = (out, x)
        return out

    def pack(self, tensor: ms.Tensor) -> Any:
        noted = self._noted.get(_key(tensor))
        return _Regather(self, noted[1]) if noted is not None else tensor

    def unpack(self, packed: Any) -> ms.Tensor:
        if isinstance(packed, _Regather):
            self.recomputes += 1
            return ops.stop_gradient(self.comm.construct(packed.input))
        return packed

    def forget(self) -> None:
        """Drop the forward outputs (the parent's forward is over)."""
        self._noted.clear()


class _Regather:
    __slots__ = ("input", "owner")

    def __init__(self, owner: RecomputedComm, input: ms.Tensor):
        self.owner, self.input = owner, input


def _key(tensor: ms.Tensor) -> tuple[int, tuple[int, ...]]:
    return tensor.data_ptr(), tuple(tensor.shape)


def apply_recompute_comm(model: nn.Cell, config: RecomputeCommConfig) -> list[str]:
    """Wrap the tensor-parallel gather/copy cells under each named module in a
    `RecomputedComm`, so that backward gathers their output again instead of keeping it.

    Args:
        model: a model with the layer contract, built with mf-parallel's tensor-parallel cells.
        config: the config's `recompute_comm` section.

    Returns:
        The wrapped cells' paths (`layers[0].attention.qkv.enter`); empty when not enabled.

    Raises:
        RecomputeError: no gather/copy cell under a named module, or one wrapped already.
    """
    if not config.enable:
        return []
    if not config.select_module:
        raise RecomputeError("recompute_comm.select_module: enable needs a mapping from module "
                             "path to layer specs, such as {'attention.qkv': ['0-3']}")
    plan = []
    for index, module, where, layer, target in _selected_modules(
            model, config.select_module, "recompute_comm.select_module"):
        found = _comm_cells(layer, module)
        if not found:
            raise RecomputeError(
                f"{where}: {layer_path(index, module)} ({type(target).__name__}) has no "
                "gather/copy communication cell (GatherFromSequenceRegion or "
                "CopyToTensorRegion of mf_parallel.runtime.tensor_parallel); name a "
                "column-parallel layer or such a cell")
        plan.extend((f"{layer_path(index)}.{path}", parent, name, cell)
                    for path, parent, name, cell in found)
    for path, parent, name, cell in plan:
        if isinstance(cell, RecomputedComm) or isinstance(getattr(parent, name), RecomputedComm):
            raise RecomputeError(f"recompute_comm: {path} is already recomputed (was "
                                 "recompute_comm applied twice?)")
    for _, parent, name, cell in plan:
        _wrap(parent, name, cell)
    return [path for path, _, _, _ in plan]


def _comm_cells(layer: nn.Cell, module: str) -> list[tuple[str, nn.Cell, str, nn.Cell]]:
    """(path from the layer, parent cell, attribute name, cell) of each gather/copy cell at or
    under the module `module` of the layer."""
    classes = (*_comm_classes(), RecomputedComm)
    found = []
    for name, cell in layer.cells_and_names():
        inside = name == module or name.startswith(module + ".")
        if inside and isinstance(cell, classes):
            parent_path, _, attribute = name.rpartition(".")
            parent = layer if not parent_path else resolve_module(layer, parent_path, module)
            if not isinstance(parent, RecomputedComm):
                found.append((name, parent, attribute, cell))
    return found


def _wrap(parent: nn.Cell, name: str, cell: nn.Cell) -> None:
    wrapper = RecomputedComm(cell)
    setattr(parent, name, wrapper)
    scope: dict[str, Any] = {}

    def enter(_cell: nn.Cell, _args: Any) -> None:
        scope["hooks"] = ms.saved_tensors_hooks(wrapper.pack, wrapper.unpack)
        scope["hooks"].__enter__()

    def leave(_cell: nn.Cell, _args: Any, _out: Any) -> None:
        scope.pop("hooks").__exit__(None, None, None)
        wrapper.forget()

    parent.register_forward_pre_hook(enter)
    parent.register_forward_hook(leave)
