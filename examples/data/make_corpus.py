"""Write the demo corpus: the Python documentation's help topics, one document per topic.

Real English text of about 465 KB that every CPython installation carries
(`pydoc_data.topics`), so the demo needs no download. Output: JSON lines with a "text" field,
the input `mf-data preprocess` reads.

Usage: python examples/data/make_corpus.py OUTPUT.jsonl
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from pydoc_data.topics import topics


def main(output: str) -> None:
    path = Path(output)
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_suffix(path.suffix + ".tmp")
    with open(temporary, "w", encoding="utf-8") as out:
        for name in sorted(topics):
            out.write(json.dumps({"text": topics[name].strip()}) + "\n")
    temporary.replace(path)
    print(f"wrote {path}: {len(topics)} documents, {path.stat().st_size:,} bytes")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    main(sys.argv[1])
