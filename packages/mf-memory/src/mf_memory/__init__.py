"""mf-memory: recompute, communication recompute, swap and memory estimates.

Not built yet: its contents arrive with issue 5. See README.md beside this package.
"""
