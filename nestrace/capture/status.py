"""The status lines of a recording (record --status): each level's rate and
the events lost so far, from the agent's status lines."""
from __future__ import annotations

import re

from nestrace.capture.devices import kdev_str
from nestrace.capture.stack import Stack

_STATUS = re.compile(r"nestrace-agent: status ms=(\d+) records=(\d+) drops=(-?\d+) "
                     r"vfs=(\d+):(\d+) hostfs=(\d+) cache=(\d+) blk=(\S*)$")


def _rate(n: float) -> str:
    return f"{n / 1000:.1f}k" if n >= 1000 else f"{n:.0f}"


class StatusLines:
    """The agent's status lines (cumulative counts since the start) as
    rates per level since the line before (page cache: only when there
    were page-cache events):
    `nestrace: 12.0 s | vfs 10.2k/s 40.0 MiB/s | vdisk ... | hostfs 10.2k ev/s
    | disk ... | lost 0`.  Block counts are dispatches (D) and their bytes;
    vfs, completed calls and the bytes they returned; hostfs, raw host-FS
    events (a buffered access may be several).  The agent prints a line
    right after a flush (--flush-ms), so a line comes at most that much
    later than asked for, with the counts as of the time on it."""

    def __init__(self, stack: Stack):
        self.levels = (["vfs"] if stack.has_guest else []) + \
                      (["vdisk"] if stack.has_guest and stack.vdisk else []) + \
                      (["hostfs", "disk"] if stack.has_host else [])
        self.level_of = {kdev_str(d.kdev): "disk" for d in stack.disks}
        if stack.has_guest and stack.vdisk:
            self.level_of[kdev_str(stack.vdisk.kdev)] = "vdisk"
        # counts of the last line (zero before the first)
        self.last = {"ms": 0, "vfs": (0, 0), "vdisk": (0, 0), "hostfs": (0, 0), "disk": (0, 0),
                     "cache": (0, 0)}

    def parse(self, line: str) -> dict | None:
        """An agent status line's counts since the start: ms, records,
        drops (-1: unread), and per level (count, bytes); None for other
        lines."""
        m = _STATUS.search(line)
        if not m:
            return None
        cur = {"ms": int(m[1]), "records": int(m[2]), "drops": int(m[3]),
               "vfs": (int(m[4]), int(m[5])), "hostfs": (int(m[6]), 0), "cache": (int(m[7]), 0),
               "vdisk": (0, 0), "disk": (0, 0)}
        for part in filter(None, m[8].split(",")):
            maj, mi, n, b = part.split(":")
            lvl = self.level_of.get(f"{maj}:{mi}")
            if lvl:
                cur[lvl] = (cur[lvl][0] + int(n), cur[lvl][1] + int(b))
        return cur

    def text(self, line: str) -> str | None:
        """The human line for an agent status line; None for other
        lines."""
        cur = self.parse(line)
        if cur is None:
            return None
        dt = max(cur["ms"] - self.last["ms"], 1) / 1000
        parts = [f"nestrace: {cur['ms'] / 1000:.1f} s"]
        for lvl in self.levels:
            n = (cur[lvl][0] - self.last[lvl][0]) / dt
            if lvl == "hostfs":
                parts.append(f"hostfs {_rate(n)} ev/s")
            else:
                mib = (cur[lvl][1] - self.last[lvl][1]) / dt / (1 << 20)
                parts.append(f"{lvl} {_rate(n)}/s {mib:.1f} MiB/s")
        cache = (cur["cache"][0] - self.last["cache"][0]) / dt
        if cache:
            parts.append(f"page cache {_rate(cache)} ev/s")
        drops = cur["drops"]
        parts.append("lost ?" if drops < 0 else f"LOST {drops}" if drops else "lost 0")
        self.last = cur
        return " | ".join(parts)
