"""What the optimizers that update each parameter whole (AdamW, Muon) share: the parameters,
their float32 masters, the named state and the update count, with a state dict of numpy arrays
for checkpoints (`protocol.Optimizer` is the interface; `ShardedAdamW` is its other kind).

Updates are computed in float32. A float32 parameter is updated in place; a float16 or
bfloat16 parameter gets a float32 master copy (`main_param.<name>`, MindFormers' name), which
the optimizer updates and then casts back into the parameter, so small updates are not lost to
rounding. After loading weights into the model without optimizer state, call
`reload_main_params_from_model()` so that the masters follow the loaded weights.

State names are MindFormers' (`adam_m.<name>`, `adam_v.<name>`, `muon_m.<name>`,
`main_param.<name>`, `global_step`), so a state dict reads like MindFormers' optimizer
checkpoint.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Mapping, Sequence
from contextvars import ContextVar
from typing import Any

import mindspore as ms
import numpy as np
from mindspore import Parameter, Tensor, ops

from mf_config import OptimizerConfig
from mf_config.component_settings import settings_error
from mf_config.yaml_source import Source
from mf_parallel.runtime.flat_shard import built_shape

from ..checkpoint.regions import Held, RankRegions, check, pieces, read
from .param_groups import check_rules, unmatched_rules, weight_decay_flags
from .protocol import (
    FLOAT32,
    STEP_KEY,
    OptimizerStateError,
    checked_lr,
    counted,
    read_count,
    update_gradient,
)

LOW_PRECISION = (ms.float16, ms.bfloat16)
MASTER_PREFIX = "main_param"
_MAX_LISTED = 8


class ParameterOptimizer:
    """Base of the optimizers that update each parameter whole (`protocol.Optimizer`).

    Subclasses create their state with `add_state` and implement `_update`, which returns the
    new float32 value of one parameter. `step(grads, lr)` checks the gradients, counts the
    update and writes every new value back into the model's parameters. `state` maps each
    state-dict key (`adam_m.<name>`, ...) to its float32 tensor, for inspection.
    """

    def __init__(self, named_params: Sequence[tuple[str, Parameter]], weight_decay: float,
                 decays: Sequence[bool]):
        self.names, self.params = _checked_params(named_params)
        self._positions = {name: index for index, name in enumerate(self.names)}
        self.decays = list(decays)
        if len(self.decays) != len(self.params):
            raise ValueError(f"got {len(self.decays)} weight-decay flags for "
                             f"{len(self.params)} parameters")
        self.weight_decays = [weight_decay if decay else 0.0 for decay in self.decays]
        self.global_step = 0
        self._masters: dict[int, Tensor] = {
            index: ops.cast(param, FLOAT32)
            for index, param in enumerate(self.params) if param.dtype in LOW_PRECISION}
        self.state: dict[str, Tensor] = {}
        _warn_if_bf16_on_cpu(self.names, self.params)

    # ----- the training loop's interface -----

    def step(self, grads: Sequence[Tensor], lr: float, clip: float | Tensor = 1.0,
             keep: Tensor | None = None) -> None:
        """One update of every parameter from `grads` (same order as `params`) at rate `lr`,
        the gradients scaled by `clip` first (1: unclipped); with `keep` false, nothing
        changes (`protocol.Optimizer.step`)."""
        lr = checked_lr(lr)
        self._check_grads(grads)
        self.global_step += 1
        for index, (param, grad) in enumerate(zip(self.params, grads, strict=True)):
            value = self._masters.get(index, param)
            grad = update_gradient(grad, clip, keep)
            new_value = self._update(index, value, grad, lr, self.weight_decays[index], keep)
            self._write(index, new_value)

    def uncount(self) -> None:
        self.global_step -= 1

    def rescale(self, param: Parameter, factor: Tensor) -> bool:
        """Multiply `param` (its float32 master where it has one) by `factor`, broadcasting:
        a change made between updates (QK-clip). False when `param` is not this
        optimizer's."""
        index = next((i for i, p in enumerate(self.params) if p is param), None)
        if index is None:
            return False
        self._write(index, self._masters.get(index, param) * factor)
        return True

    def state_dict(self) -> dict[str, np.ndarray]:
        """Copies of the update count, the masters and the state, as numpy arrays."""
        state = {STEP_KEY: np.array([self.global_step], dtype=np.int64)}
        for index, master in self._masters.items():
            state[f"{MASTER_PREFIX}.{self.names[index]}"] = master.asnumpy().copy()
        for key, value in self.state.items():
            state[key] = value.asnumpy().copy()
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore what `state_dict` returned; `OptimizerStateError` naming every missing,
        unexpected or mis-shaped key, before anything is changed."""
        expected = self._expected_shapes()
        problems = _key_problems(state, expected)
        arrays = {}
        for key in expected.keys() & state.keys():
            array, problem = _checked_array(key, state[key], expected[key])
            if problem:
                problems.append(problem)
            arrays[key] = array
        if problems:
            raise OptimizerStateError(f"{type(self).__name__} state dict does not fit:\n  "
                                      + "\n  ".join(problems))
        self.global_step = int(arrays.pop(STEP_KEY).reshape(()))
        for key, array in arrays.items():
            self._set_loaded(key, Tensor(array.copy()))

    def state_pieces(self, regions: RankRegions, count: bool = True) -> dict[Any, Any]:
        """The update count (on the rank that writes scalars, with `count`) and each state
        tensor's region this rank owns (`protocol.Optimizer`)."""
        masters, moments = self._held()
        return counted(pieces([*masters, *moments], regions), self.global_step, regions, count)

    def load_state_pieces(self, index: Any, model: Any, regions: RankRegions) -> None:
        """Every state tensor's region read by overlap; a master the checkpoint lacks from
        the model's pieces (`protocol.Optimizer`). Names and shapes are checked first
        (nothing changes on a mismatch); then each tensor is read and replaces the one it
        restores before the next is read, so loading holds one tensor beside the state."""
        masters, moments = self._held()
        step = read_count(index, [*check(moments, regions, index),
                                  *check(masters, regions, index, model)], type(self).__name__)
        for item in masters:
            self._set_loaded(item.key, Tensor(read(item, regions, index, model), FLOAT32))
        for item in moments:
            self._set_loaded(item.key, Tensor(read(item, regions, index), FLOAT32))
        self.global_step = step

    def _held(self) -> tuple[list[Held], list[Held]]:
        """The float32 masters and the state, as a checkpoint stores them."""
        masters = [Held(f"{MASTER_PREFIX}.{self.names[index]}", self.names[index],
                        master.shape, master) for index, master in self._masters.items()]
        moments = [Held(key, key.partition(".")[2], value.shape, value)
                   for key, value in self.state.items()]
        return masters, moments

    def reload_main_params_from_model(self) -> None:
        """Set the float32 masters from the model's (low-precision) parameters, after weights
        were loaded into the model without optimizer state."""
        for index in self._masters:
            self._masters[index] = ops.cast(self.params[index], FLOAT32)

    def groups_summary(self) -> dict[str, list[str]]:
        """Parameter names by weight-decay group (MindFormers' group names)."""
        return {"weight_decay": [n for n, d in zip(self.names, self.decays, strict=True) if d],
                "no_weight_decay": [n for n, d in zip(self.names, self.decays, strict=True)
                                    if not d]}

    # ----- for subclasses -----

    def _update(self, index: int, value: Tensor, grad: Tensor, lr: float,
                weight_decay: float, keep: Tensor | None) -> Tensor:
        """The new float32 value of parameter `index` (`value` is its current float32 value:
        the parameter itself or its master, which may be updated in place and returned);
        where `keep` is false, `value` and the state unchanged."""
        raise NotImplementedError

    def add_state(self, prefix: str, index: int) -> str:
        """A float32 zero buffer `<prefix>.<name>` shaped like parameter `index`; its key."""
        key = f"{prefix}.{self.names[index]}"
        self.state[key] = ops.zeros(self.params[index].shape, FLOAT32)
        return key

    # ----- internals -----

    def _write(self, index: int, value: Tensor) -> None:
        param = self.params[index]
        if value is param:  # updated in place
            return
        if index in self._masters:
            self._masters[index] = value
            value = ops.cast(value, param.dtype)
        param.copy_(value)

    def _check_grads(self, grads: Sequence[Tensor]) -> None:
        if len(grads) != len(self.params):
            raise ValueError(f"{type(self).__name__}.step: got {len(grads)} gradients for "
                             f"{len(self.params)} parameters")
        for name, param, grad in zip(self.names, self.params, grads, strict=True):
            if grad is None or tuple(grad.shape) != tuple(param.shape):
                got = "None" if grad is None else tuple(grad.shape)
                raise ValueError(f"{type(self).__name__}.step: the gradient of {name!r} has "
                                 f"shape {got}, the parameter {tuple(param.shape)}")

    def _expected_shapes(self) -> dict[str, tuple[int, ...]]:
        shapes: dict[str, tuple[int, ...]] = {STEP_KEY: (1,)}
        for index in self._masters:
            shapes[f"{MASTER_PREFIX}.{self.names[index]}"] = tuple(self.params[index].shape)
        for key, value in self.state.items():
            shapes[key] = tuple(value.shape)
        return shapes

    def _set_loaded(self, key: str, value: Tensor) -> None:
        prefix, _, name = key.partition(".")
        if prefix != MASTER_PREFIX:
            self.state[key] = value
            return
        index = self.names.index(name)
        self._masters[index] = value
        self.params[index].copy_(ops.cast(value, self.params[index].dtype))


def adam_hyperparameters(config: OptimizerConfig,
                         source: Source | None = None) -> tuple[tuple[float, float], float]:
    """`(betas, eps)` of the optimizer section, checked: two betas, each in [0, 1)."""
    betas = list(config.betas)
    if len(betas) != 2 or not all(0.0 <= beta < 1.0 for beta in betas):
        raise settings_error([(("optimizer", "betas"),
                               f"must be two numbers [beta1, beta2], each >= 0 and < 1, got "
                               f"{betas}")], source)
    return (float(betas[0]), float(betas[1])), float(config.eps)


def decay_flags(config: OptimizerConfig, named_params: Sequence[tuple[str, Parameter]],
                source: Source | None = None) -> list[bool]:
    """Which parameters get `config.weight_decay` (see `param_groups`); warns about rules
    that select no parameter, which are usually typos."""
    include = check_rules(config.weight_decay_include, ("optimizer", "weight_decay_include"),
                          source)
    exclude = check_rules(config.weight_decay_exclude, ("optimizer", "weight_decay_exclude"),
                          source)
    warn_unmatched_rules(config, [name for name, _ in named_params], source)
    return weight_decay_flags([(name, len(built_shape(param))) for name, param in named_params],
                              include, exclude)


UNMATCHED = "match no parameter name"
"""The end of the warning about weight-decay rules that select nothing."""
logger = logging.getLogger(__name__)
_RULES_UNCHECKED: ContextVar[bool] = ContextVar("rules_unchecked", default=False)


@contextlib.contextmanager
def rules_unchecked() -> Iterator[None]:
    """Optimizers built inside do not check the weight-decay rules against their parameters
    (a layout that splits the model over several optimizers checks the whole model once)."""
    token = _RULES_UNCHECKED.set(True)
    try:
        yield
    finally:
        _RULES_UNCHECKED.reset(token)


def warn_unmatched_rules(config: OptimizerConfig, names: Sequence[str],
                         source: Source | None = None) -> None:
    """Log one warning line per weight-decay key whose rules match none of `names` (usually
    typos)."""
    if _RULES_UNCHECKED.get():
        return
    for key in ("weight_decay_include", "weight_decay_exclude"):
        rules = check_rules(getattr(config, key), ("optimizer", key), source)
        unused = unmatched_rules(list(names), rules)
        if unused:
            logger.warning("optimizer.%s: %s %s", key, unused, UNMATCHED)


def _checked_params(named_params: Sequence[tuple[str, Parameter]],
                    ) -> tuple[list[str], list[Parameter]]:
    names = [name for name, _ in named_params]
    params = [param for _, param in named_params]
    if not params:
        raise ValueError("the optimizer got no parameters to update")
    duplicates = sorted({name for name in names if names.count(name) > 1})
    if duplicates:
        raise ValueError(f"the optimizer got parameter names more than once: {duplicates}")
    for name, param in named_params:
        if param.dtype != FLOAT32 and param.dtype not in LOW_PRECISION:
            raise ValueError(f"parameter {name!r} is {param.dtype}; the optimizer updates "
                             "float32, float16 and bfloat16 parameters")
    return names, params


def _warn_if_bf16_on_cpu(names: Sequence[str], params: Sequence[Parameter]) -> None:
    bf16 = [name for name, param in zip(names, params, strict=True)
            if param.dtype == ms.bfloat16]
    if bf16 and ms.get_context("device_target") == "CPU":
        listed = ", ".join(bf16[:3]) + (", ..." if len(bf16) > 3 else "")
        logger.warning("bfloat16 parameters (%s) on the CPU backend: the optimizer updates "
                       "float32 masters and works, but MindSpore's CPU kernels for MatMul, "
                       "Softmax, Exp and reductions lack bfloat16, so the model cannot train; "
                       "use float32 on CPU", listed)


def _key_problems(state: Mapping[str, Any], expected: Mapping[str, tuple[int, ...]]) -> list[str]:
    problems = []
    missing = [key for key in expected if key not in state]
    extra = [key for key in state if key not in expected]
    if missing:
        problems.append(f"missing {len(missing)} key(s): {_listed(missing)}")
    if extra:
        problems.append(f"unexpected {len(extra)} key(s): {_listed(extra)}")
    return problems


def _listed(keys: Sequence[str]) -> str:
    shown = ", ".join(keys[:_MAX_LISTED])
    return shown + (f", ... ({len(keys) - _MAX_LISTED} more)" if len(keys) > _MAX_LISTED else "")


def _checked_array(key: str, value: Any, shape: tuple[int, ...],
                   ) -> tuple[np.ndarray, str | None]:
    array = np.asarray(value)
    if key == STEP_KEY:
        if array.size != 1 or not np.issubdtype(array.dtype, np.integer) or array.min() < 0:
            return array, (f"{key}: expected one integer >= 0, got {array.dtype} of shape "
                           f"{array.shape}")
        return array.astype(np.int64), None
    if not np.issubdtype(array.dtype, np.floating):
        return array, f"{key}: expected floating-point values, got {array.dtype}"
    if tuple(array.shape) != shape:
        return array, f"{key}: expected shape {shape}, got {tuple(array.shape)}"
    return np.ascontiguousarray(array, dtype=np.float32), None
