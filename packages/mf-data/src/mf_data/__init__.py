"""mf-data: Megatron indexed datasets, GPT samples, blending and the loader.

Not built yet: its contents arrive with issue 4. See README.md beside this package.
"""
