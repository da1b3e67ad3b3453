"""Fully sharded data parallelism (`optim_grads_params`: ZeRO-3, FSDP), with HSDP.

Between steps a rank keeps only its slice of every parameter (in `FlatShard` buffers, one
per sharded unit), its slice of the gradients and the optimizer state of its slice; the
model's parameters themselves hold empty placeholders. Around each unit (a cell, typically
one decoder layer; the model's remaining parameters form the root unit), hooks do what
PyTorch's FSDP does:

- forward pre-hook: all-gather the unit's parameters into the model;
- forward hook: if the unit reshards after forward (`sharding.reshard_after_forward`), free
  them again;
- backward pre-hook: gather them again if they were freed;
- backward hook: free them.

Freeing a parameter after forward only saves memory if autograd does not keep it for the
backward pass, and it does (a matmul saves its weight). While the model runs forward, a
`saved_tensors_hooks` pair therefore replaces each saved tensor that *is* a gathered
parameter of a resharding unit by a reference to it, and hands the parameter back,
re-gathered by the backward pre-hook, when the backward pass needs it. A saved view of a
parameter with another shape (a transposed weight) is kept as it is: correct, not freed.

Each unit's gradients are reduce-scattered to this rank's slice (then summed over the
replicate group with HSDP: `FlatBucket.reduce`) by `grad_shards.ShardedGradients` with
`grad_reduce.GradientReducer`; the caller updates the slices with any element-wise optimizer
(mf-train's AdamW with per-element weight decay) and hands them back with `publish(slices)`,
which makes them the units' masters: the next forward pass gathers them. AdamW is
element-wise, so the result equals plain data parallelism: the tests compare them on real
ranks. Parameters must be used only inside the cell that owns them (no weight shared between
units), and units must not nest.

Compiled layers (`mindspore.jit`) hold the parameter tensors they were compiled with, so
swapping a parameter's tensor would leave a graph reading the old one. With `keep_tensors`
each parameter keeps its tensor and shape once gathered, and freeing resizes its storage to
nothing (`untyped_storage().resize_(0)`, PyTorch FSDP2's way); gathering resizes it back and
copies the gathered values in: one more copy of the unit per gather than swapping.

With `vocabulary_tables`, the `[vocabulary, hidden]` tables (the embedding, an untied head)
are units of one table each, never gathered for the model's passes: they hold this rank's rows
through forward and backward (`VocabularyRows`), the model moves its tokens to them instead
(`sharded_vocabulary.ShardedVocabulary`), and their gradient is this rank's rows already summed
over the shard group (summed over the replicate group only, with HSDP).

A model may be built unit by unit with each unit cut to this rank's slice as soon as it
exists (`flat_shard.preslice`): its parameters are then empty from the start and the wrapper
takes the recorded slice, so no rank ever holds more than one unit of the model whole.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import NamedTuple

import mindspore as ms
from mindspore import Parameter, nn, ops

from mf_parallel.reshard_policy import reshard_plan

from .collectives import Collectives
from .flat_shard import (
    DATA_GROUPS,
    EXPERT_DATA_GROUPS,
    PRESLICED,
    FlatBucket,
    ShardGroups,
    built_shape,
)


class ShardedUnit(FlatBucket):
    """The parameters one cell owns, kept as this rank's slice and gathered on demand."""

    def __init__(self, name: str, params: Sequence[Parameter], collectives: Collectives,
                 reshard_after_forward: bool, presliced: ms.Tensor | None = None,
                 groups: ShardGroups = DATA_GROUPS, keep_tensors: bool = False):
        super().__init__(f"fsdp_{name}", params, collectives, presliced, groups)
        self.name = name
        self.reshard_after_forward = reshard_after_forward
        self.keep_tensors = keep_tensors
        """Free and refill each parameter's storage instead of swapping its tensor."""
        self.gathered = presliced is None
        self.gathers = 0
        """All-gathers so far (tests and benchmarks read it)."""
        self.reshard()

    def unshard(self) -> None:
        """Put the full parameters into the model (no-op when they are there)."""
        if self.gathered:
            return
        gathered = self.flat.all_gather(self.flat_master())
        for param, full in zip(self.params, gathered, strict=True):
            if self.keep_tensors and tuple(param.shape) == tuple(full.shape):
                param.untyped_storage().resize_(full.nbytes)
                ops.assign(param, full)
            else:  # swapped in (kept tensors too, the first time: a built unit was emptied)
                param.set_data(full, slice_shape=True)
        self.gathered = True
        self.gathers += 1

    def reshard(self) -> None:
        """Free the full parameters: empty placeholders, or (`keep_tensors`) their storage
        resized to nothing."""
        if not self.gathered:
            return
        for param in self.params:
            if self.keep_tensors:
                param.untyped_storage().resize_(0)
            else:
                param.set_data(ops.zeros((0,), param.dtype), slice_shape=True)
        self.gathered = False

class VocabularyRows(ShardedUnit):
    """One `[vocabulary, ...]` table whose rows are split over the shard group, used where it
    is: `use_rows` puts this rank's rows (its slice, whole rows since the group's size divides
    the vocabulary) into the parameter for the model's passes, without communication.
    `unshard` still gathers it whole (to read or load it), `reshard` empties it either way.

    The master keeps the rows' 2-D shape, so the parameter holds the master tensor itself:
    a reshaped view of a 1-D master would be copied by MindSpore at each use (the 127M Qwen3
    on 4 FSDP ranks peaked 40 MB higher with the view than with a second copy of the rows).

    Its gradient comes out of backward as this rank's rows summed over the shard group's
    tokens (`ShardedVocabulary`): `reduce` only sums it over the replicate group.
    """

    def __init__(self, name: str, param: Parameter, collectives: Collectives):
        shape = built_shape(param)
        shards = collectives.comm.group_size(DATA_GROUPS.shard)
        if len(shape) != 2 or shape[0] % shards:
            raise ValueError(f"{name}: a table of shape {shape} does not split by rows over "
                             f"{shards} ranks")
        self.rows_shape = (shape[0] // shards, shape[1])
        """This rank's rows: the shape of the slice and of `master`."""
        self.in_use = False
        """Whether the parameter holds this rank's rows."""
        super().__init__(name, [param], collectives, reshard_after_forward=False)

    @property
    def slice_shape(self) -> tuple[int, ...]:
        return self.rows_shape

    def use_rows(self) -> None:
        """This rank's rows into the parameter (the master tensor; no-op when there)."""
        if self.in_use:
            return
        self.reshard()
        self.params[0].set_data(self.master, slice_shape=True)  # shared; .value() copies
        self.in_use = True

    def unshard(self) -> None:
        """The whole table into the parameter (a collective)."""
        if self.in_use:
            self._empty()
        super().unshard()

    def reshard(self) -> None:
        """Empty the parameter, whole or holding rows."""
        if self.in_use:
            self._empty()
        super().reshard()

    def _empty(self) -> None:
        param = self.params[0]
        param.set_data(ops.zeros((0,), param.dtype), slice_shape=True)
        self.in_use = False

    def reduce(self, grads: Sequence[ms.Tensor]) -> ms.Tensor:
        """This rank's rows' gradient, already summed over the shard group, summed over the
        replicate group."""
        (grad,) = grads
        return self.flat.over_replicas(grad.reshape(-1))


class _ParamRef(NamedTuple):
    unit: ShardedUnit
    index: int


class _SavedParams:
    """Saved-tensor hooks that keep references, not copies, of gathered parameters."""

    def __init__(self) -> None:
        self.watched: dict[int, _ParamRef] = {}
        self.replaced = 0
        """Saved tensors replaced by references so far."""
        self._context: ms.saved_tensors_hooks | None = None

    def enter(self) -> None:
        self.exit()  # a forward pass that raised never reached its exit
        self._context = ms.saved_tensors_hooks(self._pack, self._unpack)
        self._context.__enter__()

    def exit(self) -> None:
        if self._context is not None:
            self._context.__exit__(None, None, None)
            self._context = None

    def watch(self, unit: ShardedUnit) -> None:
        for index, param in enumerate(unit.params):
            self.watched[param.data_ptr()] = _ParamRef(unit, index)

    def unwatch(self, unit: ShardedUnit) -> None:
        self.watched = {ptr: ref for ptr, ref in self.watched.items() if ref.unit is not unit}

    def _pack(self, tensor: ms.Tensor) -> object:
        ref = self.watched.get(tensor.data_ptr())
        if ref is None or tuple(tensor.shape) != tuple(ref.unit.params[ref.index].shape):
            return tensor
        self.replaced += 1
        return ref

    @staticmethod
    def _unpack(saved: object) -> ms.Tensor:
        if not isinstance(saved, _ParamRef):
            return saved
        if not saved.unit.gathered:
            raise RuntimeError(f"fully sharded unit {saved.unit.name!r} is needed by the "
                               "backward pass but is not gathered: was its backward "
                               "pre-hook skipped (a parameter used outside its own cell?)")
        return saved.unit.params[saved.index]  # the gathered tensor; .value() would copy it


class FullyShardedDataParallel:
    """Shards `model`'s parameters over the data-parallel ranks, unit by unit.

    `units` are cells of `model` in forward order (its decoder layers, say); the parameters no
    unit owns form a root unit. Take gradients over `self.params` (the model's trainable
    parameters), reduce them unit by unit (`buffers`), update the slices and `publish` them.

    Args:
        model: the whole model; its parameters are replaced by empty placeholders.
        units: cells of `model` in forward order, each sharded and gathered on its own.
        collectives: this rank's collectives; slices are over the `shard` group (and
            summed over `replicate` with HSDP).
        reshard_after_forward_policy: `always`, `never` or `default` (see `reshard_plan`).
        pipeline_parallel: the pipeline degree (for the `default` policy).
        keep_tensors: free a parameter by resizing its storage, keeping its tensor (compiled
            layers hold the tensors they were compiled with).
        expert_units: routed experts under expert parallelism, left out of `model`'s
            trainable parameters: pairs of (one of `units`, the cell holding its experts).
            Each holder's parameters are one more unit, sliced over the expert-data group
            (`EXPERT_DATA_GROUPS`: the ranks holding the same experts) and gathered and freed
            by hooks on its unit's cell as that unit is; their gradients are summed over that
            group. Their parameters follow the model's in `params`, their units the cells'.
        vocabulary_tables: the model's `[vocabulary, hidden]` parameters (embedding, untied
            head), if the model uses them through a `ShardedVocabulary`: units of one table
            each, kept as rows, never gathered for the passes.
        reduce_dtype: the dtype the gradients are reduced in (None: their own; a vocabulary
            table's rows are summed over the shard group by its token exchange, in the
            gradient's dtype, and over the replicate group in this one).
    """

    def __init__(self, model: nn.Cell, units: Sequence[nn.Cell], collectives: Collectives, *,
                 reshard_after_forward_policy: str = "default", pipeline_parallel: int = 1,
                 keep_tensors: bool = False,
                 expert_units: Sequence[tuple[nn.Cell, nn.Cell]] = (),
                 vocabulary_tables: Sequence[Parameter] = (),
                 reduce_dtype: ms.Type | None = None):
        self.params = list(model.trainable_params())
        owned = _owned_params(units, self.params)
        kept = {id(q) for ps in owned for q in ps} | {id(p) for p in vocabulary_tables}
        root = [p for p in self.params if id(p) not in kept]
        reshard = reshard_plan(reshard_after_forward_policy, len(units), pipeline_parallel)
        self.units = [ShardedUnit(f"unit{i}", ps, collectives, flag,
                                  getattr(cell, PRESLICED, None), keep_tensors=keep_tensors)
                      for i, (cell, ps, flag) in enumerate(zip(units, owned, reshard,
                                                               strict=True))]
        flags = {id(cell): flag for cell, flag in zip(units, reshard, strict=True)}
        experts = [(cell, list(holder.get_parameters()), holder) for cell, holder in expert_units]
        self.expert_units = [ShardedUnit(f"experts{i}", ps, collectives, flags[id(cell)],
                                         getattr(holder, PRESLICED, None), EXPERT_DATA_GROUPS,
                                         keep_tensors)
                             for i, (cell, ps, holder) in enumerate(experts)]
        self.params += [p for _, ps, _ in experts for p in ps]
        self.vocabulary_units = [VocabularyRows(f"vocabulary{i}", param, collectives)
                                 for i, param in enumerate(vocabulary_tables)]
        self.root = ShardedUnit("root", root, collectives, False) if root else None
        for unit in self._all_units():
            unit.flat.reduce_dtype = reduce_dtype
        self.saved = _SavedParams()
        for cell, unit in zip(units, self.units, strict=True):
            self._hook_unit(cell, unit)
        for (cell, _, _), unit in zip(experts, self.expert_units, strict=True):
            self._hook_unit(cell, unit)
        self._hook_root(model)

    @property
    def buffers(self) -> list[ShardedUnit]:
        """The units in the order of their slices (`publish`): the cells' units
        in forward order, the experts' units, the vocabulary's tables, then the root unit (if
        any). Each has `.params`, `.flat` (its `FlatShard`), `.master` (this rank's slice,
        in the parameters' dtype, of shape `.slice_shape`: 2-D for a vocabulary table's
        rows) and `.as_slice` (`FlatBucket`)."""
        return self._all_units()

    def publish(self, slices: Sequence[ms.Tensor]) -> None:
        """Take this rank's updated slices; the next forward pass gathers them. Local: no
        communication.

        Args:
            slices: this rank's new slice of each unit, in `buffers` order (1-D, or of the
                unit's `slice_shape`).
        """
        units = self._all_units()
        lengths = [unit.flat.length for unit in units]
        if any(tuple(s.shape) not in {(unit.flat.length,), unit.slice_shape}
               for unit, s in zip(units, slices, strict=False)) or len(slices) != len(units):
            raise ValueError(f"publish expects slices of {lengths} elements, got "
                             f"{[tuple(s.shape) for s in slices]}")
        self.reshard()
        for unit, mine in zip(units, slices, strict=True):
            unit.master.set_data(unit.as_slice(mine if mine.dtype == unit.master.dtype
                                               else ops.cast(mine, unit.master.dtype)))

    def unshard(self) -> None:
        """Gather every unit's parameters into the model (a collective: all ranks call it),
        to read or load whole parameters; `reshard` frees them again."""
        for unit in self._all_units():
            unit.unshard()

    def reshard(self) -> None:
        """Free every gathered parameter (after an evaluation forward pass, say)."""
        for unit in self._all_units():
            unit.reshard()

    def full_parameters(self) -> list[ms.Tensor]:
        """Every parameter whole, in `self.params` order (a collective: all ranks call it)."""
        full: dict[int, ms.Tensor] = {}
        for unit in self._all_units():
            for param, tensor in zip(unit.params, unit.flat.all_gather(unit.flat_master()),
                                     strict=True):
                full[id(param)] = tensor
        return [full[id(p)] for p in self.params]

    def held_bytes(self) -> dict[str, int]:
        """Bytes this rank keeps between steps for parameters, gradients and optimizer state."""
        mine = sum(u.flat.length for u in self._all_units()) * 4
        return {"params": mine, "grads": mine, "optimizer": 2 * mine}

    def _all_units(self) -> list[ShardedUnit]:
        return (self.units + self.expert_units + self.vocabulary_units
                + ([self.root] if self.root is not None else []))

    def _hook_unit(self, cell: nn.Cell, unit: ShardedUnit) -> None:
        def before_forward(_cell, _inputs):
            unit.unshard()
            if unit.reshard_after_forward:
                self.saved.watch(unit)

        def after_forward(_cell, _inputs, _output):
            if unit.reshard_after_forward:
                self.saved.unwatch(unit)
                unit.reshard()

        cell.register_forward_pre_hook(before_forward)
        cell.register_forward_hook(after_forward)
        cell.register_backward_pre_hook(lambda _cell, _grad_output: unit.unshard())
        cell.register_backward_hook(lambda _cell, _grad_input, _grad_output: unit.reshard())

    @contextmanager
    def forward_context(self) -> Iterator[None]:
        """What the model's own forward hooks do around its forward pass, for callers that
        run the model's pieces directly (a pipeline stage runs its chunks without the
        model's `construct`): the root unit gathered, saved parameters kept as references."""
        self._enter_forward()
        try:
            yield
        finally:
            self.saved.exit()

    def _enter_forward(self) -> None:
        if self.root is not None:
            self.root.unshard()
        for unit in self.vocabulary_units:
            unit.use_rows()
        self.saved.enter()

    def _hook_root(self, model: nn.Cell) -> None:
        model.register_forward_pre_hook(lambda _cell, _inputs: self._enter_forward())
        model.register_forward_hook(lambda _cell, _inputs, _output: self.saved.exit())


def _owned_params(units: Sequence[nn.Cell], params: list[Parameter]) -> list[list[Parameter]]:
    """Each unit's trainable parameters; an error if a parameter is in two units or a unit's
    parameter is not the model's."""
    known = {id(p) for p in params}
    seen: dict[int, int] = {}
    owned = []
    for index, cell in enumerate(units):
        mine = list(cell.trainable_params())
        for param in mine:
            if id(param) not in known:
                raise ValueError(f"unit {index} ({type(cell).__name__}) has parameter "
                                 f"{param.name!r}, which is not a trainable parameter of the "
                                 "model")
            if id(param) in seen:
                raise ValueError(f"parameter {param.name!r} is in units {seen[id(param)]} and "
                                 f"{index}: fully sharded units must not nest or share "
                                 "parameters")
            seen[id(param)] = index
        if not mine:
            raise ValueError(f"unit {index} ({type(cell).__name__}) has no trainable "
                             "parameters")
        owned.append(mine)
    return owned
