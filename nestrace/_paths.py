"""Where nestrace's non-Python parts live (the SQL modules, the agent)."""
from __future__ import annotations

import os
import shutil
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SQL_DIR = ROOT / "correlate" / "sql"


class AgentNotFound(FileNotFoundError):
    pass


def agent_path() -> Path:
    """The nestrace-agent binary: $NESTRACE_AGENT, the build tree, or PATH."""
    env = os.environ.get("NESTRACE_AGENT")
    if env:
        return Path(env)
    built = ROOT / "tracers" / "build" / "nestrace-agent"
    if built.exists():
        return built
    found = shutil.which("nestrace-agent")
    if found:
        return Path(found)
    raise AgentNotFound("nestrace-agent is not built: run `make -C tracers` "
                        "(ci/demo and ci/test do it)")
