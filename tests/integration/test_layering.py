"""The package stack: each package declares exactly what its code imports, and imports only down.

    config < parallel < {memory, data} < train      (memory and data independent)

Imports are read with `ast` from every .py file under packages/<name>/src/, wherever they stand
(lazy imports inside functions count: the package needs the distribution all the same);
relative imports, the package's own name and the standard library are left out. Import names
are mapped to distribution names (yaml -> pyyaml, attr/attrs -> attrs, mf_config -> mf-config).
A distribution that is only a dependency of a dependency (attrs comes with cattrs) is not
declared by being pulled in: the code that imports it must declare it.
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    tomllib = pytest.importorskip("tomli")

ROOT = Path(__file__).resolve().parents[2]
PACKAGES_DIR = ROOT / "packages"
PACKAGES = sorted(p.name for p in PACKAGES_DIR.iterdir() if (p / "pyproject.toml").is_file())

STACK = ["mf-config", "mf-parallel", "mf-memory", "mf-data", "mf-train"]
ALLOWED_BELOW = {
    "mf-config": set(),
    "mf-parallel": {"mf-config"},
    "mf-memory": {"mf-config", "mf-parallel"},
    "mf-data": {"mf-config", "mf-parallel"},
    "mf-train": {"mf-config", "mf-parallel", "mf-memory", "mf-data"},
}
"""design.md: a package imports only packages below it; never sideways between mf-data and
mf-memory, never up."""

DISTRIBUTIONS = {
    "yaml": "pyyaml",
    "attr": "attrs",
    "attrs": "attrs",
    "cattr": "cattrs",
    "cattrs": "cattrs",
    "numpy": "numpy",
    "mindspore": "mindspore",
    "google": "protobuf",
    "PIL": "pillow",
    "sklearn": "scikit-learn",
    "tensorboardX": "tensorboardx",
    "tqdm": "tqdm",
    **{name.replace("-", "_"): name for name in STACK},
}
"""Import name -> distribution name, where the two differ or are worth saying."""


def import_name(package: str) -> str:
    return package.replace("-", "_")


def distribution(module: str) -> str:
    top = module.split(".")[0]
    return canonicalize_name(DISTRIBUTIONS.get(top, top))


def imported_modules(package: str) -> dict[str, list[str]]:
    """Top-level module name -> the files (relative paths) importing it, for one package."""
    found: dict[str, list[str]] = {}
    src = PACKAGES_DIR / package / "src"
    for file in sorted(src.rglob("*.py")):
        tree = ast.parse(file.read_text(encoding="utf-8"), filename=str(file))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                found.setdefault(top, []).append(str(file.relative_to(ROOT)))
    return found


def imported_distributions(package: str) -> dict[str, list[str]]:
    """Non-stdlib distributions the package's code imports -> files importing them."""
    result: dict[str, list[str]] = {}
    for module, files in imported_modules(package).items():
        if module in sys.stdlib_module_names or module == import_name(package):
            continue
        result.setdefault(distribution(module), []).extend(files)
    return result


def declared_distributions(package: str, extras: bool = False) -> set[str]:
    """Names in [project].dependencies (and, with `extras`, in every optional extra)."""
    project = tomllib.loads((PACKAGES_DIR / package / "pyproject.toml").read_text("utf-8"))
    requirements = list(project["project"].get("dependencies", []))
    if extras:
        for group in project["project"].get("optional-dependencies", {}).values():
            requirements += group
    return {canonicalize_name(Requirement(r).name) for r in requirements}


def test_the_five_packages_are_there() -> None:
    found = PACKAGES
    assert found == sorted(STACK)
    for package in PACKAGES:
        assert (PACKAGES_DIR / package / "src" / import_name(package) / "__init__.py").is_file()


def test_the_parser_finds_imports_of_every_form() -> None:
    """Guard against an import scanner that sees nothing: mf-config's code imports these."""
    modules = imported_modules("mf-config")
    for name in ("yaml", "cattrs", "attrs", "typing", "__future__"):
        assert name in modules, name
    assert "errors" not in modules and "sections" not in modules  # relative imports
    assert "json" in {m for m, files in modules.items()
                      if any(f.endswith("cli.py") for f in files)}  # a lazy import


@pytest.mark.parametrize("package", STACK)
def test_declared_dependencies_are_exactly_the_imported_ones(package: str) -> None:
    imported = imported_distributions(package)
    declared = declared_distributions(package, extras=True)
    undeclared = {d: sorted(set(files)) for d, files in imported.items() if d not in declared}
    unused = declared_distributions(package) - set(imported)
    assert not undeclared, f"{package} imports but does not declare: {undeclared}"
    assert not unused, f"{package} declares but never imports: {sorted(unused)}"


def test_mf_config_needs_only_pyyaml_cattrs_and_attrs() -> None:
    assert set(imported_distributions("mf-config")) == {"pyyaml", "cattrs", "attrs"}
    assert declared_distributions("mf-config") == {"pyyaml", "cattrs", "attrs"}


@pytest.mark.parametrize("package", STACK)
def test_declared_stack_dependencies_point_down(package: str) -> None:
    stack_deps = declared_distributions(package) & set(STACK)
    assert stack_deps <= ALLOWED_BELOW[package], (
        f"{package} may depend on {sorted(ALLOWED_BELOW[package])} only, "
        f"declares {sorted(stack_deps)}")


@pytest.mark.parametrize("package", STACK)
def test_imported_stack_packages_point_down(package: str) -> None:
    stack_imports = set(imported_distributions(package)) & set(STACK)
    assert stack_imports <= ALLOWED_BELOW[package]


def test_the_allowed_graph_is_the_design() -> None:
    """The table above is a strict layering: acyclic, memory and data independent."""
    for package, below in ALLOWED_BELOW.items():
        assert package not in below
        for other in below:
            assert package not in ALLOWED_BELOW[other], (package, other)
            assert ALLOWED_BELOW[other] <= below, (package, other)  # transitive
    assert "mf-data" not in ALLOWED_BELOW["mf-memory"]
    assert "mf-memory" not in ALLOWED_BELOW["mf-data"]


def test_the_root_import_linter_contract_matches() -> None:
    """pyproject.toml's import-linter layers say the same order."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text("utf-8"))
    contracts = config["tool"]["importlinter"]["contracts"]
    layers = next(c["layers"] for c in contracts if c["type"] == "layers")
    assert [sorted(re.split(r"\s*\|\s*", layer)) for layer in layers] == [
        ["mf_train"], ["mf_data", "mf_memory"], ["mf_parallel"], ["mf_config"]]


def test_mindspore_stays_in_the_runtime_of_mf_parallel() -> None:
    """design.md: mf-parallel imports MindSpore only inside its runtime module, which is an
    optional extra, so the plan installs and runs without it."""
    imported = imported_distributions("mf-parallel")
    assert all("/runtime/" in file for file in imported.get("mindspore", []))
    assert "mindspore" not in declared_distributions("mf-parallel")
    assert "mindspore" in declared_distributions("mf-parallel", extras=True)


def test_mindspore_stays_in_the_adapter_of_mf_data() -> None:
    """mf-data needs MindSpore only for its optional mindspore.dataset adapter."""
    imported = imported_distributions("mf-data")
    assert all(file.endswith("mindspore_adapter.py") for file in imported.get("mindspore", []))
    assert "mindspore" not in declared_distributions("mf-data")
    assert "mindspore" in declared_distributions("mf-data", extras=True)
