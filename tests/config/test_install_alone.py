"""`pip install mf-config` alone, in a fresh virtual environment, validates configuration files:
it brings pyyaml and cattrs (and what cattrs needs), no numpy, no MindSpore."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "packages" / "mf-config"
SKELETON = ROOT / "examples" / "spec_skeleton.yaml"
BOOTSTRAP = {"pip", "setuptools", "wheel"}
"""What `python -m venv` may put into a new environment by itself."""


def run(args: list[str | Path], timeout: float = 120,
        cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    return subprocess.run([str(a) for a in args], capture_output=True, text=True,
                          timeout=timeout, env=env, cwd=cwd, check=False)


def installed(python: Path) -> set[str]:
    result = run([python, "-m", "pip", "list", "--format=json", "--disable-pip-version-check"])
    assert result.returncode == 0, result.stderr
    return {canonicalize_name(item["name"]) for item in json.loads(result.stdout)}


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    """A new environment with mf-config installed from this checkout (not editable)."""
    home = tmp_path_factory.mktemp("alone") / "venv"
    made = run([sys.executable, "-m", "venv", home], timeout=300)
    assert made.returncode == 0, made.stderr
    python = home / "bin" / "python"
    before = installed(python)
    result = run([python, "-m", "pip", "install", "--disable-pip-version-check", PACKAGE],
                 timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    return {"home": home, "python": python, "before": before, "after": installed(python)}


def test_a_new_venv_starts_with_pip_only(venv: dict[str, object]) -> None:
    assert "pip" in venv["before"]
    assert venv["before"] <= BOOTSTRAP


def cattrs_requirements(python: Path) -> set[str]:
    """cattrs' own (non-extra) requirements that apply to that interpreter."""
    code = ("import importlib.metadata, json, platform, sys; "
            "print(json.dumps([importlib.metadata.requires('cattrs'), "
            "platform.python_version()]))")
    result = run([python, "-c", code])
    assert result.returncode == 0, result.stderr
    requires, version = json.loads(result.stdout)
    needed = set()
    for text in requires:
        requirement = Requirement(text)
        environment = {"extra": "", "python_version": ".".join(version.split(".")[:2]),
                       "python_full_version": version}
        if requirement.marker is None or requirement.marker.evaluate(environment):
            needed.add(canonicalize_name(requirement.name))
    return needed


def test_installs_exactly_mf_config_pyyaml_cattrs_and_what_cattrs_needs(
        venv: dict[str, object]) -> None:
    python = venv["python"]
    added = venv["after"] - venv["before"]
    from_cattrs = cattrs_requirements(python)
    assert "attrs" in from_cattrs
    assert from_cattrs <= {"attrs", "typing-extensions", "exceptiongroup"}
    assert added == {"mf-config", "pyyaml", "cattrs"} | from_cattrs
    # Today (cattrs 26 on Python 3.11): mf-config, pyyaml, cattrs, attrs, typing-extensions.
    if sys.version_info >= (3, 11):
        assert added <= {"mf-config", "pyyaml", "cattrs", "attrs", "typing-extensions"}


def test_no_numpy_no_mindspore(venv: dict[str, object]) -> None:
    assert not {"numpy", "mindspore"} & venv["after"]
    code = ("import importlib.util, mf_config; "
            "print(importlib.util.find_spec('numpy'), importlib.util.find_spec('mindspore'), "
            "mf_config.__file__)")
    result = run([venv["python"], "-c", code], cwd=venv["home"])
    assert result.returncode == 0, result.stderr
    numpy, mindspore, location = result.stdout.split()
    assert (numpy, mindspore) == ("None", "None")
    assert Path(location).is_relative_to(venv["home"]), "mf_config was not imported from the venv"


def test_validate_the_skeleton(venv: dict[str, object]) -> None:
    """Alone, mf-config checks its own sections and says which open sections it could not,
    and that the trainer's pre-launch checks were not made."""
    result = run([venv["home"] / "bin" / "mf-config", "validate", SKELETON])
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"{SKELETON}: OK\n"
    not_checked = "note: not checked: no installed package declares the settings of"
    assert result.stderr.splitlines() == [
        f"{SKELETON}:37: lr_scheduler.type: {not_checked} learning-rate scheduler type "
        "'ConstantWarmUpLR'; its keys are checked when it is built",
        f"{SKELETON}:44: train_dataset.dataloader.type: {not_checked} data loader type "
        "'BlendedMegatronDatasetDataLoader'; its keys are checked when it is built",
        f"{SKELETON}:65: model.architectures: {not_checked} model type "
        "'DeepseekV3ForCausalLM'; its keys are checked when it is built",
        f"{SKELETON}: note: not checked: what the trainer refuses or says has no effect "
        "before it starts (no installed package declares pre-launch checks; mf-train does)"]


def test_validate_a_broken_copy(venv: dict[str, object], tmp_path: Path) -> None:
    text = SKELETON.read_text(encoding="utf-8")
    assert text.count("global_batch_size: 8\n") == 1
    broken = tmp_path / "broken.yaml"
    broken.write_text(text.replace("global_batch_size: 8\n", "global_batch_size: 0\n"),
                      encoding="utf-8")
    line = text.splitlines().index("  global_batch_size: 8") + 1

    result = run([venv["home"] / "bin" / "mf-config", "validate", broken])
    assert result.returncode == 1, result.stdout + result.stderr
    assert "OK" not in result.stdout
    assert "Traceback" not in result.stderr
    assert re.search(rf"^{re.escape(str(broken))}:{line}: training\.global_batch_size: "
                     r"must be positive\b.*\bgot 0$", result.stderr, re.M), result.stderr


def test_show_and_schema_work_too(venv: dict[str, object]) -> None:
    show = run([venv["home"] / "bin" / "mf-config", "show", SKELETON])
    assert show.returncode == 0, show.stderr
    assert "global_batch_size: 8" in show.stdout
    schema = run([venv["home"] / "bin" / "mf-config", "schema"])
    assert schema.returncode == 0, schema.stderr
    assert json.loads(schema.stdout)["required"] == ["model", "train_dataset", "training"]
