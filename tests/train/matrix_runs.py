"""Every layout the trainer runs, alone and composed, and the runs of each layout the tests
share: in PyNative, compiled (`context.compile: true`), and with the `Evaluate` callback.

A layout's PyNative run is the one its own test file trains (`runs`, one msrun job each),
except those in `PYNATIVE_HERE`. Everything else of one rank count (the compiled runs, the
PyNative runs of `PYNATIVE_HERE`, the evaluated runs of `EVALUATED` and
`COMPILED_EVALUATED`, and the resumed one of
`RESUMED`) is trained in ONE msrun job (`RunsTogether`): test_compiled_layouts.py and
test_evaluation.py ask for the same job, which the session trains once.
"""

from __future__ import annotations

from pathlib import Path

from runs import (
    DATA,
    DEEPSEEK,
    DEEPSEEK_3_LAYERS,
    QWEN3,
    QWEN3_2_LAYERS,
    QWEN3_4_LAYERS,
    Runs,
    RunsTogether,
)

from mf_train.checkpoint.layout import iteration_name

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
"""The layouts whose PyNative run no other test file trains: trained in the shared job."""

EVALUATED = {"single", "data parallel", "ZeRO-2", "FSDP", "tensor parallel", "pipeline gpipe",
             "pipeline 1f1b", "pipeline interleaved", "context parallel", "DeepSeek-V3 single",
             "DeepSeek-V3 experts all-to-all", "ZeRO-2 on 4", "pipeline x tensor parallel"}
"""The layouts also trained with `Evaluate` (`with_evaluate`), in PyNative."""

COMPILED_EVALUATED = {"single", "FSDP", "pipeline 1f1b", "ZeRO-2 on 4"}
"""The layouts also trained with `Evaluate` under `context.compile` (the evaluation's forward
runs the compiled layers)."""

RESUMED = "FSDP"
"""The layout whose evaluated run is also resumed from its step-2 checkpoint (in the job)."""

EVALUATE = "callbacks=[{type: Evaluate, interval: 2, iters: 1}]"
"""Evaluated after steps 2 and 4, one global batch of the valid split each time."""


def with_evaluate(prefix: str) -> tuple[str, ...]:
    """The settings that add `Evaluate` to a run on the corpus at `prefix` without changing
    its training samples: the valid split is a blend of its own (`valid_data_path`, the same
    corpus: the training split of `data_path` with `split: "1, 0, 0"` is that of
    `train_data_path`, sample for sample), 40 samples."""
    blend = f"['1','{prefix}']"
    return (f"{DATA}data_path=[]", f"{DATA}train_data_path={blend}",
            f"{DATA}valid_data_path={blend}", "train_dataset.dataloader.sizes=[4000, 40, 0]",
            EVALUATE)


class MatrixRuns:
    """The output directory of a layout's run (`MATRIX` name, variant), trained on first use:
    variant "pynative", "compiled", "evaluated" (PyNative with `with_evaluate`), "compiled
    evaluated" (compiled with `with_evaluate`), "resumed" (the
    evaluated run of `RESUMED` again from its step-2 checkpoint), or "one" (the one-process
    run the layout is compared with; "one evaluated" with `Evaluate`).

    Args:
        runs: the session's runs (conftest's `runs`).
        together: the session's jobs of several runs (conftest's `together`).
    """

    def __init__(self, runs: Runs, together: RunsTogether):
        self.runs, self.together = runs, together
        self.done: dict[tuple[str, str], Path] = {}

    def settings(self, name: str, variant: str) -> tuple[str, ...]:
        _, base, layout, _ = MATRIX[name]
        if variant.startswith("one"):
            layout = ()
        more = {"compiled": (COMPILE,)}.get(variant, ())
        if variant in ("evaluated", "resumed", "one evaluated"):
            more = with_evaluate(self.runs.prefix)
        if variant == "compiled evaluated":
            more = (COMPILE, *with_evaluate(self.runs.prefix))
        return (*base, *layout, *more)

    def __call__(self, name: str, variant: str) -> Path:
        config, _, _, nproc = MATRIX[name]
        if variant.startswith("one") or nproc == 1:
            return self.runs(config, *self.settings(name, variant))
        if variant == "pynative" and name not in PYNATIVE_HERE:
            return self.runs(config, *self.settings(name, variant), nproc=nproc)
        if (name, variant) not in self.done:
            self.train_job(nproc)
        return self.done[name, variant]

    def train_job(self, nproc: int) -> None:
        names = [name for name, entry in MATRIX.items() if entry[3] == nproc]
        jobs = [(name, "compiled") for name in names]
        jobs += [(name, "pynative") for name in names if name in PYNATIVE_HERE]
        jobs += [(name, "evaluated") for name in names if name in EVALUATED]
        jobs += [(name, "compiled evaluated") for name in names if name in COMPILED_EVALUATED]
        entries = [(MATRIX[name][0], self.settings(name, variant)) for name, variant in jobs]
        if MATRIX[RESUMED][3] == nproc:
            source = jobs.index((RESUMED, "evaluated"))
            entries.append((MATRIX[RESUMED][0], (
                *self.settings(RESUMED, "resumed"),
                f"checkpoint.load_path={{run:{source}}}/ckpt/{iteration_name(2)}")))
            jobs.append((RESUMED, "resumed"))
        self.done.update(zip(jobs, self.together(entries, nproc), strict=True))
