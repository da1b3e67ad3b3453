"""mf-memory: recompute, communication recompute, swap and memory estimates.

Modules: `layers` (the layer contract), `recompute` (recompute and communication recompute),
`swap` (activation offload); MindSpore is imported by `recompute` and `swap` only. See README.md.
"""
