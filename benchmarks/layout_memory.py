"""Per-rank peak memory of `mf-train` itself, layout by layout, beside mf-memory's estimate.

The model is a 127M-parameter Qwen3 (hidden 1024, 8 layers, 16 heads / 8 key-value heads,
head dim 64, MLP 2816, vocabulary 32000, tied embedding, float32), AdamW, sequence 128,
global batch 4 (local batch 4 / ranks: one micro-batch per rank; `--micro-batches K`: global
batch 4K, K micro-batches), 2 steps and a checkpoint,
trained on the Python-docs corpus `nox -s train` builds (examples/data/make_corpus.py). For
each number of ranks (1, 2, 4) and each data-parallel strategy (plain, `optim` = ZeRO-1,
`optim_grads` = ZeRO-2, `optim_grads_params` = FSDP) one real `mf-train --nproc N` run:

- **built**: the largest rank's peak once the model, optimizer and state exist (the
  `build_peak_memory_gib` of metrics.jsonl's start line);
- **training**: the largest rank's peak through the steps (the last step line's
  `peak_memory_gib`; peak resident memory on CPU);
- **whole run**: the largest rank process's resident memory polled every 0.2 s over the
  whole run, checkpoint included (psutil), which also serves code that logs no memory;
- **estimate**: `mf_memory.estimate(config, world_size).total` for the same configuration.

`--composed fsdp2_tp2,fsdp2_pp2` adds FSDP over 2 ranks x tensor (or pipeline) parallel 2 on 4
ranks; `--floor` a model of almost no parameters (what MindSpore holds itself); `--jsonl FILE`
appends each run's figures (each rank's polled peak too); `--table FILE` runs nothing and
prints a recorded file's runs beside the installed mf-memory's estimates (`build_peak` against
built, `total` against training) with the error of each.

`--from-hf` starts every run from Hugging Face weights of the model (random, bfloat16, written
by `hf_import.write_checkpoint`; `checkpoint.load_path` at them, `no_load_optim`), so that the
figures include loading them.

`--revisions A,B` measures each git revision's packages instead of the installed ones (a
temporary worktree put first on PYTHONPATH), side by side in the same run: this commit and the
one before, say.
Usage: python benchmarks/layout_memory.py [--ranks 1,2,4] [--strategies ...] [--from-hf]
       [--revisions ...]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
SIZES = {"vocab_size": 32000, "hidden_size": 1024, "intermediate_size": 2816,
         "num_hidden_layers": 8, "num_attention_heads": 16, "num_key_value_heads": 8,
         "head_dim": 64}
FLOOR_SIZES = {**SIZES, "vocab_size": 512, "hidden_size": 32, "intermediate_size": 64,
               "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 2,
               "head_dim": 16}
"""A Qwen3 of 26K parameters: what a run holds besides the model."""
STRATEGIES = ("plain", "optim", "optim_grads", "optim_grads_params")
COMPOSED = {  # name: (ranks, data-parallel ranks, --set arguments); FSDP over the data ranks
    "fsdp2_tp2": (4, 2, ["parallelism.tensor_parallel=2"]),
    "fsdp2_pp2": (4, 2, ["parallelism.pipeline_parallel=2"]),
}
GIB = 2**30


def scaled_example(name: str, data_prefix: Path, sizes: dict[str, int],
                   replacements: dict[str, str]) -> str:
    """examples/`name` reading the corpus at `data_prefix`, each text of `replacements`
    replaced and each model size of `sizes` set."""
    text = (ROOT / "examples" / name).read_text()
    text = text.replace("./output/data/python_docs_text_document", str(data_prefix))
    for old, new in replacements.items():
        text = text.replace(old, new)
    for key, value in sizes.items():
        head, _, rest = text.partition(f"  {key}: ")
        text = f"{head}  {key}: {value}{rest[rest.index(chr(10)):]}"
    return text


def config_text(data_prefix: Path, sizes: dict[str, int] = SIZES) -> str:
    """examples/qwen3_tiny.yaml at 127M parameters (or `sizes`), 2 steps, saved once, no
    recompute."""
    text = scaled_example("qwen3_tiny.yaml", data_prefix, sizes,
                          {"steps: 50": "steps: 2",
                           "save_interleaved_steps: 25": "save_interleaved_steps: 2"})
    return text[:text.index("recompute:")] + text[text.index("monitor:"):]


def settings(ranks: int, strategy: str, micro_batches: int = 1,
             composed: str | None = None) -> list[str]:
    """The `key=value` settings of one run: `micro_batches` micro-batches per step on each
    data-parallel rank (global batch 4 x micro_batches); a `COMPOSED` layout adds its own."""
    data_ranks, extra = (COMPOSED[composed][1:] if composed else (ranks, []))
    sets = [f"training.local_batch_size={4 // data_ranks}",
            f"training.global_batch_size={4 * micro_batches}", *extra]
    if strategy == "plain":  # the default shards over every data-parallel rank
        return [*sets, "parallelism.data_parallel_shard=1"]
    return [*sets, "parallelism.data_parallel_shard=-1",
            f"parallelism.data_parallel_shard_strategy={strategy}"]


def overrides(ranks: int, strategy: str, micro_batches: int = 1,
              composed: str | None = None) -> list[str]:
    """`settings` as `--set` arguments."""
    return [arg for item in settings(ranks, strategy, micro_batches, composed)
            for arg in ("--set", item)]


def polled_peak(command: list[str], env: dict[str, str], log: Path) -> tuple[int, float]:
    """Run `command`; the return code and the largest resident memory (GiB) any rank process
    (or the single process) reached."""
    code, peaks = polled_peaks(command, env, log)
    return code, max(peaks, default=0.0)


def polled_peaks(command: list[str], env: dict[str, str], log: Path) -> tuple[int, list[float]]:
    """Run `command`; the return code and each rank process's (or the single process's)
    largest resident memory, GiB, polled every 0.2 s, largest first."""
    peaks: dict[int, int] = {}
    with log.open("w") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env)
        root = psutil.Process(process.pid)
        while process.poll() is None:
            try:
                procs = [root, *root.children(recursive=True)]
            except psutil.Error:
                procs = []
            for proc in procs:
                try:
                    if proc is root or "mf-train-rank" in " ".join(proc.cmdline()):
                        peaks[proc.pid] = max(peaks.get(proc.pid, 0), proc.memory_info().rss)
                except psutil.Error:
                    pass
            time.sleep(0.2)
    ranks = [peak for pid, peak in peaks.items() if pid != root.pid or len(peaks) == 1]
    return process.returncode, sorted((peak / GIB for peak in ranks), reverse=True)


def estimate_gib(config_path: Path, sets: list[str], ranks: int) -> float | None:
    """mf-memory's estimate (GiB) of the configuration at `config_path` with the `key=value`
    `sets` applied, on `ranks` ranks."""
    from mf_config import load_config
    from mf_memory.estimate import estimate

    try:
        return estimate(load_config(config_path, sets), ranks).total / GIB
    except Exception as exc:  # an estimate that fails is reported, not fatal
        print(f"estimate failed: {exc}", file=sys.stderr)
        return None


def metrics_peaks(output: Path) -> tuple[float | None, float | None]:
    lines = [json.loads(line) for line in (output / "metrics.jsonl").read_text().splitlines()]
    start = next((line for line in lines if line.get("event") == "start"), {})
    steps = [line for line in lines if "event" not in line]
    return start.get("build_peak_memory_gib"), steps[-1].get("peak_memory_gib") if steps else None


def make_corpus(tmp: Path) -> Path:
    """The Python-docs corpus (examples/data/make_corpus.py) preprocessed in `tmp`; its
    prefix."""
    corpus = tmp / "docs.jsonl"
    subprocess.run([sys.executable, str(ROOT / "examples/data/make_corpus.py"), str(corpus)],
                   check=True, capture_output=True)
    subprocess.run(["mf-data", "preprocess", "--input", str(corpus), "--output-prefix",
                    str(tmp / "docs")], check=True, capture_output=True)
    return tmp / "docs"


def revision_env(revision: str, tmp: Path) -> tuple[dict[str, str], Path]:
    """The environment that runs `revision`'s packages, and its worktree."""
    tree = tmp / f"tree-{revision}"
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(tree),
                    revision], check=True, capture_output=True)
    paths = [str(path) for path in sorted((tree / "packages").glob("*/src"))]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([*paths, os.environ.get("PYTHONPATH", "")]))
    return env, tree


def remove_worktrees(trees: list[Path]) -> None:
    """Remove the worktrees `revision_env` added."""
    for tree in trees:
        subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)],
                       check=False)


def prepare(tmp: Path, revisions: str | None,
            ) -> tuple[Path, list[tuple[str, dict[str, str]]], list[Path]]:
    """The 127M configuration on a fresh corpus in `tmp`, and the code to run: each of the
    comma-separated `revisions` (its environment; worktrees to remove after), or the
    installed packages."""
    config = tmp / "qwen3_127m.yaml"
    config.write_text(config_text(make_corpus(tmp)))
    codes, trees = [("installed", dict(os.environ))], []
    if revisions:
        codes = []
        for revision in revisions.split(","):
            env, tree = revision_env(revision, tmp)
            codes.append((revision, env))
            trees.append(tree)
    return config, codes, trees


def estimate_table(records: Path) -> str:
    """The runs `--jsonl` recorded (those that ended well), each beside the installed
    mf-memory's estimate of its configuration (made again: the recorded one is the
    estimator's of its day), as a
    Markdown table: each rank's polled peak over the whole run (the largest first), the
    largest rank's built and training peaks, the estimates and their error relative to the
    measurement."""
    import expert_memory  # a sibling script (which imports this one)

    from mf_config import load_config
    from mf_memory.estimate import estimate

    texts = {"127m": config_text(Path("data")),
             "floor": config_text(Path("data"), FLOOR_SIZES),
             "deepseek_121m": expert_memory.config_text(Path("data"))}
    lines = ["| model | layout | ranks | ranks' peaks | built | estimate | error | training | "
             "estimate | error |", "|---|---|---|---|---|---|---|---|---|---|"]
    with tempfile.TemporaryDirectory() as tmp:
        for line in records.read_text().splitlines():
            run = json.loads(line)
            if run["exit"]:  # a failed run measured nothing whole
                continue
            config = Path(tmp, f"{run['model']}.yaml")
            config.write_text(texts[run["model"]])
            result = estimate(load_config(config, run["sets"]), run["ranks"])
            built, training = result.build_peak / GIB, result.total / GIB
            peaks = ", ".join(f"{peak:.2f}" for peak in run["rank_peaks"][:run["ranks"]])
            lines.append(f"| {run['model']} | {run['layout']} | {run['ranks']} | {peaks} | "
                         f"{_gib(run['built'])} | {built:.2f} | {_error(built, run['built'])} | "
                         f"{_gib(run['training'])} | {training:.2f} | "
                         f"{_error(training, run['training'])} |")
    return "\n".join(lines)


def _error(estimate: float, measured: float | None) -> str:
    return "-" if not measured else f"{100 * (estimate - measured) / measured:+.0f} %"


def runs(ranks: str, strategies: str, composed: str) -> list[tuple[int, str, str | None]]:
    """(ranks, strategy, composed layout) of each run the options ask for."""
    plain = [(int(r), strategy, None) for r in ranks.split(",") for strategy in
             strategies.split(",") if strategy and (int(r) > 1 or strategy == "plain")]
    return plain + [(COMPOSED[name][0], "optim_grads_params", name)
                    for name in composed.split(",") if name]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", default="1,2,4")
    parser.add_argument("--strategies", default=",".join(STRATEGIES))
    parser.add_argument("--composed", default="",
                        help=f"FSDP composed with another layout on 4 ranks: {', '.join(COMPOSED)}")
    parser.add_argument("--floor", action="store_true",
                        help="also run a model of almost no parameters (MindSpore's own memory)")
    parser.add_argument("--micro-batches", type=int, default=1,
                        help="micro-batches per step on each rank (gradient accumulation)")
    parser.add_argument("--from-hf", action="store_true",
                        help="start every run from Hugging Face weights of the model")
    parser.add_argument("--revisions", help="git revisions to measure, comma-separated "
                                            "(default: the installed packages)")
    parser.add_argument("--jsonl", type=Path, help="append each run's figures to this file")
    parser.add_argument("--table", type=Path, metavar="JSONL",
                        help="run nothing: the runs a --jsonl file recorded beside the "
                             "installed mf-memory's estimates, as a Markdown table")
    args = parser.parse_args()
    if args.table:
        print(estimate_table(args.table))
        return
    tmp = Path(tempfile.mkdtemp(prefix="mf-layout-memory-"))  # kept if a run fails: its logs
    config, codes, trees = prepare(tmp, args.revisions)
    start = []
    if args.from_hf:
        sys.path.insert(0, str(Path(__file__).parent))
        from hf_import import write_checkpoint

        hf, _, _ = write_checkpoint(tmp / "hf", SIZES["num_hidden_layers"],
                                    {**SIZES, "tie_word_embeddings": True})
        start = ["--set", f"checkpoint.load_path={hf}", "--set", "checkpoint.no_load_optim=true"]
    configs = [("127m", config)]
    if args.floor:
        configs.append(("floor", tmp / "floor.yaml"))
        configs[-1][1].write_text(config_text(tmp / "docs", FLOOR_SIZES))
    rows, failed = [], False
    for model, path in configs:
        for ranks, strategy, composed in runs(args.ranks, args.strategies, args.composed):
            if model == "floor" and (composed or strategy != "plain"):
                continue
            sets = settings(ranks, strategy, args.micro_batches, composed)
            estimate = estimate_gib(path, sets, ranks)
            layout = composed or strategy
            for code, env in codes:
                output = tmp / f"{code.replace(' ', '_')}-{model}-{ranks}-{layout}"
                launch = ["--nproc", str(ranks)] if ranks > 1 else []
                command = ["mf-train", "--config", str(path), "--output-dir", str(output),
                           *launch, *overrides(ranks, strategy, args.micro_batches, composed),
                           *start]
                code_rc, peaks = polled_peaks(command, env, tmp / f"{output.name}.log")
                built, training = metrics_peaks(output) if code_rc == 0 else (None, None)
                failed |= code_rc != 0
                rows.append((code, ranks, f"{model} {layout}", built, training,
                             max(peaks, default=None), estimate, code_rc))
                print(rows[-1], flush=True)
                if args.jsonl:
                    with args.jsonl.open("a") as out:
                        out.write(json.dumps({
                            "code": code, "model": model, "ranks": ranks, "layout": layout,
                            "sets": sets, "built": built, "training": training,
                            "rank_peaks": peaks, "estimate": estimate, "exit": code_rc}) + "\n")
    remove_worktrees(trees)
    print("| code | ranks | layout | built GiB | training GiB | whole run GiB | "
          "estimate GiB | exit |")
    print("|---|---|---|---|---|---|---|---|")
    for code, ranks, layout, built, training, whole, estimate, rc in rows:
        cells = [_gib(built), _gib(training), _gib(whole), _gib(estimate)]
        print(f"| {code} | {ranks} | {layout} | {' | '.join(cells)} | {rc} |")
    if not failed:
        shutil.rmtree(tmp)


def _gib(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


if __name__ == "__main__":
    main()
