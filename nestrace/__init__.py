"""nestrace: multi-level I/O tracing and correlation for nested storage stacks.

    import nestrace
    s = nestrace.open("demo.store")
    s.query("SELECT * FROM disk_io LIMIT 10")      # -> pyarrow.Table
"""
from nestrace._version import __version__

__all__ = ["Session", "open", "stores_from_env", "__version__"]


def __getattr__(name: str):
    # (imported when first used: DuckDB and pyarrow take ~0.4 s to import,
    # which `nestrace lab up` and the CLI's other commands that need
    # neither would pay on every run)
    if name in ("Session", "open", "stores_from_env"):
        from nestrace.query import session
        return getattr(session, name)
    raise AttributeError(f"module 'nestrace' has no attribute {name!r}")
