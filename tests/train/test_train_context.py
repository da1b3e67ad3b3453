"""`mf-train --nproc N --set parallelism.context_parallel=...` on real msrun ranks: each
attention method (colossal, ulysses, hybrid) gives the losses and gradient norms of one
process, with and without packed documents (compact and dense document masks); context
parallelism composes with data, tensor and sharded data parallelism and with DeepSeek-V3's
experts; a run resumes bit for bit; what cannot run is refused before any rank starts."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("mindspore")

from test_train_pipeline import assert_same_run
from test_train_sharded import steps

from mf_train.checkpoint.layout import iteration_name, rank_file
from mf_train.cli import run

ROOT = Path(__file__).resolve().parents[2]
QWEN3 = ROOT / "examples" / "qwen3_tiny.yaml"
DEEPSEEK = ROOT / "examples" / "deepseek_v3_tiny.yaml"
DATA = "train_dataset.dataloader.config."
PACKING = {
    "plain": [],
    "compact": [f"{DATA}reset_position_ids=true", f"{DATA}reset_attention_mask=true",
                f"{DATA}create_compressed_eod_mask=true", f"{DATA}eod_mask_loss=true"],
    "dense": [f"{DATA}reset_position_ids=true", f"{DATA}reset_attention_mask=true",
              f"{DATA}create_attention_mask=true"],
}
METHODS = {
    "colossal": (2, ["parallelism.context_parallel=2"]),
    "ulysses": (2, ["parallelism.context_parallel=2",
                    "parallelism.context_parallel_method=ulysses"]),
    "hybrid": (4, ["parallelism.context_parallel=4", "parallelism.context_parallel_method=hybrid",
                   "parallelism.ulysses_degree_in_cp=2"]),
}
pytestmark = pytest.mark.ranks


def arguments(prefix: str, output: Path, *more: str, config: Path = QWEN3) -> list[str]:
    """A tiny model (Qwen3: 2 layers, 4 heads of 8, 2 key/value heads) on sequences of 32,
    4 steps, a checkpoint at steps 2 and 4."""
    sizes = (["model.hidden_size=32", "model.intermediate_size=64", "model.head_dim=8",
              "model.num_hidden_layers=2", "recompute.mode=None",
              "recompute.select_module=null"] if config == QWEN3 else ["model.seq_length=32"])
    sets = [f"{DATA}data_path=['1','{prefix}']", "training.steps=4", f"{DATA}seq_length=32",
            "model.max_position_embeddings=32", "lr_scheduler.warmup_steps=1",
            f"checkpoint.save_path={output / 'ckpt'}", "checkpoint.save_interleaved_steps=2",
            *sizes, *more]
    return ["--config", str(config), "--output-dir", str(output),
            *[arg for value in sets for arg in ("--set", value)]]


def launch(prefix: str, output: Path, nproc: int, *more: str, config: Path = QWEN3) -> Path:
    extra = ["--nproc", str(nproc), "--timeout", "600"] if nproc > 1 else []
    assert run([*arguments(prefix, output, *more, config=config), *extra]) == 0
    return output


@pytest.fixture(scope="module")
def single(data_prefix, tmp_path_factory):
    """The one-process run of each packing, launched once on first use."""
    outputs: dict[str, Path] = {}

    def output_of(packing: str) -> Path:
        if packing not in outputs:
            outputs[packing] = launch(data_prefix, tmp_path_factory.mktemp(packing), 1,
                                      *PACKING[packing])
        return outputs[packing]

    return output_of


@pytest.fixture(scope="module")
def colossal(data_prefix, tmp_path_factory) -> Path:
    """Colossal CP 2 on plain sequences: the run the resume test continues."""
    return launch(data_prefix, tmp_path_factory.mktemp("colossal"), 2, *METHODS["colossal"][1])


def test_packing_changes_the_loss(single) -> None:
    """The tiny corpus has ends of documents inside the 32-token samples: the document masks
    and restarting positions change every step's loss."""
    plain, compact, dense = (steps(single(name)) for name in ("plain", "compact", "dense"))
    assert all(abs(p["loss"] - c["loss"]) > 1e-4 for p, c in zip(plain, compact, strict=True))
    assert all(abs(p["loss"] - d["loss"]) > 1e-4 for p, d in zip(plain, dense, strict=True))


def test_colossal_matches_one_process(single, colossal) -> None:
    assert_same_run(colossal, single("plain"))
    log = (colossal / "logs" / "worker_0.log").read_text()
    assert ("context parallel 2 (keys and values all-gathered over 2 (colossal)) x data "
            "parallel 2 (replicated) over data x context") in log


@pytest.mark.parametrize(("method", "packing", "mask_type", "overlap"), [
    ("colossal", "compact", "causal", True), ("ulysses", "plain", "full", False),
    ("ulysses", "dense", "causal", False), ("hybrid", "compact", "causal", True)])
def test_each_method_matches_one_process(data_prefix, single, tmp_path, method, packing,
                                         mask_type, overlap) -> None:
    """`context_parallel_mask_type: full` splits the sequence into contiguous chunks (no load
    balancing); attention is still causal, by global token index. `context_parallel_async`
    attends to this rank's keys while the others' are gathered and merges the two parts
    (the blocking gather runs in the other tests: colossal, CP x DP, CP x TP)."""
    nproc, sets = METHODS[method]
    output = launch(data_prefix, tmp_path, nproc, *sets, *PACKING[packing],
                    f"parallelism.context_parallel_mask_type={mask_type}",
                    f"parallelism.context_parallel_async={str(overlap).lower()}")
    assert_same_run(output, single(packing))
    if overlap:
        log = (output / "logs" / "worker_0.log").read_text()
        assert "overlapped with attention over this rank's keys" in log


def test_context_and_data_parallel_on_four_ranks(data_prefix, single, tmp_path) -> None:
    """CP 2 x DP 2 (replicated): the gradients are averaged over data x context."""
    output = launch(data_prefix, tmp_path, 4, "parallelism.context_parallel=2",
                    "parallelism.data_parallel_shard=1", *PACKING["compact"])
    assert_same_run(output, single("compact"))


def test_a_context_parallel_run_resumes_bit_for_bit(data_prefix, colossal, tmp_path) -> None:
    launch(data_prefix, tmp_path, 2, *METHODS["colossal"][1],
           f"checkpoint.load_path={colossal / 'ckpt' / iteration_name(2)}")
    again, reference = steps(tmp_path), steps(colossal)[2:]
    assert [s["step"] for s in again] == [3, 4]
    assert [(s["loss"], s["grad_norm"]) for s in again] == \
        [(s["loss"], s["grad_norm"]) for s in reference]
    for rank in (0, 1):
        name = rank_file("qwen3_tiny", "model", rank, 2)
        got = load(tmp_path / "ckpt" / iteration_name(4) / name)
        want = load(colossal / "ckpt" / iteration_name(4) / name)
        for key in want:
            np.testing.assert_array_equal(got[key], want[key], err_msg=key)


def load(path: Path) -> dict[str, np.ndarray]:
    from safetensors.numpy import load_file
    return load_file(str(path))


def test_deepseek_v3_with_context_parallel(data_prefix, tmp_path) -> None:
    """MLA's heads exchanged (ulysses), the balance loss counted over the whole sequences
    (a coefficient large enough to move the gradients), packed documents."""
    sets = ["model.aux_loss_alpha=0.1", *PACKING["compact"]]
    one = launch(data_prefix, tmp_path / "one", 1, *sets, config=DEEPSEEK)
    two = launch(data_prefix, tmp_path / "two", 2, *sets, *METHODS["ulysses"][1],
                 config=DEEPSEEK)
    assert_same_run(two, one)


@pytest.mark.slow
@pytest.mark.parametrize("sets", [
    ["parallelism.tensor_parallel=2"],
    ["parallelism.data_parallel_shard=2"],
], ids=["tensor", "fsdp"])
def test_context_parallel_with_tensor_or_fsdp_on_four_ranks(data_prefix, single, tmp_path,
                                                            sets) -> None:
    output = launch(data_prefix, tmp_path, 4, "parallelism.context_parallel=2", *sets)
    assert_same_run(output, single("plain"))


@pytest.mark.slow
def test_deepseek_v3_with_context_and_expert_parallel(data_prefix, tmp_path) -> None:
    sets = ["model.aux_loss_alpha=0.1"]
    one = launch(data_prefix, tmp_path / "one", 1, *sets, config=DEEPSEEK)
    four = launch(data_prefix, tmp_path / "four", 4, *sets, "parallelism.context_parallel=2",
                  "parallelism.expert_parallel=2", config=DEEPSEEK)
    assert_same_run(four, one)


def test_ulysses_needs_heads_it_can_split(tmp_path, capsys) -> None:
    """4 query and 2 key/value heads over tensor 2 x Ulysses 2: refused before launch."""
    status = run(["--config", str(QWEN3), "--output-dir", str(tmp_path),
                  "--set", "parallelism.context_parallel=2", "--set",
                  "parallelism.context_parallel_method=ulysses",
                  "--set", "parallelism.tensor_parallel=2", "--nproc", "4"])
    err = capsys.readouterr().err
    assert status == 2
    assert ("model.num_key_value_heads: 2 heads are not divisible by tensor_parallel (2) x the "
            "Ulysses degree (2") in err
    assert "starting 4 ranks" not in err
