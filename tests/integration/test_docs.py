"""The user guide against the code: every command of README.md and docs/ that trains or
validates is checked as mf would check it before starting (in this process, no rank started),
the sample output shown for `mf-memory estimate` and `mf-config validate` is what they print
today, the error catalogue lists the messages the code holds, and every results table equals
benchmarks/results.json."""

from __future__ import annotations

import importlib.util
import json
import math
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from markdown_files import ROOT, commands

from mf_config.cli import main as mf_config
from mf_memory.cli import main as mf_memory
from mf_parallel.cli import main as mf_parallel

GUIDE = sorted([ROOT / "README.md", *(ROOT / "docs").rglob("*.md")])


def readers_own(config: str) -> bool:
    """Whether a command's configuration is the reader's own file (`train.yaml`): such commands
    are checked for their flags only. The repository's examples must exist."""
    if config.startswith("examples/"):
        assert (ROOT / config).is_file(), f"{config} is not in the repository"
        return False
    return True


def _load(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


catalogue = _load(ROOT / "docs" / "_tools" / "error_catalogue.py", "error_catalogue")
charts = _load(ROOT / "benchmarks" / "charts.py", "charts")


def guide_commands(program: str) -> list[tuple[str, str]]:
    return [(page.relative_to(ROOT).as_posix(), command) for page in GUIDE
            for command in commands(page)
            if command.startswith(f"{program} ") or command.startswith(f"$ {program} ")]


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory like a clone after `nox -s train`'s data step: examples/ and the demo
    corpus at the path the examples read (here from examples/data/tiny.jsonl)."""
    from mf_data.cli import run as mf_data

    work = tmp_path_factory.mktemp("guide")
    (work / "examples").symlink_to(ROOT / "examples")
    assert mf_data(["preprocess", "--input", str(ROOT / "examples" / "data" / "tiny.jsonl"),
                    "--output-prefix", str(work / "output/data/python_docs_text_document"),
                    "--quiet"]) == 0
    return work


def _arguments(command: str) -> list[str]:
    """The arguments of `command`, without its comment and its `[optional]` parts."""
    command = re.sub(r" \[[^\]]*\]", "", command.split(" #")[0])
    words = shlex.split(command, posix=True)
    return words[1:] if words[0] != "$" else words[2:]


@pytest.mark.parametrize(("page", "command"), guide_commands("mf-train"))
def test_every_training_command_is_valid(page: str, command: str, workdir: Path,
                                         monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    """The configuration, its --set overrides, the layout on the command's world size, what the
    trainer supports and its input files: what mf-train checks before starting any rank.
    A checkpoint the command loads is taken to be there (an earlier command of the page saved
    it)."""
    from mf_train.launch.cli import _parser, _validated

    arguments = _arguments(command)
    if arguments[0] == "export-hf":
        return
    if arguments[0] == "generate":  # its flags are its own parser's
        from mf_train.launch.generate_command import _parser as generate_parser
        generate_parser().parse_args(arguments[1:])
        return
    args = _parser().parse_args(arguments)
    if readers_own(args.config):
        return
    monkeypatch.chdir(workdir)
    for setting in args.overrides:
        key, _, value = setting.partition("=")
        if key == "checkpoint.load_path":
            (workdir / value).mkdir(parents=True, exist_ok=True)
    world = args.nproc * args.nnodes
    assert _validated(args, world) is not None, f"{page}: `{command}`: {capsys.readouterr().err}"


@pytest.mark.parametrize(("page", "command"), guide_commands("mf-config validate"))
def test_every_validate_command_passes(page: str, command: str, workdir: Path,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    arguments = _arguments(command)
    if any(readers_own(word) for word in arguments[1:] if word.endswith(".yaml")):
        return  # broken.yaml: the error example below; train.yaml, typos.yaml: the reader's
    monkeypatch.chdir(workdir)
    assert mf_config(arguments) == 0, f"{page}: `{command}`"


@pytest.mark.parametrize(("page", "command"), guide_commands("mf-parallel plan"))
def test_every_plan_command_passes(page: str, command: str, capsys) -> None:
    assert mf_parallel(_arguments(command)) == 0, f"{page}: `{command}`"


def _console_blocks(page: Path) -> list[tuple[str, list[str]]]:
    """(command, shown output lines) of each ```console block of `page`."""
    found = []
    for block in re.findall(r"```console\n(.*?)```", page.read_text(), re.DOTALL):
        command, _, output = block.replace("\\\n", " ").partition("\n")
        found.append((command.removeprefix("$ "), output.splitlines()))
    return found


MEMORY_OUTPUTS = [(page.relative_to(ROOT).as_posix(), command, shown) for page in GUIDE
                  for command, shown in _console_blocks(page)
                  if command.startswith("mf-memory estimate")]


def test_the_guide_shows_an_estimate() -> None:
    assert MEMORY_OUTPUTS


@pytest.mark.parametrize(("page", "command", "shown"), MEMORY_OUTPUTS)
def test_estimate_output_is_what_mf_memory_prints(page: str, command: str, shown: list[str],
                                                  capsys) -> None:
    """Every line shown (but `...`) is printed today, in that order."""
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(ROOT)
        assert mf_memory(_arguments("x " + command.removeprefix("mf-memory "))) == 0
    printed = capsys.readouterr()
    lines = (printed.err + printed.out).splitlines()
    position = 0
    for line in shown:
        if line.strip() == "...":
            continue
        assert line in lines[position:], f"{page}: `{line}` is no longer printed: {lines}"
        position = lines.index(line, position) + 1


def test_the_error_example_prints_what_the_guide_says(tmp_path: Path) -> None:
    """docs/train-yaml.md's broken copy of the skeleton, run as a shell would."""
    page = (ROOT / "docs" / "train-yaml.md").read_text()
    block = next(block for block in re.findall(r"```bash\n(.*?)```", page, re.DOTALL)
                 if "broken.yaml" in block)
    expected = [line.removeprefix("# ") for line in block.splitlines() if line.startswith("# ")]
    script = "\n".join(line for line in block.splitlines() if not line.startswith("#"))
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    bin_dir = Path(sys.executable).parent
    done = subprocess.run(["bash", "-c", script], cwd=tmp_path, capture_output=True, text=True,
                          env={"PATH": f"{bin_dir}:/usr/bin:/bin"}, timeout=120)
    assert done.returncode == 1
    assert done.stderr.splitlines() == expected


def test_the_readme_train_yaml_is_valid(tmp_path: Path) -> None:
    block = re.search(r"```yaml\n(.*?)```", (ROOT / "README.md").read_text(), re.DOTALL)
    (tmp_path / "train.yaml").write_text(block.group(1))
    assert mf_config(["validate", str(tmp_path / "train.yaml")]) == 0


def test_the_error_catalogue_is_current() -> None:
    written = (ROOT / "docs" / "reference" / "errors.md").read_text()
    assert written == catalogue.page(), "run python docs/_tools/error_catalogue.py"


def test_the_catalogue_holds_the_messages_users_meet() -> None:
    """Messages from each kind of place the extractor reads: bounds, rules, overrides,
    the launcher's own lines, layouts, the run directory."""
    page = catalogue.page()
    for message in ("must be positive, got <value>",
                    "graph mode (0) is not supported",
                    "bad override",
                    "--nproc must be >= 1, got <args.nproc>",
                    "is in use by another run",
                    "is not divisible by num_attention_heads"):
        assert message in page, message


def test_every_results_table_equals_results_json() -> None:
    data = charts.results()
    stale = [page.relative_to(ROOT).as_posix() for page in charts.pages()
             if charts.synced(page.read_text(), data) != page.read_text()]
    assert stale == [], "run python benchmarks/charts.py"


def test_the_headline_results_are_tables_from_results_json() -> None:
    for page in (ROOT / "README.md", ROOT / "benchmarks" / "README.md",
                 ROOT / "docs" / "results.md"):
        assert charts.BLOCK.search(page.read_text()), page
    used = {match.group(1) for page in charts.pages()
            for match in charts.BLOCK.finditer(page.read_text())}
    assert used == set(charts.results())


def test_the_nox_sessions_the_guide_names_exist() -> None:
    sessions = set(re.findall(r"^def (\w+)\(session", (ROOT / "noxfile.py").read_text(), re.M))
    named = {name for page in [*GUIDE, ROOT / "benchmarks" / "README.md"]
             for name in re.findall(r"nox (?:-r )?-s (\w+)", page.read_text())}
    assert named and named <= sessions, named - sessions


def test_the_pipeline_bubbles_are_the_simulators() -> None:
    """results.json's simulated bubbles (2 stages, interleaved with 2 chunks) are what
    mf-parallel's simulator gives today."""
    from mf_parallel.pipeline_schedules import build_schedule
    from mf_parallel.pipeline_simulator import simulate, unit_times

    rows = charts.results()["pipeline_bubbles"]["rows"]
    for name, count, bubble, _ in rows:
        schedule, split = name.split()[0].removesuffix("_split"), name.startswith("1f1b_split")
        chunks = 2 if schedule == "interleaved_1f1b" else 1
        actions = build_schedule(schedule, 2, count, chunks, split)
        simulated = simulate(actions, num_chunks=chunks, **unit_times(split)).bubble_fraction
        assert round(simulated, 3) == bubble, (name, count, simulated)


def test_the_readme_train_yaml_trains(workdir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The README's train.yaml, as its sentence says to run it (2 steps), on the corpus at the
    path it names: a real one-process run whose loss is finite."""
    from mf_train.launch.cli import run as mf_train

    block = re.search(r"```yaml\n(.*?)```", (ROOT / "README.md").read_text(), re.DOTALL)
    (workdir / "train.yaml").write_text(block.group(1))
    monkeypatch.chdir(workdir)
    assert mf_train(["--config", "train.yaml", "--output-dir", "output/mine",
                     "--set", "training.steps=2"]) == 0
    steps = [json.loads(line) for line in (workdir / "output/mine/metrics.jsonl").open()
             if '"event"' not in line]
    assert [step["step"] for step in steps] == [1, 2]
    assert all(math.isfinite(step["loss"]) for step in steps)


def _yaml_blocks() -> list[tuple[str, str]]:
    return [(page.relative_to(ROOT).as_posix(), block) for page in GUIDE
            for block in re.findall(r"```yaml\n(.*?)```", page.read_text(), re.DOTALL)]


def _merged(into: dict, part: dict) -> dict:
    for key, value in part.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            _merged(into[key], value)
        else:
            into[key] = value
    return into


@pytest.mark.parametrize(("page", "block"), _yaml_blocks())
def test_every_yaml_snippet_validates_in_the_example(page: str, block: str, tmp_path: Path,
                                                     capsys) -> None:
    """Each train.yaml snippet of the guide, written into examples/qwen3_tiny.yaml (a
    `config:` fragment under the data loader), passes `mf-config validate`."""
    import yaml

    part = yaml.safe_load(block)
    if "config" in part:
        part = {"train_dataset": {"dataloader": part}}
    if "callbacks" in part:
        pytest.importorskip("wandb")
    if "model" in part:  # a whole file, such as the README's
        config = part
    else:
        config = _merged(yaml.safe_load((ROOT / "examples" / "qwen3_tiny.yaml").read_text()),
                         part)
    (tmp_path / "train.yaml").write_text(yaml.safe_dump(config))
    assert mf_config(["validate", str(tmp_path / "train.yaml")]) == 0, capsys.readouterr().err
