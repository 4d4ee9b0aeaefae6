"""Mutation fuzzing of nestrace's readers of files it did not write whole:
a reader must read a damaged file, or refuse it with its own error naming
the file and an offset; any other exception, a hang or a crash of the
process is a finding.  Run as a child process (`python tests/fuzzer.py
KIND BASE N SEED`), so that a crash (pyarrow's SIGSEGV on an unverified
message) fails the test that runs it instead of killing pytest.  Prints
one line per finding, the last mutant kept at BASE + ".mutant"; exit 1
when there is any.

KIND: ipc (a live capture's Arrow IPC stream: nestrace.store.files.read_ipc_tolerant),
image:FMT (an image's map: nestrace.images.chain.cluster_map), dat (a
trace-cmd trace.dat: nestrace.importers.tracecmd.read)."""
from __future__ import annotations

import os
import random
import resource
import shutil
import signal
import sys
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

# values a damaged length, offset or count field takes
EDGES = (0, 1, 2**31 - 1, 2**31, 2**32 - 1, 2**63 - 1, 2**64 - 1)


def mutate(rng: random.Random, data: bytes, hot: int) -> bytes:
    """Bytes flipped, set to edge values, or whole 4- and 8-byte fields set
    to edge values, mostly within the first `hot` bytes (headers and
    tables); now and then the file cut short."""
    d = bytearray(data)
    for _ in range(rng.choice((1, 1, 2, 4, 16))):
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
            _, problem = read_ipc_tolerant(Path(p), schema)
            return [problem] if problem else []
        return read, ()
    if kind.startswith("image:"):
        from nestrace.images.base import ImageMapError
        from nestrace.images.chain import cluster_map
        fmt = kind.split(":", 1)[1]
        return (lambda p: cluster_map(p, fmt) and []), (ImageMapError,)
    if kind == "dat":
        from nestrace.importers import datfile, tracecmd
        return (lambda p: tracecmd.read(p).problems), (datfile.TraceCmdError,)
    raise SystemExit(f"fuzzer: unknown kind {kind}")


class Timeout(Exception):
    pass


def _alarm(*_):
    raise Timeout()


def main(kind: str, base: str, n: int, seed: int, hot: int = 1 << 16) -> int:
    signal.signal(signal.SIGALRM, _alarm)
    resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))   # a huge allocation is a finding
    read, own = reader(kind)
    data = Path(base).read_bytes()
    read(base)                              # the base itself reads
    rng = random.Random(seed)
    mut = base + ".mutant"
    findings: dict[tuple, str] = {}
    for i in range(n):
        Path(mut).write_bytes(mutate(rng, data, hot))
        signal.alarm(30)
        try:
            msgs = read(mut)
        except own as e:
            msgs = [str(e)]
        except Timeout:
            msgs, findings[("timeout",)] = [], f"mutant {i}: no answer in 30 s"
        except BaseException as e:          # (MemoryError too)
            tb = traceback.extract_tb(e.__traceback__)[-1]
            key = (type(e).__name__, os.path.basename(tb.filename), tb.lineno)
            findings.setdefault(key, f"mutant {i}: {type(e).__name__}: {str(e)[:200]} "
                                     f"at {os.path.basename(tb.filename)}:{tb.lineno}")
            shutil.copy(mut, f"{mut}.{i}")
            msgs = []
        finally:
            signal.alarm(0)
        for m in msgs:
            if not m.startswith(mut) or "offset" not in m and "byte" not in m:
                findings.setdefault(("message", m[:40]), f"mutant {i}: names no file and offset: {m[:200]}")
    for f in findings.values():
        print(f"{kind} seed {seed}: {f}")
    return 1 if findings else 0


if __name__ == "__main__":
    k, b, n, s = sys.argv[1:5]
    sys.exit(main(k, b, int(n), int(s)))
