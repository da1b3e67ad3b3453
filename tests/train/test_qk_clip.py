"""QK-clip (mf_train.optim.qk_clip, Kimi K2's MuonClip) on DeepSeek-V3's multi-head latent
attention: each head's largest logit as the attention records it, against the independent numpy
DeepSeek-V3 (deepseek_v3_reference.py); the weights after a clip against the rescaling written
out in numpy; the clipped heads' largest logit is then the threshold; nothing changes below the
threshold or on a skipped step; the attention's output and gradients do not change by
recording."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("mindspore")

import mindspore as ms
from mindspore import Tensor, ops

from mf_config import ModelConfig, ParallelismConfig, TrainingConfig
from mf_parallel import make_plan
from mf_parallel.runtime import Collectives, init_communication
from mf_train.models.blocks import AttentionCore
from mf_train.models.deepseek_v3 import DeepseekV3ForCausalLM
from mf_train.optim import Muon
from mf_train.optim.qk_clip import QKClip

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import deepseek_v3_reference as ref  # noqa: E402
from runs import DEEPSEEK, DEEPSEEK_3_LAYERS, steps  # noqa: E402

ms.set_context(mode=ms.PYNATIVE_MODE)
ms.set_device("CPU")


def setup(name: str, threshold: float | None = None, boost: float = 6.0) -> dict:
    """The reference's model `name` with layer 0's head 0 queries `boost` times larger (a large
    logit), its clip, and the reference's largest logits of the batch `[layers, heads]`;
    `threshold` None: the median of those (some heads clipped, some not)."""
    cfg = ref.CONFIGS[name]
    state = dict(ref.random_hf_state(cfg))
    query = f"model.layers.0.self_attn.{query_name(cfg)}.weight"
    state[query] = state[query].copy()
    state[query][:cfg["qk_nope_head_dim"] + cfg["qk_rope_head_dim"]] *= boost
    model = DeepseekV3ForCausalLM.from_config(ModelConfig(extras=dict(cfg)), seed=0)
    model.load_hf_state(state)
    ids, _, _ = ref.batch()
    largest = np.full((cfg["num_hidden_layers"], cfg["num_attention_heads"]), -np.inf)
    ref.forward(state, cfg, ids, max_logits=largest)
    threshold = float(np.median(largest)) if threshold is None else threshold
    optimizer = Muon([(p.name, p) for p in model.trainable_params()])
    collectives = Collectives(init_communication(
        make_plan(ParallelismConfig(), TrainingConfig(global_batch_size=1), 1), "CPU"))
    clip = QKClip([layer.attention for layer in model.decoder_layers], threshold, collectives,
                  optimizer)
    return {"cfg": cfg, "state": state, "model": model, "ids": Tensor(ids), "clip": clip,
            "largest": largest, "threshold": threshold}


def query_name(cfg: dict) -> str:
    return "q_proj" if cfg.get("q_lora_rank") is None else "q_b_proj"


def weights(case: dict) -> dict[str, np.ndarray]:
    """The query and key projections of every layer, by Hugging Face name."""
    out = {}
    for index, layer in enumerate(case["model"].decoder_layers):
        attention = layer.attention
        query = attention.q_b_proj if attention.q_lora else attention.q_proj
        prefix = f"model.layers.{index}.self_attn"
        out[f"{prefix}.{query_name(case['cfg'])}.weight"] = query.weight.asnumpy().copy()
        out[f"{prefix}.kv_b_proj.weight"] = attention.kv_b_proj.weight.asnumpy().copy()
        out[f"{prefix}.kv_a_proj_with_mqa.weight"] = \
            attention.kv_a_proj_with_mqa.weight.asnumpy().copy()
    return out


def clipped_in_numpy(case: dict) -> dict[str, np.ndarray]:
    """Kimi K2's rescaling of `weights(case)`, written out per head: gamma = tau / S where
    S > tau; q_nope and k_nope rows times sqrt(gamma), q_rope rows times gamma, the values'
    rows and the shared rotary key (kv_a_proj_with_mqa) as they were."""
    cfg, state, tau = case["cfg"], case["state"], case["threshold"]
    nope, rope, v = cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"], cfg["v_head_dim"]
    out = {}
    for index, per_head in enumerate(case["largest"]):
        prefix = f"model.layers.{index}.self_attn"
        query = state[f"{prefix}.{query_name(cfg)}.weight"].astype(np.float64).copy()
        kv = state[f"{prefix}.kv_b_proj.weight"].astype(np.float64).copy()
        for head, largest in enumerate(per_head):
            if largest <= tau:
                continue
            gamma = tau / largest
            q0, k0 = head * (nope + rope), head * (nope + v)
            query[q0:q0 + nope] *= np.sqrt(gamma)
            query[q0 + nope:q0 + nope + rope] *= gamma
            kv[k0:k0 + nope] *= np.sqrt(gamma)
        out[f"{prefix}.{query_name(cfg)}.weight"] = query
        out[f"{prefix}.kv_b_proj.weight"] = kv
        out[f"{prefix}.kv_a_proj_with_mqa.weight"] = state[f"{prefix}.kv_a_proj_with_mqa.weight"]
    return out


@pytest.mark.parametrize("name", sorted(ref.CONFIGS))
def test_clip_rescales_the_heads_over_the_threshold_as_kimi_k2(name: str) -> None:
    case = setup(name)
    case["model"].logits(case["ids"])
    recorded = case["clip"].largest_logits().asnumpy()
    np.testing.assert_allclose(recorded, case["largest"], rtol=1e-5)
    assert recorded[0, 0] > 2 * case["threshold"]  # the boosted head is clipped hard
    assert (recorded <= case["threshold"]).any()  # and some heads are not clipped
    before = weights(case)
    case["model"].logits(case["ids"])
    case["clip"]()
    after, want = weights(case), clipped_in_numpy(case)
    for key, value in after.items():
        np.testing.assert_allclose(value, want[key], rtol=2e-6, atol=1e-7, err_msg=key)
    # unclipped heads' rows and the shared rotary key: bit for bit
    cfg = case["cfg"]
    rows = cfg["qk_nope_head_dim"] + cfg["qk_rope_head_dim"]
    for layer, per_head in enumerate(case["largest"]):
        key = f"model.layers.{layer}.self_attn.{query_name(cfg)}.weight"
        for head in np.flatnonzero(per_head <= case["threshold"]):
            np.testing.assert_array_equal(after[key][head * rows:(head + 1) * rows],
                                          before[key][head * rows:(head + 1) * rows])
        key = f"model.layers.{layer}.self_attn.kv_a_proj_with_mqa.weight"
        np.testing.assert_array_equal(after[key], before[key])
    # the clipped model's largest logits are the reference's on the clipped weights: in
    # layer 0 (whose input the clip does not change) the threshold where it clipped
    clipped = {**case["state"], **{k: v.astype(np.float32) for k, v in want.items()}}
    largest = np.full_like(case["largest"], -np.inf)
    ref.forward(clipped, cfg, case["ids"].asnumpy(), max_logits=largest)
    case["model"].logits(case["ids"])
    np.testing.assert_allclose(case["clip"].largest_logits().asnumpy(), largest, rtol=1e-5)
    np.testing.assert_allclose(largest[0], np.minimum(case["largest"][0], case["threshold"]),
                               rtol=1e-6)


@pytest.mark.parametrize("keep", [None, False])
def test_nothing_changes_below_the_threshold_or_on_a_skipped_step(keep: bool | None) -> None:
    case = setup("lora", threshold=1e6 if keep is None else 1e-3)
    before = weights(case)
    case["model"].logits(case["ids"])
    case["clip"](None if keep is None else Tensor(keep))
    after = weights(case)
    for key, value in before.items():
        np.testing.assert_array_equal(after[key], value)


def test_recording_changes_neither_the_output_nor_the_gradients() -> None:
    """Grouped-query heads (4 queries on 2 keys), causal: the same output and gradients with
    the largest logits recorded; those against numpy, kept over two calls."""
    rng = np.random.default_rng(0)
    q, k, v = (Tensor(rng.standard_normal(shape).astype(np.float32))
               for shape in ((2, 4, 5, 8), (2, 2, 5, 8), (2, 2, 5, 8)))
    results = []
    for tracks in (False, True):
        core = AttentionCore(8 ** -0.5)
        if tracks:
            core.track_max_logits()
        output = core(q, k, v)
        grads = ms.value_and_grad(lambda a, b, c, cell=core: (cell(a, b, c) ** 2).sum(),
                                  (0, 1, 2))(q, k, v)[1]
        results.append([output.asnumpy(), *(g.asnumpy() for g in grads)])
        if tracks:
            core(q * 0.5, k, v)  # a smaller call leaves the maxima
            taken = core.take_max_logits().asnumpy()
    for plain, tracked in zip(*results, strict=True):
        np.testing.assert_array_equal(plain, tracked)
    keys = np.repeat(k.asnumpy(), 2, axis=1)
    scores = q.asnumpy() @ keys.transpose(0, 1, 3, 2) * 8 ** -0.5
    scores[..., np.triu(np.ones((5, 5), bool), k=1)] = -np.inf
    np.testing.assert_allclose(taken, scores.max(axis=(0, 2, 3)), rtol=1e-6)
    assert ops.isfinite(Tensor(taken)).all()


@pytest.mark.ranks
def test_two_replicas_clip_as_one_process(runs) -> None:
    """`mf-train` with Muon's QK-clip: 2 replicated ranks equal one process over 4 steps,
    since each head's largest logit is taken over both ranks' tokens (a clip from each rank's
    own would part the replicas). Larger initial weights give logits of 5 to 10 (not about
    0.07), so that the clip at 5 acts on every head and the attention still depends on it."""
    sets = (*DEEPSEEK_3_LAYERS, "model.initializer_range=0.2", "optimizer.type=Muon",
            "optimizer.qk_clip_enabled=true", "optimizer.qk_clip_threshold=5")
    one = steps(runs(DEEPSEEK, *sets))
    two = steps(runs(DEEPSEEK, *sets, "parallelism.data_parallel_shard=1", nproc=2))
    assert len(one) == len(two) == 4
    assert [s["loss"] for s in two] == pytest.approx([s["loss"] for s in one], rel=1e-5)
    assert [s["grad_norm"] for s in two] == pytest.approx([s["grad_norm"] for s in one],
                                                          rel=1e-5)
