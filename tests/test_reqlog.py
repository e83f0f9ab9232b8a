"""The request log (_ragproxy.reqlog): SQLite rows written by a background writer, in-process.

Retention, the never-blocking queue and the stats run against a fake clock;
the last tests drive a proxy on real sockets and check that each call is
logged and counted in /metrics.  The metrics registry itself is
test_metrics's.
"""
import contextlib
import random
import sqlite3
import threading
import time

import pytest

from _ragproxy.metrics import Metrics
from _ragproxy.reqlog import RequestLog
from conftest import at_once, logged_rows

T0 = 1_700_000_000.0


class FakeClock:
    def __init__(self, now=T0):
        self.now = now

    def __call__(self):
        return self.now


@pytest.fixture
def clock():
    return FakeClock()


@pytest.fixture
def open_log(tmp_path, clock):
    logs = []

    def make(**kwargs):
        kwargs.setdefault("clock", clock)
        rl = RequestLog(str(tmp_path / "logs" / "requests.db"), **kwargs)
        logs.append(rl)
        return rl

    yield make
    for rl in logs:
        rl.close()


def entry(**fields):
    base = {"client": "team", "model": "gpt-4o", "upstream": "oa", "endpoint": "chat", "kbs": ["docs"],
            "retrieval_mode": "hybrid", "outcome": "retrieved", "chunk_ids": ["docs:a.md#0"],
            "context_tokens": 120, "retrieval_ms": 12.5, "upstream_ms": 800.0, "total_ms": 815.0,
            "status": 200, "streamed": True, "error": None, "query": "how do I deploy"}
    base.update(fields)
    return base


# --- writing and reading back --------------------------------------------------

def test_records_round_trip_through_the_queue(open_log):
    rl = open_log()
    assert rl.record(entry(time=T0 - 5)) is True
    assert rl.flush()
    [row] = rl.query()
    assert row["id"] >= 1 and row["time"] == T0 - 5
    assert (row["client"], row["model"], row["upstream"], row["endpoint"]) == ("team", "gpt-4o", "oa", "chat")
    assert row["kbs"] == ["docs"] and row["chunk_ids"] == ["docs:a.md#0"]
    assert (row["retrieval_mode"], row["outcome"], row["context_tokens"]) == ("hybrid", "retrieved", 120)
    assert (row["retrieval_ms"], row["upstream_ms"], row["total_ms"]) == (12.5, 800.0, 815.0)
    assert row["status"] == 200 and row["streamed"] is True and row["error"] is None
    assert rl.get(row["id"]) == row
    assert rl.get(row["id"] + 1) is None


def test_empty_columns_are_sql_nulls_in_the_log_and_for_every_other_sqlite3_user(open_log, tmp_path):
    # The log registers sqlite3's adapter for None, process-wide: it must bind NULL as before.
    rl = open_log()
    rl.record(entry(kbs=None, retrieval_mode=None, context_tokens=None, query=None))
    assert rl.flush()
    with contextlib.closing(sqlite3.connect(rl.path)) as conn:
        nulls = conn.execute("SELECT kbs IS NULL, retrieval_mode IS NULL, context_tokens IS NULL, error IS NULL, "
                             "typeof(model) FROM requests").fetchall()
    assert nulls == [(1, 1, 1, 1, "text")]
    with contextlib.closing(sqlite3.connect(str(tmp_path / "other.db"))) as other:
        assert other.execute("SELECT ? IS NULL, typeof(?)", (None, None)).fetchone() == (1, "null")


def test_time_is_stamped_from_the_clock_when_absent(open_log, clock):
    rl = open_log()
    clock.now = T0 + 123.25
    rl.record(entry())
    rl.flush()
    assert rl.query()[0]["time"] == T0 + 123.25


def test_query_filters_and_orders_newest_first(open_log):
    rl = open_log()
    rl.record(entry(time=T0 + 1, model="a", kbs=["docs"], outcome="retrieved"))
    rl.record(entry(time=T0 + 3, model="b", kbs=["docs", "code"], outcome="no_match"))
    rl.record(entry(time=T0 + 2, model="a", kbs=["doc"], outcome="failed", status=502, error="boom"))
    rl.record(entry(time=T0 + 4, model="a", kbs=[], outcome="skipped", chunk_ids=[]))
    rl.flush()

    def times(**kw):
        return [r["time"] - T0 for r in rl.query(**kw)]

    assert times() == [4, 3, 2, 1]
    assert times(model="a") == [4, 2, 1]
    # exact knowledge-base names: "doc" is not "docs"
    assert times(kb="docs") == [3, 1]
    assert times(kb="doc") == [2]
    assert times(kb="code") == [3]
    assert times(outcome="failed") == [2]
    assert times(outcome=["retrieved", "no_match"]) == [3, 1]
    assert times(since=T0 + 2, until=T0 + 3) == [3, 2]
    assert times(limit=2) == [4, 3]
    assert times(limit=2, offset=2) == [2, 1]
    assert times(model="a", kb="docs") == [1]
    assert times(client="nobody") == []
    skipped = rl.query(outcome="skipped")[0]
    assert skipped["kbs"] == [] and skipped["chunk_ids"] == []
    assert rl.query(outcome="failed")[0]["error"] == "boom"


def test_query_text_is_stored_only_with_log_query(tmp_path, clock):
    with RequestLog(str(tmp_path / "off.db"), clock=clock) as off:
        off.record(entry(query="secret question"))
        off.flush()
        assert off.query()[0]["query"] is None
    with RequestLog(str(tmp_path / "on.db"), clock=clock, log_query=True) as on:
        on.record(entry(query="how do I deploy"))
        on.flush()
        assert on.query()[0]["query"] == "how do I deploy"
    raw = sqlite3.connect(str(tmp_path / "off.db")).execute("SELECT count(*) FROM requests WHERE query IS NOT NULL")
    assert raw.fetchone()[0] == 0


GUARDED = {"findings": 2, "rule_ids": ["deny_pattern.0", "override.ignore_previous"], "dropped": 1,
           "denied": None, "redactions": {"email": 2, "jwt": 1},
           "guard_findings": [{"rule_id": "override.ignore_previous", "category": "instruction_override",
                               "confidence": 0.55, "where": "retrieved", "item": "docs/a.md:3-9", "action": "drop",
                               "chunk_id": "abc", "excerpt": "Ignore all previous instructions"}],
           "budget": {"limit": 4000, "request_tokens": 3900, "cut": 2, "over": False, "tokens": 3990}}


def test_guardrail_fields_round_trip_and_the_matched_text_needs_log_query(tmp_path, clock):
    with RequestLog(str(tmp_path / "off.db"), clock=clock) as off:
        off.record(entry(**GUARDED))
        off.record(entry(denied="input", findings=1, dropped=0))
        off.flush()
        denied, row = off.query()
        assert (row["findings"], row["dropped"], row["denied"]) == (2, 1, None)
        assert row["rule_ids"] == GUARDED["rule_ids"] and row["redactions"] == {"email": 2, "jwt": 1}
        assert row["budget"] == GUARDED["budget"]
        assert row["guard_findings"] == [{k: v for k, v in GUARDED["guard_findings"][0].items() if k != "excerpt"}]
        assert denied["denied"] == "input" and denied["guard_findings"] is None and denied["redactions"] is None
    assert b"Ignore all" not in (tmp_path / "off.db").read_bytes()
    with RequestLog(str(tmp_path / "on.db"), clock=clock, log_query=True) as on:
        on.record(entry(**GUARDED))
        on.flush()
        assert on.query()[0]["guard_findings"] == GUARDED["guard_findings"]


def test_a_database_from_before_the_guardrails_gets_their_columns(tmp_path, clock):
    path = str(tmp_path / "requests.db")
    old = sqlite3.connect(path)
    old.executescript("""
        CREATE TABLE requests (id INTEGER PRIMARY KEY, time REAL NOT NULL, client TEXT, model TEXT, upstream TEXT,
            endpoint TEXT, kbs TEXT, retrieval_mode TEXT, outcome TEXT, chunk_ids TEXT, context_tokens INTEGER,
            retrieval_ms REAL, upstream_ms REAL, total_ms REAL, status INTEGER, streamed INTEGER, error TEXT,
            query TEXT);
        CREATE INDEX requests_time ON requests (time);
        INSERT INTO requests (time, client, model, outcome, chunk_ids, status, streamed)
            VALUES (1699999990.0, 'team', 'old-model', 'retrieved', '["x"]', 200, 0);
        PRAGMA user_version=1;
    """)
    old.close()
    with RequestLog(path, clock=clock) as rl:
        rl.record(entry(**GUARDED))
        assert rl.flush()
        new, before = rl.query()
        assert before["model"] == "old-model" and before["chunk_ids"] == ["x"]
        assert before["findings"] is None and before["rule_ids"] is None and before["budget"] is None
        assert new["dropped"] == 1 and new["redactions"] == {"email": 2, "jwt": 1}
        assert rl.stats(now=T0)["requests"] == 2
    with RequestLog(path, clock=clock) as again:   # opened a second time: nothing to add, nothing lost
        assert again.count() == 2
    assert sqlite3.connect(path).execute("PRAGMA user_version").fetchone()[0] == 3


def test_a_malformed_entry_is_skipped_without_losing_its_batch(open_log):
    rl = open_log(start=False)
    rl.record(entry(time=T0 + 1))
    rl.record(entry(time="not a time"))
    rl.record(entry(time=T0 + 2, context_tokens="lots"))
    rl.start()
    rl.flush()
    assert [r["time"] - T0 for r in rl.query()] == [2, 1]
    assert rl.query()[0]["context_tokens"] is None
    assert rl.failed == 1 and rl.written == 2


# --- retention -----------------------------------------------------------------

def test_retention_by_age_runs_periodically_not_per_insert(open_log, clock):
    rl = open_log(retention_days=1, max_rows=0, prune_interval=60)
    rl.record(entry(time=T0 - 2 * 86400))          # already too old
    rl.record(entry(time=T0 - 3600))
    rl.flush()
    assert rl.count() == 2                          # not pruned on insert
    clock.now += 60
    rl.record(entry(time=clock.now))
    rl.flush()
    assert [r["time"] for r in rl.query()] == [T0 + 60, T0 - 3600]
    assert rl.pruned == 1


def test_retention_by_row_count_keeps_the_newest(open_log, clock):
    rl = open_log(max_rows=10, prune_interval=60)
    for i in range(25):
        rl.record(entry(time=T0 + i))
    rl.flush()
    assert rl.count() == 25
    clock.now += 61
    rl.record(entry(time=T0 + 25))
    rl.flush()
    assert [r["time"] - T0 for r in rl.query(limit=100)] == list(range(25, 15, -1))


def test_database_is_wal_survives_reopening_and_prunes_at_startup(tmp_path, clock):
    path = str(tmp_path / "logs" / "requests.db")
    with RequestLog(path, clock=clock, retention_days=30) as rl:
        rl.record(entry(time=T0 - 40 * 86400, model="ancient"))
        rl.record(entry(time=T0 - 86400, model="recent"))
        # close() without flush(): close must write what is queued
    assert sqlite3.connect(path).execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert sqlite3.connect(path).execute("SELECT count(*) FROM requests").fetchone()[0] == 2
    with RequestLog(path, clock=clock, retention_days=30) as again:
        again.record(entry(time=T0, model="new"))
        again.flush()
        assert [r["model"] for r in again.query()] == ["new", "recent"]


# --- never blocking ------------------------------------------------------------

def test_full_queue_drops_and_counts_without_blocking(open_log):
    rl = open_log(queue_size=3, start=False)    # writer paused: nothing drains the queue
    results = []
    worker = threading.Thread(target=lambda: results.extend(rl.record(entry(time=T0 + i)) for i in range(10)))
    worker.start()
    worker.join(timeout=30)
    assert not worker.is_alive(), "record() blocked on a full queue"
    assert results == [True] * 3 + [False] * 7
    assert rl.dropped == 7
    rl.start()
    assert rl.flush()
    assert [r["time"] - T0 for r in rl.query()] == [2, 1, 0]


def test_record_after_close_is_dropped(open_log):
    rl = open_log()
    rl.close()
    assert rl.record(entry()) is False
    assert rl.dropped == 1
    assert rl.flush() is False


def test_concurrent_record_from_many_threads(open_log):
    rl = open_log()
    threads, per_thread = 8, 400

    def work(n):
        for i in range(per_thread):
            rl.record(entry(time=T0 + i, client=f"key{n}", chunk_ids=[f"c{n}:{i}"]))

    pool = [threading.Thread(target=work, args=(n,)) for n in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    assert rl.flush()
    rows = rl.query(limit=10_000)
    assert len(rows) == threads * per_thread and rl.dropped == 0
    assert sorted(r["chunk_ids"][0] for r in rows) == sorted(
        f"c{n}:{i}" for n in range(threads) for i in range(per_thread))
    assert len({r["id"] for r in rows}) == len(rows)


# --- stats -----------------------------------------------------------------------

def test_stats_against_hand_computed_figures(open_log, clock):
    rl = open_log()
    now = clock.now
    since = now - 24 * 3600
    rows = [
        # time, model, kbs, outcome, retrieval_ms, status, error
        (now - 10, "a", ["docs"], "retrieved", 10.0, 200, None),
        (now - 20, "a", ["docs", "code"], "cached", 1.0, 200, None),
        (now - 30, "b", ["code"], "no_match", 30.0, 200, None),
        (now - 2 * 3600 - 5, "b", ["docs"], "failed", 200.0, 502, "boom"),
        (now - 2 * 3600 - 10, "a", [], "skipped", None, 200, None),
        (now - 5 * 3600, "a", ["docs"], "stale", 50.0, 200, None),
        (since, "c", [], "none", None, 200, None),                       # the window's first instant
        (since - 1, "a", ["docs"], "retrieved", 5.0, 200, None),        # outside the window
    ]
    for t, model, kbs, outcome, ms, status, error in rows:
        rl.record(entry(time=t, model=model, kbs=kbs, outcome=outcome, retrieval_ms=ms, status=status, error=error))
    rl.flush()
    s = rl.stats()
    assert (s["since"], s["until"], s["hours"]) == (since, now, 24)
    assert s["requests"] == 7
    assert s["retrieval_attempts"] == 5 and s["retrieval_hits"] == 3
    assert s["hit_rate"] == pytest.approx(0.6)
    assert s["retrieval_ms_avg"] == pytest.approx((10 + 1 + 30 + 200 + 50) / 5)
    assert s["retrieval_ms_p95"] == 200.0
    assert s["errors"] == 1
    assert s["outcomes"] == {"retrieved": 1, "cached": 1, "no_match": 1, "failed": 1, "skipped": 1,
                             "stale": 1, "none": 1}

    trend = s["trend"]
    assert len(trend) == 24
    assert [b["start"] for b in trend] == [since + i * 3600 for i in range(24)]
    busy = {i: (b["requests"], b["hits"], b["retrieval_ms_avg"]) for i, b in enumerate(trend) if b["requests"]}
    assert busy == {0: (1, 0, None), 19: (1, 1, 50.0), 21: (2, 0, 200.0), 23: (3, 2, pytest.approx(41 / 3))}

    assert s["models"]["a"] == {"requests": 4, "retrieval_attempts": 3, "retrieval_hits": 3, "hit_rate": 1.0,
                                "retrieval_ms_avg": pytest.approx(61 / 3), "errors": 0}
    assert s["models"]["b"] == {"requests": 2, "retrieval_attempts": 2, "retrieval_hits": 0, "hit_rate": 0.0,
                                "retrieval_ms_avg": 115.0, "errors": 1}
    assert s["models"]["c"]["hit_rate"] is None
    assert s["kbs"]["docs"]["requests"] == 4 and s["kbs"]["docs"]["hit_rate"] == 0.75
    assert s["kbs"]["code"]["requests"] == 2 and s["kbs"]["code"]["hit_rate"] == 0.5
    assert set(s["kbs"]) == {"docs", "code"}


def test_stats_p95_is_nearest_rank(open_log):
    rl = open_log()
    values = list(range(1, 31))
    random.Random(7).shuffle(values)
    for ms in values:
        rl.record(entry(time=T0 - ms, retrieval_ms=float(ms)))
    rl.flush()
    s = rl.stats(now=T0, hours=1)
    assert s["retrieval_ms_p95"] == 29.0          # ceil(0.95 * 30) = 29th smallest (interpolation gives 28.55)
    assert s["retrieval_ms_avg"] == 15.5
    assert len(s["trend"]) == 1 and s["trend"][0]["requests"] == 30


def test_stats_on_an_empty_log(open_log):
    s = open_log().stats()
    assert s["requests"] == 0 and s["hit_rate"] is None and s["retrieval_ms_p95"] is None
    assert s["models"] == {} and all(b["requests"] == 0 for b in s["trend"])


# -- wired into the proxy ---------------------------------------------------------

def _proxy_with_kb(make_proxy, fake, tmp_path, log_query=False):
    from conftest import proxy_config
    docs = tmp_path / "documents" / "docs"
    docs.mkdir(parents=True)
    (docs / "a.md").write_text("# Elephants\n\nThe purple elephant sings at midnight.\n")
    text = proxy_config(fake.url, extra=f"knowledge_bases:\n  docs: {{retrieval: lexical}}\n"
                                        f"security: {{log_query: {'true' if log_query else 'false'}}}\n")
    text = text.replace('  - {name: "*", upstream: [ol, oa]}', '  - {name: "*", upstream: [ol, oa], kb: [docs]}')
    p = make_proxy(text, data_dir=tmp_path)
    p.app.knowledge_bases.index_all()
    return p


def test_proxied_calls_are_logged_and_counted(make_proxy, fake, tmp_path):
    import openai

    from conftest import API_KEY
    p = _proxy_with_kb(make_proxy, fake, tmp_path)
    client = openai.OpenAI(base_url=p.url + "/v1", api_key=API_KEY, max_retries=0)
    client.chat.completions.create(model="llama3", messages=[{"role": "user", "content": "purple elephant?"}])
    list(client.chat.completions.create(model="llama3", stream=True,
                                        messages=[{"role": "user", "content": "zzz qqq"}]))
    fake.fail_next(500, path="/v1/chat/completions")
    with pytest.raises(openai.APIStatusError):
        client.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "x"}])
    rows = logged_rows(p.app, 3)
    assert len(rows) == 3
    by_model = {(r["model"], r["streamed"]): r for r in rows}
    hit = by_model[("llama3", False)]
    assert hit["outcome"] == "retrieved" and hit["kbs"] == ["docs"] and hit["chunk_ids"]
    assert hit["status"] == 200 and hit["client"] == "key1" and hit["retrieval_mode"] == "lexical"
    assert hit["query"] is None  # log_query is off
    assert hit["upstream"] == "oa" and hit["upstream_ms"] >= 0 and hit["context_tokens"] > 0
    assert by_model[("llama3", True)]["outcome"] == "no_match"
    metrics = p.app.metrics.render()
    assert 'ragproxy_requests_total{model="llama3",outcome="retrieved",status="200"} 1' in metrics
    assert 'ragproxy_kb_chunks{kb="docs"}' in metrics
    assert 'ragproxy_retrieval_seconds_count{stage="lexical"}' in metrics
    import urllib.request
    with urllib.request.urlopen(p.url + "/metrics", timeout=5) as resp:
        assert resp.headers["content-type"].startswith("text/plain")
        assert b"ragproxy_requests_total" in resp.read()


def test_query_text_logged_only_when_asked(make_proxy, fake, tmp_path):
    import openai

    from conftest import API_KEY
    p = _proxy_with_kb(make_proxy, fake, tmp_path, log_query=True)
    openai.OpenAI(base_url=p.url + "/v1", api_key=API_KEY, max_retries=0).chat.completions.create(
        model="llama3", messages=[{"role": "user", "content": "purple elephant?"}])
    assert logged_rows(p.app, 1)[0]["query"] == "purple elephant?"


def test_writer_waits_for_its_period_not_for_each_entry(tmp_path):
    # Woken per entry, the writer competed with the request it was logging;
    # now entries wait for the period, and flush() still writes at once.
    with RequestLog(str(tmp_path / "slow.db"), write_interval=30.0) as rl:
        rl.record({"model": "m", "status": 200})
        time.sleep(0.1)
        assert rl.written == 0          # the writer sleeps until its period ends...
        started = time.monotonic()
        assert rl.flush()               # ...unless someone needs the rows now
        assert rl.written == 1 and time.monotonic() - started < 5.0
        rl.record({"model": "m", "status": 200})
    assert rl.written == 2              # close() writes what is queued
    with RequestLog(str(tmp_path / "fast.db"), write_interval=0.05) as rl:
        rl.record({"model": "m", "status": 200})
        deadline = time.monotonic() + 10.0
        while rl.written < 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert rl.written == 1          # and without a flush, once the period is over


def test_a_failure_while_logging_a_call_costs_its_answer_nothing(make_proxy, fake):
    # The call is logged after its answer is sent, so a broken metrics or log
    # backend cannot turn a good answer into a 500.
    import openai

    from conftest import API_KEY
    p = make_proxy()
    seen = []

    class Failing(Metrics):
        def observe_request(self, entry):
            seen.append(entry["status"])
            if len(seen) == 1:
                raise RuntimeError("metrics backend broke")
            super().observe_request(entry)

    p.app.metrics = Failing()
    client = openai.OpenAI(base_url=p.url + "/v1", api_key=API_KEY, max_retries=0)
    for text in ("first", "second"):
        reply = client.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": text}])
        assert reply.choices[0].message.content == "ECHO: " + text
    deadline = time.monotonic() + 5
    while len(seen) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert seen == [200, 200]
    assert 'ragproxy_requests_total{model="gpt-4o",outcome="none",status="200"} 1' in p.app.metrics.render()


def test_the_log_and_its_wal_are_readable_by_their_owner_only(tmp_path, clock):
    import os
    import stat
    path = tmp_path / "logs" / "requests.db"
    with RequestLog(str(path), clock=clock) as rl:
        rl.record({"model": "m", "client": "team-key", "status": 200})
        assert rl.flush()
        for name in ("requests.db", "requests.db-wal"):
            assert stat.S_IMODE(os.stat(path.parent / name).st_mode) == 0o600, name


def test_a_write_stuck_in_the_database_holds_up_no_answer(make_proxy, tmp_path):
    # The writer thread owns all the SQL: while it is stuck in a write (a
    # disk stall, another process holding the database), calls on the same
    # keep-alive connection and on another one are answered all the same.
    import json
    import socket

    from conftest import API_KEY

    class StuckLog(RequestLog):
        def __init__(self, *args, **kwargs):
            self.writing, self.release = threading.Event(), threading.Event()
            super().__init__(*args, **kwargs)

        def _write(self, entries):
            self.writing.set()
            self.release.wait(30)
            super()._write(entries)

    p = make_proxy()
    p.app.request_log = log = StuckLog(str(tmp_path / "requests.db"), write_interval=0.01)
    body = json.dumps({"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]}).encode()
    request = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {API_KEY}\r\n"
               f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n").encode() + body

    def answer(sock):
        data = b""
        while b"\r\n\r\n" not in data:
            data += sock.recv(65536)
        head, rest = data.split(b"\r\n\r\n", 1)
        length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
        while len(rest) < length:
            rest += sock.recv(65536)
        return head.split(b" ", 2)[1], json.loads(rest)

    try:
        first, second = (socket.create_connection(("127.0.0.1", p.port), timeout=10) for _ in range(2))
        first.sendall(request)
        assert answer(first)[0] == b"200"
        assert log.writing.wait(10), "the writer never took the first call's row"
        for sock in (first, second, first):   # the writer is inside _write, waiting to be released
            sock.sendall(request)
            status, reply = answer(sock)
            assert status == b"200" and reply["choices"][0]["message"]["content"] == "ECHO: hi"
        assert not log.release.is_set() and log.written == 0
    finally:
        log.release.set()
    # A call is logged after its answer goes out, before its connection reads
    # the next request: one more call on `first` has the fourth queued.
    first.sendall(request)
    assert answer(first)[0] == b"200"
    assert log.flush(10) and log.written >= 4
    first.close()
    second.close()
    log.close()


LEVERS = [{"lever": "rag_select", "outcome": "applied", "reason": "applied", "tokens_before": 900, "tokens_after": 300},
          {"lever": "window_fit", "outcome": "skipped", "reason": "not_needed", "tokens_before": 0, "tokens_after": 0}]


def test_the_levers_that_ran_are_kept_in_order_and_a_request_without_compression_has_none(open_log):
    rl = open_log()
    rl.record(entry(levers=LEVERS))
    rl.record(entry(model="plain"))
    assert rl.flush()
    plain, compressed = rl.query()
    assert compressed["levers"] == LEVERS
    assert plain["levers"] is None


def test_a_version_2_database_gets_the_levers_column_and_keeps_its_rows(tmp_path, clock):
    path = str(tmp_path / "requests.db")
    old = sqlite3.connect(path)
    old.executescript("""
        CREATE TABLE requests (id INTEGER PRIMARY KEY, time REAL NOT NULL, client TEXT, model TEXT, upstream TEXT,
            endpoint TEXT, kbs TEXT, retrieval_mode TEXT, outcome TEXT, chunk_ids TEXT, context_tokens INTEGER,
            retrieval_ms REAL, upstream_ms REAL, total_ms REAL, status INTEGER, streamed INTEGER, error TEXT,
            query TEXT, findings INTEGER, rule_ids TEXT, dropped INTEGER, denied TEXT, redactions TEXT,
            guard_findings TEXT, budget TEXT);
        CREATE INDEX requests_time ON requests (time);
        INSERT INTO requests (time, model, outcome, chunk_ids, status, streamed, budget)
            VALUES (1699999990.0, 'before', 'retrieved', '[]', 200, 0, '{"cut": 2}');
        PRAGMA user_version=2;
    """)
    old.close()
    with RequestLog(path, clock=clock) as rl:
        rl.record(entry(model="after", levers=LEVERS))
        assert rl.flush()
        after, before = rl.query()
        assert before["model"] == "before" and before["levers"] is None and before["budget"] == {"cut": 2}
        assert after["levers"] == LEVERS
    assert sqlite3.connect(path).execute("PRAGMA user_version").fetchone()[0] == 3


def test_processes_opening_a_new_log_at_once_all_open_it(tmp_path):
    """serve's workers open the request log together at start.  Four connections racing to make a new
    file failed with "database is locked" (the switch to WAL calls no busy handler) in 3 rounds of 50."""
    for round_ in range(100):
        path = str(tmp_path / f"log-{round_}.sqlite3")
        results = at_once(lambda: RequestLog(path).close())
        assert results == [None] * 4, f"round {round_}: {results}"
