"""Where the run is, as a checkpoint carries it besides the arrays: steps, samples, batch, RNG.

`common.json` holds MindFormers' fields (`epoch_num`, `step_num`, `global_step`, `loss_scale`,
`global_batch_size`, `consumed_samples`) plus mf's `extra` mapping. The random generator
states differ per rank, so each rank writes its own `rng` file beside its arrays.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from .errors import CheckpointError

_COMMON_FIELDS = ("epoch_num", "step_num", "global_step", "loss_scale", "global_batch_size",
                  "consumed_samples")


@dataclass(frozen=True)
class RunProgress:
    """Where the run is: what a resumed run needs besides weights and optimizer state.

    `global_step` counts optimizer updates done (the LR schedule's next input);
    `consumed_samples` the samples read so far (the data position); `step_num` MindFormers'
    total steps of the run; `epoch_num` the data epoch. `rng` is this rank's generator states
    (`capture_rng_state()`; `CheckpointManager.save` captures them when None). `extra` is any
    JSON-serialisable run data the trainer wants back (e.g. skipped-step counters).
    """

    global_step: int
    consumed_samples: int
    global_batch_size: int
    step_num: int = 0
    epoch_num: int = 0
    loss_scale: float = 1.0
    rng: dict[str, Any] | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def common(self) -> dict[str, Any]:
        """The `common.json` fields (without `rng`, which is per rank)."""
        values = {name: getattr(self, name) for name in _COMMON_FIELDS}
        return {**values, "extra": dict(self.extra)}

    def with_rng(self, rng: dict[str, Any] | None) -> RunProgress:
        return dataclasses.replace(self, rng=rng)

    def rescaled(self, global_batch_size: int) -> RunProgress:
        """This state for a run with another global batch size: MindFormers' resume rule
        `global_step = int(global_step * saved_gbs / new_gbs)`, samples unchanged."""
        if global_batch_size == self.global_batch_size:
            return self
        step = int(self.global_step * self.global_batch_size / global_batch_size)
        return dataclasses.replace(self, global_step=step, global_batch_size=global_batch_size)

    @classmethod
    def from_common(cls, common: dict[str, Any], rng: dict[str, Any] | None,
                    where: str) -> RunProgress:
        """The state `common.json` (at `where`) describes; `consumed_samples` falls back to
        `global_step * global_batch_size` as in MindFormers when a checkpoint lacks it."""
        missing = [name for name in ("global_step", "global_batch_size") if name not in common]
        if missing:
            raise CheckpointError(f"{where}: missing {', '.join(missing)}")
        step, batch = common["global_step"], common["global_batch_size"]
        consumed = common.get("consumed_samples")
        return cls(global_step=int(step), global_batch_size=int(batch),
                   consumed_samples=int(step * batch if consumed is None else consumed),
                   step_num=int(common.get("step_num") or 0),
                   epoch_num=int(common.get("epoch_num") or 0),
                   loss_scale=float(common.get("loss_scale") or 1.0),
                   rng=rng, extra=dict(common.get("extra") or {}))
