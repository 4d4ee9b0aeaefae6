"""A study file: one experiment, declared (TOML).

    [study]     name, title, seeds (the talks it reproduces), rounds
    [matrix]    guest_fs, host_fs (lists), baseline (the host_fs every
                stack is measured against: "none", the raw baseline),
                guest_dio, host_dio, image_size
    [quick]     what --quick changes: guest_fs, host_fs, rounds, env
    [env]       variables the fio job files read (${SIZE}, ${RUNTIME})
    [[workload]]  name, job (a fio job file, its path from the study's
                directory), prepare (true: the job's files laid out
                untraced before, fio --create_only; or another job file,
                run untraced), kind (read or write: what dominates it),
                what (its words)
    [[claim]]   id, words (the seed's), query (SQL over study_cells and
                study_relative giving one number, `value`), holds (a
                comparison of it: ">= 0.8")

Every error names the file, the line and the key.
"""
from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from nestrace.capture.lab import FILESYSTEMS, HOST_FILESYSTEMS, LabError, parse_size

KEYS = {
    "study": {"name", "title", "seeds", "rounds"},
    "matrix": {"guest_fs", "host_fs", "baseline", "guest_dio", "host_dio", "image_size"},
    "quick": {"guest_fs", "host_fs", "rounds", "env"},
    "env": None,            # (any names: the job files' variables)
    "workload": {"name", "job", "prepare", "kind", "what"},
    "claim": {"id", "words", "query", "holds"},
}
HOLDS = re.compile(r"^\s*(>=|<=|>|<)\s*(-?[0-9.]+)\s*$")


class StudyError(ValueError):
    pass


@dataclass
class Workload:
    name: str
    job: Path
    prepare: Path | None        # run untraced before (the job itself: --create_only)
    kind: str
    what: str = ""


@dataclass
class Claim:
    id: str
    words: str
    query: str
    op: str
    threshold: float


@dataclass
class Study:
    path: Path
    text: str
    name: str
    title: str
    seeds: list[str]
    rounds: int
    guest_fs: list[str]
    host_fs: list[str]
    baseline: str
    guest_dio: bool
    host_dio: bool
    image_size: int
    env: dict[str, str]
    workloads: list[Workload] = field(default_factory=list)
    claims: list[Claim] = field(default_factory=list)

    def stacks(self) -> list[tuple[str, str]]:
        """(guest FS, host FS) of every stack, the baseline's included."""
        hosts = list(dict.fromkeys([*self.host_fs, self.baseline]))
        return [(g, h) for g in self.guest_fs for h in hosts]


def _line(text: str, section: str, key: str | None, index: int = 0) -> int:
    """The line of `key` in the `index`-th [section] (or [[section]]) of
    the text, else of the section's header, else 1."""
    lines = text.splitlines()
    heads = [i for i, ln in enumerate(lines)
             if re.match(rf"^\s*\[\[?\s*{re.escape(section)}\s*\]\]?\s*(#.*)?$", ln)]
    if len(heads) <= index:
        return 1
    start = heads[index]
    if key is None:
        return start + 1
    for i in range(start + 1, len(lines)):
        if re.match(r"^\s*\[", lines[i]):
            break
        if re.match(rf"^\s*{re.escape(key)}\s*=", lines[i]):
            return i + 1
    return start + 1


def load(path: str | Path, quick: bool = False) -> Study:
    """The study in `path` (with its [quick] changes when `quick`), every
    key checked; StudyError naming the file, line and key."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as e:
        raise StudyError(f"{path}: cannot read: {e.strerror}") from None
    except UnicodeDecodeError:
        raise StudyError(f"{path}: not UTF-8 text (a study is a TOML file)") from None
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:    # ("... (at line 5, column 8)")
        m = re.match(r"(.*) \(at line (\d+), column (\d+)\)$", str(e))
        raise StudyError(f"{path}: line {m[2]}: column {m[3]}: {m[1]} (not TOML)" if m
                         else f"{path}: {e} (not TOML)") from None

    def err(section: str, key: str | None, msg: str, index: int = 0):
        where = f"[{section}]" + (f" {key}" if key else "")
        raise StudyError(f"{path}: line {_line(text, section, key, index)}: {where}: {msg}")

    for section, value in doc.items():
        if section not in KEYS:
            raise StudyError(f"{path}: line {_line(text, section, None)}: unknown section "
                             f"[{section}] (known: {', '.join(KEYS)})")
        tables = value if isinstance(value, list) else [value]
        for i, t in enumerate(tables):
            if not isinstance(t, dict):
                err(section, None, "not a table")
            allowed = KEYS[section]
            for k in t:
                if allowed is not None and k not in allowed:
                    err(section, k, f"unknown key (known: {', '.join(sorted(allowed))})", i)
    for section in ("study", "matrix"):
        if section not in doc:
            raise StudyError(f"{path}: line 1: no [{section}] section")
    st, mx, env = doc["study"], doc["matrix"], dict(doc.get("env", {}))
    q = doc.get("quick", {}) if quick else {}

    def text_list(section: str, key: str, known: tuple[str, ...], value) -> list[str]:
        if not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value):
            err(section, key, "a list of names, e.g. [\"ext4\", \"xfs\"]")
        bad = [v for v in value if v not in known]
        if bad:
            err(section, key, f"{', '.join(bad)}: no such file system here (known: "
                              f"{', '.join(known)})")
        return list(dict.fromkeys(value))

    def text_of(section: str, t: dict, key: str, default=None, index: int = 0) -> str:
        v = t.get(key, default)
        if not isinstance(v, str) or not v.strip():
            err(section, key, "missing, or not a text", index)
        return v

    rounds = q.get("rounds", st.get("rounds", 1))
    if not isinstance(rounds, int) or isinstance(rounds, bool) or not 1 <= rounds <= 50:
        err("quick" if "rounds" in q else "study", "rounds", "a whole number from 1 to 50")
    guest = text_list("matrix", "guest_fs", FILESYSTEMS, mx.get("guest_fs"))
    host = text_list("matrix", "host_fs", HOST_FILESYSTEMS, mx.get("host_fs"))
    if "guest_fs" in q:
        guest = text_list("quick", "guest_fs", FILESYSTEMS, q["guest_fs"])
    if "host_fs" in q:
        host = text_list("quick", "host_fs", HOST_FILESYSTEMS, q["host_fs"])
    baseline = mx.get("baseline", "none")
    if baseline not in HOST_FILESYSTEMS:
        err("matrix", "baseline", f"{baseline!r}: none (the raw baseline) or a host file system")
    for k in ("guest_dio", "host_dio"):
        if not isinstance(mx.get(k, True), bool):
            err("matrix", k, "true or false")
    try:
        image_size = parse_size(mx.get("image_size", "512M"))
    except LabError as e:
        err("matrix", "image_size", str(e))
    for k, v in {**env, **q.get("env", {})}.items():
        if not isinstance(v, (str, int)) or not re.fullmatch(r"[A-Z_][A-Z0-9_]*", k):
            err("quick" if k in q.get("env", {}) else "env", k,
                "a variable in capitals with a text or number value")
    env = {k: str(v) for k, v in {**env, **q.get("env", {})}.items()}
    study = Study(path, text, text_of("study", st, "name"), st.get("title", ""),
                  [str(s) for s in st.get("seeds", [])], rounds, guest, host, baseline,
                  mx.get("guest_dio", True), mx.get("host_dio", True), image_size, env)
    for i, w in enumerate(doc.get("workload", [])):
        job = path.parent / text_of("workload", w, "job", index=i)
        if not job.is_file():
            err("workload", "job", f"{job}: no such fio job file", i)
        prep = w.get("prepare")
        if prep is True:        # (the job's own files laid out: fio --create_only)
            prep = job
        elif prep is False:
            prep = None
        elif prep is not None:
            prep = path.parent / text_of("workload", w, "prepare", index=i)
            if not prep.is_file():
                err("workload", "prepare", f"{prep}: no such fio job file", i)
        kind = w.get("kind", "read")
        if kind not in ("read", "write"):
            err("workload", "kind", f"{kind!r}: read or write (what dominates it)", i)
        study.workloads.append(Workload(text_of("workload", w, "name", index=i), job, prep, kind,
                                        w.get("what", "")))
    if not study.workloads:
        raise StudyError(f"{path}: line 1: no [[workload]]")
    names = [w.name for w in study.workloads]
    if len(set(names)) != len(names):
        err("workload", "name", "two workloads of one name")
    for i, c in enumerate(doc.get("claim", [])):
        m = HOLDS.match(str(c.get("holds", "")))
        if not m:
            err("claim", "holds", "a comparison of the query's value, e.g. \">= 0.8\"", i)
        study.claims.append(Claim(text_of("claim", c, "id", index=i),
                                  text_of("claim", c, "words", index=i),
                                  text_of("claim", c, "query", index=i), m[1], float(m[2])))
    return study
