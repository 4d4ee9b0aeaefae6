"""A study file: one experiment, declared (TOML).

    [study]     name, title, seeds (the talks it reproduces), rounds
    [matrix]    guest_fs, host_fs (lists), baseline (the host_fs every
                stack is measured against: "none", the raw baseline),
                guest_dio, host_dio, image_size, memory (each workload
                in a memory cgroup of this size, record --memory: a file
                against memory as on a smaller machine)
    [quick]     what --quick changes: guest_fs, host_fs, rounds, env, memory
    [env]       variables the fio job files read (${SIZE}, ${RUNTIME})
    [[workload]]  name, job (a fio job file, its path from the study's
                directory), prepare (true: the job's files laid out
                untraced before, fio --create_only; or another job file,
                run untraced), kind (read or write: what dominates it),
                what (its words)
    [[claim]]   id, words (the seed's), query (SQL over study_cells,
                study_relative and study_levels giving one number,
                `value`), holds (a comparison of it: ">= 0.8")
    [[stack]]   name, guest_fs, host_fs, net (sshfs-socat, sshfs-ssh),
                gateway, net_address: named stacks instead of the guest_fs
                x host_fs product ([matrix] baseline then names one, and
                [quick] stacks lists those --quick runs)
    [[table]]   title, words, query (SQL over the same views; its rows
                printed as they come), transpose (a row per column, a
                column per row: a seed's table of stacks side by side)

Every error names the file, the line and the key.
"""
from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from nestrace.capture.lab import FILESYSTEMS, HOST_FILESYSTEMS, LabError, parse_size
from nestrace.capture.memlimit import MIN_BYTES
from nestrace.capture.netlab import NETS

KEYS = {
    "study": {"name", "title", "seeds", "rounds"},
    "matrix": {"guest_fs", "host_fs", "baseline", "guest_dio", "host_dio", "image_size",
               "memory"},
    "quick": {"guest_fs", "host_fs", "stacks", "rounds", "env", "memory"},
    "env": None,            # (any names: the job files' variables)
    "workload": {"name", "job", "prepare", "kind", "what"},
    "claim": {"id", "words", "query", "holds"},
    "stack": {"name", "guest_fs", "host_fs", "net", "gateway", "net_address"},
    "table": {"title", "words", "query", "transpose"},
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
class StackSpec:
    """One stack of a study: its name, its lab configuration's fields,
    and the name of the stack it is measured against."""
    name: str
    base: str
    guest_fs: str
    host_fs: str
    net: str = ""
    gateway: bool = False
    net_address: str = "127.0.0.1"


@dataclass
class Table:
    title: str
    words: str
    query: str
    transpose: bool = False


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
    memory: int | None = None       # each workload's memory cgroup (record --memory)
    workloads: list[Workload] = field(default_factory=list)
    claims: list[Claim] = field(default_factory=list)
    named: list[StackSpec] = field(default_factory=list)     # [[stack]], when given
    tables: list[Table] = field(default_factory=list)

    def stacks(self) -> list[StackSpec]:
        """Every stack, the baseline's included: the [[stack]]s, or each
        guest FS on each host FS (named "GUEST on HOST"), measured against
        the same guest FS on the baseline host."""
        if self.named:
            return self.named
        hosts = list(dict.fromkeys([*self.host_fs, self.baseline]))
        return [StackSpec(f"{g} on {h}", f"{g} on {self.baseline}", g, h)
                for g in self.guest_fs for h in hosts]


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
    r = _Reader(path, text, doc)
    r.check_keys()
    q = doc.get("quick", {}) if quick else {}
    study = r.head(q)
    study.workloads = r.workloads()
    study.claims = r.claims()
    if "stack" in doc:
        study.named = r.named(study.baseline, q)
    elif "stacks" in doc.get("quick", {}):
        r.err("quick", "stacks", "names [[stack]]s, and the study has none")
    study.tables = r.tables()
    return study


@dataclass
class _Reader:
    """A parsed study file's checks, each error naming the line and key."""
    path: Path
    text: str
    doc: dict

    def err(self, section: str, key: str | None, msg: str, index: int = 0):
        where = f"[{section}]" + (f" {key}" if key else "")
        raise StudyError(f"{self.path}: line {_line(self.text, section, key, index)}: "
                         f"{where}: {msg}")

    def check_keys(self) -> None:
        for section, value in self.doc.items():
            if section not in KEYS:
                raise StudyError(f"{self.path}: line {_line(self.text, section, None)}: "
                                 f"unknown section [{section}] (known: {', '.join(KEYS)})")
            tables = value if isinstance(value, list) else [value]
            for i, t in enumerate(tables):
                if not isinstance(t, dict):
                    self.err(section, None, "not a table")
                allowed = KEYS[section]
                for k in t:
                    if allowed is not None and k not in allowed:
                        self.err(section, k,
                                 f"unknown key (known: {', '.join(sorted(allowed))})", i)
        for section in ("study", "matrix"):
            if section not in self.doc:
                raise StudyError(f"{self.path}: line 1: no [{section}] section")

    def text_list(self, section: str, key: str, known: tuple[str, ...], value) -> list[str]:
        if not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value):
            self.err(section, key, "a list of names, e.g. [\"ext4\", \"xfs\"]")
        bad = [v for v in value if v not in known]
        if bad:
            self.err(section, key, f"{', '.join(bad)}: no such file system here (known: "
                                   f"{', '.join(known)})")
        return list(dict.fromkeys(value))

    def text_of(self, section: str, t: dict, key: str, default=None, index: int = 0) -> str:
        v = t.get(key, default)
        if not isinstance(v, str) or not v.strip():
            self.err(section, key, "missing, or not a text", index)
        return v

    def head(self, q: dict) -> Study:
        """[study], [matrix] and [env], with [quick]'s changes `q`."""
        st, mx = self.doc["study"], self.doc["matrix"]
        rounds = q.get("rounds", st.get("rounds", 1))
        if not isinstance(rounds, int) or isinstance(rounds, bool) or not 1 <= rounds <= 50:
            self.err("quick" if "rounds" in q else "study", "rounds",
                     "a whole number from 1 to 50")
        named = "stack" in self.doc     # (then the product's lists are not needed)
        guest = self.text_list("matrix", "guest_fs", FILESYSTEMS, mx.get("guest_fs", ["ext4"])
                               if named else mx.get("guest_fs"))
        host = self.text_list("matrix", "host_fs", HOST_FILESYSTEMS, mx.get("host_fs", ["xfs"])
                              if named else mx.get("host_fs"))
        if "guest_fs" in q:
            guest = self.text_list("quick", "guest_fs", FILESYSTEMS, q["guest_fs"])
        if "host_fs" in q:
            host = self.text_list("quick", "host_fs", HOST_FILESYSTEMS, q["host_fs"])
        baseline = mx.get("baseline", "none")
        if not named and baseline not in HOST_FILESYSTEMS:
            self.err("matrix", "baseline",
                     f"{baseline!r}: none (the raw baseline) or a host file system")
        for k in ("guest_dio", "host_dio"):
            if not isinstance(mx.get(k, True), bool):
                self.err("matrix", k, "true or false")
        try:
            image_size = parse_size(mx.get("image_size", "512M"))
        except LabError as e:
            self.err("matrix", "image_size", str(e))
        memory = None
        where, given = ("quick", q["memory"]) if "memory" in q else ("matrix", mx.get("memory"))
        if given is not None:
            try:
                memory = parse_size(given)
            except LabError as e:
                self.err(where, "memory", str(e))
            if memory < MIN_BYTES:
                self.err(where, "memory", f"{given!r}: at least {MIN_BYTES >> 20}M, which a "
                         "workload needs to start")
        return Study(self.path, self.text, self.text_of("study", st, "name"),
                     st.get("title", ""), [str(s) for s in st.get("seeds", [])], rounds,
                     guest, host, baseline, mx.get("guest_dio", True), mx.get("host_dio", True),
                     image_size, self.env(q), memory)

    def env(self, q: dict) -> dict[str, str]:
        quick_env = q.get("env", {})
        for k, v in {**self.doc.get("env", {}), **quick_env}.items():
            if not isinstance(v, (str, int)) or not re.fullmatch(r"[A-Z_][A-Z0-9_]*", k):
                self.err("quick" if k in quick_env else "env", k,
                         "a variable in capitals with a text or number value")
        return {k: str(v) for k, v in {**self.doc.get("env", {}), **quick_env}.items()}

    def workloads(self) -> list[Workload]:
        out = []
        for i, w in enumerate(self.doc.get("workload", [])):
            job = self.path.parent / self.text_of("workload", w, "job", index=i)
            if not job.is_file():
                self.err("workload", "job", f"{job}: no such fio job file", i)
            prep = w.get("prepare")
            if prep is True:        # (the job's own files laid out: fio --create_only)
                prep = job
            elif prep is False:
                prep = None
            elif prep is not None:
                prep = self.path.parent / self.text_of("workload", w, "prepare", index=i)
                if not prep.is_file():
                    self.err("workload", "prepare", f"{prep}: no such fio job file", i)
            kind = w.get("kind", "read")
            if kind not in ("read", "write"):
                self.err("workload", "kind", f"{kind!r}: read or write (what dominates it)", i)
            out.append(Workload(self.text_of("workload", w, "name", index=i), job, prep, kind,
                                w.get("what", "")))
        if not out:
            raise StudyError(f"{self.path}: line 1: no [[workload]]")
        names = [w.name for w in out]
        if len(set(names)) != len(names):
            self.err("workload", "name", "two workloads of one name")
        return out

    def named(self, baseline: str, q: dict) -> list[StackSpec]:
        """The [[stack]]s (those [quick] stacks names, with --quick), each
        measured against the one `baseline` names."""
        out = []
        for i, t in enumerate(self.doc["stack"]):
            fs = {k: t.get(k, d) for k, d in (("guest_fs", "ext4"), ("host_fs", "xfs"))}
            for k, known in (("guest_fs", FILESYSTEMS), ("host_fs", HOST_FILESYSTEMS)):
                if fs[k] not in known:
                    self.err("stack", k, f"{fs[k]!r}: no such file system here (known: "
                                         f"{', '.join(known)})", i)
            if t.get("net", "") not in ("", *NETS):
                self.err("stack", "net", f"{t['net']!r}: one of {', '.join(NETS)}", i)
            if not isinstance(t.get("gateway", False), bool):
                self.err("stack", "gateway", "true or false", i)
            if t.get("gateway") and not t.get("net"):
                self.err("stack", "gateway", "a gateway is on a network mount: give net", i)
            out.append(StackSpec(self.text_of("stack", t, "name", index=i), baseline,
                                 fs["guest_fs"], fs["host_fs"], t.get("net", ""),
                                 t.get("gateway", False),
                                 str(t.get("net_address", "127.0.0.1"))))
        names = [s.name for s in out]
        if len(set(names)) != len(names):
            self.err("stack", "name", "two stacks of one name")
        if baseline not in names:
            self.err("matrix", "baseline", f"{baseline!r}: with [[stack]]s, the name of one "
                                           f"(known: {', '.join(names)})")
        if "stacks" in q:
            pick = q["stacks"]
            if not isinstance(pick, list) or not pick or any(n not in names for n in pick):
                self.err("quick", "stacks", f"a list of [[stack]] names (known: "
                                            f"{', '.join(names)})")
            out = [s for s in out if s.name in pick or s.name == baseline]
        return out

    def tables(self) -> list[Table]:
        out = []
        for i, t in enumerate(self.doc.get("table", [])):
            if not isinstance(t.get("transpose", False), bool):
                self.err("table", "transpose", "true or false", i)
            out.append(Table(self.text_of("table", t, "title", index=i), t.get("words", ""),
                             self.text_of("table", t, "query", index=i),
                             t.get("transpose", False)))
        return out

    def claims(self) -> list[Claim]:
        out = []
        for i, c in enumerate(self.doc.get("claim", [])):
            m = HOLDS.match(str(c.get("holds", "")))
            if not m:
                self.err("claim", "holds", "a comparison of the query's value, e.g. \">= 0.8\"", i)
            out.append(Claim(self.text_of("claim", c, "id", index=i),
                             self.text_of("claim", c, "words", index=i),
                             self.text_of("claim", c, "query", index=i), m[1], float(m[2])))
        return out
