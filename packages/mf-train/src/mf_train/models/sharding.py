"""A model's sharding table (`mf_parallel.placement.ShardingTable`) from its weight table.

Each model lists its parameters as `WeightMap`s (our name, Hugging Face parts and shapes, the
tensor-parallel axis) from its settings alone; `table_from_maps` adds what the record needs
besides: the decoder layer and routed expert read off our names, where the embedding, final
norm and head sit, and the dtype. `sharding_table(config)` gives the table of the model the
`model` section names, building nothing.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Sequence

from mf_parallel.placement import ParameterSpec, ShardingTable

from .hf_weights import WeightMap

_LAYER = re.compile(r"decoder_layers\.(\d+)\.")
_EXPERT = re.compile(r"\.mlp\.experts\.(\d+)\.")
EMBEDDING = "embedding.weight"


def table_from_maps(maps: Sequence[WeightMap], *, tied: bool, dtype: str, experts: int = 0,
                    frozen: Collection[str] = (), float32: Collection[str] = ()
                    ) -> ShardingTable:
    """The sharding table of a model whose parameters `maps` lists.

    Args:
        maps: every parameter's `WeightMap`, in the model's order.
        tied: the head is the embedding's table.
        dtype: the parameters' dtype (`params_dtype`).
        experts: routed experts per MoE layer (0: none).
        frozen: names of parameters the optimizer does not train.
        float32: names of parameters kept in float32 whatever `dtype` is.
    """
    specs = []
    for entry in maps:
        layer = _LAYER.match(entry.ours)
        expert = _EXPERT.search(entry.ours)
        shape = (sum(entry.rows()), *entry.shapes[0][1:]) if len(entry.shapes) > 1 \
            else entry.shapes[0]
        specs.append(ParameterSpec(
            name=entry.ours, shape=shape,
            dtype="float32" if entry.ours in float32 else dtype,
            parts=tuple(zip(entry.hf, entry.rows(), strict=True)), axis=entry.axis,
            layer=int(layer.group(1)) if layer else None,
            where="layer" if layer else "embedding" if entry.ours == EMBEDDING else "head",
            expert=int(expert.group(1)) if expert else None,
            experts=experts if expert else 0, trainable=entry.ours not in frozen))
    return ShardingTable(specs, tied=tied, embedding=EMBEDDING)

