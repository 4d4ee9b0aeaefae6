"""Records missing by their sequence numbers, counted so that damage is
never taken for loss: a number out of order between neighbours in order
is one damaged field, a jump past MAX_SEQ_JUMP is damage, and no count
is negative or past what the numbers can hold."""
from __future__ import annotations

import numpy as np

# a jump of a CPU's sequence numbers past this many is damage, not loss
# (a relay buffer's or ring buffer's loss is far fewer records)
MAX_SEQ_JUMP = 1 << 24


def seq_gaps(q: np.ndarray) -> tuple[int, int]:
    """(records missing, numbers that are damage) of the sequence numbers
    of one CPU's records (of one device, for blktrace), in the order they
    were written."""
    q = q.astype(np.int64)
    n = len(q)
    if n < 2:
        return 0, 0
    bad = np.zeros(n, bool)
    if n > 2:
        mid, before, after = q[1:-1], q[:-2], q[2:]
        bad[1:-1] = ((mid <= before) | (mid >= after)) & (before < after)
        bad[0] = q[0] >= q[1] and q[1] < q[2]
    bad[-1] = q[-1] <= q[-2] and not bad[-2]
    idx = np.flatnonzero(~bad)
    d, between = np.diff(q[idx]), np.diff(idx) - 1     # (the damaged ones between hold numbers)
    jumps = (d > MAX_SEQ_JUMP) | (d <= 0)
    return int(np.maximum(d - 1 - between, 0)[~jumps].sum()), int(bad.sum() + jumps.sum())


def missing_upto(q: np.ndarray, last: int | None) -> tuple[int, int, int]:
    """(records missing, numbers past `last` or otherwise damage,
    duplicates) of one CPU's records numbered from 1 (the agent's): the
    numbers taken, each once, against `last` (the agent's own count of
    numbers taken; None: not known, the numbers themselves tell)."""
    u = np.unique(q.astype(np.uint64))
    dups = len(q) - len(u)
    if last is not None:
        past = int((u > np.uint64(last)).sum())
        return max(int(last) - (len(u) - past), 0), past, dups
    huge = u >= np.uint64(1 << 62)          # (past what int64 holds: damage)
    u = u[~huge].astype(np.int64)
    gaps, damaged = seq_gaps(np.r_[0, u] if len(u) and u[0] <= MAX_SEQ_JUMP else u)
    return gaps, damaged + int(huge.sum()), dups
