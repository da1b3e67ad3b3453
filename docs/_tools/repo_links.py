"""MkDocs hook: links from docs/ to the repository's other files (package READMEs,
benchmarks/README.md, examples/) are checked to exist and kept as they are written.

MkDocs checks only links between pages of docs/; in strict mode it fails on every link that
leaves docs/. This hook resolves such a link against the repository: a missing file is a
warning (so `mkdocs build --strict` fails), an existing one is kept relative. The site is
built into `site/` at the repository's root with `use_directory_urls: false`, so a page sits
as deep under site/ as its source under docs/ and the same relative link reaches the
repository's file in a checkout.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path

log = logging.getLogger("mkdocs.plugins.repo_links")
LINK = re.compile(r"\]\((?!https?:|mailto:|#)([^)#\s]+)(#[^)\s]*)?\)")
MARK = "repo-file:"


def on_page_markdown(markdown: str, page, config, files) -> str:
    docs = Path(config["docs_dir"]).resolve()
    root = docs.parent
    source = (docs / page.file.src_path).parent

    def rewrite(match: re.Match) -> str:
        target, anchor = match.group(1), match.group(2) or ""
        resolved = (source / target).resolve()
        if resolved.is_relative_to(docs):
            return match.group(0)  # MkDocs checks its own pages
        if not resolved.is_relative_to(root) or not resolved.exists():
            log.warning("%s links to %s, which is not in the repository",
                        page.file.src_path, target)
            return match.group(0)
        return f"]({MARK}{target}{anchor})"

    return LINK.sub(rewrite, markdown)


def on_page_content(html: str, page, config, files) -> str:
    return html.replace(f'href="{MARK}', 'href="').replace(f'src="{MARK}', 'src="')
