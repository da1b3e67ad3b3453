"""Tokens per expert of MoE layers, every `save_tokens_per_expert_interval` steps.

`monitor.moe_monitor` (`MoeMonitorConfig`): on each step `s` with
`s % save_tokens_per_expert_interval == 0` the monitor reads the model's
`tokens_per_expert()` (global layer index -> int counts `[n_routed_experts]`, each summing to
tokens * num_experts_per_tok; `DeepseekV3ForCausalLM` provides it) for the `target_layers`
(null = every MoE layer; an int N = layers 0..N-1, as MindFormers; a list = those layers) and
puts into `record.extra` the counts of the whole step: summed over its micro-batches and over
every rank that routes different tokens (the loss and tensor groups, `mf_train.step.expert_counts`),
the numbers the auxiliary-loss-free bias update sees:

    moe/layer{L}/expert{e}              tokens routed to expert e of layer L in the step
    moe/layer{L}/max_over_mean          load imbalance: the busiest expert's count over the mean
    moe/layer{L}/rank{r}/max_over_mean  the same of the tokens rank r routed (more than one
                                        routing rank only): which rank's data is skewed
    moe/layer{L}/rank{r}/processed      (token, expert) pairs rank r's experts computed, under
                                        expert parallelism (the model's `expert_load()`): which
                                        rank the dispatch loads most

Per-expert counts per rank would be ranks x layers x experts scalars (118,784 for the 671B model
on 8 ranks), too many for TensorBoard; the imbalance per rank is one number per rank and layer,
and each rank's own counts go to its own file, `<output_dir>/moe_tokens/rank_<r>.jsonl`
(appended, never through a symbolic link): one JSON line per layer and recorded step
(`{"step": 100, "layer": 3, "rank": 1, "tpe": [...]}`, the shape of MindFormers'
Megatron-format record plus the rank), off the console.

The collective runs on the recorded steps, on every rank (the interval and the layers are the
same everywhere; `TrainContext.collectives`, None in one process).

`tokens_per_expert()` reports the last forward. With gradient accumulation the loop calls
`record_forward()` after each micro-batch's forward, and the step's counts are the sum over
its micro-batches; without those calls the monitor reads the model once at the step's end
(the last micro-batch only). `record_forward()` does nothing on steps that are not recorded.
Under pipeline parallelism a stage holds and counts only its layers; the stages' tables are
then summed over the pipeline group (`expert_counts.across_stages`), so every rank's record,
rank 0's metrics included, has every stage's layers; each rank's own file has its own.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from mf_config import MoeMonitorConfig
from mf_config.component_settings import settings_error
from mf_config.model_shape import ModelSettings
from mf_config.yaml_source import Source

from ..no_follow import open_no_follow
from ..observe.callbacks import Callback, StepRecord, TrainContext
from ..step.expert_counts import StepCounts, across_stages, per_rank_counts

logger = logging.getLogger(__name__)

PATH = ("monitor", "moe_monitor")
TOKENS_DIR = "moe_tokens"
"""Under the output directory: each rank's own tokens per expert (`rank_<r>.jsonl`)."""


class MoeMonitor(Callback):
    """Collects tokens per expert on recorded steps; see the module docstring."""

    def __init__(self, config: MoeMonitorConfig | None = None, source: Source | None = None):
        config = config if config is not None else MoeMonitorConfig()
        self.interval = config.save_tokens_per_expert_interval
        self.target_layers = _target_layers(config.target_layers, source)
        self._due = False
        self._counts: StepCounts | None = None
        self._loads: StepCounts | None = None
        """Under expert parallelism, the pairs this rank's experts computed."""
        self._warned = False

    @property
    def active(self) -> bool:
        return self.interval is not None

    def on_train_begin(self, ctx: TrainContext) -> None:
        """A model without MoE layers turns the monitor off. Validation has said so already
        (with the line) for a model built from declared settings (`model.settings`, a
        `ModelSettings`: `rules.moe_monitor_layer_warnings`); only another model is said
        here, once."""
        if self.active and not callable(getattr(ctx.model, "tokens_per_expert", None)):
            if not isinstance(getattr(ctx.model, "settings", None), ModelSettings):
                logger.warning("monitor.moe_monitor.save_tokens_per_expert_interval is set, "
                               "but the model (%s) has no MoE layers (no tokens_per_expert()); "
                               "MoE monitoring is off", type(ctx.model).__name__)
            self.interval = None

    def on_step_begin(self, ctx: TrainContext, step: int) -> None:
        self._due = self.interval is not None and step % self.interval == 0
        if self._due and self._counts is None:
            self._counts = StepCounts(ctx.model)
            collectives = ctx.collectives
            if (collectives is not None and collectives.comm.group_size("expert") > 1
                    and callable(getattr(ctx.model, "expert_load", None))):
                self._loads = StepCounts(ctx.model, "expert_load")

    def record_forward(self, layers: Sequence[int] | None = None) -> None:
        """Add the last forward's counts of these layers (None: all) to the step's (on
        recorded steps only)."""
        if not self._due or self._counts is None:
            return
        for step_counts in (self._counts, self._loads):
            if step_counts is not None:
                step_counts.add_last_forward(layers)

    def on_step_end(self, ctx: TrainContext, record: StepRecord) -> None:
        if not self._due or self._counts is None:
            return
        counts = self._targets(self._counts.take())
        ranks, per_rank = per_rank_counts(counts, ctx.collectives)
        tables = across_stages(per_rank, ranks, ctx.collectives)
        processed = self._processed(ctx)
        for layer, (rows, table) in sorted(tables.items()):  # rows: the stage's ranks
            record.extra.update(_extras(layer, table.sum(0)))
            if len(rows) > 1:
                for index, rank in enumerate(rows):
                    loads = processed[layer][index] if layer in processed else None
                    record.extra.update(_rank_extras(layer, rank, table[index], loads))
        self._write_own_counts(ctx, record.step, counts)
        self._due = False

    @staticmethod
    def _write_own_counts(ctx: TrainContext, step: int, counts: Mapping[int, np.ndarray]) -> None:
        """Append this rank's counts of `step`, one JSON line per layer, to its own file."""
        path = Path(ctx.output_dir) / TOKENS_DIR / f"rank_{ctx.rank}.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        lines = "".join(json.dumps({"step": step, "layer": layer, "rank": ctx.rank,
                                    "tpe": counts[layer].tolist()}) + "\n"
                        for layer in sorted(counts))
        with os.fdopen(open_no_follow(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT), "a",
                       encoding="utf-8") as stream:
            stream.write(lines)

    def _processed(self, ctx: TrainContext) -> dict[int, np.ndarray]:
        """Layer -> `[ranks, n_routed_experts]` pairs each rank's experts computed in the step
        (rows as `per_rank_counts`'), of every pipeline stage; empty without expert
        parallelism."""
        if self._loads is None:
            return {}
        ranks, tables = per_rank_counts(self._targets(self._loads.take()), ctx.collectives)
        return {layer: table for layer, (_, table) in
                across_stages(tables, ranks, ctx.collectives).items()}

    def _targets(self, counts: Mapping[int, np.ndarray]) -> dict[int, np.ndarray]:
        """The target layers' counts (all MoE layers without `target_layers`)."""
        layers = set(counts) if self.target_layers is None else self.target_layers & set(counts)
        self._warn_missing(set(counts))
        return {layer: counts[layer] for layer in layers}

    def _warn_missing(self, present: set[int]) -> None:
        if self._warned or self.target_layers is None:
            return
        self._warned = True
        missing = sorted(self.target_layers - present)
        if missing:
            logger.warning("monitor.moe_monitor.target_layers: layers %s are not MoE layers "
                           "of this model (or not on this pipeline stage); MoE layers here: %s",
                           missing, sorted(present))


def _target_layers(setting: int | list[int] | None, source: Source | None) -> set[int] | None:
    path = (*PATH, "target_layers")
    if setting is None:
        return None
    if isinstance(setting, int):
        if setting <= 0:
            raise settings_error([(path, f"an int selects layers 0..N-1 and must be > 0, got "
                                         f"{setting}; or give a list of layer ids")], source)
        return set(range(setting))
    negative = [layer for layer in setting if layer < 0]
    if negative:
        raise settings_error([(path, f"layer ids must be >= 0, got {negative}")], source)
    return set(setting)


def _extras(layer: int, counts: np.ndarray) -> dict[str, float]:
    """The step's global counts of one layer and their imbalance."""
    prefix = f"moe/layer{layer}"
    extras = {f"{prefix}/expert{expert}": float(count) for expert, count in enumerate(counts)}
    extras.update(_imbalance(prefix, counts))
    return extras


def _rank_extras(layer: int, rank: int, routed: np.ndarray,
                 processed: np.ndarray | None) -> dict[str, float]:
    """One rank's share of a layer: the imbalance of the tokens it routed and, under expert
    parallelism, the (token, expert) pairs its own experts computed."""
    extras = _imbalance(f"moe/layer{layer}/rank{rank}", routed)
    if processed is not None:
        extras[f"moe/layer{layer}/rank{rank}/processed"] = float(processed.sum())
    return extras


def _imbalance(prefix: str, counts: np.ndarray) -> dict[str, float]:
    """`{prefix}/max_over_mean`, when any token was routed."""
    mean = counts.mean() if counts.size else 0.0
    return {f"{prefix}/max_over_mean": float(counts.max() / mean)} if mean > 0 else {}
