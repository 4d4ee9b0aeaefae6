"""A lab's network hop: the host file system exported over sshfs or NFS
on the loopback address, and mounted back (`lab up --net`).

    sshfs-socat  sftp-server behind socat: sftp over plain TCP, no
                 encryption (seed 002's fast gateway)
    sshfs-ssh    sftp over ssh to an sshd of the lab's own (its keys, its
                 config, root by key only, on 127.0.0.1)
    nfs3, nfs4   this machine's nfsd (the kernel's NFS server) exporting
                 it to the loopback address, mounted with NFSv3 or NFSv4.2
                 (a kernel with nfsd and the NFS client: not this
                 project's CI machine, the VM test's guest)

Each daemon is started in a session of its own and recorded as a step of
the lab (kind "daemon": its process group), so that `lab down` stops it
after the mount on it is gone.
"""
from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

from nestrace.capture.netmount import sshfs_processes

NETS = ("sshfs-socat", "sshfs-ssh", "nfs3", "nfs4")
# the NFS ones: the version the client mounts with
NFS = {"nfs3": "3", "nfs4": "4.2"}
NFSD = Path("/proc/fs/nfsd")
NFS_STATE = Path("/var/lib/nfs")
SFTP_SERVERS = ("/usr/lib/openssh/sftp-server", "/usr/libexec/openssh/sftp-server",
                "/usr/lib/ssh/sftp-server")


class NetLabError(RuntimeError):
    pass


def _tool(name: str, paths: tuple[str, ...] = ()) -> str:
    for p in (shutil.which(name), *paths):
        if p and os.access(p, os.X_OK):
            return p
    raise NetLabError(f"{name}: not installed (ci/setup installs sshfs, socat, "
                      "openssh-server and openssh-sftp-server)")


def _free_port(address: str) -> int:
    with socket.socket() as s:
        s.bind((address, 0))
        return s.getsockname()[1]


def _listening(address: str, port: int) -> bool:
    """Someone listens on `address`:`port` (an IPv4 address; from
    /proc/net/tcp: no connection made)."""
    want = {f"{socket.inet_aton(a)[::-1].hex().upper()}:{port:04X}"
            for a in (address, "0.0.0.0")}         # (or on every address)
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        f = line.split()
        if f[1] in want and f[3] == "0A":
            return True
    return False


def _start(cmd: list[str], log: Path, address: str, port: int, what: str) -> int:
    """Start a daemon in a session of its own, its environment naming the
    lab's directory (NESTRACE_LAB_DIR: whose daemon it is, for a reader
    of /proc); its pid once it listens."""
    env = os.environ | {"NESTRACE_LAB_DIR": str(log.parent)}
    with open(log, "ab") as out:
        p = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                             start_new_session=True, env=env)
    for _ in range(200):
        if _listening(address, port):
            return p.pid
        if p.poll() is not None:
            tail = log.read_text(errors="replace").strip().splitlines()[-1:] or ["no output"]
            raise NetLabError(f"{what} exited ({p.returncode}): {tail[0]} (log: {log})")
        time.sleep(0.025)
    stop(p.pid)
    raise NetLabError(f"{what}: not listening on {address}:{port} after 5 s (log: {log})")


def _ssh_files(d: Path, address: str, port: int, sftp: str) -> tuple[Path, Path]:
    """Keys and config of the lab's sshd: (its config, the client key)."""
    d.mkdir(mode=0o700, exist_ok=True)
    for key in ("host_key", "client_key"):
        if not (d / key).exists():
            r = subprocess.run([_tool("ssh-keygen"), "-q", "-t", "ed25519", "-N", "",
                                "-f", str(d / key)], capture_output=True, text=True)
            if r.returncode:
                raise NetLabError(f"ssh-keygen: {r.stderr.strip()}")
    (d / "authorized_keys").write_text((d / "client_key.pub").read_text())
    conf = d / "sshd_config"
    conf.write_text(f"""Port {port}
ListenAddress {address}
HostKey {d / 'host_key'}
AuthorizedKeysFile {d / 'authorized_keys'}
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
PidFile none
Subsystem sftp {sftp}
""")
    return conf, d / "client_key"


def serve(net: str, export: Path, data_dir: Path, address: str = "127.0.0.1"
          ) -> tuple[int, list[str]]:
    """Start the server of `export` for `net` on `address` (a loopback
    one): (its daemon's pid, the sshfs options and source that mount it)."""
    sftp = _tool("sftp-server", SFTP_SERVERS)
    _tool("sshfs")
    port = _free_port(address)
    log = data_dir / f"{net}.log"
    if net == "sshfs-socat":
        pid = _start([_tool("socat"), f"TCP-LISTEN:{port},bind={address},reuseaddr,fork,nodelay",
                      f"EXEC:{sftp}"], log, address, port, "socat")
        return pid, ["-o", f"directport={port}", f"{address}:{export}"]
    if net == "sshfs-ssh":
        conf, key = _ssh_files(data_dir / "ssh", address, port, sftp)
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)    # (its privilege separation)
        pid = _start([_tool("sshd", ("/usr/sbin/sshd",)), "-D", "-e", "-f", str(conf)],
                     log, address, port, "sshd")
        return pid, ["-o", f"port={port},IdentityFile={key},StrictHostKeyChecking=no,"
                     "UserKnownHostsFile=/dev/null,BatchMode=yes",
                     f"root@{address}:{export}"]
    raise NetLabError(f"--net {net}: unknown (choose from {', '.join(NETS)})")


def _run(cmd: list[str], what: str) -> str:
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    if r.returncode:
        msg = (r.stderr or r.stdout).strip().splitlines()
        raise NetLabError(f"{what}: {' '.join(cmd)}: {msg[-1] if msg else r.returncode}")
    return r.stdout


def _has_fs(name: str) -> bool:
    return any(line.split()[-1] == name
               for line in Path("/proc/filesystems").read_text().splitlines())


def _running(name: str) -> bool:
    return subprocess.run(["pgrep", "-x", name], capture_output=True).returncode == 0


def export_nfs(net: str, export: Path, data_dir: Path) -> tuple[list[tuple[str, int]], dict]:
    """Export `export` to the loopback addresses from this machine's nfsd, starting
    what is not running: rpcbind and rpc.mountd (daemons of the lab's,
    NFSv3 needs them) and nfsd's threads.  Returns the daemons started
    ((what, pid)) and what `unexport_nfs` undoes."""
    for fs, module in (("nfsd", "nfsd"), ("nfs", "nfs")):
        if not _has_fs(fs) and shutil.which("modprobe"):
            subprocess.run(["modprobe", module], capture_output=True)
        if not _has_fs(fs):
            raise NetLabError(f"this kernel has no NFS {'server' if fs == 'nfsd' else 'client'} "
                              f"({fs} is not in /proc/filesystems, and modprobe {module} "
                              "did not add it): the VM test's guest has it")
    exportfs, mountd, nfsd = (_tool(t, (f"/usr/sbin/{t}",))
                              for t in ("exportfs", "rpc.mountd", "rpc.nfsd"))
    rpcbind = _tool("rpcbind", ("/usr/sbin/rpcbind", "/sbin/rpcbind"))
    if not (NFSD / "threads").exists():
        _run(["mount", "-t", "nfsd", "nfsd", str(NFSD)], "nfsd's file system")
    NFS_STATE.mkdir(parents=True, exist_ok=True)
    for f in ("etab", "rmtab"):
        (NFS_STATE / f).touch()
    started = []
    if not _running("rpcbind"):
        started.append(("rpcbind", _start([rpcbind, "-f", "-w"], data_dir / "rpcbind.log",
                                          "127.0.0.1", 111, "rpcbind")))
    # (to the whole loopback network: a mount of 127.0.0.2 comes from
    # 127.0.0.1.  NFSv4: as its root, fsid=0, mounted as /: the pseudo
    # root nfs-utils would make holds the directories above the export,
    # on file systems that may not be exportable)
    undo = {"net": net, "client": "127.0.0.0/8", "path": str(export), "nfsd": False}
    opts = "rw,no_root_squash,sync,no_subtree_check"
    if NFS[net].startswith("4"):
        if root := [p for p, rest in _exports() if "fsid=0" in rest]:
            raise NetLabError(f"NFSv4's root (fsid=0) is exported already: {root[0]}; the "
                              "lab's NFSv4 export would take its place (one at a time)")
        opts += ",fsid=0"
    _run([exportfs, "-o", opts, f"{undo['client']}:{export}"], "the export")
    try:
        if not _running("rpc.mountd"):
            port = _free_port("127.0.0.1")
            started.append(("rpc.mountd", _start([mountd, "-F", "--no-udp", "-p", str(port)],
                                                 data_dir / "mountd.log", "127.0.0.1", port,
                                                 "rpc.mountd")))
        if int((NFSD / "threads").read_text() or 0) == 0:
            # (NFSv4's grace period cut to the least nfsd takes: a client's
            # first OPEN waits for it to end)
            _run([nfsd, "--grace-time", "10", "--lease-time", "10", "8"], "nfsd")
            undo["nfsd"] = True
    except NetLabError:
        unexport_nfs(undo)
        for _, pid in started:
            stop(pid)
        raise
    return started, undo


def _exports() -> list[tuple[str, str]]:
    """nfsd's exports: (path, client(options)) each."""
    if not (NFSD / "exports").exists():
        return []
    out = []
    for line in (NFSD / "exports").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            path, _, rest = line.partition("\t")
            out.append((path.encode().decode("unicode_escape"), rest.strip()))
    return out


def unexport_nfs(undo: dict) -> bool:
    """Undo export_nfs's export (and stop nfsd's threads if it started
    them and nothing else is exported: another lab's); whether the export
    was still there."""
    there = any(p == undo["path"] and rest.startswith(undo["client"] + "(")
                for p, rest in _exports())
    if there:
        _run([_tool("exportfs", ("/usr/sbin/exportfs",)), "-u",
              f"{undo['client']}:{undo['path']}"], "the export")
    if undo["nfsd"] and (NFSD / "threads").exists() and \
            (NFSD / "threads").read_text().strip() != "0" and not _exports():
        _run([_tool("rpc.nfsd", ("/usr/sbin/rpc.nfsd",)), "0"], "nfsd")
    return there


def mount_nfs(net: str, address: str, export: Path, mount_point: Path) -> None:
    mount_point.mkdir(parents=True, exist_ok=True)
    # (nolock: no rpc.statd; locks stay on the client)
    # (NFSv4: the export is its root)
    path = "/" if NFS[net].startswith("4") else str(export)
    _run(["mount", "-t", "nfs", "-o", f"vers={NFS[net]},nolock", f"{address}:{path}",
          str(mount_point)], "the mount")


def mount(sshfs_args: list[str], mount_point: Path) -> None:
    mount_point.mkdir(parents=True, exist_ok=True)
    r = subprocess.run([_tool("sshfs"), *sshfs_args, str(mount_point)],
                       capture_output=True, text=True, timeout=60)
    if r.returncode:
        msg = (r.stderr or r.stdout).strip().splitlines()
        raise NetLabError(f"sshfs {' '.join(sshfs_args)} {mount_point}: "
                          f"{msg[-1] if msg else r.returncode}")


def wait_unmounted(mount_point: str) -> None:
    """After an sshfs mount is unmounted, its process exits on its own:
    wait for it (up to 5 s), then stop it."""
    for _ in range(250):
        pids = [pid for pid, _ in sshfs_processes(mount_point)]
        if not pids:
            return
        time.sleep(0.02)
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def stop(pid: int) -> bool:
    """Stop a daemon the lab started, with everything in its session (the
    sftp-servers socat forked); whether it was still running."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
        if state == "Z" or os.getsid(pid) != pid:   # (dead, or not the leader we made)
            return False
        os.killpg(pid, signal.SIGTERM)
    except (OSError, IndexError):                    # (ProcessLookupError: gone)
        return False
    for _ in range(100):
        try:
            os.killpg(pid, 0)
        except ProcessLookupError:
            return True
        try:
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            pass
        time.sleep(0.02)
    os.killpg(pid, signal.SIGKILL)
    return True
