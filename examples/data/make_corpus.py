"""Write the demo corpus: the Python documentation's help topics, one document per topic;
with `--valid`, also a held-out corpus for the validation loss: the docstrings of Python's
built-in functions, types and exceptions, one document each (text the topics do not hold).

Real English text that every CPython installation carries (`pydoc_data.topics`, about
465 KB; `builtins`' docstrings, about 26 KB), so the demo needs no download. Output: JSON lines
with a "text" field, the input `mf-data preprocess` reads.

Usage: python examples/data/make_corpus.py OUTPUT.jsonl [--valid VALID.jsonl]
"""

from __future__ import annotations

import builtins
import json
import sys
from pathlib import Path
from pydoc_data.topics import topics


def write(output: str, documents: list[str]) -> None:
    path = Path(output)
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_suffix(path.suffix + ".tmp")
    with open(temporary, "w", encoding="utf-8") as out:
        for text in documents:
            out.write(json.dumps({"text": text}) + "\n")
    temporary.replace(path)
    print(f"wrote {path}: {len(documents)} documents, {path.stat().st_size:,} bytes")


def builtin_docstrings() -> list[str]:
    """The docstring of each public name of `builtins`, once each, in name order."""
    documents: list[str] = []
    for name in sorted(dir(builtins)):
        text = (getattr(builtins, name).__doc__ or "").strip()
        if not name.startswith("_") and text and text not in documents:
            documents.append(text)
    return documents


if __name__ == "__main__":
    if len(sys.argv) not in (2, 4) or (len(sys.argv) == 4 and sys.argv[2] != "--valid"):
        raise SystemExit(__doc__)
    write(sys.argv[1], [topics[name].strip() for name in sorted(topics)])
    if len(sys.argv) == 4:
        write(sys.argv[3], builtin_docstrings())
