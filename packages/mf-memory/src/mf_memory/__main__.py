"""`python -m mf_memory estimate ...`: the same as the `mf-memory` command."""

from .cli import run

run()
