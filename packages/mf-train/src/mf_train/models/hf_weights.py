"""Our parameter names <-> Hugging Face weight names, and loading a model from HF arrays.

A model describes itself by `weight_maps()`: one `WeightMap` per parameter, naming the HF
weights it holds (several when fused, such as `qkv` = q_proj, k_proj, v_proj stacked by rows),
their full HF shapes, and the axis tensor parallelism splits the full arrays along (0 for a
column-parallel or vocabulary-parallel weight, 1 for a row-parallel one, None when every rank
holds the whole array). Fused column-parallel weights are stacked by `blocks.fuse_rows`, so each
rank's shard holds its own rows of every part. The model also has `tensor_group` (None or a
TensorGroup) and may list `hf_ignored` names (HF weights it accepts and does not use, such as
`lm_head.weight` when the head is tied to the embedding) and, through `hf_skipped(names)`,
whole groups of HF weights it recognises and does not train (DeepSeek-V3's multi-token
prediction layers): those are left out with one log line saying how many and why.

Export runs the other way on the same table: `gather_hf_state` concatenates the tensor-parallel
ranks' shards along each entry's axis and splits fused parameters back into their HF parts.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import mindspore as ms
import numpy as np
from mindspore import Tensor

from .blocks import fuse_rows, split_rows, tensor_size

LOG = logging.getLogger(__name__)


class HFWeightsError(ValueError):
    """HF weights that do not fit the model: missing, mis-shaped or unknown names."""


@dataclass(frozen=True)
class WeightMap:
    """One parameter of ours and the HF weights it holds."""

    ours: str
    hf: tuple[str, ...]
    shapes: tuple[tuple[int, ...], ...]
    axis: int | None = None

    def rows(self) -> list[int]:
        return [shape[0] for shape in self.shapes]


def hf_names(model: Any) -> dict[str, tuple[str, ...]]:
    """Our parameter name -> the HF names it holds (one, or the fused parts in row order)."""
    return {entry.ours: entry.hf for entry in model.weight_maps()}


def load_hf_state(model: Any, tensors: Mapping[str, np.ndarray], strict: bool = True) -> None:
    """Fill `model`'s parameters from HF-named full arrays (this rank's shards under tensor
    parallelism). Every problem is reported at once: missing names, wrong shapes, and (when
    `strict`) names the model does not use. Values are cast to each parameter's dtype."""
    tensors = _without_skipped(model, tensors)
    entries = model.weight_maps()
    problems = _shape_problems(entries, tensors)
    if strict:
        known = {name for entry in entries for name in entry.hf}
        known |= set(getattr(model, "hf_ignored", ()))
        problems += [f"{name}: not a weight of {type(model).__name__}"
                     for name in sorted(set(tensors) - known)]
    if problems:
        raise HFWeightsError("Hugging Face weights do not fit the model:\n  "
                             + "\n  ".join(problems))
    params = dict(model.parameters_and_names())
    group = model.tensor_group
    for entry in entries:
        value = local_value(entry, [tensors[name] for name in entry.hf], group)
        param = params[entry.ours]
        param.set_data(Tensor(value).astype(param.dtype))


def hf_state(model: Any) -> dict[str, np.ndarray]:
    """The model's weights under their HF names, as float32 arrays (fused parameters split
    back into their parts). Single-process models only: a tensor-parallel rank holds shards."""
    if tensor_size(model.tensor_group) > 1:
        raise HFWeightsError("hf_state needs the whole weights; this model holds a "
                             "tensor-parallel shard (gather the shards first)")
    params = dict(model.parameters_and_names())
    state = {}
    for entry in model.weight_maps():
        state.update(hf_parts(entry, params[entry.ours].astype(ms.float32).asnumpy()))
    return state


def hf_parts(entry: WeightMap, full: np.ndarray, shards: int = 1) -> dict[str, np.ndarray]:
    """The HF weights of `entry` from its parameter's whole value (the inverse of the fusing
    in `local_value`): fused parts split back, rank-interleaved when the value was gathered
    from `shards` column-parallel ranks."""
    if len(entry.hf) == 1:
        return {entry.hf[0]: full}
    parts = split_rows(full, entry.rows(), shards if entry.axis == 0 else 1)
    return dict(zip(entry.hf, parts, strict=True))


def gather_hf_state(entries: list[WeightMap],
                    ranks: Sequence[Mapping[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """Whole HF-named arrays from the arrays (under our names) of each place of a
    tensor-parallel group, in place order (a rank's file, or several ranks' merged: pipeline
    stages, expert shares); one mapping when there is no tensor parallelism. The inverse of
    `load_hf_state`: the shards are concatenated along each entry's split axis, then fused
    parts split back. `HFWeightsError` lists every parameter missing from a place and every
    weight whose gathered shape is not the HF one."""
    problems = [f"{entry.ours}: missing from tensor rank {rank}'s arrays"
                for entry in entries for rank, arrays in enumerate(ranks)
                if entry.ours not in arrays]
    if problems:
        raise HFWeightsError("the arrays do not hold the model:\n  " + "\n  ".join(problems))
    state, problems = {}, []
    for entry in entries:
        pieces = [np.asarray(arrays[entry.ours]) for arrays in ranks]
        split = entry.axis is not None and len(pieces) > 1
        full = np.concatenate(pieces, axis=entry.axis) if split else pieces[0]
        whole = (sum(entry.rows()), *entry.shapes[0][1:])
        if full.shape != whole:
            problems.append(f"{entry.ours}: shape {full.shape}, expected {whole} (for "
                            f"{', '.join(entry.hf)})")
            continue
        state.update(hf_parts(entry, full, len(pieces) if split else 1))
    problems += _shape_problems(entries, state) if not problems else []
    if problems:
        raise HFWeightsError("the gathered weights do not have Hugging Face's shapes:\n  "
                             + "\n  ".join(problems))
    return state


def _without_skipped(model: Any, tensors: Mapping[str, np.ndarray]) -> Mapping[str, np.ndarray]:
    """`tensors` without those the model's `hf_skipped` names, logged once with its reason."""
    skip = getattr(model, "hf_skipped", None)
    if skip is None:
        return tensors
    skipped, reason = skip(tensors.keys())
    if not skipped:
        return tensors
    LOG.info("Hugging Face weights: skipped %d tensors: %s", len(skipped), reason)
    return {name: value for name, value in tensors.items() if name not in skipped}


def _shape_problems(entries: list[WeightMap], tensors: Mapping[str, np.ndarray]) -> list[str]:
    problems = []
    for entry in entries:
        for name, shape in zip(entry.hf, entry.shapes, strict=True):
            if name not in tensors:
                problems.append(f"{name}: missing (needed for {entry.ours}, shape {shape})")
            elif tuple(np.shape(tensors[name])) != shape:
                problems.append(f"{name}: shape {tuple(np.shape(tensors[name]))}, expected "
                                f"{shape} (for {entry.ours})")
    return problems


def local_value(entry: WeightMap, arrays: list[np.ndarray], group: Any) -> np.ndarray:
    """This rank's value of `entry`'s parameter from its full HF `arrays`: the parts fused
    (rank-interleaved when column parallel), then this rank's slice along the split axis."""
    arrays = [np.asarray(array, np.float32) for array in arrays]
    shards = tensor_size(group)
    full = fuse_rows(arrays, shards if entry.axis == 0 else 1) if len(arrays) > 1 else arrays[0]
    if shards == 1 or entry.axis is None:
        return full
    return group.shard(full, entry.axis)
