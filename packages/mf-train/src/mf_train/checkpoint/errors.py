"""The exception types of checkpoint reading and writing."""


class CheckpointError(ValueError):
    """A checkpoint that cannot be written, found or loaded; the message names the path and
    every problem found."""


class CorruptCheckpointError(CheckpointError):
    """A complete checkpoint whose file bytes do not match the checksum `common.json` records
    (damaged after it was written); a resume falls back to an older checkpoint."""
