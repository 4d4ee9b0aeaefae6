"""The importers' compiled loops (tracers/readers.c): found, refused when
missing or of another ABI with a one-line error naming the file, and the
record walk hands damage back to the Python walk, which names it."""
from __future__ import annotations

import struct

import numpy as np
import pytest

from nestrace import _paths
from nestrace.importers import blktrace, compiled


def test_a_checkout_without_the_build_is_told_to_build_it(tmp_path, monkeypatch):
    monkeypatch.setattr(_paths, "ROOT", tmp_path)
    monkeypatch.setattr(_paths, "INSTALLED", False)
    with pytest.raises(_paths.ReadersNotFound) as e:
        _paths.readers_path()
    msg = str(e.value)
    assert "\n" not in msg and str(tmp_path / "tracers" / "build") in msg
    assert "make -C tracers" in msg


def record(seq: int, t: int, sector: int, pdu: bytes = b"", action: int = 1) -> bytes:
    return blktrace.HEADER.pack(blktrace.MAGIC | blktrace.VERSION, seq, t, sector, 4096,
                                action | (1 << 16), 7, (8 << 20) | 1, 0, 0, len(pdu)) + pdu


def test_the_walk_gives_every_header_field_as_the_format_lays_it(tmp_path):
    data = b"".join(record(i + 1, 1000 * i, 8 * i, b"x" * (i % 3)) for i in range(50))
    h = compiled.blk_index(data)
    assert h is not None and len(h["offset"]) == 50
    rows = np.frombuffer(b"".join(data[o:o + 48] for o in h["offset"].tolist()),
                         blktrace.DTYPE)
    for name in blktrace.DTYPE.names[1:]:
        assert np.array_equal(h[name], rows[name]), name
    assert h["offset"][1] == 48 and h["pdu_len"].tolist()[:3] == [0, 1, 2]


@pytest.mark.parametrize("damage, where", [
    (lambda d: d[:96] + b"\0" * 4 + d[100:], 96),                # a magic overwritten
    (lambda d: d[:-10], 48 * 9),                                  # the last one cut short
    (lambda d: d[:48 * 3 + 46] + struct.pack("=H", 1000) + d[48 * 3 + 48:], 48 * 3),
])
def test_damage_goes_back_to_the_python_walk_that_names_it(tmp_path, damage, where):
    data = damage(b"".join(record(i + 1, 1000 * i, 8 * i) for i in range(10)))
    assert compiled.blk_index(data) is None
    f = tmp_path / "d.blktrace.0"
    f.write_bytes(data)
    t, problems = blktrace.read_tolerant(f)
    assert problems and problems[0].startswith(f"{f}: byte {where}:"), problems
    assert t.num_rows >= 7
