"""DeepSeek-V3 mixture of experts (mf_train.models.moe): group-limited routing against hand-worked
examples, routing weights, the sequence-wise balance loss against its formula, the exact
dispatch against a per-token loop, and the auxiliary-loss-free bias update against a per-expert
loop over several routed steps."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("mindspore")

import mindspore as ms
from mindspore import Tensor

from mf_train.models.blocks import SwiGLU
from mf_train.models.moe import (
    MoE,
    Router,
    balance_loss,
    expert_counts,
    select_experts,
    updated_expert_bias,
)

ms.set_context(mode=ms.PYNATIVE_MODE)
ms.set_device("CPU")

# Six experts in two groups {0, 1, 2} and {3, 4, 5}.
BIASED = np.array([[0.9, 0.1, 0.2, 0.6, 0.7, 0.5],    # groups: 0.9+0.2=1.1 < 0.7+0.6=1.3
                   [0.3, 0.8, 0.7, 0.9, 0.1, 0.2]])   # groups: 0.8+0.7=1.5 > 0.9+0.2=1.1


def np_select_experts(biased_scores: np.ndarray, top_k: int, n_group: int,
                      topk_group: int) -> np.ndarray:
    """The group-limited top-k in numpy (the reference of the device's `select_experts`):
    a group's score is the sum of its two best biased scores, the `topk_group` best groups
    stay eligible, the `top_k` best eligible experts are chosen, best first."""
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


def selected(biased: np.ndarray, top_k: int, n_group: int, topk_group: int) -> list:
    """The device's choice, as lists."""
    return select_experts(Tensor(biased.astype(np.float32)), top_k, n_group,
                          topk_group).asnumpy().tolist()


def test_group_limited_routing_picks_the_best_group_by_its_top_two() -> None:
    # Token 0's single best expert (0) lies in the losing group, so it is not chosen.
    assert selected(BIASED, top_k=2, n_group=2, topk_group=1) == [[4, 3], [1, 2]]


def test_routing_without_group_limit_is_plain_top_k() -> None:
    assert selected(BIASED, top_k=2, n_group=2, topk_group=2) == [[0, 4], [3, 1]]
    assert selected(BIASED, top_k=3, n_group=1, topk_group=1) == [[0, 4, 3], [3, 1, 2]]


@pytest.mark.parametrize(("n_group", "topk_group"), [(4, 2), (8, 3), (16, 16), (1, 1)])
def test_device_routing_equals_numpy_on_random_scores(n_group, topk_group) -> None:
    scores = np.random.default_rng(n_group).uniform(0, 1, (200, 16)).astype(np.float32)
    assert selected(scores, 4, n_group, topk_group) == \
        np_select_experts(scores, 4, n_group, topk_group).tolist()


def _router(scores: list[float], bias: list[float], top_k: int, norm: bool,
            scale: float = 2.5) -> tuple[np.ndarray, np.ndarray]:
    """Route one token whose sigmoid scores are `scores` (the router weight is their logit)."""
    logits = np.log(np.array(scores) / (1 - np.array(scores)))
    router = Router(logits[:, None].astype(np.float32), top_k, 1, 1, norm, scale)
    router.e_score_correction_bias.set_data(Tensor(np.array(bias, np.float32)))
    indices, weights, _ = router(Tensor(np.ones((1, 1), np.float32)))
    return indices.asnumpy(), weights.asnumpy()


def test_bias_chooses_experts_but_weights_are_the_unbiased_scores() -> None:
    indices, weights = _router([0.5, 0.6, 0.1, 0.2], [0.3, 0.0, 0.0, 0.0], top_k=1, norm=False)
    assert indices.tolist() == [[0]]                       # 0.5 + 0.3 beats 0.6
    np.testing.assert_allclose(weights, [[0.5 * 2.5]], rtol=1e-6)


def test_normalised_weights_sum_to_the_scaling_factor() -> None:
    indices, weights = _router([0.5, 0.6, 0.1, 0.2], [0.3, 0.0, 0.0, 0.0], top_k=2, norm=True)
    assert indices.tolist() == [[0, 1]]
    np.testing.assert_allclose(weights, [[0.5 / 1.1 * 2.5, 0.6 / 1.1 * 2.5]], rtol=1e-6)


def test_balance_loss_matches_the_formula_by_hand() -> None:
    # One sequence of two tokens, four experts, k = 1: token 0 -> expert 0, token 1 -> expert 1.
    scores = np.array([[0.8, 0.4, 0.4, 0.4], [0.2, 0.6, 0.2, 0.2]], np.float32)
    indices = np.array([[0], [1]])
    # f = 4 / (1 * 2) * [1, 1, 0, 0]; P = mean of the normalised scores over the two tokens.
    p0, p1 = (0.4 + 1 / 6) / 2, (0.2 + 0.5) / 2
    expected = 0.01 * (2 * p0 + 2 * p1)
    got = balance_loss(Tensor(scores), Tensor(indices.astype(np.int32)), seq=2,
                       alpha=0.01).asnumpy()
    np.testing.assert_allclose(got, expected, rtol=1e-6)


def test_balance_loss_is_one_alpha_when_perfectly_balanced() -> None:
    # Uniform scores and each expert chosen equally often: sum_i f_i P_i = N * 1 * 1/N = 1.
    scores = np.full((4, 4), 0.3, np.float32)
    indices = np.array([[0, 1], [2, 3], [1, 0], [3, 2]])
    got = balance_loss(Tensor(scores), Tensor(indices.astype(np.int32)), 4, 0.5).asnumpy()
    np.testing.assert_allclose(got, 0.5, rtol=1e-6)


def test_balance_loss_averages_sequences_in_seq_batch_order() -> None:
    # Tokens are [seq, batch]: rows 0, 2 are sequence 0 and rows 1, 3 sequence 1.
    rng = np.random.default_rng(3)
    scores = rng.uniform(0.1, 0.9, (4, 4)).astype(np.float32)
    indices = np.array([[0], [1], [0], [2]])
    per_sequence = [balance_loss(Tensor(scores[[b, b + 2]]),
                                 Tensor(indices[[b, b + 2]].astype(np.int32)), 2, 1.0)
                    .asnumpy() for b in (0, 1)]
    got = balance_loss(Tensor(scores), Tensor(indices.astype(np.int32)), 2, 1.0).asnumpy()
    np.testing.assert_allclose(got, np.mean(per_sequence), rtol=1e-6)


def _mlp_weights(rng: np.random.Generator, size: int, hidden: int) -> list[np.ndarray]:
    return [(rng.standard_normal(shape) * 0.3).astype(np.float32)
            for shape in ((size, hidden), (size, hidden), (hidden, size))]


def _numpy_swiglu(weights: list[np.ndarray], x: np.ndarray) -> np.ndarray:
    gate, up, down = (w.astype(np.float64) for w in weights)
    g = x @ gate.T
    return (g / (1 + np.exp(-g)) * (x @ up.T)) @ down.T


def test_dispatch_is_exact_and_counts_every_token_slot() -> None:
    rng = np.random.default_rng(0)
    hidden, experts, top_k, seq, batch = 8, 6, 2, 5, 2
    expert_weights = {f"experts.{e}": _mlp_weights(rng, 4, hidden) for e in range(experts)}
    expert_weights["shared_experts"] = _mlp_weights(rng, 8, hidden)
    router = (rng.standard_normal((experts, hidden)) * 0.5).astype(np.float32)
    moe = MoE(moe_intermediate_size=4, n_routed_experts=experts, num_experts_per_tok=top_k,
              n_shared_experts=2, n_group=2, topk_group=1, norm_topk_prob=True,
              routed_scaling_factor=1.5, aux_loss_alpha=0.0, router_weight=router,
              make_mlp=lambda name, size: SwiGLU(*expert_weights[name]))
    x = rng.standard_normal((seq, batch, hidden)).astype(np.float32)
    out, balance = moe(Tensor(x))

    flat = x.reshape(-1, hidden).astype(np.float64)
    scores = 1 / (1 + np.exp(-(flat @ router.T.astype(np.float64))))
    chosen = np_select_experts(scores, top_k, 2, 1)
    expected = _numpy_swiglu(expert_weights["shared_experts"], flat)
    for t, experts_of_t in enumerate(chosen):
        w = scores[t, experts_of_t] / scores[t, experts_of_t].sum() * 1.5
        for e, we in zip(experts_of_t, w, strict=True):
            expected[t] += we * _numpy_swiglu(expert_weights[f"experts.{e}"], flat[t:t + 1])[0]
    np.testing.assert_allclose(out.asnumpy().reshape(-1, hidden), expected, atol=1e-5)
    assert float(balance.asnumpy()) == 0.0
    counts = moe.last_tokens_per_expert
    assert counts.tolist() == expert_counts(chosen, experts).tolist()
    assert counts.sum() == seq * batch * top_k


def test_an_expert_without_tokens_gets_a_zero_gradient() -> None:
    rng = np.random.default_rng(1)
    hidden = 4
    weights = {f"experts.{e}": _mlp_weights(rng, 4, hidden) for e in range(4)}
    router = np.zeros((4, hidden), np.float32)
    router[2] = 5.0                      # with positive inputs, experts 2 and (tie) 0 win
    moe = MoE(moe_intermediate_size=4, n_routed_experts=4, num_experts_per_tok=2,
              n_shared_experts=0, n_group=1, topk_group=1, norm_topk_prob=True,
              routed_scaling_factor=1.0, aux_loss_alpha=0.1, router_weight=router,
              make_mlp=lambda name, size: SwiGLU(*weights[name]))
    x = Tensor(np.abs(rng.standard_normal((3, 1, hidden))).astype(np.float32))
    params = moe.trainable_params()

    def loss(x: Tensor) -> Tensor:
        out, balance = moe(x)
        return out.sum() + balance

    _, grads = ms.value_and_grad(loss, None, params)(x)
    assert moe.last_tokens_per_expert.tolist() == [3, 0, 3, 0]
    by_name = {p.name: g.asnumpy() for p, g in zip(params, grads, strict=True)}
    for name, grad in by_name.items():
        assert np.isfinite(grad).all(), name
        if ".1." in name or ".3." in name:
            assert not grad.any(), name
        elif "experts.0." in name or "experts.2." in name:
            assert grad.any(), name


# ----------------------------------------------------------- auxiliary-loss-free bias


def reference_bias_step(bias: list[float], counts: list[int], rate: float) -> list[float]:
    """One update, expert by expert: +rate below the mean load, -rate above, 0 at it."""
    total, n = sum(counts), len(counts)
    out = []
    for b, c in zip(bias, counts, strict=True):
        direction = 1.0 if c * n < total else -1.0 if c * n > total else 0.0
        out.append(float(np.float32(b) + np.float32(rate) * np.float32(direction)))
    return out


def test_bias_update_by_hand() -> None:
    # mean 3: expert 0 and 2 are overloaded, 1 and 3 underloaded; a row at the mean stays.
    bias = updated_expert_bias(Tensor(np.zeros((2, 4), np.float32)),
                               Tensor(np.float32([[6, 2, 4, 0], [3, 3, 3, 3]])), 0.001).asnumpy()
    assert bias.dtype == np.float32
    np.testing.assert_array_equal(bias, np.float32([[-0.001, 0.001, -0.001, 0.001],
                                                    [0, 0, 0, 0]]))


def test_router_bias_follows_the_reference_over_routed_steps() -> None:
    """Five steps of routing random tokens with the current bias, then the router's update,
    against the per-expert loop: the same biases, and the load evens out."""
    rng = np.random.default_rng(7)
    n_experts, rate = 8, 0.05
    skew = np.linspace(0.4, 0.0, n_experts, dtype=np.float32)  # experts 0.. are favoured
    router = Router(np.zeros((n_experts, 4), np.float32), top_k=2, n_group=2, topk_group=2,
                    norm_topk_prob=True, scaling_factor=1.0)
    reference = [0.0] * n_experts
    spreads = []
    for _ in range(5):
        scores = rng.uniform(0, 0.2, (64, n_experts)).astype(np.float32) + skew
        bias = router.e_score_correction_bias.asnumpy()
        counts = expert_counts(np_select_experts(scores + bias, 2, 2, 2), n_experts)
        spreads.append(int(counts.max() - counts.min()))
        router.update_bias(Tensor(counts.astype(np.float32)), rate)
        reference = reference_bias_step(reference, counts.tolist(), rate)
        np.testing.assert_array_equal(router.e_score_correction_bias.asnumpy(),
                                      np.float32(reference))
    assert not router.e_score_correction_bias.requires_grad
    assert spreads[-1] < spreads[0] - 20  # 60 -> 34 here
