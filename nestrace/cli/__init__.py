"""The `nestrace` command: a thin layer over the library (common: the group
and shared options; record; main: the other commands; lab, study: their groups)."""
from nestrace.cli.main import main  # (lab, record and study: common.ELSEWHERE)

__all__ = ["main"]
