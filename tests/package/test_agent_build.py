"""An agent is driven only by the package it was built with: its --version
names a build id (a hash of the agent's sources), and anything else is
refused by its path."""
from __future__ import annotations

import os
import stat

import pytest
from conftest import ROOT, run_cli

from nestrace import _paths


def fake_agent(path, build: str):
    path.write_text(f"#!/bin/sh\necho 'nestrace-agent 0.1.0 build {build}'\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def test_checkout_expects_the_build_id_the_makefile_gives():
    built = ROOT / "tracers" / "build" / "build-id"
    if built.exists():
        assert built.read_text().strip() == _paths.expected_build_id()
    # any change to a source of the agent is another build
    assert _paths.build_id_of(ROOT / "tracers") == _paths.expected_build_id()


def test_an_agent_of_another_build_is_refused_by_name(tmp_path, monkeypatch):
    agent = fake_agent(tmp_path / "nestrace-agent", "0123456789abcdef")
    r = run_cli("--version", env=dict(os.environ, NESTRACE_AGENT=str(agent)))
    assert r.stdout.splitlines()[0].startswith("nestrace 0.")
    assert f"{agent}: agent build 0123456789abcdef, this nestrace expects build " \
        f"{_paths.expected_build_id()}" in r.stdout
    monkeypatch.setenv("NESTRACE_AGENT", str(agent))
    with pytest.raises(_paths.AgentMismatch, match=f"^{agent}: agent build 0123456789abcdef"):
        _paths.agent_path()      # (what record and lab run start the agent through)


def test_the_matching_agent_is_accepted(tmp_path):
    agent = fake_agent(tmp_path / "nestrace-agent", _paths.expected_build_id())
    r = run_cli("--version", env=dict(os.environ, NESTRACE_AGENT=str(agent)))
    assert r.stdout.splitlines()[1] == f"agent build {_paths.expected_build_id()} ({agent})"
