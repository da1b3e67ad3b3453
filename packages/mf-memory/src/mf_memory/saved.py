"""What a saved activation is, and the token counts of one device (pure Python)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Geometry:
    """Token counts and degrees of one device, per micro-batch."""

    micro_batch: int
    seq_length: int
    tp: int
    cp: int
    flash: bool
    act_bytes: int
    tiled: bool = False
    ep: int = 1
    """Expert-parallel degree: above 1 the token exchanges keep their rows
    (`mla_moe_activations.moe_tensors`)."""
    """Broadcast operands are repeated to full shape (mf-train on the CPU backend,
    `mla_moe_activations`); the dense reference decoder does not depend on it."""

    @property
    def tokens(self) -> int:
        """T = b S / cp: tokens of one micro-batch on this device (full sequence slice)."""
        return self.micro_batch * self.seq_length // self.cp

    @property
    def sp_tokens(self) -> int:
        """T_sp: tokens of a sequence-parallel tensor, T / t with tensor parallelism."""
        return self.tokens // self.tp


@dataclass(frozen=True)
class Saved:
    """One tensor kept for the backward pass: `elements * itemsize` bytes per micro-batch."""

    name: str
    module: str
    """`input_norm`, `attention`, `post_norm` or `mlp`: what recompute/swap of a module drops."""
    elements: int
    itemsize: int

    @property
    def bytes(self) -> int:
        return self.elements * self.itemsize
