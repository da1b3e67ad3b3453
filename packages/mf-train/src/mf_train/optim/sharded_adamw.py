"""AdamW over this rank's slice of sharded data parallelism (ZeRO-1, ZeRO-2, FSDP).

mf-parallel's `ShardedDataParallel` (`optim`, `optim_grads`) and `FullyShardedDataParallel`
(`optim_grads_params`) shard the parameters by buffer (one per unit) and give each rank one
equal slice of each: its chunk of every tensor of the buffer, end to end. `ShardedAdamW` keeps
the optimizer state of this rank's slices only, one float32 tensor per buffer and state, of the
buffer's `slice_shape` (1-D, or a vocabulary unit's rows, 2-D), and implements
`protocol.Optimizer` on them: the sharded step layouts (`mf_train.layouts.sharded`) reduce the
local gradients to this rank's slices (one per buffer) and take their global norm;
`step(slices, lr, clip)` clips the slices, runs AdamW on them buffer by buffer (so the update's
temporaries are one buffer's slice) and publishes them.

AdamW (`mf_train.optim.adamw_update`) is element-wise, so updating slices gives the
parameters whole-tensor AdamW gives. Weight decay is per parameter (the optimizer section's
groups, `mf_train.optim.param_groups`), so each slice element carries the index of its rate in
a small table (runs of one rate within each buffer's slice); the decay factor `1 - lr * rate`
is computed in Python as `adamw_update` computes it and applied to each run before the fused
AdamW kernel (`adamw_update_in_place`, the one-process AdamW's) updates the slice in place.
`publish` hands the new slices back to mf-parallel, which gathers them into the model (ZeRO)
or keeps them as the units' masters (FSDP).

Checkpoints (`state_pieces`, `load_state_pieces`, through `checkpoint.regions`): the regions
of one process's `adam_m.<name>`, `adam_v.<name>` (and `main_param.<name>` below float32)
this rank's slices hold, so they load onto any layout. State dict (per rank, as format-2
checkpoints held it): `global_step`, `main_param.flat`, `adam_m.flat`, `adam_v.flat` (this
rank's float32 slices) and `shard_layout` (shard degree, shard rank, elements in all
buffers, slice length, number of buffers, slice order): it loads only onto the same layout.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from mindspore import Parameter, Tensor, mint, ops

from mf_parallel.runtime.copies import joined

from ..checkpoint.regions import Held, RankRegions, check, pieces, read_buffer
from .adamw import adamw_update_in_place
from .base import MASTER_PREFIX
from .protocol import (
    FLOAT32,
    STEP_KEY,
    OptimizerStateError,
    checked_lr,
    counted,
    gated,
    read_count,
    update_gradient,
)

LAYOUT_KEY = "shard_layout"
LAYOUT_FIELDS = ("shard degree", "shard rank", "elements", "slice length", "buffers",
                 "slice order")
SLICE_ORDER = 2
"""How a slice orders its elements: 2, each tensor's chunk in turn (`FlatShard`); state
saved before it (one contiguous range of the tensors end to end) had no such field."""
SLICE_KEYS = ("main_param.flat", "adam_m.flat", "adam_v.flat")


class ShardedAdamW:
    """AdamW on this rank's slices of `sharded` (a `ShardedDataParallel` or
    `FullyShardedDataParallel`), with `protocol.Optimizer`'s interface.

    `named_params` are the model's trainable parameters in the order of the gradients (the
    same parameters `sharded` was built over); `weight_decays` their decay rates. The state is
    kept per buffer (one unit's slice each) and updated buffer by buffer with the fused AdamW
    kernel, so an update's temporaries are one buffer's slice, not the rank's whole share.
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
        self._position = {id(param): index for index, param in enumerate(self.params)}
        self.rates, self.runs = self._decay_runs(buffers)
        self.masters = [ops.cast(buffer.master, FLOAT32) for buffer in buffers]
        """Shared with the buffers' masters when the parameters are float32 (a cast to the
        same dtype returns its input; `Parameter.value()` would be a copy); updated in place
        (`_decay`, then the fused kernel). Each has its buffer's `slice_shape`, and so have
        the moments (the kernel updates tensors of one shape)."""
        self.avgs = [ops.zeros(buffer.slice_shape, FLOAT32) for buffer in buffers]
        self.avg_sqs = [ops.zeros(buffer.slice_shape, FLOAT32) for buffer in buffers]

    # ----- the whole slice, for reading -----

    @property
    def master(self) -> Tensor:
        """This rank's float32 parameter slices, all buffers end to end (a copy)."""
        return joined(self.masters)

    @property
    def exp_avg(self) -> Tensor:
        return joined(self.avgs)

    @property
    def exp_avg_sq(self) -> Tensor:
        return joined(self.avg_sqs)

    @property
    def rate_ids(self) -> Tensor | None:
        """Each slice element's index into `rates` (None when nothing decays)."""
        if self.rates == [0.0]:
            return None
        ids = np.concatenate([np.repeat([r for _, _, r in runs], [b - a for a, b, _ in runs])
                              .astype(np.int32) if runs else np.zeros(0, np.int32)
                              for runs in self.runs])
        return Tensor(ids)

    # ----- the training step's interface -----

    def step(self, grads: Sequence[Tensor], lr: float, clip: float | Tensor = 1.0,
             keep: Tensor | None = None) -> None:
        """AdamW update number `global_step + 1` of this rank's slices, then publish them.

        Args:
            grads: this rank's float32 slices of the reduced gradients: one per buffer (as
                the sharded layouts reduce them), or one of all buffers end to end.
            lr: the learning rate of this update.
            clip: the clip coefficient the slices are scaled by (1: unclipped).
            keep: whether the update applies (`protocol.Optimizer.step`).
        """
        lr = checked_lr(lr)
        grads = self._per_buffer(grads)
        self.global_step += 1
        for b, grad in enumerate(grads):
            grad = update_gradient(grad, clip, keep)
            if grad.shape != self.masters[b].shape:  # a 2-D slice (vocabulary rows)
                grad = grad.reshape(self.masters[b].shape)
            self._decay(b, self.masters[b], lr, keep)
            adamw_update_in_place(self.masters[b], grad, self.avgs[b], self.avg_sqs[b],
                                  self.global_step, lr, 0.0, self.betas, self.eps, keep)
        self._publish()

    def uncount(self) -> None:
        self.global_step -= 1

    # ----- checkpoints and loading -----

    def reload_main_params_from_model(self) -> None:
        """Take this rank's slices from the model after weights were loaded into it without
        optimizer state: from the whole parameters where they are gathered (ZeRO; FSDP
        inside the layout's `whole_model()`), or from the units' shards where FSDP holds
        them sharded (they are the model's parameters then: a loader publishes them)."""
        buffers = self.sharded.buffers
        gathered = [getattr(buffer, "gathered", True) for buffer in buffers]
        if all(gathered):
            self.masters = [buffer.as_slice(ops.cast(buffer.flat.own_tensors(buffer.params),
                                                     FLOAT32)) for buffer in buffers]
        elif not any(gathered):
            self.masters = [ops.cast(buffer.master, FLOAT32) for buffer in buffers]
        else:
            raise RuntimeError("reload_main_params_from_model: some units are gathered and "
                               "some are not; load inside the step layout's whole_model(), "
                               "or publish every unit's shard")
        self._publish()

    def state_dict(self) -> dict[str, np.ndarray]:
        """This rank's slices (float32), the update count and the shard layout."""
        return {STEP_KEY: np.array([self.global_step], dtype=np.int64),
                LAYOUT_KEY: self.shard_layout.copy(),
                "main_param.flat": _numpy(self.masters),
                "adam_m.flat": _numpy(self.avgs),
                "adam_v.flat": _numpy(self.avg_sqs)}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore `state_dict()`'s arrays and publish the loaded slices (a collective under
        ZeRO). `OptimizerStateError` before anything changes when a key is missing or
        extra, the layout differs (another shard degree, strategy or model) or a slice has
        the wrong length."""
        expected = {STEP_KEY, LAYOUT_KEY, *SLICE_KEYS}
        total = sum(self.lengths)
        problems = [f"missing key {key!r}" for key in sorted(expected - state.keys())]
        problems += [f"unexpected key {key!r}" for key in sorted(state.keys() - expected)]
        if not problems:
            problems = self._layout_problems(np.asarray(state[LAYOUT_KEY]))
        if not problems:
            problems = [f"{key}: expected {total} float values, got "
                        f"{np.asarray(state[key]).dtype} of shape {np.shape(state[key])}"
                        for key in SLICE_KEYS
                        if np.shape(state[key]) != (total,)
                        or not np.issubdtype(np.asarray(state[key]).dtype, np.floating)]
        if problems:
            raise OptimizerStateError("sharded AdamW state dict does not fit:\n  "
                                      + "\n  ".join(problems))
        self.global_step = int(np.asarray(state[STEP_KEY]).reshape(-1)[0])
        ends = np.cumsum(self.lengths)[:-1]
        self.masters, self.avgs, self.avg_sqs = (
            [Tensor(np.array(part, dtype=np.float32).reshape(buffer.slice_shape))
             for part, buffer in zip(np.split(state[key], ends), self.sharded.buffers,
                                     strict=True)]
            for key in SLICE_KEYS)
        self._publish()

    def state_pieces(self, regions: RankRegions, count: bool = True) -> dict[Any, Any]:
        """The regions of `adam_m.<name>` and `adam_v.<name>` (and `main_param.<name>` for
        parameters below float32) this rank's slices hold, where it owns them
        (`protocol.Optimizer`): the state of one process's AdamW, cut where the slices cut."""
        masters = [master if buffer.master.dtype != FLOAT32 else None
                   for master, buffer in zip(self.masters, self.sharded.buffers, strict=True)]
        held = [*self._held("adam_m", self.avgs), *self._held("adam_v", self.avg_sqs),
                *self._held(MASTER_PREFIX, masters)]
        return counted(pieces([item for buffer in held for item in buffer], regions),
                       self.global_step, regions, count)

    def load_state_pieces(self, index: Any, model: Any, regions: RankRegions) -> None:
        """This rank's slices of the moments and masters read by overlap, whatever layout
        saved them; the masters from the model's pieces where the checkpoint keeps none
        (float32 parameters). Publishes the slices (a collective under ZeRO)."""
        states = [(self._held("adam_m", self.avgs), None),
                  (self._held("adam_v", self.avg_sqs), None),
                  (self._held(MASTER_PREFIX, self.masters), model)]
        step = read_count(index, [problem for held, fallback in states for buffer in held
                                  for problem in check(buffer, regions, index, fallback)],
                          "sharded AdamW")
        self.avgs, self.avg_sqs, self.masters = (
            [Tensor(read_buffer(items, buffer.flat.length, regions, index, fallback)
                    .reshape(buffer.slice_shape))
             for items, buffer in zip(held, self.sharded.buffers, strict=True)]
            for held, fallback in states)
        self.global_step = step
        self._publish()

    def _held(self, prefix: str, tensors: Sequence[Tensor | None]) -> list[list[Held]]:
        """Per buffer, state `prefix`'s chunk of each of its tensors (none for a buffer
        without that state: `tensors[b]` None)."""
        return [[] if tensor is None else
                [Held(f"{prefix}.{self.names[self._position[id(param)]]}",
                      self.names[self._position[id(param)]], buffer.flat.shapes[i], tensor,
                      buffer.flat.offsets[i]) for i, param in enumerate(buffer.params)]
                for tensor, buffer in zip(tensors, self.sharded.buffers, strict=True)]

    def groups_summary(self) -> dict[str, list[str]]:
        """Parameter names by weight-decay group (MindFormers' group names)."""
        decayed = [rate != 0.0 for rate in self.weight_decays]
        return {"weight_decay": [n for n, d in zip(self.names, decayed, strict=True) if d],
                "no_weight_decay": [n for n, d in zip(self.names, decayed, strict=True)
                                    if not d]}

    # ----- internals -----

    def _per_buffer(self, grads: Sequence[Tensor]) -> list[Tensor]:
        shapes = [tuple(g.shape) for g in grads]
        if shapes == [(n,) for n in self.lengths]:
            return list(grads)
        if shapes == [(sum(self.lengths),)]:
            return list(mint.split(grads[0], self.lengths)) if len(self.lengths) > 1 \
                else list(grads)
        raise ValueError(f"ShardedAdamW.step: expected gradient slices of {self.lengths} "
                         f"elements (or one of {sum(self.lengths)}), got shapes {shapes}")

    def _decay_runs(self, buffers: Sequence[Any],
                    ) -> tuple[list[float], list[list[tuple[int, int, int]]]]:
        """The distinct decay rates (0 first: padding) and, per buffer, the runs
        `(start, end, rate index)` of this rank's slice elements with one rate."""
        rates = sorted({0.0, *self.weight_decays})
        rate_of = {id(p): rates.index(r)
                   for p, r in zip(self.params, self.weight_decays, strict=True)}
        runs = []
        for buffer in buffers:
            ids = buffer.flat.own_values([rate_of[id(p)] for p in buffer.params], np.int32)
            edges = [0, *(np.flatnonzero(np.diff(ids)) + 1).tolist(), len(ids)]
            runs.append([(a, b, int(ids[a])) for a, b in itertools.pairwise(edges)
                         if b > a])
        return rates, runs

    def _decay(self, b: int, value: Tensor, lr: float, keep: Tensor | None = None) -> None:
        """`value *= 1 - lr * rate` per element of buffer `b`'s slice, in place, the factor
        computed as `adamw_update` computes it for a whole tensor (in Python, then float32; 1
        where `keep` is false).

        In place, as the fused kernel then updates it: a master stays where it was made in
        MindSpore's memory pool instead of a new one being placed each step among the
        step's freed transients (ZeRO-2 on 4 ranks of the 127M Qwen3 peaked 0.1 GiB higher
        with new masters, benchmarks/README.md)."""
        runs = self.runs[b]
        if lr == 0.0 or all(self.rates[r] == 0.0 for _, _, r in runs):
            return
        factors = [gated(float(np.float32(1.0 - lr * self.rates[r])), keep, 1.0)
                   for _, _, r in runs]
        if len(runs) == 1:
            decayed = value * factors[0]
        else:
            flat = value if value.ndim == 1 else value.reshape(-1)
            decayed = ops.cat([flat[a:e] * f for (a, e, _), f in zip(runs, factors, strict=True)])
            decayed = decayed if value.ndim == 1 else decayed.reshape(value.shape)
        ops.assign(value, decayed)

    def _publish(self) -> None:
        self.sharded.publish(list(self.masters))

    def _layout_problems(self, saved: np.ndarray) -> list[str]:
        ours = self.shard_layout
        if saved.shape == (len(LAYOUT_FIELDS) - 1,):  # saved before the slice order existed
            if ours[0] == 1 and np.array_equal(saved, ours[:-1]):
                return []  # one shard: the slice is every tensor end to end either way
            return [f"{LAYOUT_KEY}: the checkpoint's optimizer slices were saved by an earlier "
                    "mf, in which a slice was one range of the tensors laid end to end; this "
                    "mf cuts each tensor into one chunk per rank, so they cannot be read in "
                    "order: resume its weights only (checkpoint.no_load_optim: true), or "
                    "convert the checkpoint to format 3 with an earlier mf that writes format 3 "
                    "but still lays slices end to end (commits 14016ab to 6dbc58f)"]
        if saved.shape != ours.shape or not np.array_equal(saved, ours):
            mine = ", ".join(f"{name} {value}" for name, value in
                             zip(LAYOUT_FIELDS, self.shard_layout.tolist(), strict=True))
            theirs = (", ".join(f"{name} {value}" for name, value in
                                zip(LAYOUT_FIELDS, saved.tolist(), strict=True))
                      if saved.shape == self.shard_layout.shape else f"{saved.tolist()}")
            return [f"{LAYOUT_KEY}: the checkpoint's slices were saved with {theirs}; this "
                    f"run has {mine} (loading sharded optimizer state onto another layout is "
                    "not supported: use the same parallelism, strategy and model)"]
        return []


def _numpy(parts: Sequence[Tensor]) -> np.ndarray:
    return np.concatenate([part.asnumpy().reshape(-1) for part in parts])


def _shard_layout(buffers: Sequence[Any], collectives: Any) -> np.ndarray:
    comm = collectives.comm
    shards, rank = ((buffers[0].flat.shards, buffers[0].flat.rank) if buffers
                    else (comm.group_size("shard"), comm.group_rank("shard")))
    return np.array([shards, rank,
                     sum(buffer.flat.total for buffer in buffers),
                     sum(buffer.flat.length for buffer in buffers), len(buffers), SLICE_ORDER],
                    dtype=np.int64)
