"""mf-train: the trainer, models, checkpoints and the mf-train launcher.

Not built yet: its contents arrive with issue 6. See README.md beside this package.
"""
