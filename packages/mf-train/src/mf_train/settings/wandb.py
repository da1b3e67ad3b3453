"""The keys of a `callbacks:` item of type `wandb` (Weights & Biases; the callback is
`mf_train.monitor.wandb.WandbWriter`).

No `from __future__ import annotations` here: cattrs reads the field types at run time.
"""

import importlib.util
from typing import Literal

from mf_config.errors import Path
from mf_config.sections import Section, section, setting

INSTALL = "pip install 'mf-train[wandb]'"


@section
class WandbSettings(Section):
    """Where the run is logged in Weights & Biases, and how often."""

    project: str = setting("mf", "W&B project of the run.")
    entity: str | None = setting(None, "W&B team or user; null: the account's default.")
    name: str | None = setting(None, "Run name; null: W&B picks one.")
    group: str | None = setting(None, "Group of runs (the runs of one experiment, say).")
    tags: list[str] = setting([], "Tags of the run.")
    mode: Literal["online", "offline", "disabled"] | None = setting(
        None, "online: sync while training; offline: write the run directory only (upload "
        "it later with `wandb sync`); disabled: log nothing; null: WANDB_MODE, else online.")
    dir: str | None = setting(
        None, "Directory W&B writes its `wandb/` run directories under; null: the run's "
        "--output-dir.")
    log_interval: int = setting(1, "Log the steps with step % log_interval == 0.", gt=0)

    def problems(self, path: Path) -> list[tuple[Path, str]]:
        """The callback cannot run without the wandb package: said before anything starts."""
        if importlib.util.find_spec("wandb") is None:
            return [((*path, "type"), "the wandb callback needs the wandb package, which is "
                                      f"not installed in this environment: {INSTALL}")]
        return []
