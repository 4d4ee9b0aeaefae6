"""Where nestrace's non-Python parts live: the SQL modules, the agent, its
BPF objects and the record schema.

An installed wheel carries them in `nestrace/_data/` (setup.py's build
maps `correlate/sql`, `tracers/build` and `schemas/` there); a checkout
(an editable install) reads them from the repository.  Either way the
agent must be the build this package was made with: its `--version` names
a build id, a hash of the agent's sources.
"""
from __future__ import annotations

import functools
import hashlib
import os
import shutil
import subprocess
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent
DATA = PACKAGE / "_data"
INSTALLED = DATA.is_dir()
ROOT = PACKAGE.parent                 # the checkout (not used when INSTALLED)
SQL_DIR = DATA / "sql" if INSTALLED else ROOT / "correlate" / "sql"
SCHEMA_FILE = DATA / "schemas" / "records.toml" if INSTALLED else ROOT / "schemas" / "records.toml"
BPF_DIR = DATA / "bpf" if INSTALLED else ROOT / "tracers" / "build"


class AgentNotFound(FileNotFoundError):
    pass


class AgentMismatch(RuntimeError):
    """An agent of another build than this package's."""


def tracer_sources(tracers: Path) -> list[Path]:
    """The files the build id hashes, in the order tracers/Makefile cats them
    (all but readers*.c, the importers' loops: not the agent's)."""
    return sorted([*(p for p in tracers.glob("*.c") if not p.name.startswith("readers")),
                   *tracers.glob("*.h"), tracers / "Makefile"], key=lambda p: p.name.encode())


def build_id_of(tracers: Path) -> str:
    h = hashlib.sha256()
    for p in tracer_sources(tracers):
        h.update(p.read_bytes())
    return h.hexdigest()[:16]


@functools.cache
def expected_build_id() -> str:
    """The agent build this package drives."""
    if INSTALLED:
        return (DATA / "build_id").read_text().strip()
    return build_id_of(ROOT / "tracers")


def _find_agent() -> Path:
    env = os.environ.get("NESTRACE_AGENT")
    if env:
        return Path(env)
    built = DATA / "bin" / "nestrace-agent" if INSTALLED else ROOT / "tracers" / "build" / "nestrace-agent"
    if built.exists():
        return built
    found = shutil.which("nestrace-agent")
    if found:
        return Path(found)
    raise AgentNotFound("nestrace-agent is not built: run `make -C tracers` "
                        "(ci/demo and ci/test do it)")


@functools.cache
def agent_build_id(path: Path) -> str:
    """The build id an agent binary names in its --version ('' if none)."""
    try:
        out = subprocess.run([str(path), "--version"], capture_output=True, text=True,
                             timeout=10).stdout
    except (OSError, subprocess.TimeoutExpired) as e:
        raise AgentNotFound(f"{path}: cannot run the agent: {e}") from None
    words = out.split()
    return words[words.index("build") + 1] if "build" in words[:-1] else ""


def agent_path() -> Path:
    """The nestrace-agent binary ($NESTRACE_AGENT, the package's own, the
    checkout's build, or PATH), refused if it is not this package's build."""
    path = _find_agent()
    got, want = agent_build_id(path), expected_build_id()
    if got != want:
        raise AgentMismatch(
            f"{path}: agent build {got or 'unknown'}, this nestrace expects build {want} "
            + ("(reinstall nestrace, or unset NESTRACE_AGENT)" if INSTALLED
               else "(rebuild it: make -C tracers)"))
    return path


class ReadersNotFound(AgentNotFound):
    """The importers' compiled loops missing, or of another build."""


# what tracers/readers.c's nt_readers_abi() returns for this package
READERS_ABI = 3


def readers_path() -> Path:
    """libnestrace-readers.so: the importers' compiled loops (the package's
    own, or the checkout's build)."""
    built = (DATA / "lib" if INSTALLED else ROOT / "tracers" / "build") / "libnestrace-readers.so"
    if not built.exists():
        raise ReadersNotFound(f"{built}: not built: run `make -C tracers` "
                              "(ci/demo and ci/test do it)")
    return built
