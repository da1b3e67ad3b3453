"""Muon: momentum orthogonalised by Newton-Schulz (Keller Jordan, 2024), with Moonlight's
update scaling (Liu et al., "Muon is Scalable for LLM Training", 2025), as MindFormers'
PyNative `Muon` computes it for hidden weight matrices; every other parameter is updated by
AdamW.

For a 2-D hidden weight W (rows x cols) with gradient G and momentum buffer B, step at rate lr:

    B <- momentum * B + G
    U <- G + momentum * B          (nesterov; plain momentum: U <- B)
    O <- NewtonSchulz(U)           (about the orthogonal factor of U, see `newton_schulz`)
    W <- W * (1 - lr * wd) - lr * matched_adamw_rms * sqrt(max(rows, cols)) * O

An orthogonal rows x cols matrix has RMS 1/sqrt(max(rows, cols)), so the scale gives the update
an RMS of about `matched_adamw_rms` * lr, the RMS of a typical AdamW update: Muon then works
with AdamW's learning rate and weight decay (Moonlight, section 2.2).

Which parameters use Muon: 2-D parameters whose name matches none of `adamw_include`
(default: embeddings and output head, "*embed*", "*lm_head*", "*output_layer*"). Everything else
(1-D norms and biases, embeddings, the head) goes to AdamW with `adamw_betas` / `adamw_eps`,
which default to the section's `betas` / `eps`. Both share the learning rate and the weight
decay groups of `param_groups`. Rules match like the weight-decay rules: equal, substring or
fnmatch pattern.

Differences from MindFormers (`mindformers/pynative/optimizer/muon.py`):
- Newton-Schulz runs in float32 (MindFormers: bfloat16 on Ascend); CPU has no bfloat16 matmul.
- `adamw_betas` / `adamw_eps` default to `betas` / `eps` (MindFormers: (0.95, 0.95) and 1e-8;
  it passes `eps` on as the Newton-Schulz epsilon, called `ns_eps` here).
- QK-clip (`qk_clip_enabled`, MindFormers' default true for its MLA models) defaults to false
  here; true runs `mf_train.optim.qk_clip` after each step, on DeepSeek-V3's multi-head latent
  attention (what it is refused for is `mf_train.preflight.support`'s).
- 3-D grouped expert weights are updated by AdamW, not by Muon; there are no communication
  strategies (mf-parallel gathers what it shards).
- The `adamw_include` default adds Hugging Face names ("*embed*", "*lm_head*") to MindFormers'
  ("*word_embeddings*", "*output_layer*").

The keys are `settings.muon.MuonSettings` (MindSpore-free, so that `mf-config validate`
checks them).
"""

import math
from collections.abc import Sequence
from typing import Any

from mindspore import Parameter, Tensor, mint, ops

from mf_config import OptimizerConfig
from mf_config.component_settings import settings_error, structure_settings
from mf_config.errors import Path
from mf_config.yaml_source import Source

from ..registry import OPTIMIZERS
from ..settings.muon import MuonSettings
from .adamw import AdamMoments
from .base import ParameterOptimizer, adam_hyperparameters, decay_flags
from .param_groups import check_rules, matching_rule

Coefficients = tuple[tuple[float, float, float], ...]
PATH: Path = ("optimizer",)


def newton_schulz(matrix: Tensor, coefficients: Coefficients, eps: float = 1e-7) -> Tensor:
    """About the orthogonal factor U V^T of `matrix` = U S V^T (2-D, float32).

    X <- matrix / max(||matrix||_F, eps), transposed when it has more rows than columns (so
    that X X^T is the smaller Gram matrix); then for each (a, b, c):
    A = X X^T, X <- a X + (b A + c A A) X, which maps each singular value s to
    a s + b s^3 + c s^5. The default quintic (3.4445, -4.7750, 2.0315) pushes small singular
    values up fast and, after 5 steps, leaves them in about [0.7, 1.2] rather than exactly 1.
    """
    transposed = matrix.shape[0] > matrix.shape[1]
    x = matrix.T if transposed else matrix
    norm = ops.sqrt((x * x).sum())
    x = x / ops.clamp(norm, min=eps)
    for a, b, c in coefficients:
        gram = mint.matmul(x, x.T)
        polynomial = gram * b + mint.matmul(gram, gram) * c
        x = x * a + mint.matmul(polynomial, x)
    return x.T if transposed else x


def muon_update(param: Tensor, grad: Tensor, momentum_buffer: Tensor, lr: float,
                weight_decay: float, settings: MuonSettings,
                coefficients: Coefficients) -> tuple[Tensor, Tensor]:
    """New `(param, momentum_buffer)` of one whole 2-D float32 matrix (Newton-Schulz needs the
    whole matrix, so a sharded strategy gathers it first)."""
    momentum = settings.momentum
    momentum_buffer = momentum_buffer * momentum + grad
    direction = grad + momentum_buffer * momentum if settings.nesterov else momentum_buffer
    orthogonal = newton_schulz(direction, coefficients, settings.ns_eps)
    scale = lr * settings.matched_adamw_rms * math.sqrt(max(param.shape))
    if weight_decay:
        param = param * (1.0 - lr * weight_decay)
    return param - orthogonal * scale, momentum_buffer


def uses_muon(name: str, ndim: int, adamw_include: Sequence[str]) -> bool:
    """Whether Muon (rather than AdamW) updates the parameter `name` of `ndim` dimensions."""
    return ndim == 2 and matching_rule(name, adamw_include) is None


@OPTIMIZERS.register("Muon", "muon")
class Muon(ParameterOptimizer):
    """Muon for hidden weight matrices, AdamW for every other parameter."""

    def __init__(self, named_params: Sequence[tuple[str, Parameter]], *,
                 settings: MuonSettings | None = None, betas: tuple[float, float] = (0.9, 0.95),
                 eps: float = 1e-8, weight_decay: float = 0.0,
                 decays: Sequence[bool] | None = None):
        super().__init__(named_params, weight_decay,
                         [True] * len(named_params) if decays is None else decays)
        self.settings = settings or MuonSettings()
        self.coefficients = ns_schedule(self.settings, set())
        self.use_muon = [uses_muon(name, len(param.shape), self.settings.adamw_include)
                         for name, param in zip(self.names, self.params, strict=True)]
        self.muon_keys = {index: self.add_state("muon_m", index)
                          for index, muon in enumerate(self.use_muon) if muon}
        self.moments = AdamMoments(
            self, [index for index, muon in enumerate(self.use_muon) if not muon], betas, eps)

    @classmethod
    def from_config(cls, config: OptimizerConfig, named_params: Sequence[tuple[str, Parameter]],
                    source: Source | None = None) -> "Muon":
        """Muon from the `optimizer` section; its extra keys are `MuonSettings`."""
        settings = structure_settings(MuonSettings, config.extras, PATH, source)
        _check_settings(settings, set(config.extras), source)
        betas, eps = adam_hyperparameters(config, source)
        if settings.adamw_betas is not None:
            betas = (float(settings.adamw_betas[0]), float(settings.adamw_betas[1]))
        if settings.adamw_eps is not None:
            eps = float(settings.adamw_eps)
        return cls(named_params, settings=settings, betas=betas, eps=eps,
                   weight_decay=config.weight_decay,
                   decays=decay_flags(config, named_params, source))

    def groups_summary(self) -> dict[str, list[str]]:
        """Weight-decay groups, and which parameters Muon and AdamW update."""
        summary = super().groups_summary()
        summary["muon"] = [n for n, m in zip(self.names, self.use_muon, strict=True) if m]
        summary["adamw"] = [n for n, m in zip(self.names, self.use_muon, strict=True) if not m]
        return summary

    def _update(self, index: int, value: Tensor, grad: Tensor, lr: float,
                weight_decay: float, keep: Tensor | None) -> Tensor:
        if not self.use_muon[index]:
            return self.moments.update(index, value, grad, lr, weight_decay, keep)
        key = self.muon_keys[index]
        new, momentum = muon_update(value, grad, self.state[key], lr, weight_decay,
                                    self.settings, self.coefficients)
        if keep is not None:  # not in place: keep the old tensors where the step is skipped
            new = ops.select(keep, new, value)
            momentum = ops.select(keep, momentum, self.state[key])
        self.state[key] = momentum
        return new


def ns_schedule(settings: MuonSettings, given: set[str],
                source: Source | None = None) -> Coefficients:
    """The (a, b, c) of every Newton-Schulz step, from the flat or the segmented form of
    `ns_coefficients` (MindFormers' two forms); `ConfigError` when it is neither."""
    raw = settings.ns_coefficients
    path = (*PATH, "ns_coefficients")
    if _is_triple(raw):
        return tuple(tuple(float(v) for v in raw) for _ in range(settings.ns_steps))
    if not raw or not all(_is_segment(segment) for segment in raw):
        raise settings_error([(path, "expected three numbers [a, b, c], or segments "
                                     "[[[a, b, c], count], ...] with counts >= 1")], source)
    schedule = tuple(tuple(float(v) for v in triple) for triple, count in raw
                     for _ in range(count))
    if "ns_steps" in given and settings.ns_steps != len(schedule):
        raise settings_error([((*PATH, "ns_steps"), f"is {settings.ns_steps} but the "
                                                    f"ns_coefficients segments add up to "
                                                    f"{len(schedule)} steps")], source)
    return schedule


def _check_settings(settings: MuonSettings, given: set[str], source: Source | None) -> None:
    found = []
    betas = settings.adamw_betas
    if betas is not None and (len(betas) != 2 or not all(0.0 <= b < 1.0 for b in betas)):
        found.append(((*PATH, "adamw_betas"), f"must be two numbers [beta1, beta2], each >= 0 "
                                              f"and < 1, got {betas}"))
    if found:
        raise settings_error(found, source)
    check_rules(settings.adamw_include, (*PATH, "adamw_include"), source)
    ns_schedule(settings, given, source)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _is_triple(value: Any) -> bool:
    return (isinstance(value, (list, tuple)) and len(value) == 3
            and all(_is_number(v) for v in value))


def _is_segment(value: Any) -> bool:
    return (isinstance(value, (list, tuple)) and len(value) == 2 and _is_triple(value[0])
            and isinstance(value[1], int) and not isinstance(value[1], bool) and value[1] >= 1)
