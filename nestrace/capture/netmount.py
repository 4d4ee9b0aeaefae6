"""The network hop of a stack: a file (the disk image) on a network mount,
and where its server keeps it.

sshfs (FUSE): the mount's source is `[user@]host:path`; the sshfs process
serving it says how it reaches its sftp server: `-o directport=N` is a
plain TCP connection (the server an sftp-server behind socat: no
encryption), anything else is ssh.  When the host is this machine (the
loopback address, or its own name), the file's bytes are in the export
`path` on one of this machine's file systems, and the chain goes on there
(the server's file system and its disk); otherwise it stops at the client.

NFS (nfs, nfs4): the source is `host:path`, the transport the protocol
version (nfs3, nfs4.2, ...).  A local server's export is the path, or for
NFSv4 the path under the export nfsd serves as its root (fsid=0), when
there is one (/proc/fs/nfsd/exports).
"""
from __future__ import annotations

import contextlib
import os
import socket
from dataclasses import dataclass
from pathlib import Path

from nestrace.capture.devices import Mount, mounts

# the network file systems whose client requests nestrace traces
NET_FS = ("fuse.sshfs", "nfs", "nfs4")
NFSD = Path("/proc/fs/nfsd")
LOCAL_HOSTS = {"127.0.0.1", "localhost", "::1", "[::1]", "localhost.localdomain"}


@dataclass
class NetHop:
    kind: str            # sshfs or nfs
    fs_type: str         # the mount's: fuse.sshfs, nfs, nfs4
    transport: str       # sshfs: socat (sftp over plain TCP), ssh, or "" (not found); nfs: nfs3, nfs4.2, ...
    mount_point: str     # the client's mount
    kdev: int            # its dev_t: the FUSE connection
    source: str          # [user@]host:path, as mounted
    host: str
    export: str          # the path on the server
    local: bool          # the server is this machine: its side can be traced
    rsize: int = 0       # nfs: the largest READ and WRITE the client sends (its mount's)
    wsize: int = 0

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


def _nfs_root() -> str | None:
    """The export this machine's nfsd serves as NFSv4's root (fsid=0)."""
    with contextlib.suppress(OSError):
        for line in (NFSD / "exports").read_text().splitlines():
            path, _, rest = line.partition("\t")
            if "fsid=0" in rest.replace("(", ",").replace(")", ",").split(","):
                return path.encode().decode("unicode_escape")
    return None


def _nfs_hop(m: Mount) -> NetHop:
    host, _, path = m.source.rpartition(":")
    host = host.strip("[]") if host.startswith("[") else host
    local = host in LOCAL_HOSTS or host in {socket.gethostname(), socket.getfqdn()}
    opts = dict(o.partition("=")[::2] for o in m.options.split(","))
    vers = opts.get("vers") or ("4" if m.fs_type == "nfs4" else "3")
    export = path or "/"
    if vers.startswith("4") and local and (root := _nfs_root()):
        export = os.path.normpath(os.path.join(root, export.lstrip("/")))
    return NetHop("nfs", m.fs_type, f"nfs{vers}", m.mount_point, m.kdev, m.source, host, export,
                  local, int(opts.get("rsize") or 0), int(opts.get("wsize") or 0))


def net_hop(m: Mount) -> NetHop:
    """The network hop of a mount is_network says is one."""
    if m.fs_type in ("nfs", "nfs4"):
        return _nfs_hop(m)
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
    if net.get("kind") == "nfs":
        if net.get("local"):
            with contextlib.suppress(OSError, ValueError):
                if int((NFSD / "threads").read_text()) == 0:
                    return f"the NFS server of {mp} on this machine has stopped (no nfsd thread)"
        return None
    if net.get("transport") and not any(True for _ in sshfs_processes(mp)):
        return f"the sshfs serving {mp} has exited"
    return None


def _children(pid: int) -> list[int]:
    out = []
    with contextlib.suppress(OSError):
        for t in Path(f"/proc/{pid}/task").iterdir():
            with contextlib.suppress(OSError):
                out += [int(c) for c in (t / "children").read_text().split()]
    return out


def _tree(pids) -> set[int]:
    seen, todo = set(), list(pids)
    while todo:
        p = todo.pop()
        if p not in seen:
            seen.add(p)
            todo += _children(p)
    return seen


def _sockets(pid: int) -> set[int]:
    out = set()
    with contextlib.suppress(OSError):
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            with contextlib.suppress(OSError):
                link = os.readlink(fd)
                if link.startswith("socket:["):
                    out.add(int(link[8:-1]))
    return out


def _tcp() -> dict[int, tuple[str, str]]:
    """socket inode -> (local, remote) of every TCP socket (IPv4, IPv6)."""
    out = {}
    for name in ("tcp", "tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/net/{name}").read_text().splitlines()[1:]:
                f = line.split()
                out[int(f[9])] = (f[1], f[2])
    return out


def hop_processes(net: dict) -> tuple[set[int], set[int]]:
    """The network hop's processes on this machine: the client's (the
    sshfs serving the mount, and its ssh) and the server's (the process
    at the other end of the client's TCP connection, socat's child or
    sshd's session, and its sftp-server).  Empty sets for what is not
    found (a server on another machine).  NFS: the client is the kernel's
    (no process of its own: none), the server the nfsd threads."""
    if net.get("kind") == "nfs":
        return set(), (set(_kthreads("nfsd")) if net.get("local") else set())
    sshfs = list(sshfs_processes(net["mount_point"]))
    client = _tree(pid for pid, _ in sshfs) | _ssh_of(net, [w for _, w in sshfs])
    tcp = _tcp()
    ends = {tcp[i] for p in client for i in _sockets(p) if i in tcp}
    peers = {(r, loc) for loc, r in ends}
    server_socks = {i for i, e in tcp.items() if e in peers}
    server = set()
    if server_socks:
        for p in Path("/proc").iterdir():
            if p.name.isdigit() and int(p.name) not in client and _sockets(int(p.name)) & server_socks:
                server.add(int(p.name))
    return client, _tree(server) - client


def _kthreads(comm: str):
    for p in Path("/proc").iterdir():
        with contextlib.suppress(OSError):
            if p.name.isdigit() and (p / "comm").read_text().strip() == comm:
                yield int(p.name)


def _ssh_of(net: dict, argvs: list[list[str]]) -> set[int]:
    """The ssh processes sshfs started for the mount (a daemonized sshfs
    is no longer their parent): ssh running sftp to the mount's host,
    with the port sshfs was given."""
    if net.get("transport") != "ssh":
        return set()
    where = net["source"].rpartition(":")[0]
    ports = {o[5:] for argv in argvs for w in argv for o in w.split(",") if o.startswith("port=")}
    out = set()
    for p in Path("/proc").iterdir():
        with contextlib.suppress(OSError):
            if not p.name.isdigit() or (p / "comm").read_text().strip() != "ssh":
                continue
            argv = (p / "cmdline").read_bytes().decode(errors="replace").split("\0")
            if "sftp" in argv and where in argv and \
                    (all(f"-oport={port}" in argv for port in ports) if ports
                     else not any(a.startswith("-oport=") for a in argv)):
                out.add(int(p.name))
    return out


def cpu_seconds(pids: set[int]) -> float:
    """User and system CPU seconds the processes have used so far (those
    gone meanwhile count nothing)."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0
    for pid in pids:
        with contextlib.suppress(OSError, IndexError, ValueError):
            f = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
            total += int(f[11]) + int(f[12])        # utime, stime (fields 14, 15)
    return total / tick


class HopCpu:
    """The CPU seconds a network hop's client and server processes use
    from now until done() (recorded beside a capture: the CPU a gateway
    costs)."""

    def __init__(self, net: dict):
        self.client, self.server = hop_processes(net)
        self.before = cpu_seconds(self.client), cpu_seconds(self.server)

    def done(self) -> dict:
        def names(pids):
            out = []
            for p in sorted(pids):
                with contextlib.suppress(OSError):
                    out.append(Path(f"/proc/{p}/comm").read_text().strip())
            return sorted(set(out))
        return {"client_s": round(cpu_seconds(self.client) - self.before[0], 3),
                "server_s": round(cpu_seconds(self.server) - self.before[1], 3),
                "client": names(self.client), "server": names(self.server)}
