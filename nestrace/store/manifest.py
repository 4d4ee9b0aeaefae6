"""A capture's manifest: the one step that publishes it, and the sums its
readers check.

A writer (seal, import, merge) writes a capture's tables where no reader
looks for them, then its manifest, `STORE/_manifests/<id>.json`, last, by
a rename: each file of the capture (`<table>/capture=<id>/data.parquet`)
with its size and SHA-256.  Readers count a capture only by its manifest;
files of a capture without one are the leftovers of a write that did not
finish, which the next writer of that capture removes (and says so).

Opening a store checks every file's size against its manifest, and that
every file the manifest names is there; the first read of a capture after
it was written or changed (its files' size and mtime not those last
verified) reads each file whole and checks its SHA-256.  What was verified
is remembered in `<id>.verified.json` beside the manifest (in memory only
when the store is not writable).  A mismatch is a StoreError naming the
file, unless the reader asks to read anyway (`nestrace --read-anyway`,
NESTRACE_READ_ANYWAY=1): then it is a warning.

A store written before manifests (no `_manifests/`) is read as it was:
its captures by their capture_meta, no sums; the first capture published
into it gives the others manifests of what they hold."""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import stat
import sys
from pathlib import Path

from nestrace.errors import StoreError

MANIFESTS = "_manifests"
FORMAT = {"format": "nestrace-manifest", "version": 1}
READ_ANYWAY_ENV = "NESTRACE_READ_ANYWAY"
_CHUNK = 1 << 20


def _say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def has_manifests(store: Path) -> bool:
    return (store / MANIFESTS).is_dir()


def manifest_path(store: Path, capture_id: str) -> Path:
    return store / MANIFESTS / f"{capture_id}.json"


def partition_files(store: Path, capture_id: str) -> list[Path]:
    """The capture's table files as they are on disk (published or not)."""
    return sorted(p for p in store.glob(f"*/capture={capture_id}/data.parquet")
                  if not p.parts[-3].startswith("_"))


def published(store: Path) -> list[str]:
    d = store / MANIFESTS
    return sorted(p.name[:-5] for p in d.glob("*.json")
                  if not p.name.endswith(".verified.json")) if d.is_dir() else []


def _legacy(store: Path) -> list[str]:
    d = store / "capture_meta"
    return sorted(x.name.split("=", 1)[1] for x in d.iterdir()
                  if x.name.startswith("capture=")) if d.is_dir() else []


def _write_json(path: Path, obj) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        with open(tmp, "w") as f:
            json.dump(obj, f, indent=1, sort_keys=True)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise StoreError(f"{path}: cannot write: {e.strerror}") from None


def publish(store: Path, capture_id: str, files: list[Path] | None = None) -> Path:
    """Publish a capture whose files are written: its manifest, last.  The
    first into a store of older captures gives those manifests too."""
    if not has_manifests(store):
        (store / MANIFESTS).mkdir(exist_ok=True)
        for cid in _legacy(store):
            if cid != capture_id:
                publish(store, cid)
    files = partition_files(store, capture_id) if files is None else files
    entry = {str(f.relative_to(store)): {"size": f.stat().st_size, "sha256": sha256_of(f)}
             for f in files}
    path = manifest_path(store, capture_id)
    _write_json(path, FORMAT | {"capture_id": capture_id, "files": entry})
    return path


@contextlib.contextmanager
def publishing(store: Path, capture_id: str, say=_say):
    """Write a capture inside: the leftovers of an earlier write of it
    removed first (and said), the capture published at the end; a write
    that fails leaves nothing behind."""
    clean_unpublished(store, capture_id, say)
    try:
        yield
        publish(store, capture_id)
    except BaseException:
        clean_unpublished(store, capture_id, say=lambda _: None)
        raise


def read_manifest(store: Path, capture_id: str) -> dict:
    path = manifest_path(store, capture_id)
    try:
        m = json.loads(path.read_text())
    except OSError as e:
        raise StoreError(f"{path}: cannot read: {e.strerror}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise StoreError(f"{path}: offset {getattr(e, 'pos', 0)}: not a manifest: "
                         f"{getattr(e, 'msg', e)}") from None
    if not (isinstance(m, dict) and m.get("format") == FORMAT["format"]
            and isinstance(m.get("files"), dict)
            and all(isinstance(v, dict) and isinstance(v.get("size"), int)
                    and isinstance(v.get("sha256"), str) for v in m["files"].values())):
        raise StoreError(f"{path}: offset 0: not a nestrace manifest")
    return m


def update(store: Path, capture_id: str, add: list[Path] = (), drop: list[Path] = ()) -> None:
    """Add or take files out of a published capture's manifest (what
    `correlate` stores for it)."""
    if not has_manifests(store):
        return
    m = read_manifest(store, capture_id)
    for f in drop:
        m["files"].pop(str(f.relative_to(store)), None)
    for f in add:
        m["files"][str(f.relative_to(store))] = {"size": f.stat().st_size,
                                                 "sha256": sha256_of(f)}
    _write_json(manifest_path(store, capture_id), m)


def clean_unpublished(store: Path, capture_id: str, say=_say) -> int:
    """Before a capture is written: the files of an earlier write of it
    that did not finish (no manifest) are removed, and said."""
    if has_manifests(store) and manifest_path(store, capture_id).exists():
        return 0
    if not has_manifests(store) and capture_id in _legacy(store):
        return 0
    dirs = sorted({f.parent for f in partition_files(store, capture_id)} |
                  {d for d in store.glob(f"*/capture={capture_id}") if d.is_dir()
                   and not d.parts[-2].startswith("_")})
    for d in dirs:
        shutil.rmtree(d, ignore_errors=True)
    if dirs:
        say(f"nestrace: {store}: removed {len(dirs)} table(s) of capture {capture_id} left by "
            "a write that did not finish")
    return len(dirs)


def read_anyway() -> bool:
    return os.environ.get(READ_ANYWAY_ENV, "") not in ("", "0")


def _verified_path(store: Path, capture_id: str) -> Path:
    return store / MANIFESTS / f"{capture_id}.verified.json"


def _verified(store: Path, capture_id: str) -> dict:
    try:
        v = json.loads(_verified_path(store, capture_id).read_text())
        return v if isinstance(v, dict) else {}
    except (OSError, ValueError):
        return {}


def check_capture(store: Path, capture_id: str, anyway: bool, say=_say,
                  recomputable: frozenset[str] = frozenset()) -> list[Path]:
    """A published capture's files, checked: each there, of its size, and
    (the first time since written or changed) of its SHA-256.  A problem
    is a StoreError, or with `anyway` a warning (the file is still read,
    a missing one left out); in a table the reader computes again
    (`recomputable`: what `correlate` stores) a warning, the file left
    out."""
    m = read_manifest(store, capture_id)
    seen = _verified(store, capture_id)
    now, out, changed = {}, [], False
    for rel, want in sorted(m["files"].items()):
        f = store / rel
        try:
            st = f.stat()
            problem = None if st.st_size == want["size"] else (
                f"{st.st_size} bytes, its manifest says {want['size']}")
        except OSError as e:
            st, problem = None, f"missing ({e.strerror}): capture {capture_id} has it"
        if problem is None:
            key = [st.st_size, st.st_mtime_ns]
            if seen.get(rel) != key:
                changed = True
                try:
                    same = stat.S_ISREG(st.st_mode) and sha256_of(f) == want["sha256"]
                except OSError as e:
                    same, problem = False, f"cannot read: {e.strerror}"
                if problem is None and not same:
                    problem = ("its SHA-256 is not the one written: changed or damaged since "
                               f"capture {capture_id} was written (`nestrace verify` says where)")
            if problem is None:
                now[rel] = key
        if problem is not None and Path(rel).parts[0] in recomputable:
            say(f"nestrace: warning: {f}: {problem}: left out, its rows computed again; "
                "`nestrace correlate` stores them anew")
            continue
        if problem is not None:
            problem += f" (by {manifest_path(store, capture_id)})"
            if not anyway:
                raise StoreError(f"{f}: {problem}; `nestrace --read-anyway` reads it as it is")
            say(f"nestrace: warning: {f}: {problem}; read anyway")
        # (read anyway: not what is no regular file, a FIFO that would block)
        if st is not None and stat.S_ISREG(st.st_mode):
            out.append(f)
    if changed and now:
        try:
            _write_json(_verified_path(store, capture_id), now)
        except StoreError:
            pass                # (a store this user may read, not write)
    return out


def store_files(store: Path, anyway: bool | None = None,
                recomputable: frozenset[str] = frozenset()) -> dict[str, list[Path]] | None:
    """The published captures' files by table, checked (check_capture); None
    for a store written before manifests (read by its files as they are)."""
    if not has_manifests(store):
        return None
    anyway = read_anyway() if anyway is None else anyway
    out: dict[str, list[Path]] = {}
    for cid in published(store):
        for f in check_capture(store, cid, anyway, recomputable=recomputable):
            out.setdefault(f.parts[-3], []).append(f)
    return out


def audit(store: Path) -> list[tuple[Path, str]]:
    """`nestrace verify`: each published capture's files read whole and
    checked against its manifest, and the files of captures no manifest
    publishes (a write that did not finish): (file, a line saying what)."""
    if not has_manifests(store):
        return []
    out = []
    caps = set(published(store))
    for cid in sorted(caps):
        try:
            m = read_manifest(store, cid)
        except StoreError as e:
            out.append((manifest_path(store, cid), str(e)))
            continue
        for rel, want in sorted(m["files"].items()):
            f = store / rel
            if not f.is_file():
                if not (f.exists() or f.is_symlink()):
                    out.append((f, f"{f}: missing: capture {cid} has it"))
                continue        # (not a regular file: check_file names it)
            elif f.stat().st_size != want["size"]:
                out.append((f, f"{f}: {f.stat().st_size} bytes, its manifest says {want['size']}"))
            elif sha256_of(f) != want["sha256"]:
                out.append((f, f"{f}: its SHA-256 is not the one written (changed or "
                               f"damaged since capture {cid} was written)"))
    for f in sorted(store.glob("*/capture=*/data.parquet")):
        cid = f.parent.name.split("=", 1)[1]
        if cid not in caps and not f.parts[-3].startswith("_"):
            out.append((f, f"{f}: of capture {cid}, which no manifest publishes (a write "
                           "that did not finish): not read; writing the capture again removes it"))
    return out
