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


class StoreError(ValueError):
    """A store that cannot be read or written as asked."""


def json_object(data: bytes) -> tuple[dict | None, str]:
    """A JSON object from a file's bytes, or None and where and why it is
    not one ("offset N: not JSON: ...", N a byte offset)."""
    import json
    try:
        text = data.decode()
        obj = json.loads(text)
        if isinstance(obj, dict):
            return obj, ""
        return None, "offset 0: not a JSON object"
    except UnicodeDecodeError as e:
        return None, f"offset {e.start}: not UTF-8"
    except json.JSONDecodeError as e:
        return None, f"offset {len(text[:e.pos].encode())}: not JSON: {e.msg}"


class StackError(ValueError):
    """A stack nestrace cannot trace or map, named by its mount, device or
    file."""
