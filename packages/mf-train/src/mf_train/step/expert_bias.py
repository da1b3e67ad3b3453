"""Auxiliary-loss-free load balancing in the training step (DeepSeek-V3 report, section 2.1.2).

`ExpertBiasUpdate` watches the step (it is a `StepObserver`): after each micro-batch it adds
the model's tokens per expert to the step's counts; `update()`, called once per step by
`TrainStep`, sums them over the ranks that route different tokens (`expert_counts`) and moves
every MoE layer's `e_score_correction_bias` by `rate * sign(mean - counts)`
(`models.moe.updated_expert_bias`). The bias is a non-trainable Parameter of the model: saved
and restored with it by checkpoints, and identical on every rank since every rank applies the
same update to the same counts.

When, as Megatron does it (`finalize_model_grads` -> `_update_router_expert_bias`): once per
optimizer step, from the counts of the whole global batch, on every step including those whose
update is skipped (a non-finite or too large gradient norm). The counts describe the routing
that did happen with the current bias, whatever the gradients were; the bias is not an
optimizer state, and freezing it during a run of skipped steps would only delay balancing. The
update reads no gradient, so it runs after the optimizer update and changes only the next
step's routing.

A model opts in with `expert_bias_update_rate` (> 0) and `update_expert_bias(counts)`
(`DeepseekV3ForCausalLM`, from `moe_router_enable_expert_bias` and
`moe_router_bias_update_rate`); any other model gets `NoExpertBiasUpdate`.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from mf_parallel.runtime import Collectives

from ..layouts.contract import Unobserved
from .expert_counts import StepCounts, global_counts

LOG = logging.getLogger(__name__)


class NoExpertBiasUpdate(Unobserved):
    """The step of a model without a bias to update: an observer of nothing (the counts of
    `ExpertBiasUpdate` come from the routers, no gradient is read), and nothing to update."""

    def update(self) -> None:
        """Nothing to update."""


class ExpertBiasUpdate(NoExpertBiasUpdate):
    """Counts each micro-batch's routing and updates the model's bias once per step.

    Args:
        model: a model with `tokens_per_expert()` and `update_expert_bias(counts)`.
        collectives: this rank's collectives (None in one process).
    """

    def __init__(self, model: Any, collectives: Collectives | None):
        self.model = model
        self.collectives = collectives
        self.step_counts = StepCounts(model)

    @classmethod
    def of(cls, model: Any, collectives: Collectives | None,
           ) -> ExpertBiasUpdate | NoExpertBiasUpdate:
        """The update for `model`, or `NoExpertBiasUpdate` when it has no bias to move (not
        an MoE model, or its update rate is 0 / switched off)."""
        rate = getattr(model, "expert_bias_update_rate", 0.0)
        if not rate:
            return NoExpertBiasUpdate()
        LOG.info("auxiliary-loss-free balancing: e_score_correction_bias += %g * sign(mean - "
                 "tokens per expert) after every step", rate)
        return cls(model, collectives)

    def routed(self, layers: Sequence[int] | None) -> None:
        """Add a micro-batch's routing in these layers to the step's counts."""
        self.step_counts.add_last_forward(layers)

    def update(self) -> None:
        """Sum the step's counts over the routing ranks and update every MoE layer's bias,
        on the device."""
        counts = global_counts(self.step_counts.take(), self.collectives)
        if counts:
            self.model.update_expert_bias(counts)
