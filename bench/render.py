"""See bench/render."""
from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--events", type=int, default=10_000_000)
    args = ap.parse_args()
    import nestrace
    from correlate import NT, source_capture, timed
    from nestrace.store.synth import replicate
    with tempfile.TemporaryDirectory(dir="/var/tmp") as t:
        tmp = Path(t)
        src = source_capture(tmp, "direct")
        n_src = nestrace.open(src).rows("SELECT records_total AS n FROM capture_meta")[0]["n"]
        big = tmp / "big"
        n = replicate(src, big, max(1, -(-args.events // n_src)))
        page = tmp / "report.html"
        wall, _, rss = timed(NT + ["html", str(big), "-o", str(page)])
        print(f"\n`nestrace html` on {n} events: {wall:.1f} s, peak RSS {rss:.2f} GiB, "
              f"page {page.stat().st_size / (1 << 20):.1f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
