"""The layer contract: how mf-memory finds a model's decoder layers and their sub-modules.

A model honours the contract if it has `decoder_layers`, a sequence (e.g. `nn.CellList`) of its
decoder layer cells in forward order, and optionally `layer_offset`, the global index of its first
layer (a pipeline stage holds layers `layer_offset` to `layer_offset + len - 1`; default 0), or
`layer_ids`, the global index of each layer (an interleaved pipeline stage holds runs of layers
that are not contiguous, such as 0 and 2). A pipeline stage also says `model_layers`, the whole
model's layer count: a spec naming a layer another stage holds is then skipped here.
The config's layer specs use global indices. A sub-module is a dotted attribute path from a
layer (`attention`, `mlp.down`, `attention.qkv`).

This module reads attributes only; it never imports MindSpore, so any object tree works.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import pairwise
from typing import Any

from mf_config import LayerSpec
from mf_config.layer_spec import ids_text


class ContractError(ValueError):
    """The model, or a config entry applied to it, does not fit the layer contract."""


def decoder_layers(model: Any) -> list[Any]:
    """The model's decoder layers in forward order: the layer contract recompute and swap
    rely on.

    Args:
        model: a model with a sequence attribute `decoder_layers`.

    Returns:
        The layers, as a list.

    Raises:
        ContractError: no `decoder_layers`, or not a sequence.
    """
    layers = getattr(model, "decoder_layers", None)
    if layers is None:
        raise ContractError(
            f"{type(model).__name__} has no `decoder_layers`: recompute and swap need the model's "
            "decoder layers as a sequence attribute `decoder_layers` (e.g. an nn.CellList), "
            "optionally with `layer_offset`, the global index of its first layer")
    try:
        return list(layers)
    except TypeError:
        raise ContractError(f"{type(model).__name__}.decoder_layers is a "
                            f"{type(layers).__name__}, not a sequence of layer cells") from None


def layer_offset(model: Any) -> int:
    """The global index of the model's first decoder layer, so that layer specs name global
    layers on a pipeline stage.

    Args:
        model: a model with the layer contract.

    Returns:
        `model.layer_offset`, 0 when absent.

    Raises:
        ContractError: not an int >= 0.
    """
    offset = getattr(model, "layer_offset", 0)
    if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
        raise ContractError(f"{type(model).__name__}.layer_offset must be an int >= 0, "
                            f"got {offset!r}")
    return offset


def layer_ids(model: Any) -> list[int]:
    """The global index of each of the model's decoder layers, in `decoder_layers` order:
    `model.layer_ids` when the model has it, else `layer_offset` onwards.

    Raises:
        ContractError: `layer_ids` does not give one increasing index per layer.
    """
    count = len(decoder_layers(model))
    ids = getattr(model, "layer_ids", None)
    if ids is None:
        offset = layer_offset(model)
        return list(range(offset, offset + count))
    ids = list(ids)
    if len(ids) != count or any(b <= a for a, b in pairwise(ids)) or (ids and ids[0] < 0):
        raise ContractError(f"{type(model).__name__}.layer_ids must give one increasing global "
                            f"index >= 0 per decoder layer ({count}), got {ids}")
    return ids


def resolve_module(layer: Any, path: str, where: str, index: int | None = None) -> Any:
    """The sub-module a config entry names inside one layer.

    Args:
        layer: a decoder layer.
        path: a dotted attribute path (`attention`, `attention.qkv`).
        where: the config path of the entry, for errors.
        index: the layer's global index, for errors.

    Returns:
        The cell at `path`.

    Raises:
        ContractError: a malformed path, or no cell there (lists the child cells).
    """
    if not path or any(not part for part in path.split(".")):
        raise ContractError(f"{where}: {path!r} is not a module path; write attribute names "
                            "joined by dots, such as 'attention' or 'attention.qkv'")
    module = layer
    walked = []
    for part in path.split("."):
        child = getattr(module, part, None) if not part.startswith("_") else None
        if child is None or not _is_cell(child):
            at = f"layer {index}" if index is not None else "the layer"
            inside = ".".join(walked) or "the layer"
            raise ContractError(
                f"{where}: {at} ({type(layer).__name__}) has no sub-module {path!r}: "
                f"{inside} has no cell {part!r}; its child cells are "
                f"{_child_names(module) or 'none'}")
        module = child
        walked.append(part)
    return module


def select(model: Any, specs: Sequence[LayerSpec], where: str) -> list[tuple[int, Any]]:
    """(global index, layer) for every layer the specs name, in spec order."""
    by_id = dict(zip(layer_ids(model), decoder_layers(model), strict=True))
    whole = getattr(model, "model_layers", None)
    chosen = []
    for spec in specs:
        for index in spec.layers():
            if index not in by_id and isinstance(whole, int) and 0 <= index < whole:
                continue  # a layer of another pipeline stage
            if index not in by_id:
                raise ContractError(
                    f"{where}: '{spec}' names layer {index}, but this model has "
                    f"{len(by_id)} decoder layers ({_ids_text(list(by_id))})")
            chosen.append((index, by_id[index]))
    return chosen


def layer_path(index: int, module_path: str | None = None) -> str:
    """How reports name a layer or a module of it: `layers[3]`, `layers[3].attention`."""
    return f"layers[{index}]" if not module_path else f"layers[{index}].{module_path}"


def _ids_text(ids: list[int]) -> str:
    return f"global layer ids {ids_text(ids).replace('-', ' to ')}" if ids else "none"


def _is_cell(obj: Any) -> bool:
    return callable(obj) and hasattr(obj, "name_cells")


def _child_names(module: Any) -> str:
    names = getattr(module, "name_cells", lambda: {})()
    return ", ".join(repr(name) for name in names)
