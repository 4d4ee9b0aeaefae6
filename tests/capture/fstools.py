"""Test oracles from the file systems' own tools: where a journal is, by
dumpe2fs and debugfs (ext3/4) or xfs_db (xfs), to check what the agent
reads from the device itself."""
from __future__ import annotations

import re
import subprocess

# "(lo-hi):ph-ph_end" or "(lo):ph", a run of blocks in debugfs' stat output
_RUN = re.compile(r"\((\d+)(?:-(\d+))?\):(\d+)(?:-(\d+))?")


def _run(args: list[str]) -> str:
    return subprocess.run(args, capture_output=True, text=True, check=True, timeout=60).stdout


def ext_journal(dev: str) -> tuple[int, list[tuple[int, int, int]]]:
    """(inode, [(logical bytes, physical bytes, length bytes)]) of an ext3/4
    internal journal; (0, []) when it has none."""
    fields = dict(re.findall(r"^([A-Za-z ]+):\s+(.*)$", _run(["dumpe2fs", "-h", dev]), re.M))
    ino = int(fields.get("Journal inode", "0") or 0)
    if "has_journal" not in fields.get("Filesystem features", "").split() or not ino:
        return 0, []
    bs = int(fields["Block size"])
    text = _run(["debugfs", "-R", f"stat <{ino}>", dev])
    # a block-mapped journal's indirect blocks ("(IND):565") are left out
    body = text.split("BLOCKS:", 1)[-1].split("EXTENTS:", 1)[-1]
    return ino, [(int(lo) * bs, int(ph) * bs, (int(lo_end or lo) - int(lo) + 1) * bs)
                 for lo, lo_end, ph, _ in _RUN.findall(body)]


def xfs_log(dev: str) -> list[tuple[int, int, int]]:
    """[(0, physical bytes, length bytes)] of an xfs internal log."""
    text = _run(["xfs_db", "-r", "-c", "sb 0", "-c",
                 "print logstart logblocks blocksize agblocks agblklog", dev])
    v = {k: int(n) for k, n in re.findall(r"^(\w+) = (\d+)$", text, re.M)}
    if v["logstart"] == 0:
        return []
    agno, agbno = v["logstart"] >> v["agblklog"], v["logstart"] & ((1 << v["agblklog"]) - 1)
    return [(0, (agno * v["agblocks"] + agbno) * v["blocksize"], v["logblocks"] * v["blocksize"])]


def journal_by_tools(fs_type: str, dev: str) -> tuple[int, list[tuple[int, int, int]]]:
    if fs_type in ("ext3", "ext4"):
        return ext_journal(dev)
    if fs_type == "xfs":
        return 0, xfs_log(dev)
    return 0, []
