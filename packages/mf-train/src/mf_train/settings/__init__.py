"""The typed settings of mf-train's components: the keys each model, optimizer and
learning-rate schedule reads from its open section.

These modules import neither MindSpore nor numpy: mf-config finds them through the entry
points this package declares (`mf_config.models`, `mf_config.optimizers`,
`mf_config.lr_schedulers` in pyproject.toml) and checks a configuration file against them in
`mf-config validate`, in milliseconds; the components build from the same classes.
"""
