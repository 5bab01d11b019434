"""Minimal GGUF metadata reader: the key/value header only, never the tensors.

The `gguf` package parses every field eagerly (seconds on a 262k vocabulary); this reads what we need in ~0.1 s.
"""

from __future__ import annotations

import mmap
import struct
from pathlib import Path
from typing import Any

import numpy as np

from .errors import VocabularyError

_SCALARS = {
    0: ("<B", 1),
    1: ("<b", 1),
    2: ("<H", 2),
    3: ("<h", 2),
    4: ("<I", 4),
    5: ("<i", 4),
    6: ("<f", 4),
    7: ("<?", 1),
    10: ("<Q", 8),
    11: ("<q", 8),
    12: ("<d", 8),
}
_NUMPY = {
    0: "<u1",
    1: "<i1",
    2: "<u2",
    3: "<i2",
    4: "<u4",
    5: "<i4",
    6: "<f4",
    7: "<u1",
    10: "<u8",
    11: "<i8",
    12: "<f8",
}
_STRING, _ARRAY = 8, 9


def read_gguf_metadata(path: str | Path, skip: frozenset[str] = frozenset()) -> dict[str, Any]:
    """Return the GGUF header's key/value pairs. Arrays of numbers come back as numpy arrays.

    Keys in `skip` are parsed past but not decoded (e.g. the merges list, which we do not need).
    """
    path = Path(path)
    try:
        f = open(path, "rb")
    except OSError as e:
        raise VocabularyError(f"cannot open GGUF file {path}: {e.strerror}") from e
    with f:
        if f.read(4) != b"GGUF":
            raise VocabularyError(f"{path} is not a GGUF file (no GGUF magic bytes)")
        f.seek(0)
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            return _parse(mm, path, skip)


def _parse(mm: mmap.mmap, path: Path, skip: frozenset[str]) -> dict[str, Any]:
    off = 4
    out: dict[str, Any] = {}
    try:
        version = struct.unpack_from("<I", mm, 4)[0]
        if version < 2:
            raise VocabularyError(f"{path}: GGUF version {version} is not supported (need >= 2)")
        n_kv = struct.unpack_from("<Q", mm, 16)[0]
        off = 24
        for _ in range(n_kv):
            key, off = _read_str(mm, off)
            vtype = struct.unpack_from("<I", mm, off)[0]
            off += 4
            value, off = _read_value(mm, off, vtype, decode=key not in skip)
            out[key] = value
    except (struct.error, IndexError, UnicodeDecodeError, ValueError, OverflowError, MemoryError) as e:
        raise VocabularyError(f"{path}: corrupt GGUF header at byte {off}: {e}") from e
    return out


def _read_str(mm: mmap.mmap, off: int) -> tuple[str, int]:
    n = struct.unpack_from("<Q", mm, off)[0]
    off += 8
    if off + n > len(mm):
        raise ValueError("string runs past end of file")
    return mm[off : off + n].decode("utf-8", errors="surrogateescape"), off + n


def _read_value(mm: mmap.mmap, off: int, vtype: int, decode: bool = True) -> tuple[Any, int]:
    if vtype in _SCALARS:
        fmt, size = _SCALARS[vtype]
        return struct.unpack_from(fmt, mm, off)[0], off + size
    if vtype == _STRING:
        return _read_str(mm, off)
    if vtype == _ARRAY:
        etype, n = struct.unpack_from("<IQ", mm, off)
        off += 12
        if etype in _NUMPY:
            size = _SCALARS[etype][1]
            arr = np.frombuffer(mm, dtype=_NUMPY[etype], count=n, offset=off).copy() if decode else None
            return arr, off + n * size
        if etype == _STRING:
            items: list[str] | None = [] if decode else None
            unpack = struct.unpack_from
            for _ in range(n):
                ln = unpack("<Q", mm, off)[0]
                off += 8
                if items is not None:
                    items.append(mm[off : off + ln].decode("utf-8", errors="surrogateescape"))
                off += ln
            return items, off
        values = []
        for _ in range(n):
            v, off = _read_value(mm, off, etype, decode)
            values.append(v)
        return values, off
    raise ValueError(f"unknown GGUF value type {vtype}")
