"""The one exception type of checkpoint reading and writing."""


class CheckpointError(ValueError):
    """A checkpoint that cannot be written, found or loaded; the message names the path and
    every problem found."""
