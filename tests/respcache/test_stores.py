"""Stores: the same behaviour on SQLite, Redis (a real redis-server) and memory; SQLite across processes."""

from __future__ import annotations

import multiprocessing as mp
import sqlite3
import time

import pytest

from tokenseam.respcache import CacheStoreError, MemoryStore, RedisStore, SQLiteStore, open_store
from tokenseam.respcache.stores.base import check_value, encode_value


@pytest.fixture(params=["memory", "sqlite", "redis"])
def make_store(request, tmp_path):
    made = []

    def make(**kw):
        if request.param == "memory":
            s = MemoryStore(max_entries=kw.get("max_entries"), default_ttl=kw.get("default_ttl"))
        elif request.param == "sqlite":
            s = SQLiteStore(tmp_path / f"c{len(made)}.sqlite", **kw)
        else:
            url = request.getfixturevalue("redis_url")
            s = RedisStore(url, prefix=f"t{time.monotonic_ns()}:", **kw)
        made.append(s)
        return s

    make.kind = request.param
    yield make
    for s in made:
        s.clear()
        s.close()


def test_roundtrip_json_values(make_store):
    s = make_store()
    value = {"a": [1, 2.5, "é", None, True], "b": {"c": "\u65e5\u672c"}}
    s.put("k1", value)
    assert s.get("k1") == value
    assert s.get("missing") is None
    s.put("k1", {"v": 2})
    assert s.get("k1") == {"v": 2} and s.count() == 1
    s.delete("k1")
    assert s.get("k1") is None and s.count() == 0


def test_lone_surrogates_survive(make_store):
    s = make_store()
    s.put("k", {"t": "a\ud800b"})
    assert s.get("k") == {"t": "a\ud800b"}


def test_values_must_be_json_objects(make_store):
    s = make_store()
    for bad in ([1, 2], "text", {"x": {1, 2}}, {"x": float("nan")}, {"f": object()}):
        with pytest.raises(CacheStoreError):
            s.put("k", bad)
    assert s.get("k") is None


def test_ttl_expiry(make_store):
    s = make_store()
    s.put("short", {"v": 1}, ttl_seconds=0.2)
    s.put("long", {"v": 2}, ttl_seconds=60)
    assert s.get("short") == {"v": 1}
    time.sleep(0.45)
    assert s.get("short") is None
    assert s.get("long") == {"v": 2}
    d = make_store(default_ttl=0.2)
    d.put("x", {"v": 3})
    time.sleep(0.45)
    assert d.get("x") is None


def test_max_entries_evicts_oldest(make_store):
    s = make_store(max_entries=3)
    for i in range(5):
        s.put(f"k{i}", {"i": i})
        time.sleep(0.002)  # distinct write times
    assert s.count() == 3
    assert s.get("k0") is None and s.get("k1") is None
    assert [s.get(f"k{i}") for i in (2, 3, 4)] == [{"i": 2}, {"i": 3}, {"i": 4}]


def test_corrupt_values_read_as_miss_and_are_removed(make_store):
    s = make_store()
    for n, raw in enumerate(["{not json", "[1,2]", '"str"', "\udcff"]):
        key = f"bad{n}"
        if make_store.kind == "redis":
            s._r.set(s._key(key), raw.encode("utf-8", "surrogateescape"))
        elif make_store.kind == "sqlite":
            s.put_raw(key, raw.encode("utf-8", "surrogateescape"))
        else:
            s.put_raw(key, raw)
        assert s.get(key) is None
        assert s.get(key) is None  # removed, not re-parsed forever
    assert s.corrupt >= 3


def test_memory_lru_and_byte_budget():
    s = MemoryStore(max_entries=2)
    s.put("a", {"v": 1})
    s.put("b", {"v": 2})
    s.get("a")  # a is now most recent
    s.put("c", {"v": 3})
    assert s.get("b") is None and s.get("a") == {"v": 1}
    one = len(encode_value({"payload": "x" * 10}))  # stored size, seal included
    m = MemoryStore(max_entries=None, max_bytes=3 * one)
    for i in range(5):
        m.put(f"k{i}", {"payload": "x" * 10})
    assert m.count() == 3 and m.get("k4") is not None and m.get("k1") is None


def test_sqlite_byte_budget(tmp_path):
    one = len(encode_value({"payload": "y" * 30}))
    s = SQLiteStore(tmp_path / "b.sqlite", max_bytes=3 * one + 10)
    for i in range(10):
        s.put(f"k{i}", {"payload": "y" * 30})
        time.sleep(0.002)
    assert s.count() == 3 and s.get("k9") is not None and s.get("k6") is None


def test_sqlite_is_wal_and_shared_between_instances(tmp_path):
    p = tmp_path / "w.sqlite"
    a, b = SQLiteStore(p), SQLiteStore(p)
    a.put("x", {"v": 1})
    assert b.get("x") == {"v": 1}
    mode = sqlite3.connect(p).execute("PRAGMA journal_mode").fetchone()[0]
    assert mode.lower() == "wal"


def _writer(path: str, worker: int, n: int) -> None:
    s = SQLiteStore(path)
    for i in range(n):
        s.put(f"w{worker}-{i}", {"worker": worker, "i": i, "pad": "z" * 200})
        # Everyone also rewrites a shared key: contention on the same row.
        s.put("shared", {"worker": worker, "i": i})
    s.close()


def test_sqlite_many_processes_write_without_losing_entries(tmp_path):
    path = str(tmp_path / "mp.sqlite")
    SQLiteStore(path).close()
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_writer, args=(path, w, 60)) for w in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    s = SQLiteStore(path)
    assert s.count() == 4 * 60 + 1
    for w in range(4):
        for i in range(60):
            assert s.get(f"w{w}-{i}") == {"worker": w, "i": i, "pad": "z" * 200}
    assert s.get("shared")["i"] == 59


def test_sqlite_unusable_path_raises_store_error(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(CacheStoreError, match="SQLite cache"):
        SQLiteStore(blocker / "sub" / "c.sqlite")
    # Someone else's database at the path is refused, never moved aside (a corrupt one is: test_integrity_sqlite).
    foreign = tmp_path / "foreign.sqlite"
    conn = sqlite3.connect(foreign)
    conn.execute("CREATE TABLE entries (id INTEGER, name TEXT)")
    conn.commit()
    conn.close()
    with pytest.raises(CacheStoreError, match="not a tokenseam response cache"):
        SQLiteStore(foreign)
    assert foreign.exists() and not list(tmp_path.glob("foreign.sqlite.corrupt-*"))


def test_redis_down_raises_store_error_quickly():
    from .conftest import free_port

    s = RedisStore(f"redis://127.0.0.1:{free_port()}/0", connect_timeout=0.3, socket_timeout=0.3)
    t0 = time.monotonic()
    for op in (lambda: s.get("k"), lambda: s.put("k", {"v": 1}), s.ping):
        with pytest.raises(CacheStoreError, match="Redis cache"):
            op()
    assert time.monotonic() - t0 < 30  # bounded, not a hang


def test_open_store_specs(tmp_path, redis_url):
    assert isinstance(open_store("memory"), MemoryStore)
    assert isinstance(open_store(f"sqlite:{tmp_path / 'x.sqlite'}"), SQLiteStore)
    r = open_store(redis_url)
    assert isinstance(r, RedisStore)
    r.ping()
    for bad in ("mysql://x", "", "redis:/nohost", "memcached"):
        with pytest.raises(CacheStoreError, match="unknown cache store"):
            open_store(bad)


def test_check_value_accepts_only_sealed_objects():
    def decode(raw):
        return check_value(raw, None)[0]

    assert decode(encode_value({"a": 1})) == {"a": 1}
    assert decode(encode_value({"a": 1}).encode()) == {"a": 1}
    # Plain JSON (what earlier versions stored) is not trusted: nothing shows it is what was written.
    assert decode(b'{"a":1}') is None
    assert decode(b"[1]") is None and decode(b"\xff\xfe") is None and decode("") is None
