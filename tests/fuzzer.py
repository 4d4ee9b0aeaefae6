"""Mutation fuzzing of nestrace's readers of files it did not write whole:
a reader must read a damaged file, or refuse it with its own error naming
the file and an offset; any other exception, a hang or a crash of the
process is a finding.  Run as a child process (`python tests/fuzzer.py
KIND BASE N SEED`), so that a crash (pyarrow's SIGSEGV on an unverified
message) fails the test that runs it instead of killing pytest.  Prints
one line per finding, the last mutant kept at BASE + ".mutant"; exit 1
when there is any.

KIND: ipc (a live capture's Arrow IPC stream: nestrace.store.files.read_ipc_tolerant,
which must read every batch the mutation left intact),
frames (the agent's frame stream: nestrace.store.stream.iter_frames),
image:FMT (an image's map: nestrace.images.chain.cluster_map), dat (a
trace-cmd trace.dat: nestrace.importers.tracecmd.read; where only CPU data
was touched, each intact page's events must be read), blktrace (a
blktrace file: nestrace.importers.blktrace.read_damaged, which must also
keep every record the mutation left intact; every 10th mutant imported
into a store too), guest:FILE (a guest capture directory of the agent with
FILE damaged: nestrace import; with block_events.arrows damaged, the
block events of each batch left intact must be in the store), store:TABLE (a store with TABLE's file
damaged, or its capture's manifest (TABLE manifest): its capture checked
against its manifest, the file verified)."""
from __future__ import annotations

import os
import random
import resource
import shutil
import signal
import sys
import traceback
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

# values a damaged length, offset or count field takes
EDGES = (0, 1, 2**31 - 1, 2**31, 2**32 - 1, 2**63 - 1, 2**64 - 1)


def mutate(rng: random.Random, data: bytes, hot: int,
           records: list[tuple[int, int]] = ()) -> bytes:
    """Bytes flipped, set to edge values, or whole 4- and 8-byte fields set
    to edge values, mostly within the first `hot` bytes (headers and
    tables), or, in every other mutant, in `records` ((offset, size): where
    a file keeps its records, when that is not its start); now and then the
    file cut short."""
    d = bytearray(data)
    inside = records and rng.random() < 0.5
    for _ in range(rng.choice((1, 1, 2, 4, 16))):
        if inside:
            o, n = rng.choice(records)
            pos = o + rng.randrange(n)
        else:
            pos = rng.randrange(min(len(d), hot) if rng.random() < 0.7 else len(d))
        r = rng.random()
        if r < 0.4:
            d[pos] ^= 1 << rng.randrange(8)
        elif r < 0.7:
            d[pos] = rng.choice((0, 0xFF, 0x7F, 0x80, 1))
        else:
            w = rng.choice((4, 8))
            pos -= pos % w
            v = rng.choice(EDGES + (len(d), rng.randrange(2**32)))
            d[pos:pos + w] = (v % (1 << (8 * w))).to_bytes(w, rng.choice(("little", "big")))
    if rng.random() < 0.05:
        del d[rng.randrange(len(d)):]
    return bytes(d)


def reader(kind: str):
    """(read(path) -> list of problem strings, the reader's own error type)"""
    if kind == "ipc":
        from nestrace.schema import record_schema
        from nestrace.store.files import read_ipc_tolerant
        schema = record_schema("block_event")

        def read(p):
            batches, problem = read_ipc_tolerant(Path(p), schema)
            _intact_batches_read(Path(p).read_bytes(), batches)
            return [problem] if problem else []
        return read, ()
    if kind.startswith("image:"):
        from nestrace.images.base import ImageMapError
        from nestrace.images.chain import cluster_map
        fmt = kind.split(":", 1)[1]
        return (lambda p: cluster_map(p, fmt) and []), (ImageMapError,)
    if kind == "dat":
        from nestrace.importers import datfile
        return _dat_reader(), (datfile.TraceCmdError,)
    if kind == "frames":
        from nestrace.store.stream import DecodeState, iter_frames

        def frames(p):
            state = DecodeState(str(p))
            with open(p, "rb") as f:
                for _ in iter_frames(f, str(p), state):
                    pass
            return [str(x) for x in state.problems]
        return frames, ()
    if kind == "blktrace":
        return _blktrace_reader(), ()
    if kind.startswith("guest:"):
        return _guest_reader(kind.split(":", 1)[1])
    if kind.startswith("store:"):
        return _store_reader(kind.split(":", 1)[1])
    raise SystemExit(f"fuzzer: unknown kind {kind}")


class Lost(Exception):
    """A record the mutation left intact is not in what was read."""


_base_records: dict[int, int] = {}      # blktrace base: record offset -> its length
_base_bytes = b""


def _blktrace_reader():
    """read_damaged of the mutant; every record of the base whose bytes the
    mutant still has at the same place must be among those read."""
    import tempfile

    from nestrace.importers import blkimport, blktrace
    from nestrace.store.files import StoreError
    count = [0]

    def read(p):
        data = Path(p).read_bytes()
        t, problems, _ = blktrace.read_damaged(p)
        got = set(t.column("file_offset").to_pylist())
        for off, n in _base_records.items():
            if off + n <= len(data) and data[off:off + n] == _base_bytes[off:off + n] \
                    and off not in got:
                raise Lost(f"the intact record at byte {off} was not read")
        count[0] += 1
        if count[0] % 10 == 0:          # (and a store of it: no traceback, a manifest)
            with tempfile.TemporaryDirectory() as d:
                try:
                    blkimport.import_files([p], Path(d) / "s", {}, "f")
                except StoreError as e:
                    problems.append(str(e))
                else:
                    from nestrace.store.manifest import store_files
                    store_files(Path(d) / "s")
        return problems
    return read


_ipc_base: list[tuple[int, int, object]] = []   # IPC stream base: (offset, end, batch)


def _ipc_batches(data: bytes) -> list[tuple[int, int, object]]:
    """(offset, end, batch) of each record batch of an IPC stream."""
    import pyarrow as pa
    src = pa.BufferReader(pa.py_buffer(data))
    schema = pa.ipc.read_schema(pa.ipc.read_message(src))
    out = []
    while True:
        off = src.tell()
        try:
            m = pa.ipc.read_message(src)
        except EOFError:
            return out
        out.append((off, src.tell(), pa.ipc.read_record_batch(m, schema)))


def _intact_batches(data: bytes) -> list:
    """The base's batches whose bytes the mutant still has in place."""
    out = [b for off, end, b in _ipc_base
           if end <= len(data) and data[off:end] == _base_bytes[off:end]]
    _oracle[0] += bool(out)
    return out


def _intact_batches_read(data: bytes, batches: list) -> None:
    for b in _intact_batches(data):
        if not any(b.equals(x) for x in batches):
            raise Lost(f"an intact batch of {b.num_rows} records was not read")


_dat_pages: dict[int, int] = {}         # trace.dat base: page's file offset -> its block events
_dat_data: list[tuple[int, int]] = []   # (offset, size) of each CPU's data
_dat_page_size = 0
_oracle = [0]                           # mutants checked record by record


def _dat_reader():
    """tracecmd.read of the mutant; where the mutation touched only CPU
    data of pages stored as such (v6, uncompressed v7), every page the
    mutant still has whole must give all the block events it gave."""
    import numpy as np

    from nestrace.importers import tracecmd

    def read(p):
        r = tracecmd.read(p)
        data = Path(p).read_bytes()
        if not _dat_pages or len(data) != len(_base_bytes):
            return r.problems
        diff = np.nonzero(np.frombuffer(data, np.uint8) != np.frombuffer(_base_bytes, np.uint8))[0]
        if not all(any(o <= d < o + n for o, n in _dat_data) for d in diff.tolist()):
            return r.problems       # (headers or formats touched: no page-wise oracle)
        _oracle[0] += 1
        got = Counter(r.table.column("file_offset").to_pylist())
        for page, n in _dat_pages.items():
            whole = data[page:page + _dat_page_size] == _base_bytes[page:page + _dat_page_size]
            if whole and got[page] != n:
                raise Lost(f"the intact page at byte {page} gave {got[page]} of its {n} events")
        return r.problems
    return read


def _guest_reader(name: str):
    """nestrace import of a copy of the guest capture directory beside
    BASE (BASE is its file `name`), with that file damaged; each mutant
    into a store of its own."""
    import tempfile

    from nestrace.importers.guestdir import GuestDirError, import_guest_dir
    from nestrace.store.files import StoreError

    def read(p):
        src = Path(p).parent
        with tempfile.TemporaryDirectory() as d:
            g = Path(d) / "g"
            shutil.copytree(src, g, ignore=shutil.ignore_patterns("*.mutant*", "*.base"))
            shutil.copy(p, g / name)
            try:
                r = import_guest_dir(g, Path(d) / "s")
                msgs = r.problems + r.seal.problems
            except (GuestDirError, StoreError) as e:
                msgs = [str(e)]
            else:
                if name == "block_events.arrows":   # (each intact batch's records stored)
                    _intact_records_stored(Path(p).read_bytes(), Path(d) / "s")
            # (what names the damaged file must name it with an offset;
            # the others are of the intact files)
            return [m.replace(str(g / name), str(p)) for m in msgs if str(g / name) in m]
    return read, ()


def _intact_records_stored(data: bytes, store: Path) -> None:
    import pyarrow.parquet as pq
    t = pq.read_table(next(store.glob("block_events/capture=*/data.parquet")),
                      columns=["cpu", "seq"])
    stored = set(zip(t.column("cpu").to_pylist(), t.column("seq").to_pylist()))
    for b in _intact_batches(data):
        cs = zip(b.column("cpu").to_pylist(), b.column("seq").to_pylist())
        if not stored.issuperset(cs):
            raise Lost(f"an intact batch of {b.num_rows} block events is not all in the store")


def _store_reader(table: str):
    """A copy of the store beside BASE (BASE is its TABLE file) with that
    file damaged: its manifest check (store_files: sizes, SHA-256) and
    verify's read-back; a mutant the manifest passes must read whole."""
    import tempfile

    from nestrace.store.files import StoreError
    from nestrace.store.manifest import store_files
    from nestrace.store.seal import check_file

    def read(p):
        store = Path(p).parents[1 if table == "manifest" else 2]
        with tempfile.TemporaryDirectory() as d:
            s = Path(d) / "s"
            shutil.copytree(store, s, ignore=shutil.ignore_patterns("*.mutant*", "*.base"))
            f = next(s.glob("_manifests/*[!d].json" if table == "manifest"
                            else f"{table}/capture=*/data.parquet"))
            shutil.copy(p, f)
            for v in (s / "_manifests").glob("*.verified.json"):
                v.unlink()      # (read as written since: its sums checked)
            try:
                store_files(s)
            except StoreError as e:
                return [str(e).replace(str(f), str(p))]    # (the table file, or the manifest)
            # (the manifest passed: a table file's bytes are those written)
            problem = None if table == "manifest" else check_file(f).problem
            if problem:
                raise Lost(f"the manifest passed a file that does not read: {problem}")
        return []
    return read, ()


class Timeout(Exception):
    pass


def _alarm(*_):
    raise Timeout()


def main(kind: str, base: str, n: int, seed: int, hot: int = 1 << 16) -> int:
    global _base_bytes, _dat_page_size
    signal.signal(signal.SIGALRM, _alarm)
    resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))   # a huge allocation is a finding
    read, own = reader(kind)
    needs_offset = not kind.startswith("store:")
    data = Path(base).read_bytes()
    if kind == "dat":
        from nestrace.importers import tracecmd
        r = tracecmd.read(base)
        _base_bytes = data
        if r.dat.version == 6 or r.dat.compression == "none":
            _dat_page_size = r.dat.page_size
            _dat_data.extend((o, n) for _, o, n in r.dat.cpus if n)   # (a CPU with none: 0)
            _dat_pages.update(Counter(r.table.column("file_offset").to_pylist()))
    if kind == "ipc" or kind == "guest:block_events.arrows":
        _base_bytes = data
        _ipc_base.extend(_ipc_batches(data))
    if kind == "blktrace":
        from nestrace.importers import blktrace
        t = blktrace.read(base)
        _base_bytes = data
        _base_records.update((o, blktrace.HEADER.size + blktrace._MAGIC_PDU.unpack_from(data, o)[1])
                             for o in t.column("file_offset").to_pylist())
    read(base)                              # the base itself reads
    rng = random.Random(seed)
    mut = base + ".mutant"
    findings: dict[tuple, str] = {}
    # each mutant's outcome: read whole, read with its damage named,
    # refused (the reader's own error), or a finding
    classes = dict.fromkeys(("whole", "damage named", "refused", "finding"), 0)
    for i in range(n):
        Path(mut).write_bytes(mutate(rng, data, hot, _dat_data))
        before = len(findings)
        outcome = "whole"
        signal.alarm(30)
        try:
            msgs = read(mut)
            outcome = "damage named" if msgs else "whole"
        except Lost as e:
            findings.setdefault(("lost",), f"mutant {i}: {e}")
            shutil.copy(mut, f"{mut}.{i}")
            msgs, outcome = [], "finding"
        except own as e:
            msgs, outcome = [str(e)], "refused"
        except Timeout:
            msgs, findings[("timeout",)], outcome = [], f"mutant {i}: no answer in 30 s", "finding"
        except BaseException as e:          # (MemoryError too)
            tb = traceback.extract_tb(e.__traceback__)[-1]
            key = (type(e).__name__, os.path.basename(tb.filename), tb.lineno)
            findings.setdefault(key, f"mutant {i}: {type(e).__name__}: {str(e)[:200]} "
                                     f"at {os.path.basename(tb.filename)}:{tb.lineno}")
            shutil.copy(mut, f"{mut}.{i}")
            msgs, outcome = [], "finding"
        finally:
            signal.alarm(0)
        for m in msgs:
            # (a store file that is not the one written is named; where it
            # differs `nestrace verify` says, which the manifest cannot)
            if not (m.startswith(mut) or not needs_offset and mut in m) or \
                    needs_offset and "offset" not in m and "byte" not in m:
                findings.setdefault(("message", m[:40]), f"mutant {i}: names no file and offset: {m[:200]}")
        classes["finding" if len(findings) > before else outcome] += 1
    for f in findings.values():
        print(f"{kind} seed {seed}: {f}")
    print(f"{kind} seed {seed}: {n} mutants: "
          + ", ".join(f"{v} {k}" for k, v in classes.items())
          + (f" ({_oracle[0]} with intact pages or batches checked one by one)"
             if _dat_pages or _ipc_base else ""), file=sys.stderr)
    return 1 if findings else 0


if __name__ == "__main__":
    k, b, n, s = sys.argv[1:5]
    sys.exit(main(k, b, int(n), int(s)))
