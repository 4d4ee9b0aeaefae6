"""Notebooks run against real captures; the HTML report renders in
headless Chromium without touching the network."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import nbformat
import pytest
from conftest import ROOT, loop_devices, run_cli
from nbclient import NotebookClient

import nestrace

pytestmark = pytest.mark.root

WORKLOAD = ["--rw=randrw", "--bs=4k", "--size=64M", "--io_size=4M", "--direct=1"]


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    """ext4 on xfs and ext4 on btrfs, the same small workload."""
    from nestrace.capture.matrix import record_lab
    d = tmp_path_factory.mktemp("nb")
    out = []
    for host in ("xfs", "btrfs"):
        p = d / f"ext4-on-{host}.store"
        record_lab(p, WORKLOAD, host_fs=host, name=f"nb{host}", guest_dio=False)
        out.append(p)
    return out


def run_notebook(name: str, env: dict, tmp_path: Path) -> nbformat.NotebookNode:
    # (as committed: test_notebook_files.py)
    nb = nbformat.read(ROOT / "notebooks" / name, as_version=4)
    old = dict(os.environ)
    os.environ.update(env)
    try:
        NotebookClient(nb, timeout=300, kernel_name="python3",
                       resources={"metadata": {"path": str(tmp_path)}}).execute()
    finally:
        os.environ.clear()
        os.environ.update(old)
    return nb


def test_seek_cdf_notebook_runs_on_two_host_file_systems(stores, tmp_path):
    nb = run_notebook("seek_cdf.ipynb", {"NESTRACE_STORES": ",".join(map(str, stores))}, tmp_path)
    figs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs
            if "application/vnd.plotly.v1+json" in o.get("data", {})]
    titles = [f["data"]["application/vnd.plotly.v1+json"]["layout"]["title"]["text"]
              for f in figs]
    assert titles == [f"Seek distance CDF at {lv}" for lv in ("vfs", "vdisk", "hostfs", "disk")]
    names = [t["name"] for t in figs[0]["data"]["application/vnd.plotly.v1+json"]["data"]]
    assert names == ["ext4 on xfs", "ext4 on btrfs"]
    if shutil.which("chromium"):     # the figure as a reader sees it
        import plotly.graph_objects as go
        fig = go.Figure(figs[-1]["data"]["application/vnd.plotly.v1+json"])
        page = tmp_path / "cdf.html"
        fig.write_html(page, include_plotlyjs=True)
        shot = tmp_path / "cdf.png"
        subprocess.run(CHROMIUM + [f"--user-data-dir={tmp_path / 'p'}", "--window-size=900,600",
                                   f"--screenshot={shot}", page.as_uri()],
                       capture_output=True, timeout=120)
        assert shot.stat().st_size > 20_000


def test_seek_cdf_notebook_runs_on_a_lab_run_store(tmp_path):
    """The notebook's own recipe: one store of a matrix run, one curve per
    stack, and the side-by-side table with a row per stack."""
    store = tmp_path / "matrix.store"
    run_cli("lab", "run", "-o", str(store), "--guest-fs", "ext4", "--host-fs", "xfs,btrfs",
            "--guest-dio", "off", "--", "fio", "--name=l", "--output=/dev/null", *WORKLOAD)
    nb = run_notebook("seek_cdf.ipynb", {"NESTRACE_STORES": str(store)}, tmp_path)
    figs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs
            if "application/vnd.plotly.v1+json" in o.get("data", {})]
    assert len(figs) == 4
    for fig in figs:
        names = [t["name"] for t in fig["data"]["application/vnd.plotly.v1+json"]["data"]]
        assert names == ["ext4 on xfs", "ext4 on btrfs"]
    table = next(o["data"]["text/html"] for c in nb.cells if c.cell_type == "code"
                 for o in c.outputs if "compare" in c.source and "text/html" in o.get("data", {}))
    rows = re.findall(r"<tr>\s*<th>\d+</th>\s*<td>(\w+)</td>\s*<td>(\w+)</td>", table)
    assert rows == [("ext4", "xfs"), ("ext4", "btrfs")], table


def lab_names() -> list[str]:
    from nestrace.capture.lab import labs
    return labs()


def test_notebooks_without_a_store_read_the_demo_store_or_say_what_to_run(tmp_path):
    """Neither notebook builds a stack unless asked: with no store named
    and no demo.store they stop at their first cell with what to run."""
    from nbclient.exceptions import CellExecutionError
    for name, var in (("seek_cdf.ipynb", "NESTRACE_STORES"), ("walkthrough.ipynb", "NESTRACE_STORE")):
        before = loop_devices(), lab_names()
        with pytest.raises(CellExecutionError, match="run ci/demo, which leaves demo.store"):
            run_notebook(name, {var: ""}, tmp_path)
        assert (loop_devices(), lab_names()) == before


def test_walkthrough_notebook_runs(stores, tmp_path):
    nb = run_notebook("walkthrough.ipynb", {"NESTRACE_STORE": str(stores[0])}, tmp_path)
    figs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs
            if "application/vnd.plotly.v1+json" in o.get("data", {})]
    assert len(figs) == 8
    # the slowest call, followed: its row at depth 0 heads the table
    (cell,) = [c for c in nb.cells if c.cell_type == "code" and "follow(" in c.source]
    assert cell.outputs[0]["text"] == "the slowest vfs read or write\n"
    assert re.search(r"<th>0</th>\s*<td>0</td>\s*<td>vfs</td>", cell.outputs[1]["data"]["text/html"])


CHROMIUM = ["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
            "--no-first-run", "--disable-background-networking", "--disable-component-update",
            "--disable-sync", "--virtual-time-budget=10000"]


def page_requests(page: Path, tmp: Path) -> tuple[str, list[str]]:
    """Load a page in headless Chromium; return its DOM after scripts ran and
    the network URLs the *page* asked for (Chromium's own background
    requests carry the initiator 'not an origin' and are not the page's)."""
    tmp.mkdir(parents=True, exist_ok=True)
    log = tmp / "net.json"
    dom = subprocess.run(CHROMIUM + [f"--user-data-dir={tmp / 'profile'}", f"--log-net-log={log}",
                                     "--dump-dom", page.as_uri()],
                         capture_output=True, text=True, timeout=120).stdout
    text = log.read_text().rstrip()
    if not text.endswith("}"):              # Chromium may leave the log unterminated
        text = text.rstrip(",") + "]}"
    net = json.loads(text)
    start_job = net["constants"]["logEventTypes"]["URL_REQUEST_START_JOB"]
    urls = [e["params"].get("url", "") for e in net["events"]
            if e["type"] == start_job and e["params"].get("initiator") != "not an origin"
            and e["params"].get("url", "").startswith(("http:", "https:", "ws:", "wss:"))]
    return dom, urls


@pytest.mark.skipif(not shutil.which("chromium"), reason="needs Debian's chromium")
def test_network_check_sees_a_page_that_does_fetch(tmp_path):
    page = tmp_path / "control.html"
    page.write_text("<html><body><img src='http://127.0.0.1:9/x.png'></body></html>")
    _, urls = page_requests(page, tmp_path / "c")
    assert urls == ["http://127.0.0.1:9/x.png"]


@pytest.mark.skipif(not shutil.which("chromium"), reason="needs Debian's chromium")
def test_html_report_renders_every_figure_offline_in_chromium(stores, tmp_path):
    page = tmp_path / "report.html"
    run_cli("html", *map(str, stores), "-o", str(page))
    dom, urls = page_requests(page, tmp_path / "r")
    # a seek CDF per level, the stores overlaid; seven figures per store
    figures = 4 + 7 * len(stores)
    assert len(re.findall(r'class="[^"]*js-plotly-plot', dom)) == figures
    drawn = re.findall(r">Seek distance CDF at (\w+)<", dom)
    assert drawn == ["vfs", "vdisk", "hostfs", "disk"], drawn
    assert dom.count("main-svg") >= figures           # plotly drew each one
    # nine tables per store (the files fio used and its processes among
    # them), with the slowest I/O followed, and one of the application's
    # hints where it gave some (fio's fadvise)
    hinted = sum(1 for st in stores if nestrace.open(st).hints().num_rows)
    assert dom.count("nestrace-table") == 9 * len(stores) + hinted
    assert page.read_text().count("<h3>Files: the busiest by bytes</h3>") == len(stores)
    assert page.read_text().count("<h3>Processes: the busiest by bytes</h3>") == len(stores)
    assert page.read_text().count("Followed down the stack: the slowest vfs read or write") == \
        len(stores)
    assert urls == []
    shot = tmp_path / "report.png"
    subprocess.run(CHROMIUM + [f"--user-data-dir={tmp_path / 'p2'}", "--window-size=1280,2400",
                               f"--screenshot={shot}", page.as_uri()], capture_output=True, timeout=120)
    assert shot.stat().st_size > 50_000
