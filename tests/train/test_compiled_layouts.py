"""Every layout the trainer runs, compiled (`context.compile: true`) against the same layout in
PyNative and against one process: losses and gradient norms of 4 steps, and the weights and
optimizer state after them, within 1e-5. A layout cannot be compiled without being checked
here; where its layers cannot be compiled, the start line says why and the run equals
PyNative all the same.

The compiled runs of one rank count are trained in one msrun job (`RunsTogether`); the
PyNative runs and the one-process runs are the ones the layouts' own test files compare
(tests/train/runs.py shares them), plus a few only this matrix needs."""

from __future__ import annotations

import pytest

pytest.importorskip("mindspore")

from runs import (
    DEEPSEEK,
    DEEPSEEK_3_LAYERS,
    PREFIXES,
    QWEN3,
    QWEN3_2_LAYERS,
    QWEN3_4_LAYERS,
    assert_same_pieces,
    assert_same_run,
    assert_same_weights,
    run_log,
)

pytestmark = pytest.mark.ranks

COMPILE = "context.compile=true"
REPLICATED = "parallelism.data_parallel_shard=1"
STRATEGY = "parallelism.data_parallel_shard_strategy="
TENSOR_2 = "parallelism.tensor_parallel=2"
EXPERT_2 = "parallelism.expert_parallel=2"
ONE_SAMPLE = "training.local_batch_size=1"
"""4 data-parallel ranks of the global batch of 4."""
DEREDUNDANT = ("parallelism.moe_token_dispatcher_type=alltoall_deredundancy",
               "parallelism.npu_nums_per_device=1")

MATRIX = {
    # name: (config, the one-process run's settings, the layout's settings, ranks)
    "single": (QWEN3, QWEN3_2_LAYERS, (), 1),
    "data parallel": (QWEN3, QWEN3_2_LAYERS, (REPLICATED,), 2),
    "ZeRO-1": (QWEN3, QWEN3_2_LAYERS, (f"{STRATEGY}optim",), 2),
    "ZeRO-2": (QWEN3, QWEN3_2_LAYERS, (f"{STRATEGY}optim_grads",), 2),
    "FSDP": (QWEN3, QWEN3_2_LAYERS, (f"{STRATEGY}optim_grads_params",), 2),
    "tensor parallel": (QWEN3, QWEN3_2_LAYERS, (TENSOR_2,), 2),
    "pipeline gpipe": (QWEN3, QWEN3_4_LAYERS, ("parallelism.pipeline_parallel=2",
                                               "parallelism.pipeline_parallel_schedule=gpipe"),
                       2),
    "pipeline 1f1b": (QWEN3, QWEN3_4_LAYERS, ("parallelism.pipeline_parallel=2",), 2),
    "pipeline interleaved": (QWEN3, QWEN3_4_LAYERS, (
        "parallelism.pipeline_parallel=2", "parallelism.pipeline_parallel_schedule="
        "interleaved_1f1b", "parallelism.pipeline_parallel_interleave_num=2"), 2),
    "context parallel": (QWEN3, QWEN3_2_LAYERS, ("parallelism.context_parallel=2",), 2),
    "DeepSeek-V3 single": (DEEPSEEK, DEEPSEEK_3_LAYERS, (), 1),
    "DeepSeek-V3 experts all-to-all": (DEEPSEEK, DEEPSEEK_3_LAYERS, (EXPERT_2,), 2),
    "DeepSeek-V3 experts deredundant": (DEEPSEEK, DEEPSEEK_3_LAYERS, (EXPERT_2, *DEREDUNDANT),
                                        2),
    "ZeRO-1 on 4": (QWEN3, QWEN3_2_LAYERS, (ONE_SAMPLE, f"{STRATEGY}optim"), 4),
    "ZeRO-2 on 4": (QWEN3, QWEN3_2_LAYERS, (ONE_SAMPLE, f"{STRATEGY}optim_grads"), 4),
    "HSDP 2 x 2": (QWEN3, QWEN3_2_LAYERS, (ONE_SAMPLE, f"{STRATEGY}optim_grads_params",
                                           "parallelism.data_parallel_shard=2"), 4),
    "FSDP x tensor parallel": (QWEN3, QWEN3_2_LAYERS, (TENSOR_2, f"{STRATEGY}optim_grads_params"),
                               4),
    "pipeline x tensor parallel": (QWEN3, QWEN3_4_LAYERS, ("parallelism.pipeline_parallel=2",
                                                           TENSOR_2), 4),
    "DeepSeek-V3 experts x ZeRO-2": (DEEPSEEK, DEEPSEEK_3_LAYERS, (
        EXPERT_2, ONE_SAMPLE, f"{STRATEGY}optim_grads"), 4),
}
"""Each layout the trainer runs, alone and composed, on the tiny Qwen3 and DeepSeek-V3."""

PYNATIVE_HERE = {"ZeRO-1 on 4", "ZeRO-2 on 4", "DeepSeek-V3 experts x ZeRO-2"}
"""The layouts whose PyNative run no other test file trains: trained in the job of their
compiled runs."""

NOT_COMPILED = {"context parallel": "context-parallel attention exchanges key/value blocks"}
"""The layouts whose layers stay in PyNative under `context.compile`, and the start line's
reason."""


@pytest.fixture(scope="module")
def trained(runs, together):
    """Each entry's compiled run (`compiled=True`) and PyNative run: the compiled runs of one
    rank count, and the PyNative runs of `PYNATIVE_HERE`, trained together on first use; the
    other PyNative runs are those the layouts' own test files share (`runs`)."""
    done: dict[tuple[str, bool], object] = {}

    def settings(name: str, compiled: bool) -> tuple[str, ...]:
        _, base, layout, _ = MATRIX[name]
        return (*base, *layout, *([COMPILE] if compiled else []))

    def run(name: str, compiled: bool):
        config, _, _, nproc = MATRIX[name]
        if nproc == 1 or not (compiled or name in PYNATIVE_HERE):
            return runs(config, *settings(name, compiled), nproc=nproc)
        if (name, compiled) not in done:
            jobs = [(n, True) for n, entry in MATRIX.items() if entry[3] == nproc]
            jobs += [(n, False) for n, _ in jobs if n in PYNATIVE_HERE]
            outputs = together([(MATRIX[n][0], settings(n, c)) for n, c in jobs], nproc)
            done.update(zip(jobs, outputs, strict=True))
        return done[name, compiled]

    return run


@pytest.mark.parametrize("name", list(MATRIX))
def test_compiled_layout_equals_pynative_and_one_process(runs, trained, name) -> None:
    config, base, _, nproc = MATRIX[name]
    got, pynative, one = trained(name, True), trained(name, False), runs(config, *base)
    assert_same_run(got, pynative)
    assert_same_run(got, one)
    assert_same_pieces(got, pynative, nproc, PREFIXES[config])
    assert_same_weights(got, one)
    start = next(line for line in run_log(got).splitlines() if "context.compile" in line)
    if name in NOT_COMPILED:
        assert NOT_COMPILED[name] in start
    else:
        assert "compiled (mindspore.jit): " in start and "decoder layers" in start
