"""Gradients reduced to this rank's slices as the backward pass produces them (ZeRO-2, FSDP).

A sharded strategy keeps only its slice of each flat buffer's reduced gradient, so whole-size
gradients need not outlive the unit that produced them. `ShardedGradients` registers a hook on
every parameter (`Parameter.register_hook`: in PyNative it fires once per backward pass with
the parameter's whole gradient, summed over its uses, as soon as it is complete). The hook
keeps the gradient until every parameter of its buffer has one, then the buffer is flattened,
reduced to this rank's chunk (`reduce_bucket`: `GradientReducer.reduce_flat`), added to the
buffer's float32 sum of the step, and the
whole gradients are dropped; the hook hands autograd a one-element placeholder instead, so
`value_and_grad` returns no whole-size gradient either. The transient memory of a step is one
unit's gradients and buffers, as with PyTorch's FSDP2.

Buffers are reduced in one fixed order, backward's (`order`: by their first parameter, latest
first, so the root buffer holding the embedding comes last), so every rank issues the same
collectives in the same order whatever its hooks' timing: a buffer that completes early waits
for the ones before it. Routed experts get gradients only where this rank routed tokens to
them: their parameters are `optional`. A buffer is complete once its other parameters have
their gradients, the optional ones that did not come taken as zeros; so an optional parameter
must be used after some parameter of its buffer in the forward pass (an MoE layer's experts
after its attention), or its buffer placed `after` a buffer of parameters used before it (a
buffer of experts alone, right after its decoder layer's). Backward is then past the experts:
MindSpore calls an unused parameter's hook only at the end of the pass, with zeros, which is
then ignored. What no hook gave by the end of the micro-batch's backward pass is reduced from
the gradients `value_and_grad` returned (`finish_micro_batch`). Without hooks (`collecting`
not entered: a pipeline layout's own backward) `add_all` reduces whole gradients the same way,
buffer by buffer, freeing each buffer's as it goes.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import mindspore as ms
from mindspore import Parameter, ops


class ShardedGradients:
    """This rank's float32 slices of the step's reduced gradients, one per buffer.

    Args:
        buffers: the sharded wrapper's buffers (`.params`, `.flat`), in slice order.
        params: every parameter of the buffers, in the order of the gradients.
        reduce_bucket: `(buffer, grads) -> slice`: one buffer's gradients reduced to this
            rank's float32 slice (`GradientReducer.reduce_flat`: summed over the
            data-parallel ranks, the mean taken when gradients are averaged).
        prepare: applied to each parameter's gradient first (`(index, grad) -> grad`:
            `GradientReducer.partial_sum`), or None.
        optional: indices of the parameters whose gradient may not come (routed experts),
            see the module docstring.
        after: buffers placed in the order right after another (by index: buffer -> the
            one it follows) instead of by their first parameter: a buffer of optional
            parameters alone, after a buffer used before it in the forward pass.
    """

    def __init__(self, buffers: Sequence[Any], params: Sequence[Parameter],
                 reduce_bucket: Callable[[Any, list[ms.Tensor]], ms.Tensor], *,
                 prepare: Callable[[int, ms.Tensor], ms.Tensor] | None = None,
                 optional: Collection[int] = (), after: dict[int, int] | None = None):
        self.buffers, self.params = list(buffers), list(params)
        self.reduce_bucket, self.prepare = reduce_bucket, prepare
        index = {id(p): i for i, p in enumerate(self.params)}
        self.members = [[index[id(p)] for p in buffer.params] for buffer in self.buffers]
        self.bucket_of = {i: b for b, members in enumerate(self.members) for i in members}
        self.optional, after = frozenset(optional), dict(after or {})
        self.order = sorted((b for b in range(len(self.buffers)) if b not in after),
                            key=lambda b: -min(self.members[b]))
        """The order buffers are reduced in: backward reaches a buffer's first parameter (in
        `params` order, the model's forward order) last, so the buffer whose first parameter
        comes latest is complete first (the root buffer, holding the embedding, last); each
        buffer placed `after` another right after it."""
        for b, follows in sorted(after.items()):
            self.order.insert(self.order.index(follows) + 1, b)
        self._position = {b: k for k, b in enumerate(self.order)}
        self.sums: list[ms.Tensor | None] = [None] * len(self.buffers)
        self._pending: dict[int, ms.Tensor] = {}
        self._next = 0
        """The position in `order` of the next buffer to reduce."""
        self._collecting = False
        self._watched: frozenset[int] = frozenset()
        self.watched_grads: dict[int, ms.Tensor] = {}
        """The gradients of the watched parameters in the last micro-batch (whole, before the
        reduction), for the monitors."""
        self.hooked = 0
        """Gradients reduced from a hook so far (tests read it: the hooks ran)."""
        for i, param in enumerate(self.params):
            param.register_hook(self._hook(i))

    # ----- one micro-batch -----

    @contextmanager
    def collecting(self, watched: frozenset[int] = frozenset()) -> Iterator[None]:
        """Around one micro-batch's forward and backward and its `finish_micro_batch`:
        gradients are reduced as they come.

        Args:
            watched: parameter indices whose whole gradients the caller wants to see
                (`watched_grads`, until the next micro-batch).
        """
        self._collecting, self._watched, self.watched_grads = True, watched, {}
        try:
            yield
        finally:
            self._collecting, self._watched = False, frozenset()

    def finish_micro_batch(self, returned: Sequence[ms.Tensor]) -> None:
        """Reduce what the hooks did not: the gradients `value_and_grad` returned whole for
        parameters whose hook did not fire (unused ones: zeros).

        Args:
            returned: the micro-batch's gradients from `value_and_grad`, aligned with
                `params` (placeholders where a hook took the gradient).
        """
        waiting = set(self.order[self._next:])
        for i, grad in enumerate(returned):
            if i not in self._pending and self.bucket_of[i] in waiting:
                self._take(i, grad)
        self._flush(final=True)

    def add_all(self, grads: list[ms.Tensor | None]) -> None:
        """Reduce a whole set of gradients (aligned with `params`) buffer by buffer, setting
        each entry of `grads` to None once its buffer is reduced (so it can be freed)."""
        for b in self.order:
            for i in self.members[b]:
                self._take(i, grads[i])
                grads[i] = None
            self._flush(final=False)
        self._flush(final=True)

    def take(self) -> list[ms.Tensor]:
        """The step's slices, one per buffer, and a fresh start."""
        if any(s is None for s in self.sums):
            raise RuntimeError("ShardedGradients.take: no gradient was reduced this step")
        slices, self.sums = self.sums, [None] * len(self.buffers)
        return slices

    # ----- internals -----

    def _hook(self, index: int) -> Callable[[ms.Tensor], ms.Tensor | None]:
        def hook(grad: ms.Tensor) -> ms.Tensor | None:
            if not self._collecting:
                return None
            if index in self.optional and self._position[self.bucket_of[index]] < self._next:
                # an optional parameter's buffer already reduced: this is the zero gradient
                # MindSpore gives an unused parameter at the end of the pass, taken then
                return ops.zeros((1,), grad.dtype)
            self._take(index, grad)
            self.hooked += 1
            self._flush(final=False)
            return ops.zeros((1,), grad.dtype)  # autograd's copy: a placeholder, not the whole
        return hook

    def _take(self, index: int, grad: ms.Tensor) -> None:
        if index in self._watched:
            self.watched_grads[index] = grad  # as backward gave it, before `prepare`
        self._pending[index] = grad if self.prepare is None else self.prepare(index, grad)

    def _flush(self, final: bool) -> None:
        """Reduce the buffers, in order, whose gradients are all here (all of them when
        `final`)."""
        while self._next < len(self.order):
            b = self.order[self._next]
            if not final and any(i not in self._pending and i not in self.optional
                                 for i in self.members[b]):
                return
            for i, shape in zip(self.members[b], self.buffers[b].flat.shapes, strict=True):
                if i not in self._pending and i in self.optional:  # unused: backward is past it
                    self._take(i, ops.zeros(shape, self.params[i].dtype))
            grads = [self._pending.pop(i) for i in self.members[b]]
            mine = self.reduce_bucket(self.buffers[b], grads)
            del grads
            self.sums[b] = mine if self.sums[b] is None else self.sums[b] + mine
            self._next += 1
        if final:
            if self._pending:
                raise RuntimeError(f"ShardedGradients: {len(self._pending)} gradient(s) left "
                                   "after every buffer was reduced")
            self._next = 0
