"""A real QEMU guest for the VM test: Debian's kernel (ci/guest-kernel),
a busybox initramfs that loads the virtio, 9p and ext4 modules, and this
machine's root file system shared read-only over 9p, so the guest runs
this checkout's nestrace, its venv and fio as they are.  The guest runs one
shell script, chrooted into that root, with a writable 9p share for its
output, and powers off.

No KVM here (the host is itself a VM that cannot nest one): QEMU emulates
the CPU (TCG, `-cpu max` so that the wheels' AVX2 code runs)."""
from __future__ import annotations

import gzip
import lzma
import os
import shutil
import stat
import subprocess
from pathlib import Path

KERNEL_DIR = Path(os.environ.get("NESTRACE_GUEST_KERNEL", "/var/cache/nestrace/guest-kernel"))
BUSYBOX = Path("/bin/busybox")
QEMU = "qemu-system-x86_64"
# what the guest loads, in order of need (their dependencies come first)
WANT = ["virtio_pci", "virtio_blk", "9pnet_virtio", "9p", "crc32c_generic", "ext4"]
HOSTNAME = "nestrace-guest"

INIT = """#!/bin/busybox sh
/bin/busybox --install -s /bin
mount -t proc proc /proc; mount -t sysfs sys /sys; mount -t devtmpfs dev /dev
hostname {hostname}
for m in {modules}; do insmod /mod/$m.ko || echo "guest: insmod $m failed"; done
R=/host
# (cache=loose: the guest keeps what it read of the host's root, which
# it only reads and the host does not change under it; each stat and
# read otherwise goes to QEMU: Python's start-up took 4.5 s, not 1.1 s)
mount -t 9p -o trans=virtio,version=9p2000.L,ro,cache=loose,msize=512000 hostroot $R || {{
    echo "guest: cannot mount the host's root"; poweroff -f; }}
mount -t proc proc $R/proc; mount -t sysfs sys $R/sys; mount -t devtmpfs dev $R/dev
mount -t tracefs tracefs $R/sys/kernel/tracing
mount -t bpf bpf $R/sys/fs/bpf
mount -t tmpfs run $R/run
mkdir -p $R/run/out $R/run/tmp
mount -t 9p -o trans=virtio,version=9p2000.L,msize=512000 out $R/run/out || {{
    echo "guest: cannot mount the output share"; poweroff -f; }}
echo "guest: up, kernel $(uname -r)"
# every minute, what each task waits in (kernel threads but those in D
# state left out) and the kernel stack of each in D state: a guest that
# hangs says where in the host's message
chroot $R /usr/bin/env PATH=/usr/sbin:/usr/bin:/sbin:/bin /bin/sh -c 'while sleep 60; do
    {{ cut -d" " -f1 /proc/uptime; ps -eo pid,stat,wchan:32,etime,args |
       awk "\\$2 ~ /D/ || \\$5 !~ /^\\\\[/" | cut -c1-200
       for p in $(ps -eo pid=,stat= | awk "\\$2 ~ /D/ {{print \\$1}}"); do
           echo "--- $p $(cat /proc/$p/comm)"; cat /proc/$p/stack; done
    }} > /run/out/tasks.new 2>&1; mv /run/out/tasks.new /run/out/tasks.txt; done' \\
    > /dev/null 2>&1 &
watch=$!
chroot $R /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin TMPDIR=/run/tmp HOME=/run/tmp \\
    PYTHONDONTWRITEBYTECODE=1 /bin/sh -c 'cd /run/tmp && /bin/sh /run/out/run.sh' \\
    > $R/run/out/run.log 2>&1
echo $? > $R/run/out/rc
kill $watch
sync
umount $R/run/out
poweroff -f
"""


class GuestError(RuntimeError):
    pass


def missing() -> str | None:
    """What this machine lacks to boot the guest (ci/setup installs it)."""
    if not (KERNEL_DIR / "vmlinuz").is_file():
        return f"no guest kernel in {KERNEL_DIR} (ci/guest-kernel fetches it)"
    if not shutil.which(QEMU):
        return f"no {QEMU} (Debian package qemu-system-x86)"
    if not BUSYBOX.is_file():
        return f"no {BUSYBOX} (Debian package busybox-static)"
    if not shutil.which("qemu-img"):
        return "no qemu-img (Debian package qemu-utils)"
    return None


def _modules() -> dict[str, Path]:
    out = {}
    for p in (KERNEL_DIR / "modules").rglob("*.ko*"):
        out[p.name.split(".ko")[0].replace("-", "_")] = p
    return out


def _ko_bytes(p: Path) -> bytes:
    data = p.read_bytes()
    if p.name.endswith(".xz"):
        return lzma.decompress(data)
    if p.name.endswith(".zst"):
        raise GuestError(f"{p}: zstd-compressed modules are not handled")
    return data


def _depends(ko: bytes) -> list[str]:
    """A module's dependencies, from its .modinfo `depends=` string."""
    i = ko.find(b"\0depends=")
    if i < 0:
        return []
    end = ko.index(b"\0", i + 1)
    return [d.replace("-", "_") for d in ko[i + 9:end].decode().split(",") if d]


# NFS's client (v3, v4) and server, and the loop driver for an image on
# the NFS mount, xfs for the server's file system (tests/vm/test_vm_nfs.py)
NFS = ["loop", "xfs", "nfsd", "nfsv3", "nfsv4", "nfs"]


def module_order(want=WANT) -> list[tuple[str, bytes]]:
    """The wanted modules and their dependencies, dependencies first; a
    module built into this kernel (not in the tree) is skipped."""
    mods, order, seen = _modules(), [], set()

    def visit(name: str) -> None:
        if name in seen or name not in mods:
            return
        seen.add(name)
        ko = _ko_bytes(mods[name])
        for d in _depends(ko):
            visit(d)
        order.append((name, ko))

    for w in want:
        visit(w)
    return order


def _cpio(entries: list[tuple[str, int, bytes]]) -> bytes:
    """A newc cpio archive of (path, mode, data) entries."""
    out = bytearray()

    def pad4() -> None:
        out.extend(b"\0" * (-len(out) % 4))

    for ino, (name, mode, data) in enumerate(entries + [("TRAILER!!!", 0, b"")], 1):
        nb = name.encode() + b"\0"
        fields = [ino, mode, 0, 0, 1, 0, len(data), 0, 0, 0, 0, len(nb), 0]
        out.extend(b"070701" + b"".join(b"%08X" % f for f in fields) + nb)
        pad4()
        out.extend(data)
        pad4()
    return bytes(out)


def initramfs(path: Path, want=WANT) -> Path:
    mods = module_order(want)
    builtin = KERNEL_DIR / "modules.builtin"
    builtin = {Path(l).name.split(".ko")[0].replace("-", "_")
               for l in builtin.read_text().split()} if builtin.is_file() else set()
    lacking = [w for w in want if w not in {n for n, _ in mods} | builtin]
    if lacking:
        raise GuestError(f"{KERNEL_DIR}: no module {', '.join(lacking)}")
    d, f, x = stat.S_IFDIR | 0o755, stat.S_IFREG | 0o644, stat.S_IFREG | 0o755
    entries = [(n, d, b"") for n in ("bin", "dev", "proc", "sys", "mod", "host")]
    entries.append(("bin/busybox", x, BUSYBOX.read_bytes()))
    entries += [(f"mod/{n}.ko", f, ko) for n, ko in mods]
    init = INIT.format(hostname=HOSTNAME, modules=" ".join(n for n, _ in mods))
    entries.append(("init", x, init.encode()))
    path.write_bytes(gzip.compress(_cpio(entries), compresslevel=1))
    return path


def boot(workdir: Path, script: str, disks: list[tuple[Path, str]], *, timeout: float = 900,
         memory_mb: int = 2048, modules=()) -> tuple[int, str, str]:
    """Boot the guest with `disks`, (image, format) pairs, as its virtio-blk
    disks (vda, vdb, ... in that order; cache=none like a production VM),
    run `script` in it, and return (its exit code, what it printed, QEMU's
    console).  `workdir/out` is the guest's /run/out: the script leaves its
    results there.  `modules`: more kernel modules to load (NFS)."""
    if why := missing():
        raise GuestError(why)
    out = workdir / "out"
    out.mkdir(parents=True, exist_ok=True)
    (out / "run.sh").write_text(script)
    (out / "rc").unlink(missing_ok=True)
    ird = initramfs(workdir / "initrd.gz", WANT + [m for m in modules if m not in WANT])
    cmd = [QEMU, "-accel", "tcg", "-cpu", "max", "-smp", "2", "-m", str(memory_mb),
           "-nographic", "-no-reboot", "-kernel", str(KERNEL_DIR / "vmlinuz"), "-initrd", str(ird),
           "-append", "console=ttyS0 quiet panic=-1",
           "-virtfs", "local,path=/,mount_tag=hostroot,security_model=passthrough,readonly=on,"
                      "multidevs=remap",
           "-virtfs", f"local,path={out},mount_tag=out,security_model=passthrough"]
    for disk, fmt in disks:
        cmd += ["-drive", f"file={disk},format={fmt},if=virtio,cache=none"]
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, errors="replace", timeout=timeout,
                           stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired as e:
        tasks = out / "tasks.txt"
        raise GuestError(f"the guest did not power off in {timeout} s: "
                         f"{(e.stdout or b'')[-2000:]!r}\nits tasks a minute or less before:\n"
                         f"{tasks.read_text(errors='replace')[-6000:] if tasks.exists() else '-'}"
                         ) from None
    log = (out / "run.log").read_text(errors="replace") if (out / "run.log").exists() else ""
    if not (out / "rc").exists():
        raise GuestError(f"the guest's script did not finish (QEMU exit {p.returncode}):\n"
                         f"{p.stdout[-3000:]}{p.stderr[-2000:]}")
    return int((out / "rc").read_text()), log, p.stdout
