"""One kind of parameter and how parallelism splits it (pure Python)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ParamGroup:
    """Parameters of one kind on one device: `sharded` ones are split by tensor parallelism,
    `expert` ones (routed experts) by expert parallelism instead."""

    name: str
    count: int
    sharded: bool
    matrix: bool
    """A hidden 2-D weight (Muon updates these; embeddings, head and norms use AdamW)."""
    expert: bool = False
    """Routed experts: split over the expert-parallel ranks, whole on each ("ETP 1"); under
    expert parallelism outside the FSDP/ZeRO buffers, their optimizer state sliced over the
    expert-data ranks instead (`data_parallel.expert_shard_degree`)."""
    trainable: bool = True
    """False for buffers kept as parameters (DeepSeek's routing bias): no gradient, no
    optimizer state."""

    def per_device(self, tp: int, ep: int = 1) -> int:
        """`count / ep` for routed experts, `count / tp` for tensor-sharded groups (rounded
        up), `count` for replicated ones."""
        if self.expert:
            return -(-self.count // ep)
        return -(-self.count // tp) if self.sharded else self.count
