"""The `nestrace` command: a thin layer over the library (common: the group
and shared options; record; main: the other commands; lab, study: their groups)."""
from nestrace.cli import lab as _lab  # noqa: F401  (registers the lab group)
from nestrace.cli import record as _record  # noqa: F401  (registers record)
from nestrace.cli import study as _study  # noqa: F401  (registers the study group)
from nestrace.cli.main import main

__all__ = ["main"]
