"""``python -m mf_data`` runs the ``mf-data`` command."""

from __future__ import annotations

from mf_data.cli import run

raise SystemExit(run())
