"""Parameters, gradients and optimizer state one rank holds under data parallelism: replicated,
or sharded (ZeRO-1, ZeRO-2, FSDP) as mf-train runs the sharded strategies.

With a shard degree S (`parallelism.data_parallel_shard`, as the plan resolves it) above one,
mf-parallel lays a stage's parameters out in flat buffers, one per decoder layer and one, the
root, for the rest (embedding, final norm, head), each padded to a multiple of S; every rank
keeps one slice of each buffer (`mf_parallel.runtime.flat_shard`), and mf-train's
`ShardedAdamW` keeps the float32 state of the slices and updates them buffer by buffer:

- `optim` (ZeRO-1): whole parameters; whole gradients, accumulated over the micro-batches as
  replicated data parallelism does, then reduced buffer by buffer to this rank's slice (each
  buffer's whole gradients freed once reduced); after the update every buffer's slices are
  all-gathered back into the parameters, one buffer at a time;
- `optim_grads` (ZeRO-2): the same, but a buffer's gradients are reduced during the backward
  pass as soon as they are complete and added to the step's float32 sums of this rank's slices
  (`mf_parallel.runtime.grad_shards`), so whole gradients never outlive their buffer;
- `optim_grads_params` (FSDP): only the slices of the parameters between steps; each decoder
  layer's unit is gathered around its forward and its backward pass, the root unit through the
  whole forward and backward; gradients as ZeRO-2, no all-gather after the update. Without
  tensor or pipeline parallelism, and where S divides the vocabulary, the vocabulary tables
  (the embedding, an untied head) are buffers of one table each, kept as this rank's rows and
  never gathered (`vocabulary_rows`, mf-parallel's `sharded_vocabulary`): backward produces
  their gradients as this rank's rows, P_table / S.

Under pipeline parallelism, and under expert parallelism when no other rank holds the same
experts, the composing layout runs the backward pass itself: every strategy then accumulates
whole gradients, as ZeRO-1, and reduces them buffer by buffer after it. Routed experts under
expert parallelism are left out of the layers' buffers: kept whole on every rank that holds
them, with their own optimizer (mf-train's `ExpertParallel`), when E_d = 1 (no other rank
holds the same experts); so is every parameter that takes no gradient (DeepSeek's routing
bias). With E_d > 1 ZeRO and FSDP shard them too (`sliced_experts`): each MoE layer's experts
one more buffer over the expert-data group, their state sliced over it; FSDP's are sliced
between steps too and gathered with their layer. The backward pass is then ZeRO's or FSDP's,
everything reduced during it: a layer's experts once the layer's other gradients are there
(an expert no token went to then gives zeros), whole until then.

Notation: S the shard degree; P_b the elements of buffer b on this device (its trainable
parameters, after the tensor-parallel split); n_b = ⌈P_b / S⌉ this rank's slice of it;
N = Σ_b n_b; P_out the elements outside the buffers; p bytes per parameter
(`model.params_dtype`); G_b = P_b·p the whole gradients of buffer b; c = 2 where the backend
reduce-scatters a flattened copy of a buffer's gradients (Ascend, GPU), 1 on CPU (mf-parallel
emulates the reduce-scatter there one rank's range at a time, so only slices are made).
Temporaries of one slice (1/S of a buffer) inside a reduction are left out. Pure Python.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from mf_config import TrainConfig
from mf_parallel import Plan, keeps_vocabulary_rows, reshard_plan

from .model_shape import EstimateError
from .param_groups import ParamGroup

OPTIMIZER_STATES = {"adamw": 2, "adam": 2, "muon": 1, "sgd": 1}
"""float32 buffers per parameter: Adam's two moments, Muon's / SGD's momentum."""
ZERO_1, FSDP = "optim", "optim_grads_params"
VOCABULARY_TABLES = ("embedding", "head")
"""The root groups whose rows are the vocabulary (`param_groups`' names)."""


def shard(count: int, degree: int) -> int:
    """`count / degree`, rounded up: one rank's slice of a flat buffer padded to a multiple
    of the degree."""
    return -(-count // degree)


def optimizer_bytes(groups: list[ParamGroup], tp: int, optimizer: str, param_bytes: int,
                    ep: int = 1) -> int:
    """Optimizer state of whole parameters: AdamW/Adam two float32 moments per parameter
    (8 B); Muon one float32 momentum (4 B) on hidden matrices, AdamW's 8 B on the rest
    (embedding, head, norms); SGD one momentum (4 B); plus a float32 master copy (4 B) when
    parameters are 16-bit. Buffers (`trainable` False) have none; routed experts count E / ep."""
    kind = optimizer.lower()
    if kind not in OPTIMIZER_STATES:
        raise EstimateError(f"optimizer.type: {optimizer!r} is not modelled; known: AdamW, "
                            "Adam, Muon, SGD")
    master = 4 if param_bytes < 4 else 0
    total = 0
    for group in groups:
        if not group.trainable:
            continue
        states = OPTIMIZER_STATES[kind] if group.matrix or kind != "muon" else 2
        total += group.per_device(tp, ep) * (4 * states + master)
    return total


@dataclass(frozen=True)
class DataParallelRank:
    """What one rank of one pipeline stage holds of the parameters, gradients and optimizer
    state, each figure in bytes (replicated data parallelism when `degree` is 1).

    `units` are the stage's decoder layers' parameter groups in forward order, `root` the
    stage's other groups (embedding, final norm, head); see the module docstring.
    """

    units: tuple[tuple[ParamGroup, ...], ...]
    root: tuple[ParamGroup, ...]
    strategy: str
    """`parallelism.data_parallel_shard_strategy`."""
    degree: int
    """S, the shard degree (1: replicated)."""
    tp: int
    ep: int
    param_bytes: int
    """p."""
    scatters: bool
    """Gradients reduced during the backward pass (ZeRO-2 and FSDP on one stage without
    expert parallelism); otherwise accumulated whole."""
    tied: bool
    """The head reuses the embedding table."""
    reduce_copy: int
    """c."""
    micro_batches: int = 1
    """Micro-batches per optimizer step on this rank (gradient accumulation)."""
    expert_data: int = 1
    """E_d, the ranks routed experts are sliced over under expert parallelism with a sharded
    strategy (their expert-data group); 1 when each rank keeps its experts' state whole."""
    vocabulary_rows: bool = False
    """FSDP keeps the vocabulary tables as this rank's rows, in buffers of their own, never
    gathered (see the module docstring)."""
    all_reduced: bool = False
    """Replicated data parallelism over more than one rank: the whole gradients all-reduced
    into new tensors (mf-parallel's `GradientSync`, bucket by bucket), which the update reads
    while the local ones are still held."""

    def is_table(self, group: ParamGroup) -> bool:
        """Whether a root group is a vocabulary table kept as rows (`vocabulary_rows`)."""
        return self.fsdp and self.vocabulary_rows and group.name in VOCABULARY_TABLES

    @property
    def tables(self) -> list[ParamGroup]:
        """The vocabulary tables kept as rows, in mf-parallel's order (embedding, head)."""
        return [g for g in self.root if self.is_table(g) and self.in_buffers(g)]

    @property
    def rest(self) -> list[ParamGroup]:
        """The root unit's groups: the root's groups other than the `tables`."""
        return [g for g in self.root if not self.is_table(g)]

    @property
    def sharded(self) -> bool:
        return self.degree > 1

    @property
    def fsdp(self) -> bool:
        return self.sharded and self.strategy == FSDP

    @property
    def sliced_experts(self) -> bool:
        """Whether ZeRO or FSDP holds the routed experts in buffers of their own, sliced
        over the expert-data group (expert parallelism, E_d > 1); FSDP's parameters too."""
        return self.sharded and self.ep > 1 and self.expert_data > 1

    def experts(self, groups: Iterable[ParamGroup] | None = None) -> int:
        """E: elements of routed experts this rank holds, outside the buffers (expert
        parallelism), of `groups` (default: the stage's)."""
        return self.elements(self.groups if groups is None else groups,
                             lambda g: g.expert and g.trainable and not self.in_buffers(g))

    # ----- the buffers

    def in_buffers(self, group: ParamGroup) -> bool:
        """Whether a group is laid out in the flat buffers (trainable, and not a routed expert
        under expert parallelism)."""
        return self.sharded and group.trainable and not (group.expert and self.ep > 1)

    def elements(self, groups: Iterable[ParamGroup],
                 where: Callable[[ParamGroup], bool] | None = None) -> int:
        """Elements of `groups` (those `where` accepts) on this device."""
        return sum(g.per_device(self.tp, self.ep) for g in groups if where is None or where(g))

    def count(self, groups: Iterable[ParamGroup]) -> int:
        """P_b: elements of `groups` on this device that are in the buffers."""
        return self.elements(groups, self.in_buffers)

    def _outside(self, trainable_only: bool = False) -> int:
        """P_out: elements outside the buffers (of trainable groups only, if asked)."""
        return self.elements(self.groups, lambda g: not self.in_buffers(g)
                             and (g.trainable or not trainable_only))

    @property
    def groups(self) -> list[ParamGroup]:
        return [g for unit in self.units for g in unit] + list(self.root)

    @property
    def buffers(self) -> list[int]:
        """P_b of each buffer, in mf-parallel's order: the layers, the vocabulary tables kept
        as rows (one each), then the root (if it has any parameter)."""
        sizes = [self.count(unit) for unit in self.units]
        root = self.count(self.rest)
        return sizes + [self.count([g]) for g in self.tables] + ([root] if root else [])

    @property
    def slices(self) -> list[int]:
        """n_b = ⌈P_b / S⌉ of each buffer (a rank's chunk of each of its tensors, whose padding,
        at most S - 1 elements a tensor, is left out)."""
        return [shard(size, self.degree) for size in self.buffers]

    def reduction_order(self) -> list[int]:
        """The buffers (indices into `buffers`) in the order they are reduced: backward
        reaches a buffer's first parameter last, so the layers last to first, and the root at
        the end when it holds the embedding (first otherwise: on a later pipeline stage it
        holds the final norm and head, which come after the layers)."""
        layers = list(reversed(range(len(self.units))))
        tables = {g.name: len(self.units) + i for i, g in enumerate(self.tables)}
        root = [len(self.units) + len(tables)] if self.count(self.rest) else []
        if tables:  # the head's first, then the final norm's root; the embedding's last
            head = [tables["head"]] if "head" in tables else []
            embedding = [tables["embedding"]] if "embedding" in tables else []
            return [*head, *root, *layers, *embedding]
        if not root:
            return layers
        if any(g.name == "embedding" for g in self.root):
            return [*layers, *root]
        return [*root, *layers]

    # ----- the figures

    def held_params(self) -> int:
        """Parameter elements held between steps (what mf-train's layouts count,
        `StepLayout.held_parameters`): replicated and ZeRO, every parameter of the stage
        whole, Σ P; FSDP, this rank's slices and what is outside the buffers, N + P_out."""
        if not self.fsdp:
            return self.elements(self.groups)
        held = sum(self.slices) + self._outside()
        if self.sliced_experts:  # ⌈E / E_d⌉ instead of E
            held += shard(self.experts(), self.expert_data) - self.experts()
        return held

    def params(self) -> int:
        """Parameters held between steps: `held_params`·p."""
        return self.held_params() * self.param_bytes

    def part_bytes(self, groups: list[ParamGroup]) -> int:
        """Bytes of some groups held between steps, for the breakdown by part: whole, or under
        FSDP each group's slice ⌈P_g / S⌉·p (the buffers' padding is in `params` only)."""
        if not self.fsdp:
            return self.elements(groups) * self.param_bytes
        return sum(shard(self.elements([g]), self.degree) if self.in_buffers(g)
                   else shard(self.elements([g]), self.expert_data) if self.experts([g])
                   and self.sliced_experts else self.elements([g])
                   for g in groups) * self.param_bytes

    def grads(self) -> int:
        """Gradients at the backward pass's peak.

        Accumulated whole (replicated, ZeRO-1, and every strategy under pipeline or expert
        parallelism): Σ P·p over the trainable groups, twice with several micro-batches (the
        running sum and the micro-batch's own gradients while mf-train adds them, tensor by
        tensor). Reduced during backward (ZeRO-2, FSDP
        otherwise): the float32 sums of this rank's slices 4·N (each buffer's is added as the
        buffer completes; from the second micro-batch on all of them exist), the whole
        gradients in flight (`in_flight_grads`), and those of the trainable parameters outside
        the buffers, P_out·p (with sliced experts, also their float32 sums, 4·⌈E / E_d⌉).
        """
        p = self.param_bytes
        if not self.scatters:
            copies = 2 if self.micro_batches > 1 else 1
            return (copies * self.elements(self.groups, lambda g: g.trainable) * p
                    + self.tied_sum())
        sliced = self.experts() if self.sliced_experts else 0  # in flight, layer by layer
        return (4 * sum(self.slices) + self.in_flight_grads() + (self._outside(True) - sliced) * p
                + self._expert_sums())

    def tied_sum(self) -> int:
        """2·P_table·p: what a tied table's gradient adds at the end of the backward pass,
        when its embedding and head are on this stage and it is not kept as rows. MindSpore's
        autograd holds the head's gradient from the start of the backward pass, forms the
        embedding's as a dense table at its end and adds the two into a third, before any
        hook sees the sum; the two beside the one the other figures count are whole at once.
        On the CPU backend's pool they add to the backward pass's peak (the blocks the
        activations freed are too small to hold them). 0 otherwise."""
        if not self.tied or (self.vocabulary_rows and self.fsdp):
            return 0
        tables = [g for g in self.root if g.name == "embedding"]
        if not tables or any(g.name == "head" for g in self.root):
            return 0
        return 2 * self.elements(tables) * self.param_bytes

    def _expert_sums(self) -> int:
        """4·⌈E / E_d⌉: the float32 sums of the experts' slices (`sliced_experts`; 0
        otherwise)."""
        return 4 * shard(self.experts(), self.expert_data) if self.sliced_experts else 0

    def in_flight_grads(self) -> int:
        """Whole gradients alive at once while ZeRO-2 and FSDP reduce them during backward.

        The buffers are reduced in one fixed order (`reduction_order`), each as soon as it
        and the ones before it are complete, then freed. The root's parameters used after the
        layers (final norm, and the head, or with a tied head the shared table, whose gradient
        from the head is summed with the embedding's at the end) hold gradients G_late from
        the start of backward until the root is reduced. So each layer's reduction holds
        G_late + c·G_b (its gradients and their flattened copy), and the root's c·G_root (with
        k the root's position in the order, the buffers from k on are whole together). A
        layer's routed experts (with the layer's buffer, or sliced experts in a buffer of
        their own reduced right after it) are complete once the layer's other parameters
        are: X = max_layer E_l·p, the sliced experts of one layer, whole beside the layer's
        reduction, then reduced themselves:

            in flight = max(G_late + X + c·max_{j<k} G_j, Σ_{j≥k} G_j + (c - 1)·max_{j≥k} G_j,
                            c·X)

        Gradients a monitor watches are kept whole as well (not counted).
        """
        p, c = self.param_bytes, self.reduce_copy
        sizes = self.buffers
        experts = max((self.experts(unit) for unit in self.units), default=0) * p \
            if self.sliced_experts else 0
        if self.tables:
            return self._in_flight_with_rows(experts)
        order = self.reduction_order()
        k = order.index(len(self.units)) if len(sizes) > len(self.units) else len(order)
        early, tail = [sizes[b] * p for b in order[:k]], [sizes[b] * p for b in order[k:]]
        late_root = self.elements(self.root, lambda g: self.in_buffers(g)
                                  and (g.name != "embedding" or self.tied)) * p
        return max(late_root + experts + c * max(early, default=0),
                   sum(tail) + (c - 1) * max(tail, default=0) + self.tied_sum(), c * experts)

    def _in_flight_with_rows(self, experts: int) -> int:
        """`in_flight_grads` with the vocabulary tables kept as rows: the head's rows and the
        final norm's root are complete, and reduced, as backward starts; a tied table's rows
        then hold their gradient G_rows = ⌈P_table / S⌉·p (the head's share) through the
        layers until the embedding adds its own at the end:

            in flight = max(G_rows·[tied] + X + c·max_j G_j, c·G_rows, c·G_root, c·X)
        """
        p, c = self.param_bytes, self.reduce_copy
        rows = shard(self.count([self.tables[0]]), self.degree) * p
        layers = max((self.count(unit) * p for unit in self.units), default=0)
        return max((rows if self.tied else 0) + experts + c * layers, c * rows,
                   c * self.count(self.rest) * p, c * experts)

    def optimizer(self, kind: str) -> int:
        """Optimizer state held between steps.

        Replicated: `optimizer_bytes` of every group. Sharded (mf-train's `ShardedAdamW`):
        per slice element the two float32 moments (8 B) and a float32 master (4 B); under ZeRO
        the buffers' own slices in the parameter dtype are kept too, which with p = 4 the
        master is (shared), and under FSDP they are the parameters (counted in `params`):

            ZeRO: N·(12 + [p < 4]·p)        FSDP: N·(8 + [p < 4]·4)

        plus the state of the groups outside the buffers: routed experts under expert
        parallelism, over their slices of the expert-data group when E_d > 1 (FSDP's
        per element under FSDP, whose units they are; ZeRO's under ZeRO:
        ⌈P_experts / E_d⌉·(12 + [p < 4]·p)), or whole with their own optimizer
        (`optimizer_bytes`).
        """
        if not self.sharded:
            return optimizer_bytes(self.groups, self.tp, kind, self.param_bytes, self.ep)
        p = self.param_bytes
        per_element = 8 + (4 if p < 4 else 0) if self.fsdp else 12 + (p if p < 4 else 0)
        outside = [g for g in self.groups if not self.in_buffers(g)]
        sliced = [g for g in outside if g.expert and g.trainable and self.expert_data > 1]
        whole = [g for g in outside if all(g is not s for s in sliced)]
        experts = shard(self.elements(sliced), self.expert_data) * per_element
        return (sum(self.slices) * per_element + experts
                + optimizer_bytes(whole, self.tp, kind, p, self.ep))

    def gathered(self, policy: str, pipeline: int) -> int:
        """Parameters FSDP gathers beside this rank's slices (which stay, in `params`).

        The root unit (embedding, final norm, head; the final norm alone when the vocabulary
        tables are kept as rows, never gathered) is gathered when the forward pass starts and
        stays so until the step's gradients are reduced: P_root·p. Each layer unit i is
        gathered around its forward pass and again around its backward pass if it reshards
        after forward (mf_parallel.reshard_plan; `default` keeps the last unit, `never` every
        unit); each tensor is all-gathered straight into its own memory (mf-parallel's
        `FlatShard`: one all-gather per tensor, no buffer of the unit beside), while the
        earlier units that do not reshard are still gathered:

            gathered = (P_root + max_i (Σ_{j<i, kept} P_j + P_i))·p

        FSDP's sliced experts (`sliced_experts`) are gathered with their layer: P_i then adds
        the layer's experts E_i; other routed experts under expert parallelism are never
        gathered.
        """
        if not self.fsdp or not self.units:
            return 0
        sizes = self.buffers
        root = self.count(self.rest)
        peak = kept = 0
        for i, reshards in enumerate(reshard_plan(policy, len(self.units), pipeline)):
            experts = self.experts(self.units[i]) if self.sliced_experts else 0
            gathered = sizes[i] + experts
            peak = max(peak, kept + gathered)
            if not reshards:
                kept += gathered
        return (root + peak) * self.param_bytes

    def build_transient(self) -> int:
        """Whole parameters the build holds beside this rank's share before cutting them:
        FSDP cuts each decoder layer as it is built, and the root unit (embedding, final
        norm, head) once the model exists, so the root and one layer are whole at once,
        (P_root + max_i P_i)·p; under ZeRO and replicated parameters are whole anyway (0).
        """
        if not self.fsdp:
            return 0
        root = self.count(self.root)
        return (root + max(self.buffers[:len(self.units)], default=0)) * self.param_bytes

    def step(self) -> int:
        """Bytes the optimizer step holds beside the parameters and the optimizer state,
        after the backward pass (activations, logits and gathered parameters freed).

        - Replicated over more than one rank (`all_reduced`): the local whole gradients and
          their all-reduced copies, 2·Σ P·p, and while a bucket is summed its concatenated
          input beside, at most the largest parameter group's P_g·p (the buckets of the
          small tensors are smaller here); one process: 0, its update works on the whole
          gradients the backward pass already held.

        - Reducing whole gradients (ZeRO-1; any strategy under pipeline or expert
          parallelism), buffer by buffer in `reduction_order`: at its k-th buffer the
          gradients not reduced yet, the slices reduced so far and the buffer's flattened
          copy, max_k (Σ_{j≥k} G_j + 4·Σ_{j<k} n_j + (c - 1)·G_k), plus the whole gradients
          outside the buffers G_out.
        - Then the float32 gradient slices 4·N and G_out are held through the update, with
          the larger of
          - the update's temporaries (`ShardedAdamW.step`, buffer by buffer, the float32
            masters and moments updated in place): one buffer's clipped gradient slice
            4·n_b and its decayed master 4·n_b before it is assigned back;
          - ZeRO's all-gather of one buffer into the parameters: the parameters' new copies
            P_b, each tensor gathered straight into its own memory, P_b·p (FSDP gathers
            nothing here).

            step = max(reduction, 4·N + G_out + max(8·max n_b, ZeRO: max_b P_b·p))
        """
        if not self.sharded:
            if not self.all_reduced:
                return 0
            trainable = [g for g in self.groups if g.trainable]
            bucket = max((self.elements([g]) for g in trainable), default=0)
            return (2 * self.elements(trainable) + bucket) * self.param_bytes
        p, c = self.param_bytes, self.reduce_copy
        sizes, slices = self.buffers, self.slices
        outside = self._outside(True) * p
        if self.sliced_experts:  # reduced to their float32 slices when the backward ended
            outside += self._expert_sums() - self.experts() * p
        reduction = 0
        if not self.scatters:
            order = self.reduction_order()
            reduction = outside + max(
                (sum(sizes[b] for b in order[k:]) * p + 4 * sum(slices[b] for b in order[:k])
                 + (c - 1) * sizes[order[k]] * p for k in range(len(order))), default=0)
        biggest = max(slices, default=0)
        update = 8 * biggest
        gather = 0 if self.fsdp else max(sizes, default=0) * p
        return max(reduction, 4 * sum(slices) + outside + max(update, gather))

    def notes(self, optimizer: str) -> list[str]:
        """A warning when the optimizer cannot run sharded (mf-train refuses it)."""
        if not self.sharded or optimizer.lower() == "adamw":
            return []
        return [f"optimizer.type: {optimizer!r} cannot run under data_parallel_shard_strategy "
                f"{self.strategy!r} (mf-train updates the slices with AdamW only and refuses "
                "it); the slices' state is estimated as AdamW's"]


def data_parallel_rank(config: TrainConfig, plan: Plan, units: list[list[ParamGroup]],
                       root: list[ParamGroup], *, tied: bool, param_bytes: int,
                       vocab_size: int = 0) -> DataParallelRank:
    """What a rank of `plan` holds of a stage of `units` (its decoder layers' groups, in
    forward order) and `root` (its other groups); `vocab_size` decides whether FSDP keeps
    the vocabulary tables as rows (0: never)."""
    d = plan.dims
    strategy = config.parallelism.data_parallel_shard_strategy
    expert_data = expert_shard_degree(plan) if d.expert > 1 else 1
    return DataParallelRank(
        units=tuple(tuple(unit) for unit in units), root=tuple(root), strategy=strategy,
        degree=d.data_shard, tp=d.tensor, ep=d.expert, param_bytes=param_bytes,
        scatters=d.data_shard > 1 and strategy != ZERO_1 and d.pipeline == 1
        and (d.expert == 1 or expert_data > 1),
        tied=tied, reduce_copy=1 if config.context.device_target == "CPU" else 2,
        micro_batches=plan.batch.accumulation_steps(), expert_data=expert_data,
        vocabulary_rows=keeps_vocabulary_rows(vocab_size, d.data_shard, d.tensor, d.pipeline),
        all_reduced=d.data_shard == 1 and d.data > 1)


def expert_shard_degree(plan: Plan) -> int:
    """The degree that slices the routed experts' optimizer state: without expert parallelism
    they are sliced with the rest over the shard group; with it and a sharded strategy, over
    their expert-data group (the ranks holding the same experts, world / (pipeline x
    expert)); replicated, each rank keeps its experts' state whole."""
    d = plan.dims
    if d.expert == 1:
        return d.data_shard
    return d.world_size // (d.pipeline * d.expert) if d.data_shard > 1 else 1
