"""`nestrace study run`: a study's matrix, round after round, workload
after workload, each stack built, recorded and torn down (lab run's
cells), into one store; what ran is kept in the store beside the
captures (`_study.json`), written after every workload, so that a study
stopped half way (Ctrl-C, a failing stack) is reported on what it did."""
from __future__ import annotations

import json
import os
import shlex
import sys
from pathlib import Path

from nestrace.capture.lab import LabConfig
from nestrace.capture.matrix import Cell, run_matrix
from nestrace.study.spec import Study

RUN_FILE = "_study.json"


def run_file(store: str | Path) -> Path:
    return Path(store) / RUN_FILE


def _save(store: Path, doc: dict) -> None:
    p = run_file(store)
    tmp = p.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(doc, f, indent=1)
    os.replace(tmp, p)


def describe(study: Study, quick: bool) -> dict:
    """What a report needs of the study, kept with the run (the report
    is rebuilt from the store alone)."""
    return {"name": study.name, "title": study.title, "seeds": study.seeds, "quick": quick,
            "file": str(study.path), "text": study.text, "rounds": study.rounds,
            "baseline": study.baseline, "guest_fs": study.guest_fs, "host_fs": study.host_fs,
            "env": study.env, "memory": study.memory, "named": bool(study.named),
            "stacks": [{"name": x.name, "base": x.base, "guest_fs": x.guest_fs,
                        "host_fs": x.host_fs, "net": x.net, "gateway": x.gateway}
                       for x in study.stacks()],
            "tables": [{"title": t.title, "words": t.words, "query": t.query,
                        "transpose": t.transpose} for t in study.tables],
            "workloads": [{"name": w.name, "kind": w.kind, "what": w.what, "job": w.job.name}
                          for w in study.workloads],
            "claims": [{"id": c.id, "words": c.words, "query": c.query, "op": c.op,
                        "threshold": c.threshold} for c in study.claims],
            "cells": [], "interrupted": False}


def run_study(study: Study, store: str | Path, quick: bool = False,
              log=lambda msg: print(msg, file=sys.stderr), **record_opts) -> dict:
    """Run every round of every workload on every stack; returns the run's
    document (as kept in the store)."""
    store = Path(store)
    from nestrace.store.files import init_store
    init_store(store)
    doc = describe(study, quick)
    _save(store, doc)
    stacks = study.stacks()
    for rnd in range(1, study.rounds + 1):
        for w in study.workloads:
            todo = [Cell(LabConfig(guest_fs=x.guest_fs, host_fs=x.host_fs,
                                   guest_dio=study.guest_dio, host_dio=study.host_dio,
                                   image_size=study.image_size, net=x.net, gateway=x.gateway,
                                   net_address=x.net_address))
                    for x in stacks]
            log(f"nestrace: study {study.name}: round {rnd}/{study.rounds}, workload {w.name}")
            prepare = None if w.prepare is None else (
                "fio --output=/dev/null " + ("--create_only=1 " if w.prepare == w.job else "")
                + shlex.quote(str(w.prepare.resolve())))
            done = run_matrix(store, todo, ["fio", "--output=/dev/null", str(w.job.resolve())],
                              prepare=prepare, log=log, env=study.env, memory=study.memory,
                              **record_opts)
            doc["cells"] += [{"round": rnd, "workload": w.name, "stack": x.name, "base": x.base,
                              "guest_fs": c.config.guest_fs, "host_fs": c.config.host_fs,
                              "capture_id": c.capture_id, "error": c.error,
                              "command_exit": c.command_rc, "lost": c.lost}
                             for x, c in zip(stacks, done)]
            stopped = len(done) < len(todo) or any(c.error == "interrupted" for c in done)
            doc["interrupted"] = stopped
            _save(store, doc)
            if stopped:
                return doc
    return doc


def load_run(store: str | Path) -> dict:
    """The study run kept in `store`; ValueError naming the file."""
    p = run_file(store)
    try:
        doc = json.loads(p.read_text())
    except FileNotFoundError:
        raise ValueError(f"{store}: no study was run into this store (no {RUN_FILE})") from None
    except OSError as e:
        raise ValueError(f"{p}: cannot read: {e.strerror}") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"{p}: offset {e.pos}: not JSON: {e.msg}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("cells"), list):
        raise ValueError(f"{p}: offset 0: not a study run")
    return doc
