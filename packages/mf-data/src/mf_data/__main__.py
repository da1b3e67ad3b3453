"""``python -m mf_data`` runs the ``mf-data`` command."""

from __future__ import annotations

from mf_data.cli import run

if __name__ == "__main__":  # not when a spawned worker process imports it
    raise SystemExit(run())
