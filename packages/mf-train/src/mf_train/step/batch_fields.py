"""Which sample fields beyond tokens, labels and loss mask reach the model, from the data
settings (`micro_batches` reads them so; the pre-launch rules of `support` compare
`column_names` with them). No MindSpore or numpy here: `mf-config validate` runs those rules.
"""

from __future__ import annotations


def attention_fields(reset_position_ids: bool, reset_attention_mask: bool,
                     create_attention_mask: bool, create_compressed_eod_mask: bool,
                     ) -> tuple[str, ...]:
    """The sample fields beyond tokens, labels and loss mask that change what the model
    computes, from the data settings of the same names (see `micro_batches`' module docstring)."""
    fields: tuple[str, ...] = ("position_ids",) if reset_position_ids else ()
    if create_compressed_eod_mask:
        return (*fields, "actual_seq_len")
    if reset_attention_mask and create_attention_mask:
        return (*fields, "attention_mask")
    return fields
