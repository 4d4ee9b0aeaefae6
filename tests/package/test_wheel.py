"""The wheel works outside the checkout: built by ci/wheel, installed into
a fresh venv, and used with the checkout hidden under an empty tmpfs (in a
mount namespace of its own), so that nothing can read it."""
from __future__ import annotations

import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from conftest import ROOT, loop_devices, our_mounts

pytestmark = pytest.mark.root

LAB = "wheel"

# Run by bash in a mount namespace of its own: the checkout is covered by
# an empty tmpfs first.  A lab stack, a four-level capture of fio under
# `record`, the queries and pages on it; a guest capture by the agent alone
# while the host side records, imported and merged.
SCENARIO = r"""
set -euo pipefail
mount -t tmpfs -o size=1M,mode=0500 nestrace-checkout-hidden "$CHECKOUT"
[ -z "$(ls -A "$CHECKOUT")" ]
cd "$WORK"
NT="$VENV/bin/nestrace"
trap '"$NT" lab down --name wheel >/dev/null 2>&1 || true' EXIT
"$NT" --version
"$VENV/bin/python" -c "from nestrace.importers import compiled; compiled._lib()"
MP=$("$NT" lab up --name wheel --guest-fs ext4 --host-fs xfs --image-size 256M)
fio --name=w --directory="$MP" --size=32M --rw=write --bs=1M --direct=1 --ioengine=psync \
    --output=/dev/null
"$NT" record -o four.store --stack "$MP" -- fio --name=w --directory="$MP" --rw=randread \
    --bs=4k --direct=1 --size=32M --io_size=4M --ioengine=psync --output=/dev/null
"$NT" sql four.store --csv "SELECT level, count(*) AS n FROM (
    SELECT level FROM vfs_io UNION ALL SELECT level FROM vdisk_io
    UNION ALL SELECT level FROM hostfs_io UNION ALL SELECT level FROM disk_io)
    GROUP BY level ORDER BY level" > levels.csv
"$NT" correlate four.store > /dev/null
"$NT" report four.store --json > report.json
"$NT" html four.store -o page.html > /dev/null
# the VM shape: the host side records while the agent alone records the guest
loop=$(findmnt -no SOURCE "$MP")
image=$(cat "/sys/block/${loop#/dev/}/loop/backing_file")
"$NT" record -o host.store --side host --image "$image" 2> host.err &
host=$!
until grep -q '^nestrace: recording' host.err; do
    kill -0 $host 2>/dev/null || { cat host.err >&2; exit 1; }
    sleep 0.1
done
"$VENV_DATA/bin/nestrace-agent" --guest "$MP" --guest-capture gdir -- fio --name=w \
    --directory="$MP" --rw=randread --bs=4k --direct=1 --size=32M --io_size=2M \
    --ioengine=psync --output=/dev/null 2> agent.err
kill -INT $host
wait $host
"$NT" import gdir -o guest.store > /dev/null
"$NT" merge guest.store host.store -o merged.store > /dev/null
"$NT" sql merged.store --csv "SELECT count(*) AS links FROM links WHERE kind = 'sync' AND upper_level = 'vdisk' AND lower_level = 'hostfs'" \
    > merged.csv
"$NT" lab down --name wheel
"""


def test_wheel_installs_and_captures_four_levels_without_the_checkout(tmp_path):
    before = loop_devices(), our_mounts()
    built = subprocess.run([str(ROOT / "ci" / "wheel"), str(tmp_path / "dist")],
                           capture_output=True, text=True, cwd=ROOT)
    assert built.returncode == 0, built.stderr
    wheel = Path(built.stdout.splitlines()[-1])
    print(f"{wheel.name}: {wheel.stat().st_size} bytes")
    print(built.stdout)
    assert "manylinux" in wheel.name and "-py3-none-" in wheel.name
    assert "requires no external shared libraries" in built.stdout
    names = zipfile.ZipFile(wheel).namelist()
    for part in ("nestrace/_data/bin/nestrace-agent", "nestrace/_data/bpf/block.bpf.o",
                 "nestrace/_data/lib/libnestrace-readers.so",
                 "nestrace/_data/sql/block/requests.sql", "nestrace/_data/schemas/records.toml",
                 "nestrace/_data/build_id", "nestrace/query/session.py"):
        assert part in names, part

    venv = tmp_path / "venv"
    subprocess.run([sys._base_executable, "-m", "venv", str(venv)], check=True)
    pip = subprocess.run([str(venv / "bin" / "pip"), "install", "-q", str(wheel)],
                         capture_output=True, text=True)
    assert pip.returncode == 0, pip.stderr
    site = subprocess.run([str(venv / "bin" / "python"), "-c",
                           "import nestrace._paths as p; print(p.PACKAGE); print(p.INSTALLED)"],
                          capture_output=True, text=True, cwd=tmp_path, check=True).stdout.split()
    assert Path(site[0]).is_relative_to(venv) and site[1] == "True", site

    work = tmp_path / "work"
    work.mkdir()
    env = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
           "CHECKOUT": str(ROOT), "WORK": str(work), "VENV": str(venv),
           "VENV_DATA": site[0] + "/_data",
           "NESTRACE_LAB_STATE": str(tmp_path / "labs"),
           "NESTRACE_LAB_DATA": str(tmp_path / "labdata"), "HOME": str(tmp_path)}
    try:
        r = subprocess.run(["unshare", "--mount", "--propagation", "private", "bash", "-c",
                            SCENARIO], capture_output=True, text=True, env=env, timeout=600)
    finally:
        # (the scenario's trap tears the lab down; a leak fails below)
        after = loop_devices(), our_mounts()
    assert r.returncode == 0, r.stdout + r.stderr
    print(r.stdout)
    version = r.stdout.splitlines()[:2]
    assert version[0].startswith("nestrace ") and f"({venv}" in version[1], version
    levels = dict(line.split(",") for line in (work / "levels.csv").read_text().split()[1:])
    print("rows per level:", levels)
    assert set(levels) == {"vfs", "vdisk", "hostfs", "disk"} and min(map(int, levels.values())) > 0
    report = json.loads((work / "report.json").read_text())
    assert report["capture_id"]
    assert (work / "page.html").stat().st_size > 10_000
    merged_links = int((work / "merged.csv").read_text().split()[1])
    print("merged direct links:", merged_links)
    assert merged_links > 0
    assert (loop_devices(), our_mounts()) == before, after
