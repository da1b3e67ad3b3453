"""mf-parallel: parallel topology, batch math and MindSpore data/tensor parallelism.

Not built yet: its contents arrive with issue 3. See README.md beside this package.
"""
