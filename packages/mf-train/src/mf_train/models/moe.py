"""DeepSeek-V3 mixture of experts: sigmoid router with group-limited top-k, routed and shared
SwiGLU experts, load statistics and the sequence-wise balance loss.

Routing (DeepSeek-V3 report, eqs. 12-16; Hugging Face `DeepseekV3TopkRouter`, `noaux_tc`):
`s = sigmoid(x W_r^T)` per token and routed expert, computed in float32. The experts are
*chosen* on `s + b` (b = `e_score_correction_bias`, the auxiliary-loss-free balancing bias),
limited to the `topk_group` groups (of `n_group` equal groups) whose two best biased scores sum
highest; the chosen experts are *weighted* by the unbiased `s`, normalised to sum 1 when
`norm_topk_prob`, times `routed_scaling_factor`. Experts outside the chosen groups are never
picked (the DeepSeek reference masks them with -inf; Hugging Face masks them with 0.0, which
differs only when a negative bias makes an allowed expert's biased score negative).

Dispatch is exact (no capacity, no dropped tokens): the (token, slot) pairs are sorted by
expert, each expert runs once on its tokens, and the outputs are put back in (token, slot)
order and summed with the routing weights. The selection is not differentiable (as in
Hugging Face); the weights are, so the router learns through them and through the balance loss.

Auxiliary-loss-free balancing (report, section 2.1.2; Megatron's `moe_router_enable_expert_bias`):
after each training step, `b += gamma * sign(mean_i(c_i) - c)` with `c` the tokens routed to each
expert in the whole step (every micro-batch, every rank that routes different tokens), so an
overloaded expert's bias falls and an underloaded one's rises; `updated_expert_bias` is the
rule, `mf_train.expert_bias` gathers the counts and applies it.

Expert parallelism (`expert_group`, mf-parallel's `ExpertGroup`): this rank builds only its
share of the routed experts (named by their global index, `experts.5`, so checkpoints keep
one-process names) and the dispatch sends each token's rows to the ranks of its experts and
back (`ExpertGroup.dispatch`); the router, the shared experts and the balance loss are local.

Balance loss (report, eqs. 17-20, "complementary sequence-wise auxiliary loss"), per sequence
of T tokens: `L = alpha * sum_i f_i * P_i` with `f_i = N_r / (K_r * T) * #{t: i chosen for t}`
and `P_i = mean_t s_it / sum_j s_jt`; averaged over the sequences of the batch. The model adds
it, summed over MoE layers, to the language-model loss.

Under sequence parallelism (DeepSeek-V3's tensor parallelism) the router and the routed experts
are replicated over the tensor group ("ETP 1") and run on this rank's sequence slice; the
shared experts are column/row parallel like the dense MLP. The balance loss needs whole
sequences: each rank counts its slice's choices, the counts f_i are summed over the tensor
group, P_i is this rank's sum of normalised scores over the whole sequence length, and the
ranks' parts are summed by `ReduceFromTensorRegion` (all-reduce forward, identity backward),
so the loss and each rank's share of its gradient are one process's.
"""

from __future__ import annotations

from collections.abc import Callable

import mindspore as ms
import numpy as np
from mindspore import Parameter, Tensor, mint, nn, ops

from mf_parallel.runtime.context_parallel import ContextGroup
from mf_parallel.runtime.expert_dispatch import ExpertGroup
from mf_parallel.runtime.tensor_parallel import ReduceFromTensorRegion, TensorGroup

from .parts import LayerStack

MakeMlp = Callable[[str, int], nn.Cell]
"""Builds the SwiGLU MLP named (Hugging Face suffix under `mlp.`, e.g. `experts.3`) with the
given intermediate size."""


def select_experts(biased_scores: np.ndarray, top_k: int, n_group: int,
                   topk_group: int) -> np.ndarray:
    """Indices `[tokens, top_k]` of the experts each token is routed to.

    `biased_scores` is `[tokens, n_experts]` (sigmoid scores plus the correction bias). A
    group's score is the sum of its two highest biased scores (its only one, for one-expert
    groups); the `topk_group` best groups stay eligible and the `top_k` best eligible experts
    are chosen, best first. Ties go to the lower index.
    """
    tokens, n_experts = biased_scores.shape
    grouped = biased_scores.reshape(tokens, n_group, n_experts // n_group)
    best = min(2, grouped.shape[-1])
    group_scores = -np.sort(-grouped, axis=-1)[..., :best].sum(-1)
    chosen_groups = np.argsort(-group_scores, axis=-1, kind="stable")[:, :topk_group]
    eligible = np.zeros((tokens, n_group), dtype=bool)
    np.put_along_axis(eligible, chosen_groups, True, axis=-1)
    eligible = np.repeat(eligible, n_experts // n_group, axis=-1)
    masked = np.where(eligible, biased_scores, -np.inf)
    return np.argsort(-masked, axis=-1, kind="stable")[:, :top_k]


def expert_counts(indices: np.ndarray, n_experts: int) -> np.ndarray:
    """Tokens routed to each expert (int64 `[n_experts]`); sums to tokens * top_k."""
    return np.bincount(indices.reshape(-1), minlength=n_experts).astype(np.int64)


def updated_expert_bias(bias: np.ndarray, counts: np.ndarray, rate: float) -> np.ndarray:
    """The auxiliary-loss-free bias after one step (module docstring), in float32.

    Args:
        bias: `[..., n_experts]` current `e_score_correction_bias` (one row per layer, or one).
        counts: tokens routed to each expert in the step, the same shape.
        rate: the update rate gamma (`moe_router_bias_update_rate`).

    Returns:
        `bias + rate * sign(mean(counts) - counts)` along the last axis, float32: an expert
        exactly at the mean keeps its bias (sign 0), as in Megatron.
    """
    counts = np.asarray(counts, dtype=np.float32)
    offset = counts.mean(-1, keepdims=True, dtype=np.float32) - counts
    return (np.asarray(bias, np.float32) + np.float32(rate) * np.sign(offset)).astype(np.float32)


class Router(nn.Cell):
    """`[tokens, hidden]` -> (expert indices `[tokens, k]` as numpy, weights `[tokens, k]`,
    float32 scores `[tokens, n_experts]`). Hugging Face `mlp.gate`."""

    def __init__(self, weight: np.ndarray, top_k: int, n_group: int, topk_group: int,
                 norm_topk_prob: bool, scaling_factor: float):
        super().__init__()
        n_experts = weight.shape[0]
        self.top_k = top_k
        self.n_group, self.topk_group = n_group, topk_group
        self.norm_topk_prob, self.scaling_factor = norm_topk_prob, scaling_factor
        self.weight = Parameter(Tensor(weight), name="weight")
        # Set by auxiliary-loss-free balancing (or loaded), never by gradients.
        self.e_score_correction_bias = Parameter(
            Tensor(np.zeros(n_experts, np.float32)), name="e_score_correction_bias",
            requires_grad=False)

    def update_bias(self, counts: np.ndarray, rate: float) -> None:
        """Apply one auxiliary-loss-free step to `e_score_correction_bias` from the step's
        global `counts` (`[n_experts]`); in place, so the Parameter (and its name in
        checkpoints) stays the same."""
        bias = updated_expert_bias(self.e_score_correction_bias.asnumpy(), counts, rate)
        self.e_score_correction_bias.set_data(Tensor(bias))

    def construct(self, x: Tensor) -> tuple[np.ndarray, Tensor, Tensor]:
        logits = mint.matmul(x.astype(ms.float32), self.weight.astype(ms.float32).T)
        scores = ops.sigmoid(logits)
        biased = scores.asnumpy() + self.e_score_correction_bias.asnumpy()[None, :]
        indices = select_experts(biased, self.top_k, self.n_group, self.topk_group)
        weights = ops.gather_elements(scores, 1, Tensor(indices.astype(np.int32)))
        if self.norm_topk_prob:
            weights = weights / (weights.sum(-1, keepdims=True) + 1e-20)
        return indices, weights * self.scaling_factor, scores


def balance_loss(scores: Tensor, indices: np.ndarray, seq: int, alpha: float,
                 group: TensorGroup | None = None,
                 context: ContextGroup | None = None) -> Tensor:
    """DeepSeek-V3's sequence-wise balance loss (module docstring) of one MoE layer.

    Args:
        scores: `[seq * batch, n_experts]` float32 router scores (differentiable), tokens in
            `[seq, batch]` order (blocks.py's layout).
        indices: `[seq * batch, k]` chosen experts (numpy).
        seq: the sequence length of these tokens (this rank's slice with `group`/`context`).
        alpha: the loss coefficient.
        group: the tensor group whose ranks hold the other slices of every sequence
            (sequence parallelism), or None when the tokens are whole sequences.
        context: the context group whose ranks hold the other parts of every sequence, or
            None. Its ranks' losses are averaged by the step (as the language-model loss,
            `blocks.causal_lm_loss`), so each returns its part times the group size.

    Returns:
        The float32 scalar loss, the same on every rank of `group`.
    """
    tokens, n_experts = scores.shape
    batch, top_k = tokens // seq, indices.shape[1]
    per_sequence = indices.reshape(seq, batch, top_k)
    chosen = np.stack([expert_counts(per_sequence[:, b], n_experts) for b in range(batch)])
    normalised = scores / scores.sum(-1, keepdims=True)
    slices = (1 if group is None else group.size) * (1 if context is None else context.size)
    if slices == 1:
        fraction = Tensor((chosen * (n_experts / (top_k * seq))).astype(np.float32))
        probability = normalised.reshape(seq, batch, n_experts).mean(0)
        return (fraction * probability).sum(-1).mean() * alpha
    whole = seq * slices
    counts = Tensor(chosen.astype(np.float32))
    for over in (group, context):
        if over is not None:
            counts = over.all_reduce(counts)
    fraction = Tensor((counts.asnumpy() * (n_experts / (top_k * whole))).astype(np.float32))
    probability = normalised.reshape(seq, batch, n_experts).sum(0) / whole
    part = (fraction * probability).sum(-1).mean() * alpha
    if group is not None:
        part = ReduceFromTensorRegion(group)(part)
    return part if context is None else part * context.size


class MoE(nn.Cell):
    """`[seq, batch, hidden]` -> (output, balance loss: a float32 scalar, alpha included).

    Sub-cells (Hugging Face names in brackets): `router` (`gate`), `experts` (`experts`:
    this rank's routed experts under their global indices), `shared_experts`
    (`shared_experts`; None when `n_shared_experts` is 0). `last_tokens_per_expert` holds the
    counts of this rank's routing in the last forward, `last_expert_load` the (token, expert)
    pairs this rank's experts computed (the same without expert parallelism).
    `sequence_group`: the tensor group over which the input is a sequence slice (module
    docstring), or None; `context`: the context group holding the other parts of the
    sequences, or None.
    """

    def __init__(self, *, moe_intermediate_size: int, n_routed_experts: int,
                 num_experts_per_tok: int, n_shared_experts: int, n_group: int, topk_group: int,
                 norm_topk_prob: bool, routed_scaling_factor: float, aux_loss_alpha: float,
                 router_weight: np.ndarray, make_mlp: MakeMlp,
                 expert_group: ExpertGroup | None = None,
                 sequence_group: TensorGroup | None = None,
                 context: ContextGroup | None = None):
        super().__init__()
        self.n_experts, self.top_k = n_routed_experts, num_experts_per_tok
        self.expert_group = expert_group if expert_group and expert_group.size > 1 else None
        held = (range(n_routed_experts) if self.expert_group is None
                else self.expert_group.local_experts(n_routed_experts))
        self.aux_loss_alpha = aux_loss_alpha
        self.sequence_group = sequence_group  # the balance loss's whole sequences span it
        self.context = context  # and the context group
        self.router = Router(router_weight, num_experts_per_tok, n_group, topk_group,
                             norm_topk_prob, routed_scaling_factor)
        self.experts = LayerStack({e: make_mlp(f"experts.{e}", moe_intermediate_size)
                                   for e in held})
        self.shared_experts = (make_mlp("shared_experts", moe_intermediate_size * n_shared_experts)
                               if n_shared_experts else None)
        self.last_tokens_per_expert = np.zeros(n_routed_experts, np.int64)
        self.last_expert_load = np.zeros(n_routed_experts, np.int64)

    def construct(self, x: Tensor) -> tuple[Tensor, Tensor]:
        seq, batch, hidden = x.shape
        flat = x.reshape(seq * batch, hidden)
        indices, weights, scores = self.router(flat)
        self.last_tokens_per_expert = expert_counts(indices, self.n_experts)
        out = self._routed(flat, indices, weights).reshape(seq, batch, hidden)
        if self.shared_experts is not None:
            out = out + self.shared_experts(x)
        if self.aux_loss_alpha == 0:
            return out, ops.zeros((), ms.float32)
        return out, balance_loss(scores, indices, seq, self.aux_loss_alpha,
                                 self.sequence_group, self.context)

    def _routed(self, flat: Tensor, indices: np.ndarray, weights: Tensor) -> Tensor:
        """Sum over each token's k experts of weight * expert(token), exactly."""
        if self.expert_group is not None:
            done = self.expert_group.dispatch(flat, indices, weights, self.n_experts,
                                              lambda e, rows: self.experts.by_id(e)(rows))
            self.last_expert_load = done.load
            return done.output
        self.last_expert_load = self.last_tokens_per_expert
        tokens, top_k = indices.shape
        order = np.argsort(indices.reshape(-1), kind="stable")  # (token, slot) pairs by expert
        inputs = ops.gather(flat, Tensor((order // top_k).astype(np.int32)), 0)
        outputs, start = [], 0
        for expert, count in zip(self.experts, self.last_tokens_per_expert.tolist(), strict=True):
            if count:
                outputs.append(expert(inputs[start:start + count]))
            start += count
        by_expert = ops.cat(outputs, 0) if len(outputs) > 1 else outputs[0]
        back = Tensor(np.argsort(order, kind="stable").astype(np.int32))
        per_slot = ops.gather(by_expert, back, 0).reshape(tokens, top_k, -1)
        # Weighted in float32, as Hugging Face sums the experts' outputs in the weights' dtype.
        mixed = (per_slot.astype(ms.float32) * weights.expand_dims(-1)).sum(1)
        return mixed.astype(flat.dtype)
