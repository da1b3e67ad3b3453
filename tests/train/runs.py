"""Trainer runs the tests share, and what the tests read of a finished run.

A run is `mf-train` on an example with `--set` settings and a rank count. The `runs` fixture
(tests/train/conftest.py) trains each distinct run once per pytest session, however many test
modules compare against it: `runs(QWEN3, *QWEN3_2_LAYERS, nproc=2)` is the same directory for
every caller. Settings are compared as settings (the last value of each key counts, their order
does not), so two modules that describe the same run in another order share it. When pytest-xdist
runs the suite in several worker processes, the workers share the runs too: a run's directory
is named from its settings, and a file lock lets one worker train it while another that needs
it waits (`shared_directory`).

A layout test file declares its layouts as data: `CASES`, name -> `Case` (model, settings,
layout, ranks, what to compare), and its tests ask the `layout_runs` fixture for a case's run,
its one-process run, or their comparison (`LayoutRuns.check`); the cases of one file and rank
count are trained in one msrun job (`RunsTogether`), those other files read too by `Runs`.

Every run here reads the session's tiny corpus (`data_prefix`) and saves its checkpoints under
`<output>/ckpt`; the settings below shrink the examples so that a step takes well under a
second on 2 CPU cores.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import re
from collections.abc import Sequence
from pathlib import Path

import attrs
import numpy as np
import pytest
from safetensors.numpy import load_file
from same_tensors import assert_same_tensors
from session_files import shared_directory

from mf_config.validate import config_from_source, load_source
from mf_parallel.placement import place_parameters, rank_view
from mf_train.checkpoint.layout import RUN_CONFIG, iteration_name, rank_file
from mf_train.checkpoint.pieces import Piece, PieceIndex
from mf_train.launch.cli import run
from mf_train.models import sharding_table
from mf_train.preflight.job import make_job_plan

ROOT = Path(__file__).resolve().parents[2]
QWEN3 = ROOT / "examples" / "qwen3_tiny.yaml"
DEEPSEEK = ROOT / "examples" / "deepseek_v3_tiny.yaml"
DATA = "train_dataset.dataloader.config."
PREFIXES = {QWEN3: "qwen3_tiny", DEEPSEEK: "deepseek_v3_tiny"}
"""The checkpoint file prefix of each example."""

SHORT = (f"{DATA}seq_length=32", "model.max_position_embeddings=32", "training.steps=4",
         "lr_scheduler.warmup_steps=1", "checkpoint.save_interleaved_steps=2")
"""4 steps of sequences of 32 tokens, a checkpoint at steps 2 and 4."""
QWEN3_4_LAYERS = (*SHORT, "model.hidden_size=32", "model.intermediate_size=64",
                  "model.head_dim=8", "recompute.mode=None", "recompute.select_module=null")
"""The tiny Qwen3 (4 layers, 4 heads of 8, 2 key/value heads, tied embeddings) narrowed."""
QWEN3_2_LAYERS = (*QWEN3_4_LAYERS, "model.num_hidden_layers=2")
DEEPSEEK_3_LAYERS = (*SHORT, "model.seq_length=32")
"""The tiny DeepSeek-V3 (3 layers: one dense, two with 4 routed experts, top 2)."""


def arguments(config: Path, output: Path, prefix: str, sets: Sequence[str]) -> list[str]:
    """`mf-train`'s arguments: `config` on the corpus at `prefix`, writing to `output`
    (checkpoints in `output/ckpt`), each of `sets` as a `--set`."""
    values = [f"{DATA}data_path=['1','{prefix}']", f"checkpoint.save_path={output / 'ckpt'}",
              *sets]
    return ["--config", str(config), "--output-dir", str(output),
            *[arg for value in values for arg in ("--set", value)]]


def train(config: Path, output: Path, prefix: str, *sets: str, nproc: int = 1,
          timeout: int = 600) -> Path:
    """Train `config` with `sets` on `nproc` ranks (msrun when more than one) into `output`,
    which it returns; the run must succeed. A launched run's console output (stdout and
    stderr, as a terminal shows them) is kept in `output/console.txt`."""
    if nproc == 1:
        assert run(arguments(config, output, prefix, sets)) == 0
        return output
    # what the user's terminal shows (the launcher's lines, rank 0's echo) kept in CONSOLE
    output.mkdir(parents=True, exist_ok=True)
    launch = ["--nproc", str(nproc), "--timeout", str(timeout)]
    with (open(output / CONSOLE, "w", encoding="utf-8") as console,
          contextlib.redirect_stdout(console), contextlib.redirect_stderr(console)):
        status = run([*arguments(config, output, prefix, sets), *launch])
    assert status == 0, (output / CONSOLE).read_text(encoding="utf-8")
    return output


CONSOLE = "console.txt"
"""A launched run's console output, beside its metrics."""


def _key(config: Path, sets: Sequence[str], nproc: int) -> str:
    settings: dict[str, str] = {}
    for value in sets:
        key, _, setting = value.partition("=")
        settings.pop(key, None)
        settings[key] = setting
    return repr((Path(config).name, sorted(settings.items()), nproc))


class Runs:
    """The session's trainer runs, each trained on first use (see the module docstring).

    Args:
        base: a directory every worker process of the session sees.
        prefix: the corpus every run reads.
    """

    def __init__(self, base: Path, prefix: str):
        self.base, self.prefix = base, prefix

    def __call__(self, config: Path, *sets: str, nproc: int = 1) -> Path:
        """The output directory of `config` with `sets` on `nproc` ranks, trained now if no
        test has asked for that run before."""
        key = _key(config, sets, nproc)
        digest = hashlib.sha256(key.encode()).hexdigest()[:12]
        output = self.base / f"{Path(config).stem}-{nproc}-{digest}"
        return shared_directory(output, lambda directory: train(
            config, directory, self.prefix, *sets, nproc=nproc))


class RunsTogether:
    """Several trainer runs of one rank count trained in ONE msrun job, one after the other
    in the same rank processes (workers/trainer_suite.py): each msrun job costs 10-20 s before
    its first step, more than a run of these tiny models takes. The job is made once per
    pytest session (`shared_directory`); each run has a directory of its own inside it.

    Args:
        base: a directory every worker process of the session sees.
        prefix: the corpus every run reads.
    """

    def __init__(self, base: Path, prefix: str):
        self.base, self.prefix = base, prefix

    def __call__(self, entries: Sequence[tuple[Path, Sequence[str]]], nproc: int,
                 timeout: int = 1200) -> list[Path]:
        """The output directories of `entries` (config, settings), trained together on
        `nproc` ranks now unless this session has trained that job before, in their order. A
        setting may name the output directory of an earlier entry K as `{run:K}` (to resume
        from its checkpoint). A run that fails ends the job; the job's error names it."""
        keys = [_key(config, sets, nproc) for config, sets in entries]
        digest = hashlib.sha256(repr(keys).encode()).hexdigest()[:12]
        job = self.base / f"together-{nproc}-{digest}"
        outputs = [job / f"{Path(config).stem}-{hashlib.sha256(key.encode()).hexdigest()[:12]}"
                   for (config, _), key in zip(entries, keys, strict=True)]

        def launch(directory: Path) -> None:
            from mf_parallel.launch import run_ranks
            from mf_train.launch.stop_signals import LAUNCHED

            directory.mkdir(parents=True)
            listed = [{"output": str(output),
                       "argv": arguments(config, output, self.prefix, [re.sub(
                           r"\{run:(\d+)\}", lambda m: str(outputs[int(m[1])]), value)
                           for value in sets])}
                      for (config, sets), output in zip(entries, outputs, strict=True)]
            (directory / "runs.json").write_text(json.dumps(listed, indent=1))
            run_ranks(SUITE, nproc, log_dir=directory / "logs", timeout=timeout,
                      args=[str(directory / "runs.json")], env={LAUNCHED: "1", "GLOG_v": "3"})

        shared_directory(job, launch)
        return outputs


SUITE = Path(__file__).resolve().parent / "workers" / "trainer_suite.py"


# ------------------------------------------------------------------ layout x model cases

@attrs.frozen
class Case:
    """A layout run that must equal the one-process run of the same model and settings: what a
    layout test file declares (its `CASES`, name -> case) instead of training runs itself.

    Args:
        config: the example (`QWEN3`, `DEEPSEEK`).
        shape: the settings of both runs (the model's size, the data, the batch).
        layout: the layout's settings, on top of `shape`.
        nproc: the layout run's ranks.
        weights: the relative tolerance within which the step-4 weights (those the layout
            saved whole: `assert_same_weights`) equal one process's; None: not compared.
        log: what rank 0's log says of the layout; None: not read.
        alone: trained by `runs`, alone in its msrun job, because other test files read the
            same run; otherwise trained in one job with its file's other cases of its rank
            count and `job`.
        job: the cases of one rank count and one `job` are trained together (the `slow`
            ones apart, so that `-m "not slow"` trains none of them).
    """

    config: Path
    shape: tuple[str, ...]
    layout: tuple[str, ...] = ()
    nproc: int = 2
    weights: float | None = None
    log: str | None = None
    alone: bool = False
    job: str = ""

    @property
    def settings(self) -> tuple[str, ...]:
        return (*self.shape, *self.layout)


class LayoutRuns:
    """The runs of one test file's `CASES`: each case's one-process run (the session's
    `runs`, shared by every file) and its layout run (see `Case.alone`), each trained on
    first use, and the comparison of the two (`check`).

    Args:
        runs: the session's `Runs`.
        together: the session's `RunsTogether`.
        cases: name -> `Case`.
    """

    def __init__(self, runs: Runs, together: RunsTogether, cases: dict[str, Case]):
        self.runs, self.together, self.cases = runs, together, cases
        self.done: dict[str, Path] = {}

    def one_process(self, name: str) -> Path:
        """The one-process run of case `name`'s model and settings."""
        case = self.cases[name]
        return self.runs(case.config, *case.shape)

    def __call__(self, name: str) -> Path:
        """The output directory of case `name`'s layout run."""
        case = self.cases[name]
        if case.alone:
            return self.runs(case.config, *case.settings, nproc=case.nproc)
        if name not in self.done:
            group = [other for other, entry in self.cases.items() if not entry.alone
                     and (entry.nproc, entry.job) == (case.nproc, case.job)]
            outputs = self.together([(self.cases[other].config, self.cases[other].settings)
                                     for other in group], case.nproc)
            self.done.update(zip(group, outputs, strict=True))
        return self.done[name]

    def check(self, name: str) -> Path:
        """Case `name`'s layout run equals one process (`assert_same_run`; the weights
        within `Case.weights`), every rank logged, rank 0's log says `Case.log`; returns the
        layout run's output directory for the test's own further checks."""
        case = self.cases[name]
        got, one = self(name), self.one_process(name)
        assert_same_run(got, one)
        if case.weights is not None:
            assert_same_weights(got, one, rel=case.weights, whole=True)
        assert all((got / "logs" / f"worker_{rank}.log").exists() for rank in range(case.nproc))
        if case.log is not None:
            assert case.log in worker_log(got)
        return got


# ------------------------------------------------------------------ reading a finished run

def steps(output: Path) -> list[dict]:
    """metrics.jsonl's step records, in order (events left out)."""
    lines = [json.loads(line) for line in (output / "metrics.jsonl").read_text().splitlines()]
    return [line for line in lines if "event" not in line]


def losses(output: Path) -> dict[int, float]:
    """Each step's loss in metrics.jsonl; for a step logged twice (before a stop or a kill,
    and again after the resume), the last line counts, as metrics.jsonl documents."""
    return {entry["step"]: entry["loss"] for entry in steps(output)}


def rank_pieces(output: Path, step: int, kind: str, rank: int, world: int,
                prefix: str = PREFIXES[QWEN3]) -> dict[Piece, np.ndarray]:
    """What one rank wrote into its `kind` ("model" or "opt") file of the step-`step`
    checkpoint: each piece (a range of a model-wide tensor) and its values (flat)."""
    directory = output / "ckpt" / iteration_name(step)
    name = rank_file(prefix, kind, rank, world)
    common = json.loads((directory / "common.json").read_text())
    arrays = load_file(str(directory / name))
    pieces = [Piece.from_record(record) for record in common["files"][name]["pieces"]]
    assert sorted(piece.key for piece in pieces) == sorted(arrays)
    return {piece: arrays[piece.key] for piece in pieces}


def saved_tensors(output: Path, step: int, kind: str = "model",
                  place: tuple[int, int] | None = None) -> dict[str, np.ndarray]:
    """Every tensor of the step-`step` checkpoint whole, as one process holds it; with
    `place` (tensor place, degree), the tensor-split ones as that place holds them."""
    directory = output / "ckpt" / iteration_name(step)
    index = PieceIndex(directory, json.loads((directory / "common.json").read_text()), kind)
    with index:
        return {name: index.read_whole(name, tensor) for name, tensor in index.by_tensor
                if tensor in (None, place)}


def worker_log(output: Path, rank: int = 0) -> str:
    return (output / "logs" / f"worker_{rank}.log").read_text()


def run_log(output: Path) -> str:
    """The log of rank 0 of a run, launched (`worker_log`) or on one process (train.log)."""
    single = output / "logs" / "train.log"
    return single.read_text() if single.exists() else worker_log(output)


def assert_same_run(got: Path, want: Path, rel: float = 1e-5, count: int = 4) -> None:
    """`got` logged the losses and gradient norms of `want` within `rel`, `count` steps, and
    the loss fell; where one process read nothing back to the host inside a step, neither
    did `got`."""
    one, other = steps(want), steps(got)
    assert len(one) == len(other) == count
    assert [s["loss"] for s in other] == pytest.approx([s["loss"] for s in one], rel=rel)
    assert [s["grad_norm"] for s in other] == pytest.approx([s["grad_norm"] for s in one],
                                                            rel=rel)
    assert one[-1]["loss"] < one[0]["loss"]
    if not any(s.get("host_reads") for s in one):  # counted (conftest.py): none in one process
        assert [s.get("host_reads") for s in other] == [s.get("host_reads") for s in one], \
            "the layout's step read tensors back to the host (tests/train/test_host_reads.py)"


def assert_same_weights(got: Path, want: Path, rel: float = 1e-5, step: int = 4,
                        kind: str = "model", whole: bool = False) -> None:
    """The step-`step` checkpoint of `got` holds `want`'s weights (`kind` "opt": optimizer
    state) within `rel`: every tensor `got` saved whole (under tensor parallelism, those every
    tensor place holds whole); with `whole`, every tensor `want` saved, no more and no fewer."""
    mine, theirs = saved_tensors(got, step, kind), saved_tensors(want, step, kind)
    assert mine and mine.keys() <= theirs.keys()
    assert_same_tensors(mine, theirs if whole else {name: theirs[name] for name in mine},
                        rel=rel, what=kind)


def assert_same_pieces(got: Path, want: Path, world: int, prefix: str, rel: float = 1e-5,
                       step: int = 4) -> None:
    """Two runs of one layout on `world` ranks saved the same pieces at step `step`, each
    rank its own (weights and optimizer state), the values within `rel` (0: bit for bit)."""
    for kind in ("model", "opt"):
        for rank in range(world):
            mine = rank_pieces(got, step, kind, rank, world, prefix)
            theirs = rank_pieces(want, step, kind, rank, world, prefix)
            assert_same_tensors(mine, theirs, rel=rel, atol=1e-6 if rel else 0.0,
                                what=f"{kind} rank {rank}")


def assert_resumed_across_layouts(resumed: Path, whole: Path, rel: float = 1e-5) -> None:
    """`resumed` ran steps 3-4 from a step-2 checkpoint another layout saved, with the
    losses and gradient norms of `whole` (the uninterrupted run, in any layout) within `rel`:
    the layouts are numerically equivalent, not bit-identical."""
    again, reference = steps(resumed), steps(whole)[2:]
    assert [s["step"] for s in again] == [3, 4]
    assert [s["loss"] for s in again] == pytest.approx([s["loss"] for s in reference], rel=rel)
    assert [s["grad_norm"] for s in again] == pytest.approx(
        [s["grad_norm"] for s in reference], rel=rel)


def assert_resumed_exactly(resumed: Path, whole: Path) -> None:
    """`resumed` ran steps 3-4 from `whole`'s step-2 checkpoint with `whole`'s losses and
    gradient norms, bit for bit."""
    again, reference = steps(resumed), steps(whole)[2:]
    assert [s["step"] for s in again] == [3, 4]
    assert [(s["loss"], s["grad_norm"]) for s in again] == \
        [(s["loss"], s["grad_norm"]) for s in reference]


def assert_pieces_follow_record(output: Path, step: int = 4) -> None:
    """Each rank of the run wrote exactly the regions the placement record
    (`mf_parallel.placement`, from the run's saved configuration) says it owns: its model
    pieces, and one range per optimizer moment of each trainable parameter it owns."""
    directory = output / "ckpt" / iteration_name(step)
    common = json.loads((directory / "common.json").read_text())
    config = config_from_source(load_source(str(directory / RUN_CONFIG)))
    world = int(common["world_size"])
    plan = make_job_plan(config, world)
    placed = place_parameters(sharding_table(config.model), plan,
                              config.parallelism.data_parallel_shard_strategy)
    for rank in range(world):
        want = {}
        for placement, held, owned in rank_view(placed.values(), rank, plan):
            if owned:
                want[placement.name] = Piece(placement.name, held.shape, *held.flat,
                                             held.tensor)
        model = rank_pieces(output, step, "model", rank, world, common["prefix"])
        assert sorted(model, key=str) == sorted(want.values(), key=str), rank
        moments: dict[Piece, int] = {}
        for piece in rank_pieces(output, step, "opt", rank, world, common["prefix"]):
            name = next((n for n in placed if piece.name.endswith("." + n)), None)
            if name is not None:
                key = attrs.evolve(piece, name=name)
                moments[key] = moments.get(key, 0) + 1
        trainable = {want[name] for name in want if placed[name].trainable}
        assert set(moments) == trainable, rank
        assert len(set(moments.values())) <= 1, rank  # as many moments of each
