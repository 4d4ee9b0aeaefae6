"""Errors the CLI turns into one line and exit 2, importable without the
modules that raise them (those import pyarrow.compute, ~25 ms of every
command)."""
from __future__ import annotations


class StreamError(ValueError):
    """A problem in a record stream, with the file and byte offset."""

    def __init__(self, source: str, offset: int, reason: str):
        super().__init__(f"{source}: offset {offset}: {reason}")
        self.source, self.offset, self.reason = source, offset, reason


class RecordError(RuntimeError):
    """A capture that cannot be made (or finished) as asked."""
