"""The one error mf-data raises for bad input: what is wrong, where, and what is allowed."""

from __future__ import annotations


class DataError(ValueError):
    """Bad data or a bad data configuration. The message names the file (or the config field)
    first, then what is wrong, then what would be accepted."""
