"""Two optimizers updating two parts of one model as one `Optimizer`.

Expert parallelism updates the routed experts apart from the rest of the model when no other
rank holds the same experts or the layout of the other degrees replicates the model: the rest
is updated by that layout's optimizer (replicated, or ZeRO and FSDP slices), the experts each
rank holds by their own optimizer, over whole expert parameters. (With other ranks holding the
same experts, ZeRO and FSDP slice and update them with the rest: one optimizer.) The trainer,
the checkpoints and the logs see one optimizer: the gradients are the first part's followed by
the second's (one whole gradient per parameter), the state dict the first's keys and the
second's under a prefix, and both count the same steps.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from mindspore import Parameter, Tensor

from ..checkpoint.regions import RankRegions
from .protocol import Optimizer, OptimizerStateError


class JoinedOptimizer:
    """`first` then `second`; `second` takes the last gradients, one per parameter.

    Args:
        first: the optimizer of the model's other parameters.
        second: the optimizer of the parameters updated apart.
        prefix: put before `second`'s state-dict keys (`experts.`).
    """

    def __init__(self, first: Optimizer, second: Optimizer, prefix: str):
        self.first, self.second, self.prefix = first, second, prefix
        self.second_grads = len(second.params)
        self.names: list[str] = [*first.names, *second.names]
        self.params: list[Parameter] = [*first.params, *second.params]

    @property
    def global_step(self) -> int:
        return self.first.global_step

    def step(self, grads: Sequence[Tensor], lr: float, clip: float | Tensor = 1.0,
             keep: Tensor | None = None) -> None:
        split = len(grads) - self.second_grads
        self.first.step(grads[:split], lr, clip, keep)
        self.second.step(grads[split:], lr, clip, keep)

    def uncount(self) -> None:
        self.first.uncount()
        self.second.uncount()

    def rescale(self, param: Parameter, factor: Tensor) -> bool:
        """`param` rescaled by whichever optimizer updates it (`ParameterOptimizer.rescale`)."""
        return any(getattr(part, "rescale", lambda *_: False)(param, factor)
                   for part in (self.first, self.second))

    def state_dict(self) -> dict[str, np.ndarray]:
        state = self.first.state_dict()
        state.update({self.prefix + key: value
                      for key, value in self.second.state_dict().items()})
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Both parts' states. `OptimizerStateError` when either does not fit; the second
        part may then be loaded already (the trainer stops on the error, so a partly loaded
        state is never trained on)."""
        second = {key[len(self.prefix):]: value for key, value in state.items()
                  if key.startswith(self.prefix)}
        if not second:
            raise OptimizerStateError(f"no {self.prefix}* keys: the checkpoint's optimizer "
                                      "state was saved without this part (another "
                                      "expert_parallel?)")
        first = {key: value for key, value in state.items() if not key.startswith(self.prefix)}
        self.second.load_state_dict(second)
        self.first.load_state_dict(first)

    def state_pieces(self, regions: RankRegions, count: bool = True) -> dict[Any, np.ndarray]:
        """Both parts' pieces under their model-wide keys (no prefix: a routed expert's
        state is named as one process names it); the count once."""
        return {**self.first.state_pieces(regions, count),
                **self.second.state_pieces(regions, count=False)}

    def load_state_pieces(self, index: Any, model: Any, regions: RankRegions) -> None:
        self.second.load_state_pieces(index, model, regions)
        self.first.load_state_pieces(index, model, regions)
        self.second.global_step = self.first.global_step

    def reload_main_params_from_model(self) -> None:
        self.first.reload_main_params_from_model()
        self.second.reload_main_params_from_model()

    def groups_summary(self) -> dict[str, list[str]]:
        summary = {key: list(names) for key, names in self.first.groups_summary().items()}
        for key, names in self.second.groups_summary().items():
            summary.setdefault(key, []).extend(names)
        return summary
