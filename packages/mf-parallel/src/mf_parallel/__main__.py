"""`python -m mf_parallel ...` is the `mf-parallel` command."""

from .cli import run

run()
