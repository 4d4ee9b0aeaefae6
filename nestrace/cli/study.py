"""nestrace study: run a study file's experiment into a store, and report
on it (the `study` group of nestrace.cli.main)."""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import click

from nestrace.cli.common import UserError, cli, needs_btf, needs_root, user_errors


@cli.group()
def study() -> None:
    """Run a study (a whole experiment in one file) and report on it."""


def _write(path: Path, text: str) -> None:
    """A report file, its owner's alone as the store is."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)


def _report(store: Path, as_json: bool, html_out: str | None) -> dict:
    from nestrace.study.report import build, render, to_html
    try:
        rep = build(store)
    except ValueError as e:
        raise UserError(str(e)) from None
    _write(store / "study-report.json", json.dumps(rep, indent=1, default=str) + "\n")
    page = to_html(rep)
    _write(store / "study-report.html", page)
    if html_out:
        _write(Path(html_out), page)
    if as_json:
        click.echo(json.dumps(rep, indent=1, default=str))
    else:
        render(rep)
        click.echo(f"report: {store / 'study-report.json'}, {store / 'study-report.html'}")
    return rep


@study.command("run")
@click.argument("file", type=click.Path())
@click.option("-o", "--output", "store", required=True, type=click.Path(),
              help="Store directory: a capture per stack, workload and round, and the report.")
@click.option("--quick", is_flag=True, help="The study's [quick] subset: fewer stacks, short runs.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.option("--html", "html_out", type=click.Path(), default=None,
              help="Also write the report page here (it is always in STORE/study-report.html).")
@user_errors
@needs_root
@needs_btf
def study_run(file, store, quick, as_json, html_out) -> None:
    """Run FILE's study: every round of every workload on every stack of
    its matrix (the baseline's too), each stack built, recorded into STORE
    and torn down; then report: throughput relative to the baseline, and
    each claim checked.  Exit code 1 when a stack failed or the run was
    stopped (the report covers what ran)."""
    from nestrace.study.run import run_study
    from nestrace.study.spec import StudyError, load
    try:
        spec = load(file, quick)
    except StudyError as e:
        raise UserError(str(e)) from None
    doc = run_study(spec, store, quick)
    rep = _report(Path(store), as_json, html_out)
    if rep["failed"] or doc["interrupted"]:
        sys.exit(1)


@study.command("report")
@click.argument("store", type=click.Path())
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.option("--html", "html_out", type=click.Path(), default=None,
              help="Also write the report page here.")
@user_errors
def study_report(store, as_json, html_out) -> None:
    """The report of the study run into STORE, rebuilt from the store."""
    _report(Path(store), as_json, html_out)
