"""The keys of the `optimizer` section Muon reads beyond the declared ones (MindFormers'
names; the update is in `mf_train.optim.muon`).

No `from __future__ import annotations` here: cattrs reads the field types at run time.
"""

from typing import Any

from mf_config.sections import Section, section, setting

DEFAULT_COEFFICIENTS = [3.4445, -4.7750, 2.0315]


@section
class MuonSettings(Section):
    """The keys of `optimizer` that Muon reads beyond the declared ones (MindFormers' names)."""

    momentum: float = setting(0.95, "Momentum of the Muon buffer.", ge=0, le=1)
    nesterov: bool = setting(True, "Nesterov momentum (update from G + momentum * B).")
    ns_steps: int = setting(5, "Newton-Schulz iterations (with flat ns_coefficients).", gt=0)
    ns_coefficients: list[Any] = setting(
        DEFAULT_COEFFICIENTS, "Quintic coefficients [a, b, c] for every step, or a schedule "
        "[[[a, b, c], count], ...] whose counts add up to the number of steps.")
    ns_eps: float = setting(1e-7, "Floor of the Frobenius norm the update is divided by.", gt=0)
    matched_adamw_rms: float = setting(
        0.2, "Update RMS relative to lr: scale lr * this * sqrt(max(rows, cols)).", gt=0)
    adamw_betas: list[float] | None = setting(
        None, "Betas of the AdamW-updated parameters; null uses optimizer.betas.")
    adamw_eps: float | None = setting(
        None, "Eps of the AdamW-updated parameters; null uses optimizer.eps.", gt=0)
    adamw_include: list[str] = setting(
        ["*embed*", "*lm_head*", "*output_layer*"],
        "Rules of 2-D parameters updated by AdamW instead of Muon (embeddings, output head).")
    qk_clip_enabled: bool = setting(
        False, "QK-clip (Kimi K2's MuonClip): after each step, rescale the query and key "
        "weights of every head whose largest attention logit exceeded qk_clip_threshold.")
    qk_clip_threshold: float = setting(100.0, "QK-clip threshold tau of the largest logit.",
                                       gt=0)
