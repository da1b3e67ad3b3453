"""QK-clip (Kimi K2's MuonClip): after each optimizer step, every attention head whose largest
logit of the step exceeded `qk_clip_threshold` has its query and key weights rescaled so that
that logit would have been the threshold.

For head h with largest pre-softmax logit S_h (`q . k / sqrt(d)` over every query and the keys
it sees, in every micro-batch of the step, on every data- and context-parallel rank), and the
threshold tau: gamma_h = tau / S_h where S_h > tau, else 1; the model scales head h's logits
by gamma_h through its weights (`qk_clip_scales`: for multi-head latent attention the
head-specific query and key parts by sqrt(gamma_h) each, the head-specific rotary query by
gamma_h, the shared rotary key untouched). The attention records S_h as it computes the
scores (`AttentionCore.track_max_logits`); one max all-reduce over the `loss` group (data x
context) a step makes the factors equal on every replica. A skipped step clips nothing.
Nothing is read back to the host. Under tensor parallelism each rank clips its own heads
(their rows are its shards); under pipeline parallelism each stage its own layers.

Muon with `qk_clip_enabled: true` turns it on (`clip_settings`); what it cannot run on is
refused before launch (`mf_train.preflight.support`): models whose attention has no `qk_clip_scales`
(Qwen3 normalises each head's query and key after the projection, so its weights cannot
scale the logits), context parallelism and the fused attention kernel (neither gives the
scores). It keeps the decoder layers in PyNative (`context.compile` has no effect with it).
"""

from __future__ import annotations

from collections.abc import Sequence

from mindspore import Tensor, nn, ops

from mf_config import OptimizerConfig
from mf_config.component_settings import structure_settings
from mf_config.yaml_source import Source
from mf_parallel.runtime import Collectives

from ..registry import OPTIMIZERS
from ..settings.muon import MuonSettings
from . import Muon
from .muon import PATH

LOGITS_GROUP = "loss"
"""The ranks whose forwards saw different tokens of the same weights (data x context)."""


def clip_settings(config: OptimizerConfig, source: Source | None = None) -> MuonSettings | None:
    """Muon's settings when `optimizer` is Muon with `qk_clip_enabled`, else None."""
    cls = OPTIMIZERS.get(config.type, ("optimizer", "type"), source)
    if not (isinstance(cls, type) and issubclass(cls, Muon)):
        return None
    settings = structure_settings(MuonSettings, config.extras, PATH, source)
    return settings if settings.qk_clip_enabled else None


class QKClip:
    """The clip of every attention layer of `model` that has `qk_clip_scales`, after each
    step.

    Args:
        attentions: the attention cells (with `core` and `qk_clip_scales`).
        threshold: tau, `qk_clip_threshold`.
        collectives: this rank's collectives (the max over the `loss` group).
        optimizer: the layout's optimizer, which rescales a parameter and its master
            (`rescale`).
    """

    def __init__(self, attentions: Sequence[nn.Cell], threshold: float,
                 collectives: Collectives, optimizer: object):
        self.attentions, self.threshold = list(attentions), float(threshold)
        self.collectives, self.optimizer = collectives, optimizer
        for attention in self.attentions:
            attention.core.track_max_logits()

    @classmethod
    def of(cls, model: nn.Cell, config: OptimizerConfig, collectives: Collectives,
           optimizer: object, source: Source | None = None) -> QKClip | None:
        """The clip `config` asks for over `model`'s attention layers, or None."""
        settings = clip_settings(config, source)
        if settings is None:
            return None
        attentions = [cell for _, cell in model.cells_and_names()
                      if hasattr(cell, "qk_clip_scales")]
        if not attentions:  # `mf_train.preflight.support` refuses such models before launch
            raise ValueError(f"optimizer.qk_clip_enabled: {type(model).__name__} has no "
                             "attention with per-head query and key weights to clip")
        return cls(attentions, settings.qk_clip_threshold, collectives, optimizer)

    def largest_logits(self) -> Tensor | None:
        """`[layers, heads]`: each head's largest logit since the last call, over the loss
        group (None when no attention ran)."""
        taken = [attention.core.take_max_logits() for attention in self.attentions]
        if not taken or any(t is None for t in taken):
            return None
        return self.collectives.all_reduce(ops.stack(taken), LOGITS_GROUP, op="max")

    def __call__(self, keep: Tensor | None = None) -> None:
        """Clip after a step (a collective over the loss group); with `keep` false (a skipped
        step) nothing changes."""
        largest = self.largest_logits()
        if largest is None:
            return
        over = largest > self.threshold
        if keep is not None:
            over = ops.logical_and(over, keep)
        gamma = ops.select(over, self.threshold / largest, ops.ones_like(largest))
        for attention, factors in zip(self.attentions, gamma, strict=True):
            for param, factor in attention.qk_clip_scales(factors):
                if not self.optimizer.rescale(param, factor):
                    raise ValueError(f"QK-clip: {param.name} is not updated by the optimizer")
