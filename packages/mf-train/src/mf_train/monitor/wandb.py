"""Weights & Biases logging, from rank 0: the `wandb` callback (`pip install 'mf-train[wandb]'`).

Configured as an item of `callbacks:` (its keys: `mf_train.settings.wandb.WandbSettings`):

    callbacks:
      - type: wandb
        project: qwen3-tiny
        mode: offline

Every `log_interval` steps, one history row at step `record.step` holds what TensorBoard gets
(`loss`, `lr`, `grad_norm`, `tokens_per_s`, `step_time`, the record's other scalars such as
`tflops` and `mfu`, and every `record.extra` value) and
`consumed_samples` (TensorBoard's `loss_vs_samples` is `loss` against it). wandb is imported
when training begins, on rank 0 only; the other ranks never touch it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..observe.callbacks import Callback, StepRecord, TrainContext
from ..settings.wandb import WandbSettings


class WandbWriter(Callback):
    """The scalars of each logged step in a Weights & Biases run (rank 0 only)."""

    Settings = WandbSettings

    def __init__(self, settings: WandbSettings | None = None):
        self.settings = settings if settings is not None else WandbSettings()
        self.run: Any = None

    def on_train_begin(self, ctx: TrainContext) -> None:
        if not ctx.is_main:
            return
        import wandb

        config = self.settings
        directory = Path(config.dir) if config.dir else ctx.output_dir
        directory.mkdir(parents=True, exist_ok=True)
        self.run = wandb.init(
            project=config.project, entity=config.entity, name=config.name,
            group=config.group, tags=list(config.tags) or None, mode=config.mode,
            dir=str(directory), config={"total_steps": ctx.total_steps,
                                        "world_size": ctx.world_size,
                                        "start_step": ctx.start_step})

    def on_step_end(self, ctx: TrainContext, record: StepRecord) -> None:
        if self.run is None or record.step % self.settings.log_interval:
            return
        self.run.log({**record.scalars(), **record.extra,
                      "consumed_samples": record.consumed_samples}, step=record.step)

    def on_train_end(self, ctx: TrainContext, last: StepRecord | None) -> None:
        if self.run is not None:
            self.run.finish()
            self.run = None
