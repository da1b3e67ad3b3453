"""The monitors' view of a training step: the step layout's observer, feeding mf_train.monitor's
`TrainStateMonitor` (local/device losses and norms), `MoeMonitor` (tokens per expert summed
over the step's micro-batches) and `EmbeddingHealthMonitor` (the embedding's local norm)."""

from __future__ import annotations

from collections.abc import Sequence

from mindspore import Tensor

from ..observe.callbacks import CallbackList
from .health import EMBEDDING, EmbeddingHealthMonitor
from .moe import MoeMonitor
from .train_state import TrainStateMonitor


class MonitorObserver:
    """Hands each micro-batch and the step's local totals to the monitors."""

    def __init__(self, names: Sequence[str], train_state: TrainStateMonitor | None,
                 moe: MoeMonitor | None, health: EmbeddingHealthMonitor | None = None):
        self.names = list(names)
        self.train_state, self.moe, self.health = train_state, moe, health

    @classmethod
    def of(cls, names: Sequence[str], callbacks: CallbackList) -> MonitorObserver:
        """The observer feeding the collectors among `callbacks` (parameter `names` in
        gradient order)."""
        return cls(names, callbacks.find(TrainStateMonitor), callbacks.find(MoeMonitor),
                   callbacks.find(EmbeddingHealthMonitor))

    def micro_batch(self, index: int, loss: Tensor, grads: Sequence[Tensor]) -> None:
        """One micro-batch's own loss and gradients."""
        if self.train_state is not None:
            self.train_state.record_local_loss(index, loss)
            self.train_state.record_local_norms(index, self.names, grads)

    def routed(self, layers: Sequence[int] | None) -> None:
        """A micro-batch's routing in these layers (all: None), for the MoE monitor."""
        if self.moe is not None:
            self.moe.record_forward(layers)

    def watches(self, name: str) -> bool:
        """Whether a monitor reads the gradient of parameter `name`: the local and device
        norms' selections, and the embedding for the health monitor."""
        if self.health is not None and EMBEDDING in name:
            return True
        return self.train_state is not None and (self.train_state.local_norm(name)
                                                 or self.train_state.device_norm(name))

    def reduced(self, loss: Tensor, grads: Sequence[Tensor]) -> None:
        """The step's loss and gradients on this rank, before the data-parallel reduction."""
        if self.train_state is not None:
            self.train_state.record_device_loss(loss)
            self.train_state.record_device_norms(self.names, grads)
        if self.health is not None:
            self.health.record(self.names, grads)
