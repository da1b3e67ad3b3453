"""AdamW over this rank's slice of sharded data parallelism (ZeRO-1, ZeRO-2, FSDP).

mf-parallel's `ShardedDataParallel` (`optim`, `optim_grads`) and `FullyShardedDataParallel`
(`optim_grads_params`) lay the parameters end to end in flat buffers (one for ZeRO, one per
unit for FSDP) and give each rank one equal slice of each. `ShardedAdamW` keeps the optimizer
state of this rank's slices only, concatenated into one float32 vector per state, and
implements `protocol.Optimizer` on them: the sharded step layouts (`mf_train.layouts.sharded`)
reduce the local gradients to this rank's slice and take their global norm; `step([slice],
lr, clip)` clips the slice, runs AdamW on it and publishes the new slices.

AdamW (`mf_train.optim.adamw_update`) is element-wise, so updating slices gives the
parameters whole-tensor AdamW gives. Weight decay is per parameter (the optimizer section's
groups, `mf_train.optim.param_groups`), so each slice element carries the index of its rate in
a small table; the decay factor `1 - lr * rate` is computed in Python as `adamw_update`
computes it, then gathered per element, and applied before the Adam step exactly as
`adamw_update` applies it. `publish` hands the new slices back to mf-parallel, which gathers
them into the model (ZeRO) or keeps them as the units' masters (FSDP).

State dict (per rank): `global_step`, `main_param.flat`, `adam_m.flat`, `adam_v.flat` (this
rank's float32 slices) and `shard_layout` (shard degree, shard rank, elements in all buffers,
slice length, number of buffers): a checkpoint loads only onto the same layout.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from mindspore import Parameter, Tensor, mint, ops

from .adamw import adamw_update
from .protocol import FLOAT32, STEP_KEY, OptimizerStateError, checked_lr

LAYOUT_KEY = "shard_layout"
LAYOUT_FIELDS = ("shard degree", "shard rank", "elements", "slice length", "buffers")
SLICE_KEYS = ("main_param.flat", "adam_m.flat", "adam_v.flat")


class ShardedAdamW:
    """AdamW on this rank's slices of `sharded` (a `ShardedDataParallel` or
    `FullyShardedDataParallel`), with `protocol.Optimizer`'s interface.

    `named_params` are the model's trainable parameters in the order of the gradients (the
    same parameters `sharded` was built over); `weight_decays` their decay rates.
    """

    def __init__(self, named_params: Sequence[tuple[str, Parameter]], sharded: Any,
                 collectives: Any, *, betas: tuple[float, float] = (0.9, 0.95),
                 eps: float = 1e-8, weight_decays: Sequence[float] | None = None):
        self.names = [name for name, _ in named_params]
        self.params = [param for _, param in named_params]
        self.weight_decays = list(weight_decays or [0.0] * len(self.params))
        if len(self.weight_decays) != len(self.params):
            raise ValueError(f"got {len(self.weight_decays)} weight decays for "
                             f"{len(self.params)} parameters")
        self.sharded, self.collectives = sharded, collectives
        self.betas, self.eps = betas, eps
        self.global_step = 0
        buffers = sharded.buffers
        self.lengths = [buffer.flat.length for buffer in buffers]
        self.shard_layout = _shard_layout(buffers, collectives)
        self.rates, self.rate_ids = self._decay_table(buffers)
        self.master = ops.cat([ops.cast(buffer.master.value(), FLOAT32) for buffer in buffers])
        self.exp_avg = ops.zeros(self.master.shape, FLOAT32)
        self.exp_avg_sq = ops.zeros(self.master.shape, FLOAT32)

    # ----- the training step's interface -----

    def step(self, grads: Sequence[Tensor], lr: float, clip: float = 1.0) -> None:
        """AdamW update number `global_step + 1` of this rank's slice, then publish it.

        Args:
            grads: one float32 tensor, this rank's slice of the reduced gradients (all
                buffers end to end, as `mf_train.layouts.sharded.reduce_to_slice` gives it).
            lr: the learning rate of this update.
            clip: the clip coefficient the slice is scaled by (1: unclipped).
        """
        lr = checked_lr(lr)
        if len(grads) != 1 or tuple(grads[0].shape) != tuple(self.master.shape):
            raise ValueError(f"ShardedAdamW.step: expected one gradient slice of "
                             f"{self.master.shape[0]} elements, got shapes "
                             f"{[tuple(g.shape) for g in grads]}")
        grad = grads[0] * clip if clip != 1.0 else grads[0]
        self.global_step += 1
        value = self._decayed(self.master, lr)
        self.master, self.exp_avg, self.exp_avg_sq = adamw_update(
            value, grad, self.exp_avg, self.exp_avg_sq, self.global_step, lr, 0.0, self.betas,
            self.eps)
        self._publish()

    # ----- checkpoints and loading -----

    def reload_main_params_from_model(self) -> None:
        """Take this rank's slices from the model's (whole) parameters, after weights were
        loaded into the model without optimizer state; with FSDP inside the layout's
        `whole_model()`."""
        buffers = self.sharded.buffers
        if not all(getattr(buffer, "gathered", True) for buffer in buffers):
            raise RuntimeError("reload_main_params_from_model: the model holds sharded "
                               "placeholders; load the weights inside the step layout's "
                               "whole_model()")
        self.master = ops.cat([ops.cast(buffer.flat.own(buffer.flat.flatten(buffer.params)),
                                        FLOAT32) for buffer in buffers])
        self._publish()

    def state_dict(self) -> dict[str, np.ndarray]:
        """This rank's slices (float32), the update count and the shard layout."""
        return {STEP_KEY: np.array([self.global_step], dtype=np.int64),
                LAYOUT_KEY: self.shard_layout.copy(),
                "main_param.flat": self.master.asnumpy().copy(),
                "adam_m.flat": self.exp_avg.asnumpy().copy(),
                "adam_v.flat": self.exp_avg_sq.asnumpy().copy()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore `state_dict()`'s arrays and publish the loaded slices (a collective under
        ZeRO). `OptimizerStateError` before anything changes when a key is missing or
        extra, the layout differs (another shard degree, strategy or model) or a slice has
        the wrong length."""
        expected = {STEP_KEY, LAYOUT_KEY, *SLICE_KEYS}
        problems = [f"missing key {key!r}" for key in sorted(expected - state.keys())]
        problems += [f"unexpected key {key!r}" for key in sorted(state.keys() - expected)]
        if not problems:
            problems = self._layout_problems(np.asarray(state[LAYOUT_KEY]))
        if not problems:
            problems = [f"{key}: expected {self.master.shape[0]} float values, got "
                        f"{np.asarray(state[key]).dtype} of shape {np.shape(state[key])}"
                        for key in SLICE_KEYS
                        if np.shape(state[key]) != tuple(self.master.shape)
                        or not np.issubdtype(np.asarray(state[key]).dtype, np.floating)]
        if problems:
            raise OptimizerStateError("sharded AdamW state dict does not fit:\n  "
                                      + "\n  ".join(problems))
        self.global_step = int(np.asarray(state[STEP_KEY]).reshape(-1)[0])
        master, m, v = (Tensor(np.array(state[key], dtype=np.float32)) for key in SLICE_KEYS)
        self.master, self.exp_avg, self.exp_avg_sq = master, m, v
        self._publish()

    def groups_summary(self) -> dict[str, list[str]]:
        """Parameter names by weight-decay group (MindFormers' group names)."""
        decayed = [rate != 0.0 for rate in self.weight_decays]
        return {"weight_decay": [n for n, d in zip(self.names, decayed, strict=True) if d],
                "no_weight_decay": [n for n, d in zip(self.names, decayed, strict=True)
                                    if not d]}

    # ----- internals -----

    def _decay_table(self, buffers: Sequence[Any]) -> tuple[list[float], Tensor | None]:
        """The distinct decay rates (0 first: padding) and each slice element's index into
        them; None when nothing decays."""
        rates = sorted({0.0, *self.weight_decays})
        if rates == [0.0]:
            return rates, None
        rate_of = {id(p): rates.index(r)
                   for p, r in zip(self.params, self.weight_decays, strict=True)}
        pieces = [buffer.flat.own_values([rate_of[id(p)] for p in buffer.params], np.int32)
                  for buffer in buffers]
        return rates, Tensor(np.concatenate(pieces))

    def _decayed(self, value: Tensor, lr: float) -> Tensor:
        """`value * (1 - lr * rate)` per element, the factor computed as `adamw_update`
        computes it for a whole tensor (in Python, then float32)."""
        if self.rate_ids is None or lr == 0.0:
            return value
        factors = Tensor(np.array([1.0 - lr * rate for rate in self.rates], dtype=np.float32))
        return value * ops.gather(factors, self.rate_ids, 0)

    def _publish(self) -> None:
        pieces = [self.master] if len(self.lengths) == 1 else list(
            mint.split(self.master, self.lengths))
        self.sharded.publish(pieces)

    def _layout_problems(self, saved: np.ndarray) -> list[str]:
        if saved.shape != self.shard_layout.shape or not np.array_equal(saved, self.shard_layout):
            mine = ", ".join(f"{name} {value}" for name, value in
                             zip(LAYOUT_FIELDS, self.shard_layout.tolist(), strict=True))
            theirs = (", ".join(f"{name} {value}" for name, value in
                                zip(LAYOUT_FIELDS, saved.tolist(), strict=True))
                      if saved.shape == self.shard_layout.shape else f"{saved.tolist()}")
            return [f"{LAYOUT_KEY}: the checkpoint's slices were saved with {theirs}; this "
                    f"run has {mine} (loading sharded optimizer state onto another layout is "
                    "not supported: use the same parallelism, strategy and model)"]
        return []


def _shard_layout(buffers: Sequence[Any], collectives: Any) -> np.ndarray:
    comm = collectives.comm
    return np.array([comm.group_size("shard"), comm.group_rank("shard"),
                     sum(buffer.flat.total for buffer in buffers),
                     sum(buffer.flat.length for buffer in buffers), len(buffers)],
                    dtype=np.int64)
