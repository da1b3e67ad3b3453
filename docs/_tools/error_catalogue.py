"""docs/reference/errors.md: every one-line error and warning mf-config and mf-train can print,
read from their source so the page cannot drift from the code.

A message is a string (or f-string) that the code raises in an exception, hands to a problem
(`check.error(path, ...)`, `(path, "...")` pairs, `ConfigIssue`, `no_effect`/`refuse` rules),
warns with, or prints to stderr. An f-string's fields are shown as `<expression>`: what the
user sees there depends on the file. `python docs/_tools/error_catalogue.py` rewrites the page;
tests/integration/test_docs.py fails when it is not current.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "reference" / "errors.md"
PACKAGES = {"mf-config": "mf_config", "mf-train": "mf_train"}

MESSAGE_CALLS = {"error", "warn", "issue", "located_issue", "problem", "ConfigIssue",
                 "no_effect", "refuse", "Rule", "fail", "_issue", "refused", "warning"}
"""Callables whose string arguments are messages a user reads."""
MESSAGE_FUNCTIONS = ("problem", "message", "refusal", "warning", "reason")
"""Functions (by part of their name) whose returned strings are messages."""

HEAD = """# Error catalogue

Every error and warning that `mf-config validate` and `mf-train` can print in one line,
generated from their source code (`python docs/_tools/error_catalogue.py`; a test fails when
this page and the code disagree). A configuration problem is printed as

```
FILE:LINE: YAML.PATH: MESSAGE
```

(`FILE (--set key=value)` when the value came from an override; `warning:` before the message
for a setting that is valid but has no effect here). `mf-train` prefixes its own lines with
`mf-train:`. Parts shown as `<expression>` are filled in from your file: the value you wrote,
the allowed range, the nearest valid name.

What to do: the message says what is allowed. `mf-config validate` exits with status 1 for an
invalid file; `mf-train` refuses it with status 2 before any rank starts. Change the value at
the YAML path named, or remove it. A warning means
the run trains but the setting does nothing on this backend; remove it to silence the warning.
See [Writing train.yaml](../train-yaml.md) for what each section means and
[Troubleshooting](../troubleshooting.md) for errors met while training.
"""


def _text(node: ast.AST) -> str | None:
    """The message `node` builds, fields as `<expression>`; None when it is not a string."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        parts = []
        for value in node.values:
            if isinstance(value, ast.Constant):
                parts.append(str(value.value))
            else:
                assert isinstance(value, ast.FormattedValue)
                parts.append(f"<{ast.unparse(value.value)}>")
        return "".join(parts)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = _text(node.left), _text(node.right)
        if left is not None or right is not None:
            return (left if left is not None else f"<{ast.unparse(node.left)}>") + \
                (right if right is not None else f"<{ast.unparse(node.right)}>")
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and node.func.attr == "format"):
        return _text(node.func.value)
    return None


def _name(func: ast.AST) -> str:
    if isinstance(func, ast.Attribute):
        return func.attr
    return func.id if isinstance(func, ast.Name) else ""


def _is_message(text: str | None) -> bool:
    """A sentence, not a key, a format or a path: at least three words."""
    return text is not None and len(text.split()) >= 3 and not text.startswith(("%", "{", "While "))


def messages(source: str) -> list[str]:
    """The messages of one module, in source order, each once."""
    found: list[str] = []

    def add(node: ast.AST) -> None:
        text = _text(node)
        if _is_message(text):
            found.append(" ".join(text.split()))

    def add_branches(node: ast.AST) -> None:
        if isinstance(node, ast.IfExp):
            add_branches(node.body)
            add_branches(node.orelse)
        else:
            add(node)

    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and any(
                word in node.name for word in MESSAGE_FUNCTIONS):
            for inner in ast.walk(node):
                if isinstance(inner, ast.Return) and inner.value is not None:
                    add_branches(inner.value)
        if isinstance(node, ast.Assign) and any(
                isinstance(target, ast.Name) and target.id in ("message", "reason")
                for target in node.targets):
            add_branches(node.value)
        if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call) and node.exc.args:
            add(node.exc.args[0])
        elif isinstance(node, ast.Call):
            name = _name(node.func)
            if name in MESSAGE_CALLS:
                for arg in node.args:
                    add(arg)
            elif node.args and (name in ("warn", "print") or name.endswith(("Error", "Refused"))):
                add(node.args[0])  # print: mf-train's own lines, all on stderr
        elif (isinstance(node, ast.Tuple) and len(node.elts) == 2
              and isinstance(node.elts[0], (ast.Tuple, ast.Name))):
            add(node.elts[1])
    seen: set[str] = set()
    return [text for text in found if not (text in seen or seen.add(text))]


def _escape(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def page() -> str:
    """The whole page, package by package, module by module."""
    lines = [HEAD]
    for package, module in PACKAGES.items():
        src = ROOT / "packages" / package / "src"
        lines.append(f"## {package}\n")
        for path in sorted((src / module).rglob("*.py")):
            found = messages(path.read_text())
            if not found:
                continue
            lines.append(f"### `{path.relative_to(src).as_posix()}`\n")
            lines += [f"- `{_escape(text)}`" for text in found]
            lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def main() -> None:
    PAGE.parent.mkdir(parents=True, exist_ok=True)
    PAGE.write_text(page())
    count = page().count("\n- `")
    print(f"{PAGE.relative_to(ROOT)}: {count} messages", file=sys.stderr)


if __name__ == "__main__":
    main()
