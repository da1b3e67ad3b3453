"""Parallel degrees: how a world of ranks is divided between the kinds of parallelism.

The layout follows torchtitan's `ParallelDims`: the world is pipeline x data x context x tensor,
and data parallelism is itself replicate x shard (HSDP when both are above one; plain FSDP when
replicate is one). Data parallelism is what is left once the other degrees are taken:
`world_size // (tensor * context * pipeline)`.

Expert parallelism does not add ranks: it is laid over ranks the layout already has. The
ranks that split the experts between them (the `expert` group) are shard x context ranks of
one pipeline stage and tensor coordinate, or, when the expert degree is larger than that
block, shard x context x tensor ranks. Experts are never split by tensor parallelism (expert
tensor parallelism 1, as torchtitan's ETP = 1): under sequence parallelism each tensor rank
routes its own slice of the sequence, so the tensor ranks holding the same experts are data
parallel for them (the mesh's `expert_data` group). MindFormers borrows data and model-parallel
ranks the same way.
"""

from __future__ import annotations

from typing import Literal

import attrs

from mf_config import ParallelismConfig

from .errors import PlanError

ExpertSpan = Literal["shard_context", "shard_context_tensor"]


@attrs.frozen(kw_only=True)
class ParallelDims:
    """The degree of every kind of parallelism, for one world size. Build with `from_config`."""

    world_size: int
    pipeline: int
    data_replicate: int
    data_shard: int
    context: int
    tensor: int
    expert: int
    expert_span: ExpertSpan
    expert_node: int = 1
    """Members of an expert group that share a device and fan tokens out among themselves
    (`moe_token_dispatcher_type: alltoall_deredundancy`: `npu_nums_per_device`); 1 for the
    plain all-to-all dispatcher."""
    context_ulysses: int = 1
    """Members of a context group that exchange attention heads all-to-all (Ulysses): the
    whole group for `context_parallel_method: ulysses`, `ulysses_degree_in_cp` for `hybrid`,
    1 for `colossal` (keys and values all-gathered over the group)."""
    context_causal: bool = True
    """`context_parallel_mask_type` is causal: the sequence is cut into 2 x context chunks,
    each rank holding an early and a late one (causal load balancing)."""
    context_overlap: bool = False
    """`context_parallel_async` with a key/value all-gather to overlap (colossal, hybrid):
    attention over this rank's own keys runs while the other ranks' are gathered."""

    @property
    def data(self) -> int:
        """Data-parallel degree: replicate x shard."""
        return self.data_replicate * self.data_shard

    @property
    def hsdp(self) -> bool:
        """Hybrid sharding: sharded within groups, replicated across them."""
        return self.data_replicate > 1 and self.data_shard > 1

    @classmethod
    def from_config(cls, parallelism: ParallelismConfig, world_size: int) -> ParallelDims:
        """Derive every degree; data parallel is what tensor x context x pipeline leave.

        Args:
            parallelism: the config's `parallelism` section.
            world_size: the number of ranks.

        Returns:
            The degrees.

        Raises:
            PlanError: the degrees cannot fit the world size; names them.
        """
        if world_size < 1:
            raise PlanError(f"the world size must be >= 1, got {world_size}")
        tp, cp, pp = (parallelism.tensor_parallel, parallelism.context_parallel,
                      parallelism.pipeline_parallel)
        model_ranks = tp * cp * pp
        if world_size % model_ranks:
            raise PlanError(
                f"world size {world_size} is not divisible by tensor_parallel ({tp}) x "
                f"context_parallel ({cp}) x pipeline_parallel ({pp}) = {model_ranks}")
        data = world_size // model_ranks
        shard = data if parallelism.data_parallel_shard == -1 else parallelism.data_parallel_shard
        if data % shard:
            raise PlanError(
                f"data_parallel_shard ({shard}) must divide the data-parallel degree {data} "
                f"(world size {world_size} / (tensor {tp} x context {cp} x pipeline {pp}))")
        ep = parallelism.expert_parallel
        return cls(world_size=world_size, pipeline=pp, data_replicate=data // shard,
                   data_shard=shard, context=cp, tensor=tp, expert=ep,
                   expert_span=_expert_span(ep, shard, cp, tp),
                   expert_node=_expert_node(parallelism, ep),
                   context_ulysses=_context_ulysses(parallelism),
                   context_causal=parallelism.context_parallel_mask_type == "causal",
                   context_overlap=(parallelism.context_parallel_async
                                    and _context_ulysses(parallelism) < cp))

    def describe(self) -> str:
        """One line: `world 8 = pipeline 2 x data 2 (replicate 1 x shard 2) x context 1 x ...`."""
        text = (f"world {self.world_size} = pipeline {self.pipeline} x data {self.data} "
                f"(replicate {self.data_replicate} x shard {self.data_shard}) x context "
                f"{self.context} x tensor {self.tensor}")
        if self.expert > 1:
            over = self.expert_span.replace("_", " x ")
            text += f"; expert {self.expert} over {over}"
        if self.expert_node > 1:
            text += f" in devices of {self.expert_node}"
        if self.context > 1:
            text += f"; context {self.context}: {self.context_method()}"
        return text

    def context_method(self) -> str:
        """How attention spans the context ranks, in words (for the plan and the log)."""
        ring = self.context // self.context_ulysses
        if ring == 1:
            return f"heads all-to-all over {self.context_ulysses} (ulysses)"
        gathered = f"keys and values all-gathered over {ring}"
        if self.context_overlap:
            gathered += ", overlapped with attention over this rank's keys"
        if self.context_ulysses == 1:
            return f"{gathered} (colossal)"
        return f"heads all-to-all over {self.context_ulysses}, {gathered} (hybrid)"


def _context_ulysses(parallelism: ParallelismConfig) -> int:
    ulysses, cp = parallelism.ulysses_degree(), parallelism.context_parallel
    if cp % ulysses:
        raise PlanError(f"ulysses_degree_in_cp ({ulysses}) must divide context_parallel ({cp}) "
                        "for context_parallel_method 'hybrid'")
    return ulysses


def _expert_node(parallelism: ParallelismConfig, ep: int) -> int:
    if parallelism.moe_token_dispatcher_type != "alltoall_deredundancy" or ep == 1:
        return 1
    node = parallelism.npu_nums_per_device
    if ep % node:
        raise PlanError(
            f"expert_parallel ({ep}) must be a multiple of npu_nums_per_device ({node}) under "
            "moe_token_dispatcher_type 'alltoall_deredundancy': each device holds "
            "npu_nums_per_device members of an expert group")
    return node


def _expert_span(ep: int, shard: int, cp: int, tp: int) -> ExpertSpan:
    if ep == 1 or (shard * cp) % ep == 0:
        return "shard_context"
    if ep % tp == 0 and (shard * cp * tp) % ep == 0:
        return "shard_context_tensor"
    raise PlanError(
        f"expert_parallel ({ep}) must divide data_parallel_shard x context_parallel "
        f"({shard} x {cp} = {shard * cp}), or be a multiple of tensor_parallel ({tp}) that "
        f"divides data_parallel_shard x context_parallel x tensor_parallel "
        f"({shard * cp * tp}): expert parallelism borrows those ranks")
