"""`python -m mf_config ...` is the `mf-config` command."""

from .cli import run

run()
