"""The part of a model one pipeline stage builds, and the decoder layers it holds.

A stage builds only its own decoder layers (`ModelPart.layers`, global ids), the embedding when
it runs the first virtual stage, and the final norm, head and loss when it runs the last (with
tied embeddings the last stage also holds a copy of the embedding table, as Megatron does; the
pipeline layout keeps the two copies equal). `LayerStack` names each layer by its global id, so
every parameter keeps its model-wide name (`decoder_layers.5.mlp.down.weight` on whichever stage
holds layer 5): checkpoints of a pipelined run use the names of the whole model.

A model that can be cut into stages (`PipelineModel`) takes `part=` in its constructor and
runs its pieces separately: `embed`, `decoder` (some of its layers, with the auxiliary loss
they add: a mixture of experts' balance loss) and `head_loss`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar, runtime_checkable

from mindspore import Tensor, nn


@dataclass(frozen=True)
class ModelPart:
    """What one pipeline stage builds of a model."""

    layers: tuple[int, ...]
    """Global ids of the decoder layers, increasing."""
    embedding: bool
    """The token embedding (the stage runs the first virtual stage)."""
    head: bool
    """The final norm, the output head and the loss (the stage runs the last virtual stage)."""
    experts: tuple[int, ...] | None = None
    """Global indices of the routed experts each MoE layer builds (expert parallelism), or
    None: every one."""

    @classmethod
    def whole(cls, num_layers: int) -> ModelPart:
        """Every piece: the model of a run without pipeline parallelism."""
        return cls(tuple(range(num_layers)), True, True)


C = TypeVar("C", bound=nn.Cell)


def each_built(layer: C, layer_built: Callable[[nn.Cell], object] | None) -> C:
    """`layer`, after `layer_built(layer)` when given: a model calls it on each decoder layer
    as soon as the layer exists (fully sharded data parallelism cuts it to this rank's slice
    there, so the model is never whole on a rank)."""
    if layer_built is not None:
        layer_built(layer)
    return layer


class LayerStack(nn.Cell):
    """Cells under their global ids, in order: decoder layers (`decoder_layers.<id>.`), or a
    rank's routed experts (`mlp.experts.<id>.`, expert parallelism).

    A sequence for the layer contract (`len`, iteration, `[position]`); `ids` gives each
    position's global id.
    """

    def __init__(self, layers: Mapping[int, nn.Cell]):
        super().__init__()
        self.ids = tuple(sorted(layers))
        for index in self.ids:
            self.insert_child_to_cell(str(index), layers[index])

    def __len__(self) -> int:
        return len(self.ids)

    def __iter__(self) -> Iterator[nn.Cell]:
        return (self._cells[str(index)] for index in self.ids)

    def __getitem__(self, position: int) -> nn.Cell:
        return self._cells[str(self.ids[position])]

    def by_id(self, index: int) -> nn.Cell:
        """The layer of global id `index`."""
        return self._cells[str(index)]


@runtime_checkable
class PipelineModel(Protocol):
    """A model that a pipeline stage can hold part of (built with `part=`)."""

    part: ModelPart

    def embed(self, input_ids: Tensor) -> Tensor:
        """Token ids `[batch, seq]` -> the first layer's input (the hidden-state layout)."""

    def attending(self, input_ids: Tensor, position_ids: Tensor | None,
                  actual_seq_len: Tensor | None, attention_mask: Tensor | None) -> object:
        """What the layers' attention takes for this micro-batch (rotary positions, mask;
        `attention_inputs.Attending`)."""

    def decoder(self, hidden: Tensor, layers: Sequence[int],
                attending: object) -> tuple[Tensor, Tensor | None]:
        """The hidden states through the decoder layers of these global ids, in order, and
        the auxiliary loss those layers add to the model's loss (DeepSeek-V3's balance loss;
        None for a model without one)."""

    def head_loss(self, hidden: Tensor, labels: Tensor, loss_mask: Tensor | None) -> Tensor:
        """The last layer's output -> the mean loss (a float32 scalar)."""

    def hidden_spec(self, batch: int, seq: int) -> tuple[tuple[int, ...], object]:
        """Shape and dtype of the hidden states between layers for a `[batch, seq]` input on
        this rank (what a stage receives)."""
