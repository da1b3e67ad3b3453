"""Sessions: `tests` (the whole suite), `lint` (ruff + the layering contract), `train` (the main
job: the demo, a short training run of the tiny example), `docs` (the user guide, strict),
`charts` (results tables and charts), `bench` (side-by-side measurements).
`megatron_parity`, `bench_data`, `bench_speed` and `export_parity` (mf against PyTorch +
transformers) also install torch (CPU) and run only when named; so do `bench_pipeline`
(pipeline schedules on 2 msrun ranks, about 6-10 minutes) and `bench_experts` (the expert
dispatch on 2 and 4 ranks, about 5 minutes) and `bench_context` (one attention block at 2048
and 8192 tokens, one process against context parallelism on 2 ranks, about 15 minutes and
10 GB of memory).

Environments are made with uv where it is installed (`pip install nox uv`, or nox's own
`uv` extra), else with virtualenv and pip; installs show their progress. Every session but
`train` installs the packages from this checkout into a fresh environment; `train` keeps its
environment and reinstalls only when a package's pyproject.toml has changed (the packages are
installed editable, so source changes need no reinstall). The torch sessions use pip: they
take the CPU build of torch from the machine's pip configuration (an extra index or a local
wheel), which uv does not read.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

import nox

ROOT = Path(__file__).parent
PACKAGES = ["mf-config", "mf-parallel", "mf-memory", "mf-data", "mf-train"]
TEST_REQUIREMENTS = ["pytest>=8", "pytest-xdist>=3.5", "filelock>=3.12", "hypothesis>=6.100",
                     "jsonschema>=4.20"]

nox.options.sessions = ["lint", "tests"]
nox.options.reuse_existing_virtualenvs = False
nox.options.default_venv_backend = "uv|virtualenv"


EXTRAS = {"mf-parallel": "[runtime]", "mf-data": "[hf,mindspore]"}
"""Optional extras the sessions install (the MindSpore runtime of mf-parallel; Hugging Face
tokenizers and the MindSpore dataset adapter of mf-data)."""


def package_requirements(extras: dict[str, str] | None = None) -> list[str]:
    """The five packages of this checkout, editable, with `EXTRAS` (and `extras` on top)."""
    chosen = {**EXTRAS, **(extras or {})}
    return [f"-e{ROOT / 'packages' / name}{chosen.get(name, '')}" for name in PACKAGES]


COMPILE_BYTECODE = {"UV_COMPILE_BYTECODE": "1"}
"""uv, unlike pip, does not compile the installed modules to bytecode, and where
PYTHONDONTWRITEBYTECODE is set (as on CI's machines) Python never writes it either: every
process then compiles MindSpore's 2,000 modules again (`import mindspore` took 6.8 s, against
2.5 s compiled), and the suite starts hundreds of processes (msrun ranks, CLI runs)."""


def install(session: nox.Session, *requirements: str) -> None:
    """One install call for all `requirements`, its progress shown (uv or pip), compiled."""
    session.install(*requirements, silent=False, env=COMPILE_BYTECODE)


def install_packages(session: nox.Session, *more: str,
                     extras: dict[str, str] | None = None) -> None:
    install(session, *package_requirements(extras), *more)


def installed_stamp() -> str:
    """What decides whether an environment's install is current: every package's
    pyproject.toml and the extras installed."""
    digest = hashlib.sha256(repr(sorted(EXTRAS.items())).encode())
    for name in PACKAGES:
        digest.update((ROOT / "packages" / name / "pyproject.toml").read_bytes())
    return digest.hexdigest()


def install_packages_once(session: nox.Session) -> None:
    """`install_packages` in a reused environment only when `installed_stamp` changed."""
    stamp_file = Path(session.virtualenv.location) / ".mf-installed"
    stamp = installed_stamp()
    if stamp_file.is_file() and stamp_file.read_text() == stamp:
        session.log("the packages are installed and current: nothing to install")
        return
    install_packages(session)
    stamp_file.write_text(stamp)


PYTEST_OPTIONS = ["--durations=25", "-n", "2", "--dist", "loadfile"]
"""The 25 slowest tests listed in every run; two pytest-xdist workers, each file on one of
them (its module fixtures run once). One pytest process used 1.16 of the 2 cores: a rank job
spends much of its time starting (msrun, a scheduler, MindSpore imports) and waiting for its
peers. Measured here, the whole suite: 28.6 minutes in one process, 19.6 with two workers.
`-- -n 0` runs it in one process."""


@nox.session
def tests(session: nox.Session) -> None:
    """The whole test suite, with mf-train's optional wandb callback (installing wandb took
    12 s and 125 MB in a fresh environment; without it, the tests that need it skip)."""
    install_packages(session, *TEST_REQUIREMENTS, extras={"mf-train": "[wandb]"})
    session.run("pytest", *PYTEST_OPTIONS, *session.posargs)


@nox.session
def lint(session: nox.Session) -> None:
    """ruff, and the import-linter contract that keeps the package stack strict."""
    install_packages(session, "ruff>=0.8", "import-linter>=2.1")
    session.run("ruff", "check", ".")
    session.run("lint-imports")


CORPUS = "output/data/python_docs_text_document"
VALID_CORPUS = "output/data/python_docs_valid_text_document"
DEMOS = ("qwen3_tiny.yaml", "deepseek_v3_tiny.yaml")
"""The examples `nox -s train` evaluates during training and samples text from."""
DEMO_VALIDATION = [
    "train_dataset.dataloader.config.data_path=[]",
    f"train_dataset.dataloader.config.train_data_path=['1','{CORPUS}']",
    f"train_dataset.dataloader.config.valid_data_path=['1','{VALID_CORPUS}']",
    "train_dataset.dataloader.sizes=[4000, 40, 0]",
    "callbacks=[{type: Evaluate, interval: 25, iters: 5}]"]
"""A demo's validation loss: on the held-out corpus (Python's built-in docstrings), a blend of
its own, so the training samples are those of the example as written (its `data_path` with
`split: "1, 0, 0"`), 5 global batches after steps 25, 50, ...; `--set` values after the
example override these."""


@nox.session(reuse_venv=True)
def train(session: nox.Session) -> None:
    """The main job: validate the examples, build the demo corpus (the Python docs' help topics,
    no download) and its held-out corpus (the built-ins' docstrings), train
    `examples/qwen3_tiny.yaml` on it with a validation loss (about 25 s on 2 CPU cores), then
    print text sampled from its last checkpoint (`mf-train generate`).
    `nox -s train -- examples/deepseek_v3_tiny.yaml` trains another example. The environment
    is kept between runs (`install_packages_once`)."""
    install_packages_once(session)
    examples = sorted(str(path) for path in (ROOT / "examples").glob("*.yaml"))
    session.run("mf-config", "validate", *examples)
    session.run("python", "examples/data/make_corpus.py", "output/data/python_docs.jsonl",
                "--valid", "output/data/python_docs_valid.jsonl")
    for text, prefix in (("python_docs", CORPUS), ("python_docs_valid", VALID_CORPUS)):
        session.run("mf-data", "preprocess", "--input", f"output/data/{text}.jsonl",
                    "--output-prefix", prefix)
    session.run("mf-data", "inspect", CORPUS)
    config = session.posargs[0] if session.posargs else "examples/qwen3_tiny.yaml"
    output = f"output/demo/{run_name(config, session.posargs[1:])}"
    demo = Path(config).name in DEMOS
    validation = [arg for value in DEMO_VALIDATION for arg in ("--set", value)] if demo else []
    session.run("mf-train", "--config", config, "--output-dir", output, *validation,
                *session.posargs[1:])
    if demo:
        session.run("mf-train", "generate", "--checkpoint", f"{output}/checkpoint",
                    "--prompt", "The ", "--max-new-tokens", "64", "--temperature", "0.8",
                    "--top-k", "40", "--seed", "1")


def run_name(config: str, arguments: list[str]) -> str:
    """The demo run's directory name: the example's, with the settings given after it, so that
    each example and each variant (`--set context.compile=true`) owns its run directory."""
    settings = [re.sub(r"[^\w.=,-]", "_", arg) for arg in arguments if arg != "--set"]
    return "-".join([Path(config).stem, *settings])


DOCS_REQUIREMENTS = ["mkdocs==1.6.1", "mkdocs-material==9.8.2"]


@nox.session
def docs(session: nox.Session) -> None:
    """The user guide (docs/, mkdocs.yml) built into site/ in strict mode: a broken link, a
    page missing from the navigation or a link to a repository file that is not there fails."""
    install(session, *DOCS_REQUIREMENTS)
    session.run("mkdocs", "build", "--strict", "--clean", env={"NO_MKDOCS_2_WARNING": "1"})


@nox.session
def charts(session: nox.Session) -> None:
    """The results tables and docs/images/*.png from benchmarks/results.json."""
    install(session, "matplotlib==3.11.2")
    session.run("python", "benchmarks/charts.py")


@nox.session
def bench(session: nox.Session) -> None:
    """Benchmarks, each against a baseline measured in the same run."""
    install_packages(session)
    session.run("python", "benchmarks/config_load.py", *session.posargs)
    session.run("python", "benchmarks/dp_sync.py")
    session.run("python", "benchmarks/train_step.py")
    session.run("python", "benchmarks/sharded_memory.py")
    session.run("python", "benchmarks/layout_memory.py")
    session.run("python", "benchmarks/memory.py")
    session.run("python", "benchmarks/loader_masks.py")
    session.run("python", "benchmarks/hf_import.py")


@nox.session
def bench_pipeline(session: nox.Session) -> None:
    """Pipeline parallelism on 2 msrun ranks: each schedule's step against one process, the
    simulator's bubble and its prediction from the measured durations, per-stage busy/idle.
    `nox -s bench_pipeline -- --microbatches 4 --pin-ranks`."""
    install_packages(session)
    session.run("python", "benchmarks/pipeline.py", *session.posargs)


@nox.session
def bench_experts(session: nox.Session) -> None:
    """Expert parallelism on 2 and 4 msrun ranks: the token dispatch's communication per
    step against the rest of the step, all-to-all against the deredundant dispatcher.
    `nox -s bench_experts -- --no-four`."""
    install_packages(session)
    session.run("python", "benchmarks/expert_dispatch.py", *session.posargs)


@nox.session
def bench_context(session: nox.Session) -> None:
    """Context parallelism on 2 msrun ranks: one Qwen3 attention block's forward + backward
    and peak memory at 2048 and 8192 tokens, one process against `colossal` and `ulysses`.
    `nox -s bench_context -- --seqs 2048 --rounds 1`."""
    install_packages(session)
    session.run("python", "benchmarks/context_attention.py", *session.posargs)


TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"
TORCH_BACKEND = "virtualenv"
"""The torch sessions' backend: pip, which reads the machine's pip configuration."""


def install_torch_cpu(session: nox.Session, *extra: str) -> None:
    """torch 2.13.0, the CPU build, then its dependencies and `extra` with torch still pinned
    (an unpinned `torch` would pull the multi-GB CUDA build)."""
    try:  # the CPU build; pip also looks in the machine's find-links for the same file
        session.install("--no-deps", "--retries", "0", "--timeout", "30",
                        "--index-url", TORCH_CPU_INDEX, "torch==2.13.0")
    except nox.command.CommandFailed:
        session.log("the PyTorch CPU index is unreachable: torch==2.13.0 from the package index")
        session.install("--no-deps", "torch==2.13.0")
    session.install("torch==2.13.0", *extra)


def install_megatron(session: nox.Session, *extra: str) -> None:
    """torch 2.13.0 (CPU build), megatron-core 0.16.1, transformers 4.57.6 (the tokenizer
    megatron-core's HuggingFaceTokenizer loads) and mf-data with its tokenizers extra."""
    install_torch_cpu(session, "megatron-core==0.16.1", "numpy", "transformers==4.57.6", *extra,
                      *(f"-e{ROOT / 'packages' / name}{'[hf]' if name == 'mf-data' else ''}"
                        for name in ("mf-config", "mf-parallel", "mf-data")))


@nox.session(venv_backend=TORCH_BACKEND)
def megatron_parity(session: nox.Session) -> None:
    """mf-data against real megatron-core 0.16.1 (torch CPU): compare bit for bit (datasets,
    samples and blends; then `mf-data preprocess` against Megatron's preprocessing).

    `nox -s megatron_parity` checks; `nox -s megatron_parity -- --write` also rewrites the
    goldens in tests/data/golden/ (then run tests/data/test_megatron_golden.py).
    """
    install_megatron(session, "pytest")
    session.run("python", "-c", "import torch, megatron.core, numpy; print('torch', "
                "torch.__version__, 'megatron-core', megatron.core.__version__, 'numpy', "
                "numpy.__version__)")
    session.run("python", "tests/data/parity/generate_golden.py", "--check",
                *session.posargs)
    session.run("python", "tests/data/parity/preprocess_parity.py")


@nox.session(venv_backend=TORCH_BACKEND)
@nox.parametrize("transformers", ["4.57.6", "newest"])
def export_parity(session: nox.Session, transformers: str) -> None:
    """`mf-train export-hf` against transformers (torch CPU), the pinned 4.57.6 and the newest
    release users install today (`nox -s "export_parity(transformers='newest')"`): the tiny
    Qwen3 and DeepSeek-V3, trained a few steps and exported, load with `AutoModelForCausalLM`
    and give mf's logits to 1e-5, and transformers' greedy `generate` gives `mf-train
    generate`'s tokens (with and without its cache)."""
    install_packages(session)
    install_torch_cpu(session, "transformers" if transformers == "newest"
                      else f"transformers=={transformers}")
    session.run("python", "-c", "import transformers; print('transformers', "
                "transformers.__version__)")
    session.run("python", "tests/train/parity/export_parity.py")


@nox.session(venv_backend=TORCH_BACKEND)
def bench_data(session: nox.Session) -> None:
    """mf-data against megatron-core 0.16.1 (torch CPU) in one run: index build, sample reads,
    the batch loader; then preprocessing tokens/s with 1 and 2 workers.
    `nox -s bench_data -- --scale 0.25` for a smaller corpus (data.py's options)."""
    install_megatron(session)
    session.run("python", "benchmarks/data.py", *session.posargs)
    session.run("python", "benchmarks/data_preprocess.py")


@nox.session(venv_backend=TORCH_BACKEND)
def bench_speed(session: nox.Session) -> None:
    """Training speed of mf (`mf-train`) against PyTorch eager + Hugging Face transformers'
    Qwen3ForCausalLM (torch 2.13.0 CPU, transformers 4.57.6), side by side, on the tiny Qwen3
    and a 28M one. `nox -s bench_speed -- --only tiny --rounds 3`."""
    install_packages(session)
    install_torch_cpu(session, "transformers==4.57.6")
    session.run("python", "benchmarks/speed.py", *session.posargs)
