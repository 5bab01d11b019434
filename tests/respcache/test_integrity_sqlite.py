"""A corrupt SQLite cache file: moved aside at start, or detected on read and replaced while running; requests
keep being answered, and health says what happened."""

from __future__ import annotations

import asyncio
import logging
import os
import random
import sqlite3

import pytest

from tokenseam.respcache import ROUTE_CHAT, CacheStoreError, ResponseCache, SQLiteStore

ROWS = 3000


def body(text, **kw):
    return {"model": "m", "messages": [{"role": "user", "content": text}], "temperature": 0, **kw}


async def gen(req):
    return {
        "id": "x",
        "object": "chat.completion",
        "created": 1,
        "model": "m",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "re:" + req["messages"][0]["content"]},
                "finish_reason": "stop",
            }
        ],
    }


def aside_files(path, with_logs=False):
    """Names of the moved-aside databases (and their -wal/-shm with `with_logs`)."""
    return sorted(
        p.name
        for p in path.parent.glob(path.name + ".corrupt-*")
        if with_logs or not p.name.endswith(("-wal", "-shm"))
    )


def filled_db(path, rows=ROWS):
    """A real cache file with many rows, checkpointed so that every page is in the main file."""
    s = SQLiteStore(path)
    for i in range(rows):
        s.put(f"k{i:05d}", {"i": i, "pad": "p" * 300})
    s.close()
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()


def scribble(path, fraction=0.5, length=64 * 1024, seed=7):
    size = os.path.getsize(path)
    with open(path, "r+b") as f:
        f.seek(int(size * fraction))
        f.write(random.Random(seed).randbytes(length))


def test_random_bytes_file_is_moved_aside_with_its_wal_and_shm(tmp_path, caplog, registry):
    path = tmp_path / "c.sqlite"
    path.write_bytes(random.Random(1).randbytes(50_000))
    (tmp_path / "c.sqlite-wal").write_bytes(b"old log")
    (tmp_path / "c.sqlite-shm").write_bytes(b"old shm")
    with caplog.at_level(logging.WARNING, logger="tokenseam.respcache.stores"):
        s = SQLiteStore(path)
    aside = aside_files(path, with_logs=True)
    assert len(aside) == 3 and {a.rsplit("-", 1)[-1] for a in aside if a.endswith(("-wal", "-shm"))} == {
        "wal",
        "shm",
    }
    base = next(a for a in aside if not a.endswith(("-wal", "-shm")))
    assert (tmp_path / base).read_bytes() == random.Random(1).randbytes(50_000)
    assert (tmp_path / (base + "-wal")).read_bytes() == b"old log"
    assert "not a database" in caplog.text and "moved aside" in caplog.text
    s.put("k", {"v": 1})
    assert s.get("k") == {"v": 1}
    assert s.status()["recoveries"] == 1 and s.status()["moved_aside"].endswith(base)
    cache = ResponseCache(s, registry=registry)
    h = cache.health()
    assert h["ok"] is True and h["store_recoveries"] == 1 and h["entries"] == 1
    assert registry.get_sample_value("tokenseam_respcache_store_recoveries_total") == 1


def test_scribbled_pages_are_found_at_start(tmp_path):
    path = tmp_path / "c.sqlite"
    filled_db(path)
    scribble(path)
    s = SQLiteStore(path)
    assert len(aside_files(path)) == 1 and s.status()["recoveries"] == 1
    assert s.count() == 0 and s.get("k00001") is None
    s.put("new", {"v": 2})
    assert s.get("new") == {"v": 2}
    # The moved file is the damaged one (kept for inspection), not a copy of the fresh one.
    moved = sqlite3.connect(tmp_path / aside_files(path)[0])
    try:
        assert moved.execute("PRAGMA quick_check").fetchone()[0] != "ok"
    except sqlite3.DatabaseError as e:
        assert "malformed" in str(e)
    finally:
        moved.close()


def test_an_intact_file_is_kept(tmp_path):
    path = tmp_path / "c.sqlite"
    filled_db(path, rows=50)
    s = SQLiteStore(path)
    assert s.count() == 50 and not aside_files(path) and s.status()["recoveries"] == 0


def test_scribbled_pages_found_on_read_recover_while_requests_are_served(tmp_path, registry):
    path = tmp_path / "c.sqlite"
    filled_db(path)
    scribble(path, length=256 * 1024)
    s = SQLiteStore(path, check_on_open=False, recover_after_errors=3)
    assert not aside_files(path)
    cache = ResponseCache(s, registry=registry, store_retry_seconds=0)
    statuses, degraded_seen = [], False

    async def go():
        nonlocal degraded_seen
        for i in range(ROWS):
            # Read every stored key: some rows sit on scribbled pages.
            try:
                s.get(f"k{i:05d}")
            except CacheStoreError:
                h = cache.health()
                if s.status()["recoveries"] == 0:
                    degraded_seen = degraded_seen or (
                        h["degraded"] and not h["ok"] and "malformed" in h["error"]
                    )
            if s.status()["recoveries"]:
                break
        for n in range(5):
            r = await cache.respond(cache.plan(ROUTE_CHAT, body(f"q{n % 2}")), gen)
            statuses.append(r.status)

    asyncio.run(go())
    assert s.status()["recoveries"] == 1 and len(aside_files(path)) == 1
    assert degraded_seen  # between the first corruption error and the recovery, health said so
    assert statuses == ["miss", "miss", "hit", "hit", "hit"]  # the fresh file works
    h = cache.health()
    assert h["ok"] is True and h["degraded"] is False and h["store_recoveries"] == 1 and h["entries"] == 2
    assert registry.get_sample_value("tokenseam_respcache_store_recoveries_total") == 1


def test_requests_through_a_corrupt_file_are_generated_then_cached_again(tmp_path, registry):
    path = tmp_path / "c.sqlite"
    filled_db(path)
    with open(path, "r+b") as f:
        # Page 2 onwards (the table's root, the index, every row); page 1 (header, schema) stays readable.
        f.seek(4096)
        f.write(random.Random(3).randbytes(os.path.getsize(path) - 4096))
    s = SQLiteStore(path, check_on_open=False, recover_after_errors=2)
    cache = ResponseCache(s, registry=registry, store_retry_seconds=0)
    calls = []

    async def counted(req):
        calls.append(req)
        return await gen(req)

    async def go():
        return [(await cache.respond(cache.plan(ROUTE_CHAT, body("same")), counted)).status for _ in range(4)]

    statuses = asyncio.run(go())
    # The first read fails (passed through); the second reaches the threshold, the file is replaced and the read
    # retried there (a miss); then the answer is stored and served.
    assert statuses == ["bypass", "miss", "hit", "hit"] and len(calls) == 2
    assert s.status()["recoveries"] == 1 and cache.stats["store_errors"] == 1


def test_a_recovery_by_another_process_is_followed(tmp_path):
    path = tmp_path / "c.sqlite"
    a = SQLiteStore(path, moved_check_seconds=0)
    a.put("k", {"v": 1})
    # Another process replaces the file (as its recovery would): `a` must not keep writing to the old one.
    os.replace(path, tmp_path / "elsewhere.sqlite")
    for suffix in ("-wal", "-shm"):
        if os.path.exists(f"{path}{suffix}"):
            os.replace(f"{path}{suffix}", f"{tmp_path / 'elsewhere.sqlite'}{suffix}")
    b = SQLiteStore(path)
    b.put("fresh", {"v": 2})
    assert a.get("fresh") == {"v": 2} and a.get("k") is None
    a.put("from-a", {"v": 3})
    assert b.get("from-a") == {"v": 3}


def test_two_stores_see_one_recovery(tmp_path):
    path = tmp_path / "c.sqlite"
    filled_db(path)
    scribble(path, length=256 * 1024)
    a = SQLiteStore(path, check_on_open=False, recover_after_errors=1, moved_check_seconds=0)
    b = SQLiteStore(path, check_on_open=False, recover_after_errors=1, moved_check_seconds=0)
    for i in range(ROWS):
        try:
            a.get(f"k{i:05d}")
        except CacheStoreError:
            pass  # a damaged row: with recover_after_errors=1 the file is replaced right away
        if a.status()["recoveries"]:
            break
    assert a.status()["recoveries"] == 1
    a.put("after", {"v": 1})
    assert b.get("after") == {"v": 1}  # b noticed the replaced file instead of reading the corrupt one
    assert len(aside_files(path)) == 1 and b.status()["recoveries"] == 0


def test_health_reports_degraded_until_recovered(tmp_path, registry):
    path = tmp_path / "c.sqlite"
    filled_db(path)
    scribble(path, length=256 * 1024)
    s = SQLiteStore(path, check_on_open=False, recover_after_errors=1000)
    cache = ResponseCache(s, registry=registry, store_retry_seconds=0)
    failed = 0
    for i in range(ROWS):
        try:
            s.get(f"k{i:05d}")
        except CacheStoreError:
            failed += 1
    assert failed > 0
    s.ping()  # SELECT 1 works on a damaged file: health must not rely on it alone
    h = cache.health()
    assert h["ok"] is False and h["degraded"] is True and h["error"]
    assert s.status()["degraded"] is True and s.status()["errors"] >= failed


def test_other_sqlite_errors_are_not_mistaken_for_corruption(tmp_path):
    path = tmp_path / "c.sqlite"
    s = SQLiteStore(path, busy_timeout_ms=50, recover_after_errors=1)
    s.put("k", {"v": 1})
    blocker = sqlite3.connect(path, isolation_level=None, timeout=0)
    blocker.execute("BEGIN EXCLUSIVE")
    try:
        with pytest.raises(CacheStoreError, match="locked"):
            s.put("k2", {"v": 2})
    finally:
        blocker.execute("ROLLBACK")
        blocker.close()
    assert s.status()["recoveries"] == 0 and not aside_files(path) and s.get("k") == {"v": 1}


def test_open_store_starts_on_a_corrupt_file(tmp_path):
    # `tokenseam serve` and `tokenseam gateway` build their store with open_store: a corrupt file must not stop them.
    path = tmp_path / "cli.sqlite"
    path.write_bytes(b"\x00garbage" * 1000)
    from tokenseam.respcache import open_store

    s = open_store(f"sqlite:{path}")
    s.put("k", {"v": 1})
    assert s.get("k") == {"v": 1} and len(aside_files(path)) == 1
