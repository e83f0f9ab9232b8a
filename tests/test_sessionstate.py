"""sessionstate: summary_buffer's per-session records in SQLite and in a real redis-server.

The contract tests run on both backends, each with two state objects on one
store (two replicas): leases, fences, the version compare-and-set, expiry.
SQLite's clock is injected; Redis keeps time itself, so its leases are
given a short PX and the test waits until Redis has dropped the key.
"""
import os
import socket
import sqlite3
import stat
import threading
import time
import uuid

import pytest
from conftest import ManualClock

from _ragproxy import sessionstate
from _ragproxy.sessionstate import RedisState, RespClient, SqliteState, StateUnavailable, Stored


def Clock(now=1_000_000.0):
    return ManualClock(now)


def raw_client(server, db=0):
    return RespClient("127.0.0.1", server.port, server.password, None, db)


class Pair:
    """Two replicas on one store, and a way to let a lease run out."""

    def __init__(self, backend, a, b, clock=None, server=None):
        self.backend, self.a, self.b, self.clock, self.server = backend, a, b, clock, server

    def lease_runs_out(self, key, seconds):
        if self.clock is not None:
            self.clock.advance(seconds + 0.001)
            return
        client = raw_client(self.server)
        try:
            deadline = time.monotonic() + 10
            while client.call("EXISTS", sessionstate.KEY_PREFIX + "{" + key + "}:lease") == 1:
                assert time.monotonic() < deadline, "Redis never expired the lease"
                time.sleep(0.01)
        finally:
            client.close()

    def close(self):
        self.a.close()
        self.b.close()


@pytest.fixture(params=["sqlite", "redis"])
def pair(request, tmp_path):
    if request.param == "sqlite":
        clock = Clock()
        path = str(tmp_path / "state.sqlite3")
        p = Pair("sqlite", SqliteState(path, ttl=3600, clock=clock), SqliteState(path, ttl=3600, clock=clock),
                 clock=clock)
    else:
        server = request.getfixturevalue("redis_server")
        p = Pair("redis", RedisState(server.url, ttl=3600), RedisState(server.url, ttl=3600), server=server)
    yield p
    p.close()


def short_lease(pair):
    """A lease that runs out soon: in SQLite's injected time any length will do; Redis counts real ms."""
    return 60.0 if pair.backend == "sqlite" else 0.05


def key():
    return uuid.uuid4().hex


# -- the contract, on both backends ----------------------------------------------

def test_a_record_written_under_a_lease_is_read_by_the_other_replica(pair):
    k = key()
    assert pair.a.get(k) == Stored()
    token = pair.a.acquire(k, 30)
    assert token
    assert pair.a.put(k, token, 0, "the summary \u00e9\u4e2d", 3, "d" * 64)
    pair.a.release(k, token)
    got = pair.b.get(k)
    assert got == Stored("the summary \u00e9\u4e2d", 3, "d" * 64, 1)


def test_one_lease_at_a_time_and_release_hands_it_on(pair):
    k = key()
    token = pair.a.acquire(k, 30)
    assert token and pair.b.acquire(k, 30) is None
    pair.b.release(k, token + 100)  # not the holder's token: no effect
    assert pair.b.acquire(k, 30) is None
    pair.a.release(k, token)
    second = pair.b.acquire(k, 30)
    assert second and second > token


def test_the_fence_rejects_a_holder_whose_lease_ran_out(pair):
    k = key()
    seconds = short_lease(pair)
    stale = pair.a.acquire(k, seconds)
    pair.lease_runs_out(k, seconds)
    fresh = pair.b.acquire(k, 30)
    assert fresh and fresh > stale
    # The stale holder comes back from its summarizer: refused even before the new holder wrote anything,
    # and with the version it read still current.
    assert pair.a.put(k, stale, 0, "stale", 1, "a" * 64) is False
    assert pair.b.put(k, fresh, 0, "fresh", 1, "b" * 64) is True
    assert pair.a.put(k, stale, 1, "stale", 1, "a" * 64) is False
    assert pair.a.get(k).summary == "fresh"


def test_the_version_compare_and_set_makes_the_later_writer_reread(pair):
    k = key()
    t = pair.a.acquire(k, 30)
    assert pair.a.put(k, t, 0, "first", 1, "1" * 64)
    pair.a.release(k, t)
    seen_a = pair.a.get(k)
    seen_b = pair.b.get(k)
    assert seen_a.version == seen_b.version == 1
    tb = pair.b.acquire(k, 30)
    assert pair.b.put(k, tb, seen_b.version, "by b", 2, "2" * 64)
    pair.b.release(k, tb)
    ta = pair.a.acquire(k, 30)  # A holds the newest lease now, but read before B wrote
    assert pair.a.put(k, ta, seen_a.version, "by a", 2, "3" * 64) is False
    reread = pair.a.get(k)
    assert reread == Stored("by b", 2, "2" * 64, 2)
    assert pair.a.put(k, ta, reread.version, "by a", 3, "3" * 64) is True
    assert pair.b.get(k).version == 3


def test_racing_replicas_one_wins_each_round(pair):
    """Threads on both replicas try to take the lease and write the version they read: per round exactly
    the holder of the newest lease that read the current version gets through."""
    k = key()
    wins, refusals = [], []
    lock = threading.Lock()
    barrier = threading.Barrier(4, timeout=30)  # a failing thread breaks it instead of hanging the others

    def worker(state, name):
        for _ in range(10):
            barrier.wait()
            seen = state.get(k)
            token = state.acquire(k, 30)
            if token is None:
                with lock:
                    refusals.append(name)
            else:
                try:
                    ok = state.put(k, token, seen.version, name, seen.version + 1, "e" * 64)
                    with lock:
                        (wins if ok else refusals).append(name)
                finally:
                    state.release(k, token)
            barrier.wait()

    threads = [threading.Thread(target=worker, args=(s, n), daemon=True) for s, n in
               ((pair.a, "a1"), (pair.a, "a2"), (pair.b, "b1"), (pair.b, "b2"))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(wins) + len(refusals) == 40
    stored = pair.a.get(k)
    # every win moved the version on by one; nobody wrote over a version it had not read
    assert stored.version == len(wins) >= 1
    assert stored.covered == stored.version


def test_a_ttl_after_the_last_write_or_use(tmp_path):
    clock = Clock()
    state = SqliteState(str(tmp_path / "s.sqlite3"), ttl=100, clock=clock)
    k = key()
    t = state.acquire(k, 10)
    assert state.put(k, t, 0, "s", 1, "f" * 64)
    state.release(k, t)
    clock.advance(99)
    assert state.get(k).summary == "s"       # in use: it lives 100 s from this read
    clock.advance(99)
    assert state.get(k).summary == "s"
    clock.advance(5)
    assert state.get(k).summary == "s"       # read 5 s ago, not refreshed (a tenth of the ttl): still 94 s
    clock.advance(95)
    assert state.get(k) == Stored()          # expired on read, before any sweep
    t2 = state.acquire(k, 10)                # a new lease must not bring the old summary back
    assert state.get(k) == Stored()
    assert state.put(k, t2, 0, "new", 1, "0" * 64)
    assert state.get(k).summary == "new"
    state.close()


def test_sqlite_sweeps_expired_rows_while_writing(tmp_path):
    clock = Clock()
    state = SqliteState(str(tmp_path / "s.sqlite3"), ttl=100, clock=clock, sweep_interval=50)
    for i in range(5):
        k = "old%d" % i
        t = state.acquire(k, 1)
        state.put(k, t, 0, "s", 1, "f" * 64)
    assert state.count() == 5
    clock.advance(200)
    t = state.acquire("new", 1)
    state.put("new", t, 0, "s", 1, "f" * 64)
    assert state.count() == 1
    assert state.sweep() == 0
    state.close()


def test_redis_expires_records_itself_and_a_read_renews_them(redis_server):
    state = RedisState(redis_server.url, ttl=2.0)
    k = key()
    record = sessionstate.KEY_PREFIX + "{" + k + "}"
    t = state.acquire(k, 5)
    assert state.put(k, t, 0, "s", 1, "f" * 64)
    client = raw_client(redis_server)
    try:
        assert 0 < client.call("PTTL", record) <= 2000
        client.call("PEXPIRE", record, "300")
        assert state.get(k).summary == "s"
        assert client.call("PTTL", record) > 300       # the read gave it its ttl again
        client.call("PEXPIRE", record, "50")
        deadline = time.monotonic() + 10
        while client.call("EXISTS", record):
            assert time.monotonic() < deadline
            time.sleep(0.02)
        assert state.get(k) == Stored()
        assert client.call("EXISTS", record) == 0     # reading nothing creates nothing
    finally:
        client.close()
        state.close()


# -- SQLite ------------------------------------------------------------------

def test_sqlite_survives_a_restart_and_is_private(tmp_path):
    data = tmp_path / "data"
    state = sessionstate.open_state({"backend": "sqlite", "ttl": 3600}, str(data))
    assert state.backend == "sqlite"
    path = data / sessionstate.SQLITE_FILE
    k = key()
    t = state.acquire(k, 10)
    state.put(k, t, 0, "kept", 4, "9" * 64)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    wal = str(path) + "-wal"
    assert os.path.exists(wal) and stat.S_IMODE(os.stat(wal).st_mode) == 0o600
    state.close()
    with sqlite3.connect(str(path)) as db:
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    again = sessionstate.open_state({"backend": "sqlite", "ttl": 3600}, str(data))
    assert again.get(k) == Stored("kept", 4, "9" * 64, 1)
    again.check()
    again.close()
    with pytest.raises(StateUnavailable):
        again.get(k)


def test_sqlite_tightens_an_existing_files_mode(tmp_path):
    path = tmp_path / "s.sqlite3"
    path.write_bytes(b"")
    os.chmod(path, 0o644)
    SqliteState(str(path)).close()
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600


def test_sqlite_unusable_file_is_state_unavailable(tmp_path):
    bad = tmp_path / "not-a-db.sqlite3"
    bad.write_bytes(b"this is not a database file at all, not even close" * 100)
    with pytest.raises(StateUnavailable) as err:
        state = SqliteState(str(bad))
        state.get("k")
    assert "DatabaseError" in str(err.value)


def test_sqlite_busy_past_its_timeout_is_state_unavailable(tmp_path):
    path = str(tmp_path / "s.sqlite3")
    state = SqliteState(path, busy_timeout=0.05)
    other = sqlite3.connect(path, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")  # another process holds the write lock
    try:
        with pytest.raises(StateUnavailable):
            state.acquire("k", 10)
        assert state.get("k") == Stored()  # WAL: reads go on
    finally:
        other.execute("ROLLBACK")
        other.close()
    assert state.acquire("k", 10) == 1
    state.close()


def test_a_read_renews_without_waiting_for_another_writer(tmp_path):
    clock = Clock()
    path = str(tmp_path / "s.sqlite3")
    state = SqliteState(path, ttl=100, clock=clock, busy_timeout=30.0)
    t = state.acquire("k", 10)
    state.put("k", t, 0, "s", 1, "f" * 64)
    clock.advance(50)  # due for a renewal
    other = sqlite3.connect(path, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")
    try:
        got = []
        reader = threading.Thread(target=lambda: got.append(state.get("k")), daemon=True)
        reader.start()
        reader.join(10)  # not the 30 s busy timeout
        assert got and got[0].summary == "s", "the read waited for the writer"
    finally:
        other.execute("ROLLBACK")
        other.close()
    assert state.get("k").summary == "s"       # renewed now: lives 100 s from here
    clock.advance(99)
    assert state.get("k").summary == "s"
    state.close()


def test_open_state_spec_errors(tmp_path):
    with pytest.raises(ValueError, match="data directory"):
        sessionstate.open_state({"backend": "sqlite", "ttl": 10}, None)
    with pytest.raises(ValueError, match="backend"):
        sessionstate.open_state({"backend": "memcached", "ttl": 10}, str(tmp_path))
    with pytest.raises(ValueError, match="ttl"):
        sessionstate.open_state({"backend": "sqlite", "ttl": 0}, str(tmp_path))
    with pytest.raises(ValueError, match="redis_url"):
        sessionstate.open_state({"backend": "redis", "ttl": 10}, str(tmp_path))
    for url in ("http://x:1/0", "rediss://x:1/0", "redis://x:1/db", "redis://:1/0", "redis://x:99999/0"):
        with pytest.raises(ValueError):
            sessionstate.open_state({"backend": "redis", "ttl": 10, "redis_url": url}, None)
    explicit = tmp_path / "elsewhere" / "state.db"
    state = sessionstate.open_state({"backend": "sqlite", "ttl": 10, "path": str(explicit)}, None)
    assert explicit.exists()
    state.close()


def test_parse_redis_url():
    assert sessionstate.parse_redis_url("redis://h") == ("h", 6379, None, None, 0)
    assert sessionstate.parse_redis_url("redis://:p%40ss@h:7000/3") == ("h", 7000, None, "p@ss", 3)
    assert sessionstate.parse_redis_url("redis://user:pw@h:1/") == ("h", 1, "user", "pw", 0)


# -- Redis -------------------------------------------------------------------

def test_redis_auth_and_database_from_the_url(redis_server):
    secured = redis_server.another(password="s3cr3t-pw")
    url = "redis://:s3cr3t-pw@127.0.0.1:%d/3" % secured.port
    state = sessionstate.open_state({"backend": "redis", "ttl": 60, "redis_url": url}, None)
    state.check()
    k = key()
    t = state.acquire(k, 5)
    assert state.put(k, t, 0, "in db 3", 1, "3" * 64)
    client = raw_client(secured, db=3)
    other_db = raw_client(secured, db=0)
    try:
        assert client.call("EXISTS", sessionstate.KEY_PREFIX + "{" + k + "}") == 1
        assert other_db.call("EXISTS", sessionstate.KEY_PREFIX + "{" + k + "}") == 0
    finally:
        client.close()
        other_db.close()
    state.close()
    wrong = RedisState("redis://:not-the-password@127.0.0.1:%d/0" % secured.port)
    with pytest.raises(StateUnavailable) as err:
        wrong.check()
    assert "not-the-password" not in str(err.value) and "s3cr3t" not in str(err.value)
    assert "refused" in str(err.value)
    missing = RedisState("redis://127.0.0.1:%d/0" % secured.port)
    with pytest.raises(StateUnavailable, match="NOAUTH"):
        missing.get("k")


def test_redis_killed_then_back(redis_server):
    clock = Clock()
    state = RedisState(redis_server.url, ttl=60, clock=clock, retry_interval=5.0)
    k = key()
    state.check()
    try:
        redis_server.kill()
        with pytest.raises(StateUnavailable, match="unreachable"):
            state.get(k)
        redis_server.start()
        # Within the retry interval it does not even try (a dead Redis must not cost every request a timeout).
        with pytest.raises(StateUnavailable, match="moments ago"):
            state.get(k)
        clock.advance(5.0)
        assert state.get(k) == Stored()
        t = state.acquire(k, 5)
        assert state.put(k, t, 0, "after the restart", 1, "r" * 64)
    finally:
        if redis_server.proc is None:
            redis_server.start()
        state.close()


def test_redis_not_there_at_start_is_not_an_error_until_used():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    state = sessionstate.open_state({"backend": "redis", "ttl": 60, "redis_url": "redis://127.0.0.1:%d" % port},
                                    None)
    with pytest.raises(StateUnavailable) as err:
        state.check()
    assert "127.0.0.1:%d" % port in str(err.value)
    state.close()


def test_redis_that_never_answers_times_out():
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(5)
    accepted = []
    stop = threading.Event()

    def accept():
        listener.settimeout(0.1)
        while not stop.is_set():
            try:
                accepted.append(listener.accept()[0])
            except socket.timeout:
                pass

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        state = RedisState("redis://127.0.0.1:%d/0" % listener.getsockname()[1], timeout=0.3, retry_interval=0)
        with pytest.raises(StateUnavailable, match="unreachable"):
            state.get("k")
        state.close()
    finally:
        stop.set()
        thread.join(5)
        for conn in accepted:
            conn.close()
        listener.close()


def test_redis_garbage_reply_is_state_unavailable():
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)

    def serve():
        conn, _ = listener.accept()
        conn.recv(4096)
        conn.sendall(b"?what\r\n")
        conn.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    state = RedisState("redis://127.0.0.1:%d/0" % listener.getsockname()[1], timeout=2, retry_interval=0)
    with pytest.raises(StateUnavailable):
        state.check()
    thread.join(5)
    listener.close()
    state.close()


def test_resp_client_reply_types(redis_server):
    client = raw_client(redis_server)
    try:
        k = "resp-" + key()
        assert client.call("SET", k, b"a\r\nb\x00") == b"OK"
        assert client.call("GET", k) == b"a\r\nb\x00"
        assert client.call("GET", k + "-none") is None
        assert client.call("INCR", k + "-n") == 1
        assert client.call("MGET", k, k + "-none") == [b"a\r\nb\x00", None]
        with pytest.raises(sessionstate.RedisError):
            client.call("INCR", k)
        assert client.call("PING") == b"PONG"  # the connection is still in step after an error reply
        assert client.call("DEL", k, k + "-n") == 2
    finally:
        client.close()
    assert sessionstate.encode_command(("SET", "k", 5)) == b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$1\r\n5\r\n"
