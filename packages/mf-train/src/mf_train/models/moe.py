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

Where it runs: the scores, the group-limited top-k, the weights, the balance loss and the
bias update run on the device. A layer reads one thing back to the host per forward: the
chosen experts (without expert parallelism this rank's `[tokens, top_k]`; with it, the
group's tables after their all-gather), because PyNative runs each expert on a slice whose
length is its token count (Megatron's dispatchers read their split sizes likewise).

Auxiliary-loss-free balancing (report, section 2.1.2; Megatron's `moe_router_enable_expert_bias`):
after each training step, `b += gamma * sign(mean_i(c_i) - c)` with `c` the tokens routed to each
expert in the whole step (every micro-batch, every rank that routes different tokens), so an
overloaded expert's bias falls and an underloaded one's rises; `updated_expert_bias` is the
rule, `mf_train.step.expert_bias` gathers the counts and applies it.

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

from collections.abc import Callable, Sequence
from typing import Any

import mindspore as ms
import numpy as np
from mindspore import Parameter, Tensor, mint, nn, ops

from .parts import LayerStack

MakeMlp = Callable[[str, int], nn.Cell]
"""Builds the SwiGLU MLP named (Hugging Face suffix under `mlp.`, e.g. `experts.3`) with the
given intermediate size."""


def select_experts(biased_scores: Tensor, top_k: int, n_group: int,
                   topk_group: int) -> Tensor:
    """Indices `[tokens, top_k]` (int32, on the device) of the experts each token is routed to.

    `biased_scores` is `[tokens, n_experts]` float32 (sigmoid scores plus the correction
    bias). A group's score is the sum of its two highest biased scores (its only one, for
    one-expert groups); the `topk_group` best groups stay eligible and the `top_k` best
    eligible experts are chosen, best first; of equal scores the lower index (a stable
    descending sort: `ops.topk` orders ties differently on CPU).
    """
    tokens, n_experts = biased_scores.shape
    per_group = n_experts // n_group
    if topk_group < n_group:
        grouped = biased_scores.reshape(tokens, n_group, per_group)
        group_scores = ops.topk(grouped, min(2, per_group))[0].sum(-1)
        chosen_groups = ops.argsort(group_scores, -1, descending=True)[:, :topk_group]
        eligible = ops.one_hot(chosen_groups, n_group, Tensor(1.0, ms.float32),
                               Tensor(0.0, ms.float32)).sum(1) > 0
        eligible = eligible.expand_dims(-1).broadcast_to(grouped.shape).reshape(tokens,
                                                                                n_experts)
        biased_scores = ops.masked_fill(biased_scores, ops.logical_not(eligible),
                                        float("-inf"))
    return ops.argsort(biased_scores, -1, descending=True)[:, :top_k].astype(ms.int32)


def expert_counts(indices: np.ndarray, n_experts: int) -> np.ndarray:
    """Tokens routed to each expert (int64 `[n_experts]`); sums to tokens * top_k."""
    return np.bincount(indices.reshape(-1), minlength=n_experts).astype(np.int64)


def updated_expert_bias(bias: Tensor, counts: Tensor, rate: float) -> Tensor:
    """The auxiliary-loss-free bias after one step (module docstring), on the device.

    Args:
        bias: `[..., n_experts]` float32 current `e_score_correction_bias` (one row per
            layer, or one).
        counts: tokens routed to each expert in the step, the same shape (float32, exact).
        rate: the update rate gamma (`moe_router_bias_update_rate`).

    Returns:
        `bias + rate * sign(mean(counts) - counts)` along the last axis, float32: an expert
        exactly at the mean keeps its bias (sign 0), as in Megatron.
    """
    counts = counts.astype(ms.float32)
    offset = ops.mean(counts, -1, True) - counts
    return bias.astype(ms.float32) + ops.sign(offset) * rate


class Router(nn.Cell):
    """`[tokens, hidden]` -> (expert indices `[tokens, k]` int32, weights `[tokens, k]`,
    float32 scores `[tokens, n_experts]`), all on the device. Hugging Face `mlp.gate`."""

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

    def update_bias(self, counts: Tensor, rate: float) -> None:
        """Apply one auxiliary-loss-free step to `e_score_correction_bias` from the step's
        global `counts` (`[n_experts]`, on the device); in place, so the Parameter (and its
        name in checkpoints) stays the same."""
        ops.assign(self.e_score_correction_bias,
                   updated_expert_bias(self.e_score_correction_bias, counts, rate))

    def construct(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        logits = mint.matmul(x.astype(ms.float32), self.weight.astype(ms.float32).T)
        scores = ops.sigmoid(logits)
        biased = ops.stop_gradient(scores) + self.e_score_correction_bias.expand_dims(0)
        indices = select_experts(biased, self.top_k, self.n_group, self.topk_group)
        weights = ops.gather_elements(scores, 1, indices)
        if self.norm_topk_prob:
            weights = weights / (weights.sum(-1, keepdims=True) + 1e-20)
        return indices, weights * self.scaling_factor, scores


def balance_loss(scores: Tensor, indices: Tensor, seq: int, alpha: float,
                 group: Any = None, context: Any = None,
                 group_sum: Callable[[Tensor], Tensor] | None = None) -> Tensor:
    """DeepSeek-V3's sequence-wise balance loss (module docstring) of one MoE layer, on the
    device.

    Args:
        scores: `[seq * batch, n_experts]` float32 router scores (differentiable), tokens in
            `[seq, batch]` order (blocks.py's layout).
        indices: `[seq * batch, k]` chosen experts (int32).
        seq: the sequence length of these tokens (this rank's slice with `group`/`context`).
        alpha: the loss coefficient.
        group: the tensor group whose ranks hold the other slices of every sequence
            (sequence parallelism), or None when the tokens are whole sequences.
        context: the context group whose ranks hold the other parts of every sequence, or
            None. Its ranks' losses are averaged by the step (as the language-model loss,
            `blocks.causal_lm_loss`), so each returns its part times the group size.
        group_sum: `group`'s all-reduce forward, identity backward (mf-parallel's
            `ReduceFromTensorRegion`), with `group`.

    Returns:
        The float32 scalar loss, the same on every rank of `group`.
    """
    tokens, n_experts = scores.shape
    batch, top_k = tokens // seq, indices.shape[1]
    chosen = ops.one_hot(indices, n_experts, Tensor(1.0, ms.float32), Tensor(0.0, ms.float32))
    counts = chosen.sum(1).reshape(seq, batch, n_experts).sum(0)     # [batch, n_experts]
    normalised = scores / scores.sum(-1, keepdims=True)
    slices = (1 if group is None else group.size) * (1 if context is None else context.size)
    if slices == 1:
        fraction = counts * float(np.float32(n_experts / (top_k * seq)))
        probability = normalised.reshape(seq, batch, n_experts).mean(0)
        return (fraction * probability).sum(-1).mean() * alpha
    whole = seq * slices
    for over in (group, context):
        if over is not None:
            counts = over.all_reduce(counts)
    fraction = counts * float(np.float32(n_experts / (top_k * whole)))
    probability = normalised.reshape(seq, batch, n_experts).sum(0) / whole
    part = (fraction * probability).sum(-1).mean() * alpha
    if group_sum is not None:
        part = group_sum(part)
    return part if context is None else part * context.size


class MoE(nn.Cell):
    """`[seq, batch, hidden]` -> (output, balance loss: a float32 scalar, alpha included).

    Sub-cells (Hugging Face names in brackets): `router` (`gate`), `experts` (`experts`:
    this rank's routed experts under their global indices), `shared_experts`
    (`shared_experts`; None when `n_shared_experts` is 0). `last_tokens_per_expert` holds the
    counts of this rank's routing in the last forward, `last_expert_load` the (token, expert)
    pairs this rank's experts computed (the same without expert parallelism).

    Parallelism is set from outside (`mf_train.parallelize`): `expert_group` dispatches the
    tokens to the ranks of their experts (None: every expert here); `sequence_group` is the
    tensor group over which the input is a sequence slice (module docstring) and
    `sequence_sum` its forward all-reduce; `context` the context group holding the other
    parts of the sequences.
    """

    def __init__(self, *, moe_intermediate_size: int, n_routed_experts: int,
                 num_experts_per_tok: int, n_shared_experts: int, n_group: int, topk_group: int,
                 norm_topk_prob: bool, routed_scaling_factor: float, aux_loss_alpha: float,
                 router_weight: np.ndarray, make_mlp: MakeMlp,
                 experts: Sequence[int] | None = None):
        super().__init__()
        self.n_experts, self.top_k = n_routed_experts, num_experts_per_tok
        held = range(n_routed_experts) if experts is None else experts
        self.aux_loss_alpha = aux_loss_alpha
        self.expert_group: Any = None
        self.sequence_group: Any = None
        self.sequence_sum: nn.Cell | None = None
        self.context: Any = None
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
        out = self._routed(flat, indices, weights).reshape(seq, batch, hidden)
        if self.shared_experts is not None:
            out = out + self.shared_experts(x)
        if self.aux_loss_alpha == 0:
            return out, ops.zeros((), ms.float32)
        return out, balance_loss(scores, indices, seq, self.aux_loss_alpha,
                                 self.sequence_group, self.context, self.sequence_sum)

    def _routed(self, flat: Tensor, indices: Tensor, weights: Tensor) -> Tensor:
        """Sum over each token's k experts of weight * expert(token), exactly; the layer's
        one read to the host (module docstring)."""
        if self.expert_group is not None:
            done = self.expert_group.dispatch(flat, indices, weights, self.n_experts,
                                              lambda e, rows: self.experts.by_id(e)(rows))
            self.last_tokens_per_expert = expert_counts(done.indices, self.n_experts)
            self.last_expert_load = done.load
            return done.output
        indices = indices.asnumpy()
        self.last_tokens_per_expert = self.last_expert_load = expert_counts(indices,
                                                                            self.n_experts)
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
