"""mf-train: the trainer, models, optimizers, step layouts, checkpoints and the `mf-train`
launcher. Start at `trainer.Trainer` (the recipe) and README.md beside this package."""
