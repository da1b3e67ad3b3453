"""The keys of the `optimizer` section AdamW reads beyond the declared ones: none.

`type`, `betas`, `eps`, `weight_decay` and the weight-decay rules are the section's own fields.
MindFormers' `enable_fused_opt` / `use_fused` (an Ascend kernel) and `amsgrad` / `maximize`
(only on that kernel) are not offered.
"""

from mf_config.sections import Section, section


@section
class AdamWSettings(Section):
    """AdamW takes no keys beyond the `optimizer` section's own."""
