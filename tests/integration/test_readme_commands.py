"""The READMEs' and the user guide's commands, as a user copies them: every `mf-train --config`
command names its `--output-dir` (without one, runs land together in `./output`, beside the
data, and the second resumes or refuses the first; a command that resumes a run names that
run's), and every repository file a README links to is there."""

from __future__ import annotations

import re

import pytest
from markdown_files import READMES, ROOT, commands


def training_commands() -> list[tuple[str, str]]:
    return [(readme.relative_to(ROOT).as_posix(), command) for readme in READMES
            for command in commands(readme) if re.match(r"mf-train --config\b", command)]


def test_the_readmes_show_training_commands() -> None:
    assert len(training_commands()) >= 8


@pytest.mark.parametrize(("readme", "command"), training_commands())
def test_every_training_command_has_its_own_output_dir(readme: str, command: str) -> None:
    outputs = re.findall(r"--output-dir (\S+)", command)
    assert outputs, f"{readme}: `{command}` writes into ./output: give it --output-dir"
    assert outputs[0] != "output", command


def test_repository_links_resolve() -> None:
    missing = []
    for readme in READMES:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", readme.read_text()):
            if "://" in target or target.startswith("mailto:"):
                continue
            if not (readme.parent / target).exists():
                missing.append(f"{readme.relative_to(ROOT)}: {target}")
        for cut in re.findall(r"\]\(([^)\s]*\s)", readme.read_text()):  # a link over two lines
            missing.append(f"{readme.relative_to(ROOT)}: {cut!r} is cut")
    assert missing == []
