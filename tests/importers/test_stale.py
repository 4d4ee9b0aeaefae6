"""What the pairings forget: a sector's last start, and a bio's Q, G or
X, more than 30 s before the event that would use them (STALE_NS), and a
start more than 1 s before a split there (SPLIT_NS).
The compiled pairings then hold the starts of the last 30 s, not every
sector a trace touched, and the streamed import, the whole read, numpy
and the SQL module block.requests agree on what is forgotten."""
from __future__ import annotations

import numpy as np
import pyarrow.compute as pc
from test_blkstream import C, D, G, I, Q, X, assert_same_stores, rec, tables, write_per_cpu
from test_requests import assert_stored_as_computed

from nestrace.importers import blkimport, compiled, requests

S = requests.STALE_NS
A_Q, A_BACKMERGE, A_G, A_I, A_D, A_C = 1, 2, 4, 5, 6, 7     # block_action codes


def lives(n: int, gap_ns: int) -> dict[str, np.ndarray]:
    """n requests' events in time order, each at a sector of its own (a
    sequential write), the next bio merged into every other one (Q, then
    a back merge at the sector after), a request every gap_ns."""
    rows = []
    for k in range(n):
        t, s = k * gap_ns, 16 * k
        rows += [(A_Q, t, s), (A_G, t + 1, s)]
        if k % 2:
            rows += [(A_Q, t + 2, s + 8), (A_BACKMERGE, t + 2, s + 8)]
        rows += [(A_I, t + 3, s), (A_D, t + 4, s), (A_C, t + 50, s)]
    a, ts, sec = (np.array(c) for c in zip(*rows))
    o = np.argsort(ts, kind="stable")
    return {"a": a[o].astype(np.uint16), "ts": ts[o].astype(np.uint64),
            "sec": sec[o].astype(np.uint64)}


def most_held(ev: dict[str, np.ndarray], chunk: int = 5000) -> tuple[int, int]:
    """The most entries the pairing and the request pairing held at once,
    fed ev a chunk at a time, as the streamed import feeds them."""
    pairing, reqs = compiled.Pairing(), compiled.Requests()
    most = [0, 0]
    for k in range(0, len(ev["a"]), chunk):
        a, ts, sec = ev["a"][k:k + chunk], ev["ts"][k:k + chunk], ev["sec"][k:k + chunk]
        m = len(a)
        dev, zero = np.full(m, 7, np.uint32), np.zeros(m, np.uint64)
        bio, rq, _ = pairing.step(a, ts, dev, sec, zero, np.zeros(m, np.uint32))
        reqs.step(a, ts, dev, bio, rq, sec, zero, np.zeros(m, np.int32))
        most = [max(most[0], pairing.held()), max(most[1], reqs.held())]
    return most[0], most[1]


def test_the_pairings_hold_the_starts_of_the_last_30_s_not_of_the_whole_trace():
    n = 150_000
    # a request every 10 ms: 3,000 in 30 s, 1,500 s in all
    pairs, reqs = most_held(lives(n, S // 3000))
    # (the pairing's table is built again without them when it is half
    # full: it starts at 65,536 slots)
    assert pairs <= 32_768, pairs
    # (starts, merged bios: each table twice as big as 4 times the live
    # ones, at most, and built again when half full)
    assert reqs <= 25_000, reqs
    # the same requests within 1 s: nothing may be forgotten, and every
    # sector and merged bio is held (the bound above is the rules')
    pairs, reqs = most_held(lives(n, requests.SPLIT_NS // (2 * n)))
    assert pairs >= n and reqs >= n, (pairs, reqs)


def stale_cases(t0: int) -> list[tuple[int, int, bytes]]:
    """(time, cpu, record) of the cases, from t0, 1 µs apart: (a) a
    request at sector 800 issued again 31 s after its C, without a Q; (b)
    a bio queued at 1600 that waits 31 s for its G; (c) a bio at 2400
    split (X) 1.1 s after the Q at its sector; (d) at 3200 the same within
    0.9 s, to compare."""
    out = []

    def ev(action, sector, t, pdu=b""):
        out.append((t, 0, rec(action, sector, 4096, t, 0, pdu=pdu)))

    gap = 31 * 10 ** 9
    life = ((1, G), (2, I), (3, D), (40, C))
    ev(Q, 800, t0)
    for dt, a in life:
        ev(a, 800, t0 + dt)
        ev(a, 800, t0 + gap + dt)
    t0 += 1000
    ev(Q, 1600, t0)
    for dt, a in life:
        ev(a, 1600, t0 + gap + dt)
    for s, later in ((2400, 11 * 10 ** 8), (3200, 9 * 10 ** 8)):
        t0 += 1000
        ev(Q, s, t0)
        for dt, a in life:
            ev(a, s, t0 + dt)
        ev(X, s, t0 + later, pdu=(s + 8).to_bytes(8, "big"))
        for dt, a in life:
            ev(a, s, t0 + later + 1 + dt)
    return out


def test_a_start_and_a_q_older_than_30_s_are_forgotten_alike_by_every_pairing(tmp_path,
                                                                              monkeypatch):
    monkeypatch.setattr(blkimport, "ROW_GROUP", 7)
    monkeypatch.setattr(requests.RequestStream, "PART", 5)
    files = write_per_cpu(stale_cases(10 ** 9), tmp_path)
    r = blkimport.import_files(files, tmp_path / "s", {}, "imp", "m1")
    assert r["read"] == "streamed"
    blkimport._import_whole(files, tmp_path / "w", {}, "imp", "m1")
    assert_same_stores(tmp_path / "s", tmp_path / "w")
    # what the import stored (C and numpy) is what the SQL computes
    assert assert_stored_as_computed(tmp_path / "s") == 7
    rq = tables(tmp_path / "s")["block_requests"]
    got = {}
    for row in rq.sort_by("ts_ns").to_pylist():
        got.setdefault(row["sector"], []).append((row["q_ns"] is not None,
                                                  row["g_ns"] is not None))
    assert got[800] == [(True, True), (False, True)]     # (a): the Q is the first's
    assert got[1600] == [(False, True)]                   # (b): its G, not its Q
    assert got[2400] == [(True, True), (False, True)]    # (c): the piece has no Q
    assert got[3200] == [(True, True), (True, True)]     # (d): within 1 s, it has
    ev = tables(tmp_path / "s")["block_events"]
    # (a)'s issue again carries no bio: its sector's start was forgotten
    late = ev.filter(pc.and_(pc.equal(ev.column("sector"), 800),
                             pc.greater(ev.column("ts_ns"), 10 ** 9 + 10 ** 10)))
    assert late.num_rows == 4 and set(late.column("bio_id").to_pylist()) == {0}
