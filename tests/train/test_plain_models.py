"""The models take their settings only: no module of `mf_train.models` imports a process-group
type (`TensorGroup`, `ContextGroup`, `ExpertGroup`, ...); `mf_train.parallelize` applies
parallelism to them from outside. (The import-linter contract "Models know nothing of the
ranks" keeps them from the communication modules themselves.)"""

from __future__ import annotations

import ast
from pathlib import Path

import mf_train.models

MODELS = Path(mf_train.models.__file__).parent


def imported_names(path: Path) -> set[str]:
    """Every name a module imports, at any depth (`TYPE_CHECKING` blocks included)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.Import):
            names |= {alias.name.rsplit(".", 1)[-1] for alias in node.names}
    return names


def test_no_model_module_imports_a_process_group_type() -> None:
    found = {path.name: sorted(name for name in imported_names(path) if name.endswith("Group"))
             for path in sorted(MODELS.glob("*.py"))}
    assert {name: groups for name, groups in found.items() if groups} == {}
