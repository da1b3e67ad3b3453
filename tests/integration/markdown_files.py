"""The Markdown files users read (README.md, the package READMEs, benchmarks/README.md and the
user guide in docs/) and the shell commands their code blocks show, for the tests that check
them against the code."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
READMES = sorted([ROOT / "README.md", *ROOT.glob("packages/*/README.md"),
                  ROOT / "benchmarks" / "README.md", *(ROOT / "docs").rglob("*.md")])
"""The READMEs and the user guide's pages (tests/integration/test_docs.py runs their
commands)."""


def commands(readme: Path) -> list[str]:
    """The shell commands of `readme`'s code blocks, continuation lines joined."""
    blocks = [body for language, body in re.findall(r"```(\w*)\n(.*?)```", readme.read_text(),
                                                    re.DOTALL)
              if language in ("bash", "sh", "console", "")]  # not yaml, python, ...
    joined = "\n".join(block.replace("\\\n", " ") for block in blocks)
    return [line.strip() for line in joined.splitlines() if line.strip()]
