"""AdamW: Adam with bias correction and decoupled weight decay (Loshchilov & Hutter, 2019).

One update at step t (t = 1 for the first), as `torch.optim.AdamW` and MindFormers' PyNative
AdamW compute it, with the parameter p, gradient g, moments m and v:

    p <- p * (1 - lr * wd)
    m <- beta1 * m + (1 - beta1) * g
    v <- beta2 * v + (1 - beta2) * g^2
    p <- p - lr * (m / (1 - beta1^t)) / (sqrt(v / (1 - beta2^t)) + eps)

Everything is float32. The update is element-wise, so `adamw_update` gives the same result on a
whole tensor or on any flat slice of it; mf-parallel's sharded strategies can call it on the
slice a rank owns. `AdamW` applies it to each parameter as one fused operation
(`adamw_update_in_place`).

MindFormers' `enable_fused_opt` / `use_fused` (an Ascend kernel) and `amsgrad` / `maximize`
(only on that kernel) are not offered: the section takes no settings beyond the declared ones
(`settings.adamw.AdamWSettings`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import mindspore as ms
from mindspore import Parameter, Tensor, ops

from mf_config import OptimizerConfig
from mf_config.component_settings import structure_settings
from mf_config.sections import declared_fields
from mf_config.yaml_source import Source

from ..registry import OPTIMIZERS
from ..settings.adamw import AdamWSettings
from .base import ParameterOptimizer, adam_hyperparameters, decay_flags
from .protocol import checked_lr, gated, update_gradient


def adamw_update(param: Tensor, grad: Tensor, exp_avg: Tensor, exp_avg_sq: Tensor, step: int,
                 lr: float, weight_decay: float, betas: tuple[float, float],
                 eps: float) -> tuple[Tensor, Tensor, Tensor]:
    """New `(param, exp_avg, exp_avg_sq)` after AdamW update number `step` (from 1).

    All tensors float32 and of one shape (whole or a slice); nothing is changed in place.
    """
    beta1, beta2 = betas
    if weight_decay:
        param = param * (1.0 - lr * weight_decay)
    exp_avg = exp_avg * beta1 + grad * (1.0 - beta1)
    exp_avg_sq = exp_avg_sq * beta2 + grad * grad * (1.0 - beta2)
    bias_correction1 = 1.0 - beta1**step
    bias_correction2 = 1.0 - beta2**step
    denominator = ops.sqrt(exp_avg_sq / bias_correction2) + eps
    param = param - (lr / bias_correction1) * (exp_avg / denominator)
    return param, exp_avg, exp_avg_sq


_ADAMW_KERNEL = ops.AdamWeightDecay()


def adamw_update_in_place(param: Tensor, grad: Tensor, exp_avg: Tensor, exp_avg_sq: Tensor,
                          step: int, lr: float, weight_decay: float,
                          betas: tuple[float, float], eps: float,
                          keep: Tensor | None = None) -> None:
    """`adamw_update` as one fused operation that changes `param`, `exp_avg` and `exp_avg_sq`
    in place (`ops.AdamWeightDecay`, which has CPU, GPU and Ascend kernels).

    Why: the formula above costs about 12 operations per parameter tensor; in PyNative each is
    a launch and a pass over memory, so a 28M-parameter model spent 0.5-0.8 s per step in
    AdamW against 0.09 s with this kernel (benchmarks/README.md). The kernel has no bias
    correction and applies the decay inside the update,
    `p <- p - lr' * (m / (sqrt(v) + eps') + wd' * p)`, so the corrections are folded into its
    arguments: `lr' = lr * sqrt(bc2) / bc1`, `eps' = eps * sqrt(bc2)`,
    `wd' = wd * bc1 / sqrt(bc2)` (bc = 1 - beta^step), which is the same update up to float32
    rounding (tests/train/test_optim.py compares the two over 20 steps).

    With `keep` (a 0-d bool tensor; `grad` must then be zero where it is false), the rate
    and the decays are chosen on the device: `lr' = 0` and both betas 1 where the update does
    not apply, which leaves `param` and the moments exactly as they were.
    """
    beta1, beta2 = betas
    rate, epsilon, decay = _folded_corrections(step, betas)
    _ADAMW_KERNEL(param, exp_avg, exp_avg_sq, gated(lr * rate, keep, 0.0),
                  gated(beta1, keep, 1.0), gated(beta2, keep, 1.0),
                  eps * epsilon, weight_decay * decay, grad)


def _folded_corrections(step: int, betas: tuple[float, float]) -> tuple[float, float, float]:
    """The factors of update `step`'s bias corrections folded into the fused kernel's lr, eps
    and weight decay: `sqrt(bc2) / bc1`, `sqrt(bc2)`, `bc1 / sqrt(bc2)`."""
    correction1 = 1.0 - betas[0]**step
    root_correction2 = math.sqrt(1.0 - betas[1]**step)
    return root_correction2 / correction1, root_correction2, correction1 / root_correction2


class AdamMoments:
    """The `adam_m.<name>` / `adam_v.<name>` moments of a set of parameters of an optimizer."""

    def __init__(self, optimizer: ParameterOptimizer, indices: Sequence[int],
                 betas: tuple[float, float], eps: float):
        self.optimizer = optimizer
        self.betas = betas
        self.eps = eps
        self.keys = {index: (optimizer.add_state("adam_m", index),
                             optimizer.add_state("adam_v", index)) for index in indices}

    def update(self, index: int, value: Tensor, grad: Tensor, lr: float,
               weight_decay: float, keep: Tensor | None = None) -> Tensor:
        """Parameter `index`'s float32 `value` (the parameter or its master), updated in place
        with its moments (unless `keep` is false); returned for
        `ParameterOptimizer._write`."""
        m_key, v_key = self.keys[index]
        adamw_update_in_place(value, grad, self.optimizer.state[m_key],
                              self.optimizer.state[v_key], self.optimizer.global_step, lr,
                              weight_decay, self.betas, self.eps, keep)
        return value


@OPTIMIZERS.register("AdamW", "adamw")
class AdamW(ParameterOptimizer):
    """AdamW over named parameters, with MindFormers' weight-decay groups."""

    def __init__(self, named_params: Sequence[tuple[str, Parameter]], *,
                 betas: tuple[float, float] = (0.9, 0.95), eps: float = 1e-8,
                 weight_decay: float = 0.0, decays: Sequence[bool] | None = None):
        super().__init__(named_params, weight_decay,
                         [True] * len(named_params) if decays is None else decays)
        self.betas = betas
        self.eps = eps
        self.moments = AdamMoments(self, range(len(self.params)), betas, eps)

    @classmethod
    def from_config(cls, config: OptimizerConfig, named_params: Sequence[tuple[str, Parameter]],
                    source: Source | None = None) -> AdamW:
        """AdamW from the `optimizer` section (which must hold no keys beyond its own)."""
        adamw_settings(config, source)
        betas, eps = adam_hyperparameters(config, source)
        return cls(named_params, betas=betas, eps=eps, weight_decay=config.weight_decay,
                   decays=decay_flags(config, named_params, source))

    def _update(self, index: int, value: Tensor, grad: Tensor, lr: float,
                weight_decay: float, keep: Tensor | None) -> Tensor:
        return self.moments.update(index, value, grad, lr, weight_decay, keep)

    # --- every parameter's update as one graph (`context.compile`) -----------------------

    _graph: Callable[..., Tensor] | None = None

    def compile_blocker(self) -> str | None:
        """Why `compile_update` cannot run this optimizer's steps as one graph, or None."""
        if self._masters:
            return "low-precision parameters keep float32 masters, cast back after the update"
        return None

    def compile_update(self, wrap: Callable[[Callable[..., Tensor]], Callable[..., Tensor]]
                       = lambda graph: graph) -> None:
        """Run every later `step` as one compiled graph (`mindspore.jit`): the clipping,
        the skip gate and one fused AdamW kernel per parameter, the parameters and moments
        updated in place as the PyNative `step` does (the same kernel, the same arguments).
        Why: a PyNative operation costs about 40 us to launch here, and the update is two per
        parameter; one graph launches none from Python (benchmarks/README.md, "speed.py").
        `compile_blocker()` must be None; `wrap` is given the graph to wrap (a compile
        timer)."""
        params, count, (beta1, beta2) = list(self.params), len(self.params), self.betas
        decays = sorted(set(self.weight_decays))  # two at most: weight_decay and 0
        decay_of = [decays.index(decay) for decay in self.weight_decays]

        def update(clip: Tensor, keep: Tensor | None, lr: Tensor, eps: Tensor,
                   decay_scale: Tensor, *tensors: Tensor) -> Tensor:
            grads, exp_avgs, exp_avg_sqs = (tensors[:count], tensors[count:2 * count],
                                            tensors[2 * count:])
            first, second = ops.scalar_to_tensor(beta1), ops.scalar_to_tensor(beta2)
            scaled = []
            for decay in decays:
                scaled.append(decay_scale * decay)
            if keep is not None:  # where the update does not apply: rate 0, both betas 1
                lr = ops.select(keep, lr, ops.zeros_like(lr))
                first = ops.select(keep, first, ops.ones_like(first))
                second = ops.select(keep, second, ops.ones_like(second))
            for index, param in enumerate(params):
                grad = update_gradient(grads[index], clip, keep)
                _ADAMW_KERNEL(param, exp_avgs[index], exp_avg_sqs[index], lr, first, second,
                              eps, scaled[decay_of[index]], grad)
            return lr

        self._graph = wrap(ms.jit(update))

    def step(self, grads: Sequence[Tensor], lr: float, clip: float | Tensor = 1.0,
             keep: Tensor | None = None) -> None:
        """`ParameterOptimizer.step`, as one graph once `compile_update` ran."""
        if self._graph is None:
            super().step(grads, lr, clip, keep)
            return
        lr = checked_lr(lr)
        self._check_grads(grads)
        self.global_step += 1
        rate, epsilon, decay = _folded_corrections(self.global_step, self.betas)
        m_keys, v_keys = zip(*(self.moments.keys[i] for i in range(len(self.params))),
                             strict=True)
        self._graph(clip if isinstance(clip, Tensor) else Tensor(clip, ms.float32), keep,
                    Tensor(lr * rate, ms.float32), Tensor(self.eps * epsilon, ms.float32),
                    Tensor(decay, ms.float32),
                    *grads, *(self.state[key] for key in m_keys),
                    *(self.state[key] for key in v_keys))


def adamw_settings(config: OptimizerConfig, source: Source | None = None) -> AdamWSettings:
    """Check that the `optimizer` section holds no keys beyond its own (AdamW reads none)."""
    return structure_settings(AdamWSettings, config.extras, ("optimizer",), source,
                              owner=f"optimizer type {config.type!r}",
                              also_allowed=declared_fields(OptimizerConfig))
