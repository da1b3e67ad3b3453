"""The exception of a checkpoint the export (or generation) cannot read, with the reason."""


class ExportError(ValueError):
    """A checkpoint or configuration that cannot be exported, with the reason."""
