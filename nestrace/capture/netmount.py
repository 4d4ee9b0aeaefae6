"""The network hop of a stack: a file (the disk image) on a network mount,
and where its server keeps it.

sshfs (FUSE): the mount's source is `[user@]host:path`; the sshfs process
serving it says how it reaches its sftp server: `-o directport=N` is a
plain TCP connection (the server an sftp-server behind socat: no
encryption), anything else is ssh.  When the host is this machine (the
loopback address, or its own name), the file's bytes are in the export
`path` on one of this machine's file systems, and the chain goes on there
(the server's file system and its disk); otherwise it stops at the client.
"""
from __future__ import annotations

import contextlib
import os
import socket
from dataclasses import dataclass
from pathlib import Path

from nestrace.capture.devices import Mount, mounts

# the network file systems whose client requests nestrace traces
NET_FS = ("fuse.sshfs",)
LOCAL_HOSTS = {"127.0.0.1", "localhost", "::1", "[::1]", "localhost.localdomain"}


@dataclass
class NetHop:
    kind: str            # sshfs
    fs_type: str         # the mount's: fuse.sshfs
    transport: str       # socat (sftp over plain TCP), ssh, or "" (not found)
    mount_point: str     # the client's mount
    kdev: int            # its dev_t: the FUSE connection
    source: str          # [user@]host:path, as mounted
    host: str
    export: str          # the path on the server
    local: bool          # the server is this machine: its side can be traced

    def server_path(self, client_path: str) -> str:
        """Where the server keeps a file of the mount (a local server)."""
        rel = os.path.relpath(os.path.realpath(client_path), self.mount_point)
        return os.path.normpath(os.path.join(self.export or "/", rel))


def is_network(m: Mount) -> bool:
    return m.fs_type in NET_FS


def sshfs_processes(mount_point: str):
    """(pid, argv) of each live sshfs process serving `mount_point`."""
    for p in Path("/proc").iterdir():
        if not p.name.isdigit():
            continue
        try:
            args = (p / "cmdline").read_bytes().rstrip(b"\0").split(b"\0")
        except OSError:
            continue
        if not args or not os.path.basename(args[0].decode(errors="replace")) == "sshfs":
            continue
        words = [a.decode(errors="replace") for a in args]
        if any(os.path.realpath(w) == mount_point for w in words[1:] if w.startswith("/")):
            with contextlib.suppress(OSError):
                if (p / "stat").read_text().rpartition(")")[2].split()[0] != "Z":
                    yield int(p.name), words


def _sshfs_transport(mount_point: str) -> str:
    """socat or ssh, from the command line of the sshfs serving
    `mount_point`; "" when no such process is found."""
    for _, words in sshfs_processes(mount_point):
        opts = ",".join(words[i + 1] for i, w in enumerate(words[:-1]) if w == "-o")
        opts += "," + ",".join(w[2:] for w in words if w.startswith("-o") and len(w) > 2)
        return "socat" if any(o.startswith("directport=") for o in opts.split(",")) else "ssh"
    return ""


def net_hop(m: Mount) -> NetHop:
    """The network hop of a mount is_network says is one."""
    where, _, export = m.source.rpartition(":")
    user, _, host = where.rpartition("@")
    if not export.startswith("/"):      # (sftp's paths start in the user's home)
        export = os.path.join(os.path.expanduser(f"~{user}" if user else "~"), export)
    local = host in LOCAL_HOSTS or host in {socket.gethostname(), socket.getfqdn()}
    return NetHop("sshfs", m.fs_type, _sshfs_transport(m.mount_point), m.mount_point, m.kdev, m.source,
                  host, export, local)


def gone(net: dict) -> str | None:
    """Why the network hop `net` (a Stack's) no longer serves its files,
    or None while it does: its mount is gone (sshfs unmounts when its
    server goes), or the sshfs process found at the start has exited (its
    mount is then left, every request failing)."""
    mp = net["mount_point"]
    if not any(m.mount_point == mp and m.kdev == net["kdev"] for m in mounts()):
        return f"{mp} is no longer mounted"
    if net.get("transport") and not any(True for _ in sshfs_processes(mp)):
        return f"the sshfs serving {mp} has exited"
    return None
