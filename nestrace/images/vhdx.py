"""Where a Hyper-V vhdx image keeps each guest byte: its block allocation
table (BAT), read from the file as it is on disk.

A vhdx starts with "vhdxfile", two headers (at 64 and 128 KiB; the one
with the higher sequence number and a good CRC-32C is current), two
copies of a region table (at 192 and 256 KiB) that place the BAT and the
metadata region.  The metadata gives the block size (32 MiB by default;
QEMU's default depends on the disk's size), the disk's size, its logical
sector size and whether it has a parent.  A BAT entry per payload block
holds its state and, for a block in the file, its offset in MiB; after
every `chunk ratio` payload entries comes one for a sector bitmap, which
only a differencing disk uses.

Blocks not present, undefined, zero or unmapped have no place in the file
(zero blocks are counted); a partially present block of a differencing
disk holds only some of its sectors, the rest are the parent's: left out,
counted with the compressed ones (no one place for the block).  The BAT
is read in place, the log not replayed; a header that names a log (an
image open for writing, or not closed cleanly) makes the map `dirty`."""
from __future__ import annotations

import struct
import uuid

from nestrace.images.base import (
    ClusterMap,
    ImageMapError,
    add_run,
    coalesce,
    read_exact,
    read_file,
)

FILE_SIG = b"vhdxfile"
KiB, MiB = 1 << 10, 1 << 20
HEADERS_AT = (64 * KiB, 128 * KiB)
REGIONS_AT = (192 * KiB, 256 * KiB)
BAT = uuid.UUID("2DC27766-F623-4200-9D64-115E9BFD4A08")
METADATA = uuid.UUID("8B7CA206-4790-4B9A-B8FE-575F050F886E")
FILE_PARAMETERS = uuid.UUID("CAA16737-FA36-4D43-B3B6-33F0AA44E76B")
DISK_SIZE = uuid.UUID("2FA54224-CD1B-4876-B211-5DBED83BF4B8")
LOGICAL_SECTOR = uuid.UUID("8141BF1D-A96F-4709-BA47-F233A8FAAB5F")
PARENT_LOCATOR = uuid.UUID("A8D35F2D-B30B-454D-ABF7-D3D84834AB0C")
ZERO, FULLY_PRESENT, PARTIALLY_PRESENT = 2, 6, 7
HAS_PARENT = 2


class VhdxError(ImageMapError):
    pass


def _crc32c_table() -> list[int]:
    table = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    return table


_CRC32C = _crc32c_table()


def crc32c(data: bytes) -> int:
    """CRC-32C (Castagnoli), as vhdx checksums its headers and tables."""
    c = 0xFFFFFFFF
    for b in data:
        c = _CRC32C[(c ^ b) & 0xFF] ^ (c >> 8)
    return c ^ 0xFFFFFFFF


def _checked(buf: bytes, sig: bytes) -> bool:
    """A header or table with its signature and a good checksum (bytes 4-8,
    computed with them zeroed)."""
    if buf[:4] != sig:
        return False
    stored, = struct.unpack_from("<I", buf, 4)
    return crc32c(buf[:4] + bytes(4) + buf[8:]) == stored


def bat_map(path: str) -> ClusterMap:
    """Read the block map of the vhdx image at `path`."""
    return read_file(path, _bat_map, VhdxError)


def _read(fd: int, path: str, offset: int, n: int) -> bytes:
    return read_exact(fd, path, offset, n, VhdxError)


def _current_header(fd: int, path: str) -> tuple[int, bytes]:
    good = [(struct.unpack_from("<Q", h, 8)[0], at, h)
            for at in HEADERS_AT if _checked(h := _read(fd, path, at, 4 * KiB), b"head")]
    if not good:
        raise VhdxError(f"{path}: offset {HEADERS_AT[0]}: neither header (at {HEADERS_AT[0]} "
                        f"and {HEADERS_AT[1]}) has its signature and a good checksum")
    _, at, h = max(good)
    return at, h


def _regions(fd: int, path: str) -> dict[uuid.UUID, tuple[int, int]]:
    for at in REGIONS_AT:
        t = _read(fd, path, at, 64 * KiB)
        if not _checked(t, b"regi"):
            continue
        n, = struct.unpack_from("<I", t, 8)
        if n > 2047:
            raise VhdxError(f"{path}: offset {at + 8}: {n} region table entries (at most 2047)")
        out = {}
        for i in range(n):
            g = uuid.UUID(bytes_le=t[16 + 32 * i:32 + 32 * i])
            off, length, required = struct.unpack_from("<QII", t, 32 + 32 * i)
            if g not in (BAT, METADATA) and required & 1:
                raise VhdxError(f"{path}: offset {at + 16 + 32 * i}: a required region {g} "
                                "nestrace does not know")
            out[g] = (off, length)
        for g, name in ((BAT, "BAT"), (METADATA, "metadata")):
            if g not in out:
                raise VhdxError(f"{path}: offset {at}: the region table has no {name} region")
        return out
    raise VhdxError(f"{path}: offset {REGIONS_AT[0]}: neither region table (at {REGIONS_AT[0]} "
                    f"and {REGIONS_AT[1]}) has its signature and a good checksum")


def _metadata(fd: int, path: str, at: int, length: int) -> dict[uuid.UUID, bytes]:
    t = _read(fd, path, at, 64 * KiB)
    if t[:8] != b"metadata":
        raise VhdxError(f"{path}: offset {at}: not a metadata table (signature {t[:8]!r})")
    n, = struct.unpack_from("<H", t, 10)
    if n > 2047:
        raise VhdxError(f"{path}: offset {at + 10}: {n} metadata entries (at most 2047)")
    items = {}
    for i in range(n):
        e = 32 + 32 * i
        g = uuid.UUID(bytes_le=t[e:e + 16])
        off, ln = struct.unpack_from("<II", t, e + 16)
        if off + ln > length:
            raise VhdxError(f"{path}: offset {at + e + 16}: metadata item {g} at {off}+{ln} "
                            f"past the region's {length} bytes")
        items[g] = _read(fd, path, at + off, ln)
    for g, name in ((FILE_PARAMETERS, "file parameters"), (DISK_SIZE, "virtual disk size"),
                    (LOGICAL_SECTOR, "logical sector size")):
        if g not in items:
            raise VhdxError(f"{path}: offset {at}: the metadata has no {name}")
    return items


def _parent_path(locator: bytes) -> str:
    """The parent's path in a parent locator (its relative path, else an
    absolute one), '' if it names none."""
    n, = struct.unpack_from("<H", locator, 18)
    kv = {}
    for i in range(n):
        ko, vo, kl, vl = struct.unpack_from("<IIHH", locator, 20 + 12 * i)
        kv[locator[ko:ko + kl].decode("utf-16-le", "replace")] = \
            locator[vo:vo + vl].decode("utf-16-le", "replace")
    return next((kv[k] for k in ("relative_path", "absolute_win32_path", "volume_path")
                 if kv.get(k)), "")


def _bat_map(fd: int, path: str) -> ClusterMap:
    sig = _read(fd, path, 0, 8)
    if sig != FILE_SIG:
        raise VhdxError(f"{path}: offset 0: not a vhdx image (signature {sig!r})")
    hat, h = _current_header(fd, path)
    log_guid = h[48:64]
    version, log_len, log_off = struct.unpack_from("<HIQ", h, 66)
    if version != 1:
        raise VhdxError(f"{path}: offset {hat + 66}: vhdx version {version} (1 is read)")
    regions = _regions(fd, path)
    (bat_off, bat_len), (meta_off, meta_len) = regions[BAT], regions[METADATA]
    items = _metadata(fd, path, meta_off, meta_len)
    block, flags = struct.unpack("<II", items[FILE_PARAMETERS][:8])
    size, = struct.unpack("<Q", items[DISK_SIZE][:8])
    sector, = struct.unpack("<I", items[LOGICAL_SECTOR][:4])
    if block < MiB or block > 256 * MiB or block & (block - 1):
        raise VhdxError(f"{path}: offset {meta_off}: block size {block} (a power of two, "
                        "1 to 256 MiB)")
    if sector not in (512, 4096):
        raise VhdxError(f"{path}: offset {meta_off}: logical sector size {sector}")
    chunk = (1 << 23) * sector // block
    n_payload = -(-size // block)
    n_entries = n_payload + (n_payload - 1) // chunk    # up to the last payload entry
    if 8 * n_entries > bat_len:
        raise VhdxError(f"{path}: offset {bat_off}: a BAT of {bat_len} bytes for "
                        f"{n_entries} entries")
    bat = struct.unpack(f"<{n_entries}Q", _read(fd, path, bat_off, 8 * n_entries))
    extents: list[list[int]] = []
    zeros = partial = 0
    for i in range(n_payload):
        e = bat[i + i // chunk]
        state, at = e & 7, (e >> 20) * MiB
        if state == ZERO:
            zeros += 1
        elif state == PARTIALLY_PRESENT:
            partial += 1
        elif state == FULLY_PRESENT:
            add_run(extents, i * block, at, min(block, size - i * block))
    parent = _parent_path(items[PARENT_LOCATOR]) if flags & HAS_PARENT and \
        PARENT_LOCATOR in items else ""
    return ClusterMap(path=path, version=version, cluster_bytes=block, virtual_bytes=size,
                      extents=[tuple(x) for x in extents], zero_clusters=zeros,
                      compressed_clusters=partial, backing_file=parent,
                      dirty=log_guid != bytes(16),
                      metadata=coalesce([(0, 320 * KiB), (log_off, log_len),
                                         (bat_off, bat_len), (meta_off, meta_len)]),
                      fmt="vhdx")
