"""mf-config stays light: importing and using it never imports numpy or MindSpore, importing it
imports no package above it in the stack, and validating imports from those only the settings
modules they declare through entry points (each check runs in a fresh interpreter)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SKELETON = ROOT / "examples" / "spec_skeleton.yaml"
HEAVY = ("numpy", "mindspore")
ABOVE = ("mf_parallel", "mf_memory", "mf_data", "mf_train")

USE_MF_CONFIG = f"""
import mf_config
config = mf_config.load_config({str(SKELETON)!r}, overrides=["training.steps=10"])
assert config.training.steps == 10 and config.model.hidden_size == 1792
config.to_dict()
from mf_config.cli import main
from mf_config.schema import json_schema
json_schema()
"""


def modules_after(code: str, tmp_path: Path) -> set[str]:
    """The names in sys.modules after running `code` in a new interpreter.

    numpy and MindSpore need not be installed here, so an optional `try: import numpy` would go
    unnoticed: the interpreter runs in `tmp_path`, where importable tripwire packages of those
    names are placed (first on sys.path), so any attempt to import them shows up.
    """
    for name in HEAVY:
        (tmp_path / name).mkdir(exist_ok=True)
        (tmp_path / name / "__init__.py").write_text("TRIPWIRE = True\n", encoding="utf-8")
    script = code + "\nimport json, sys\nprint(json.dumps(sorted(sys.modules)))\n"
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                            cwd=tmp_path, timeout=120, check=False)
    assert result.returncode == 0, result.stderr
    return set(json.loads(result.stdout.splitlines()[-1]))


def starting_with(modules: set[str], prefixes: tuple[str, ...]) -> list[str]:
    return sorted(m for m in modules if m.startswith(prefixes))


def test_import_mf_config_imports_no_numpy_or_mindspore(tmp_path: Path) -> None:
    modules = modules_after("import mf_config", tmp_path)
    assert "mf_config" in modules
    assert starting_with(modules, HEAVY) == []


def test_loading_a_config_imports_no_numpy_or_mindspore(tmp_path: Path) -> None:
    modules = modules_after(USE_MF_CONFIG, tmp_path)
    assert {"mf_config.validate", "mf_config.cli", "mf_config.schema", "yaml"} <= modules
    assert starting_with(modules, HEAVY) == []


def test_mf_config_imports_no_package_above_it(tmp_path: Path) -> None:
    modules = modules_after("import mf_config", tmp_path)
    assert starting_with(modules, ABOVE) == []


SETTINGS_MODULES = {"mf_data", "mf_data.errors", "mf_data.loader_config", "mf_train",
                    "mf_train.settings", "mf_train.settings.deepseek_v3",
                    "mf_train.settings.lr_schedules", "mf_train.settings.adamw"}
"""What validating the skeleton may import from the packages above when they are installed:
the settings they declare for its components (entry points), nothing else."""


def test_validation_imports_only_the_declared_settings_above_it(tmp_path: Path) -> None:
    pytest.importorskip("mf_train")
    pytest.importorskip("mf_data")
    modules = modules_after(USE_MF_CONFIG, tmp_path)
    assert set(starting_with(modules, ABOVE)) == SETTINGS_MODULES
    assert "mf_train.settings.deepseek_v3" in modules  # the skeleton's model was checked


@pytest.mark.parametrize("name", ABOVE)
def test_the_check_sees_a_package_that_is_imported(tmp_path: Path, name: str) -> None:
    """The same check does flag an upper package when one is imported (installed in this env)."""
    pytest.importorskip(name)
    modules = modules_after(f"import mf_config\nimport {name}", tmp_path)
    assert name in starting_with(modules, ABOVE)


def test_the_check_sees_numpy_when_it_is_imported(tmp_path: Path) -> None:
    modules = modules_after("import mf_config\nimport numpy\nassert numpy.TRIPWIRE", tmp_path)
    assert starting_with(modules, HEAVY) == ["numpy"]


def test_validate_with_the_trainers_pre_launch_checks_imports_no_numpy_or_mindspore(
        tmp_path: Path) -> None:
    """`mf-config validate` runs mf-train's pre-launch checks (entry point) when it is
    installed; they stay as light as the rest of validation."""
    pytest.importorskip("mf_train")
    code = (f"from mf_config.cli import main\n"
            f"assert main(['validate', {str(SKELETON)!r}, '--nproc', '2']) == 0\n")
    modules = modules_after(code, tmp_path)
    assert "mf_train.preflight.validation" in modules
    assert starting_with(modules, HEAVY) == []
