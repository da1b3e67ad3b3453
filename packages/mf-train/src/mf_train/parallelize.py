"""Tensor (+ sequence) and context parallelism applied to a plain model from outside.

A model built from its settings alone (`models.build_model`) is one process's model: plain
`Linear` and `Embedding` cells holding whole weights, attention over the whole sequence. This
module turns it into one rank's part, as torchtitan's `parallelize_*` does: each concern is
a function that replaces or configures the model's cells, driven by the model's sharding
table (`models.sharding_table`: which axis tensor parallelism splits a weight along, and its
fused Hugging Face parts).

- `tensor_parallel_layer(layer, table, group)`: a decoder layer's linears become mf-parallel's
  column (`axis` 0) or row (`axis` 1) parallel linears holding this rank's slice, fused
  weights re-stacked so that each rank's rows hold its rows of every part; its heads counted
  per rank; replicated parameters whose gradient is partial marked for the tensor-group sum.
- `tensor_parallel_model(model, table, group)`: the same outside the layers (vocabulary-
  parallel embedding, column-parallel head, the tied head's entry) and the model's
  `tensor_group`.
- `context_parallel(model, group)`: attention exchanges keys and values over the context
  group, and the model places its tokens (`AttentionPlaces`).

`build_parallel_model` builds a model and applies them in that order; a layer is cut as soon
as it is built (the model's `layer_built` hook), before the next one exists, so that a rank
never holds the whole model's weights at once.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np
from mindspore import Parameter, nn

from mf_config import ModelConfig
from mf_config.component_settings import settings_error
from mf_config.yaml_source import Source
from mf_parallel.placement import ParameterSpec, ShardingTable
from mf_parallel.runtime.context_parallel import ContextGroup
from mf_parallel.runtime.expert_dispatch import ExpertGroup
from mf_parallel.runtime.tensor_parallel import (
    ColumnParallelLinear,
    CopyToTensorRegion,
    GatherFromSequenceRegion,
    ReduceFromTensorRegion,
    RowParallelLinear,
    TensorGroup,
    VocabParallelEmbedding,
    mark_sequence_parallel,
    mark_tensor_sharded,
)

from .models import ModelPart, build_model, model_class, sharding_table
from .models.attention_inputs import AttentionPlaces
from .models.blocks import Embedding, Linear, fuse_rows, split_rows
from .models.context_attention import SequenceExchange
from .models.gathered_heads import GatheredHeads


def build_parallel_model(config: ModelConfig, *, tensor_group: TensorGroup | None = None,
                         source: Source | None = None, seed: int | None = None,
                         part: ModelPart | None = None,
                         expert_group: ExpertGroup | None = None,
                         context_group: ContextGroup | None = None,
                         layer_built: Callable[[nn.Cell], object] | None = None) -> nn.Cell:
    """This rank's part of the model the `model` section describes.

    Args:
        config: the `model` section.
        tensor_group: this rank's tensor-parallel group (None or size 1: none).
        source: the YAML source, for error lines.
        seed: draws the initial weights (default: MindSpore's global seed, else 0).
        part: what a pipeline stage builds (None: the whole model).
        expert_group: this rank's expert-parallel group (None: every expert here).
        context_group: this rank's context-parallel group (None or size 1: none).
        layer_built: called with each decoder layer once it is this rank's (fully sharded
            data parallelism cuts it to the rank's slice there).

    Returns:
        The model, its layers and weights this rank's.

    Raises:
        ConfigError: naming the `model.<key>` of every problem.
    """
    tensor = tensor_group if tensor_group is not None and tensor_group.size > 1 else None
    context = context_group if context_group is not None and context_group.size > 1 else None
    experts = expert_group if expert_group is not None and expert_group.size > 1 else None
    settings = model_class(config, source).settings_of(config, source)
    found = (settings.tensor_parallel_problems(_size(tensor))
             + settings.context_parallel_problems(
                 _size(tensor), 1 if context is None else context.ulysses))
    if found:
        raise settings_error(found, source)
    hooks: list[Callable[[nn.Cell], object]] = []
    if tensor is not None:
        table = sharding_table(config, source)
        hooks.append(lambda layer: tensor_parallel_layer(layer, table, tensor))
    if layer_built is not None:
        hooks.append(layer_built)
    if experts is not None:  # only this rank's routed experts are built
        part = dataclasses.replace(part or ModelPart.whole(settings.num_hidden_layers),
                                   experts=tuple(experts.local_experts(
                                       settings.n_routed_experts)))
    model = build_model(config, source=source, seed=seed, part=part,
                        layer_built=_each(hooks) if hooks else None)
    if tensor is not None:
        _same_dtypes(model, source)
        tensor_parallel_model(model, table, tensor)
    if context is not None:
        context_parallel(model, context)
    if experts is not None:
        expert_parallel(model, experts)
    return model


def _each(hooks: list[Callable[[nn.Cell], object]]) -> Callable[[nn.Cell], None]:
    def run(layer: nn.Cell) -> None:
        for hook in hooks:
            hook(layer)
    return run


def _size(group: Any) -> int:
    return 1 if group is None else group.size


def _same_dtypes(model: Any, source: Source | None) -> None:
    """mf-parallel's tensor-parallel linears do not cast their weights: the parameters must
    be in the compute dtype (as resolved on this backend)."""
    if model.compute_dtype != model.params_dtype:
        s = model.settings
        raise settings_error([(("model", "params_dtype"), (
            f"must equal compute_dtype ({s.compute_dtype}) with tensor parallelism "
            f"(mf-parallel's layers do not cast), got {s.params_dtype}"))], source)


# --- tensor (+ sequence) parallelism ------------------------------------------------------

def _layer_specs(table: ShardingTable) -> dict[str, ParameterSpec]:
    """Name within its decoder layer -> spec (every layer's parameter of that name alike)."""
    return {spec.name.split(".", 2)[2]: spec for spec in table.params if spec.layer is not None}


def tensor_parallel_layer(layer: nn.Cell, table: ShardingTable, group: TensorGroup) -> None:
    """Cut a freshly built decoder layer (its parameter names relative to it) to this tensor
    rank's part.

    A cell's declarations say what the sharding table cannot: `gathers_input` (its `entry`
    brings the input into the tensor region once, and its row-split projections then need
    no communication: MLA), `tensor_counts` (attributes counting heads or rows, divided by
    the group size once the cell's linears are split) and `tensor_partial` (replicated cells
    differentiated through this rank's heads only: their gradient is summed over the group).
    Under sequence parallelism every replicated trainable parameter runs on this rank's
    sequence slice and is marked for that sum too; an MoE learns its balance loss spans the
    group's slices.
    """
    specs = _layer_specs(table)
    cells = list(layer.cells_and_names())
    gathering = [path for path, cell in cells if getattr(cell, "gathers_input", False)]
    split: set[str] = set()
    for path, cell in cells:
        spec = specs.get(f"{path}.weight") if isinstance(cell, Linear) else None
        if spec is None or spec.axis is None:
            continue
        if spec.axis == 0 and any(path.startswith(f"{outer}.") for outer in gathering):
            new = _named(Linear(group.shard(_whole(cell), 0)), cell)
            mark_tensor_sharded(new.weight)
        else:
            new = _split_linear(cell, spec, group)
        _replace(layer, path, new)
        split.add(path)
    for path, cell in cells:
        if not any(inner == path or inner.startswith(f"{path}.") or not path
                   for inner in split):
            continue
        for counted in getattr(cell, "tensor_counts", ()):
            setattr(cell, counted, getattr(cell, counted) // group.size)
        if getattr(cell, "gathers_input", False):
            cell.entry = _entry(group)
        if getattr(cell, "gathered", None) is not None:
            cell.gathered = GatheredHeads(cell.heads, cell.kv_heads, cell.head_dim)
        for name in getattr(cell, "tensor_partial", ()):
            if getattr(cell, name, None) is not None:
                mark_sequence_parallel(getattr(cell, name).weight)
    if not group.sequence_parallel:
        return
    for name, param in layer.parameters_and_names():
        spec = specs.get(name)
        if param.requires_grad and (spec is None or spec.axis is None):
            mark_sequence_parallel(param)
    for _, cell in layer.cells_and_names():
        if hasattr(cell, "sequence_group"):
            cell.sequence_group = group
            cell.sequence_sum = ReduceFromTensorRegion(group)


def _entry(group: TensorGroup) -> nn.Cell:
    """What brings activations into the tensor region: the gather of the sequence slices,
    or a copy (identity forward, all-reduce backward)."""
    return GatherFromSequenceRegion(group) if group.sequence_parallel \
        else CopyToTensorRegion(group)


def tensor_parallel_model(model: nn.Cell, table: ShardingTable, group: TensorGroup) -> None:
    """Cut the pieces outside the decoder layers to this tensor rank's part and give the
    model its `tensor_group` (the vocabulary-parallel loss, the sequence slices' size)."""
    model.tensor_group = group
    if hasattr(model, "embedding"):
        model.embedding = _named(VocabParallelEmbedding(_whole(model.embedding), group),
                                 model.embedding)
    if getattr(model.part, "head", False):
        if not model.tied:
            spec = next(spec for spec in table.params if spec.name == "head.weight")
            model.head = _split_linear(model.head, spec, group)
        else:
            model.head_entry = _entry(group)
        if group.sequence_parallel:
            mark_sequence_parallel(model.final_norm.weight)


def _split_linear(cell: Linear, spec: ParameterSpec, group: TensorGroup) -> nn.Cell:
    """`cell` as a column- (`spec.axis` 0) or row-parallel (1) linear holding this rank's
    slice; a fused weight re-stacked so that each rank's block is its rows of every part."""
    weight = _whole(cell)
    bias = None if cell.bias is None else cell.bias.asnumpy()
    if spec.axis == 0:
        rows = [count for _, count in spec.parts]
        if len(rows) > 1:
            weight = fuse_rows(split_rows(weight, rows), group.size)
            bias = None if bias is None else fuse_rows(split_rows(bias, rows), group.size)
        return _named(ColumnParallelLinear(weight, bias, group), cell)
    return _named(RowParallelLinear(weight, bias, group), cell)


def _whole(cell: Linear | Embedding) -> np.ndarray:
    """The cell's weight as numpy, in float32 as it was drawn (the cast comes after)."""
    return cell.weight.asnumpy()


def _named(new: nn.Cell, old: nn.Cell) -> nn.Cell:
    """`new` with `old`'s parameter names and dtype (a replaced child keeps its place in the
    model's names)."""
    for name in ("weight", "bias"):
        before, after = getattr(old, name, None), getattr(new, name, None)
        if isinstance(before, Parameter) and isinstance(after, Parameter):
            after.name = before.name
            if after.dtype != before.dtype:
                after.set_dtype(before.dtype)
    return new


def _replace(root: nn.Cell, path: str, new: nn.Cell) -> None:
    *parents, name = path.split(".")
    parent = root
    for step in parents:
        parent = getattr(parent, step)
    setattr(parent, name, new)


# --- context parallelism ------------------------------------------------------------------

def context_parallel(model: nn.Cell, group: ContextGroup) -> None:
    """Attention of each layer exchanges over `group`; the model takes this rank's tokens
    (`AttentionPlaces`) and counts the loss over the group."""
    model.context_group = group
    model.places = AttentionPlaces(group, varlen=model.places.varlen)
    for layer in model.decoder_layers:
        attention = layer.attention
        attention.exchange = SequenceExchange(group, attention.exchange.core)
        if hasattr(attention, "gathered"):
            attention.gathered = None
        if hasattr(layer.mlp, "context"):  # an MoE's balance loss spans the group
            layer.mlp.context = group


# --- expert parallelism -------------------------------------------------------------------

def expert_parallel(model: nn.Cell, group: ExpertGroup) -> None:
    """Each MoE layer (built with this rank's routed experts only, `ModelPart.experts`)
    dispatches the tokens to the ranks of their experts."""
    for layer in model.decoder_layers:
        if hasattr(layer.mlp, "expert_group"):
            layer.mlp.expert_group = group

