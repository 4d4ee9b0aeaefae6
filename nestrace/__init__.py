"""nestrace: multi-level I/O tracing and correlation for nested storage stacks.

    import nestrace
    s = nestrace.open("demo.store")
    s.query("SELECT * FROM disk_io LIMIT 10")      # -> pyarrow.Table
"""
__version__ = "0.1.0"

from .session import Session, open  # noqa: E402,A004

__all__ = ["Session", "open", "__version__"]
