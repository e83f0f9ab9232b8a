"""The request log: one SQLite row per proxied call, written off the request path.

One entry dict per proxied request feeds both this log (for the dashboard,
the logs page and audits) and ``metrics``.  Logging must never slow a
request: record() only queues; a writer thread does the SQL.  sqlite3 is
imported when a log is opened, so a Python built without it still starts:
RequestLog() then raises ImportError and the app runs with no request log.

May import: files.
"""
from __future__ import annotations

import collections
import contextlib
import json
import logging
import math
import os
import threading
import time

from .files import retry_while_locked

log = logging.getLogger("ragproxy")


DEFAULT_REQUEST_LOG_PATH = os.path.join("logs", "requests.db")

#: Every outcome a request's retrieval can have.  "skipped" means retrieval was
#: not attempted for this request, "none" that no knowledge base applied at all.
#: "over_budget": the model's max_input_tokens left no room for any context;
#: "out_of_scope": the key may read none of the model's knowledge bases.
RETRIEVAL_OUTCOMES = ("retrieved", "no_match", "degraded", "failed", "stale", "skipped", "cached", "none",
                      "over_budget", "out_of_scope")
RETRIEVAL_ATTEMPTED = frozenset(("retrieved", "no_match", "degraded", "failed", "stale", "cached"))
_RETRIEVAL_HITS = frozenset(("retrieved", "cached", "stale"))

#: The stages the retrieval_seconds histogram is labelled with.
RETRIEVAL_STAGES = ("query_build", "lexical", "embed", "dense", "rerank", "total")

#: Keys of the entry dict handed to RequestLog.record() and Metrics.observe_request();
#: each is a column of the ``requests`` table.  Missing keys are stored as NULL.
REQUEST_LOG_FIELDS = (
    "time",            # epoch seconds (float); stamped by record() when absent
    "client",          # the client key's display name ("team", "key1"), never the key itself
    "model",           # the model name the client asked for
    "upstream",        # provider name
    "endpoint",        # e.g. "chat", "messages"
    "kbs",             # list of knowledge-base names (stored comma-separated)
    "retrieval_mode",  # lexical / dense / hybrid ...
    "outcome",         # one of RETRIEVAL_OUTCOMES
    "chunk_ids",       # list of injected chunk ids (stored as JSON)
    "context_tokens",  # tokens of injected context
    "retrieval_ms",
    "upstream_ms",
    "total_ms",
    "status",          # HTTP status returned to the client
    "streamed",        # bool
    "error",           # error text, if any
    "query",           # the retrieval query; stored only when log_query is on
    # The guardrails (screening.Screening.log_fields):
    "findings",        # how many guardrail findings (poisoning rules, deny patterns)
    "rule_ids",        # list of the rule_ids found (stored as JSON)
    "dropped",         # retrieved chunks dropped as suspected injections
    "denied",          # where a refusal came from ("retrieved", "input"), else NULL
    "redactions",      # {category: n} redacted before injection (stored as JSON)
    "guard_findings",  # [{rule_id, category, confidence, where, item, action, excerpt}] (JSON);
                       # the excerpt (document or tool text) only when log_query is on
    "budget",          # max_input_tokens: {limit, request_tokens, cut, over, tokens} (JSON)
    "levers",          # compression: [{lever, outcome, reason, tokens_before, tokens_after}] in run order (JSON)
)
#: Columns added after the first schema, with their types: added to an older database when it is opened.
_REQLOG_ADDED_COLUMNS = (("findings", "INTEGER"), ("rule_ids", "TEXT"), ("dropped", "INTEGER"), ("denied", "TEXT"),
                         ("redactions", "TEXT"), ("guard_findings", "TEXT"), ("budget", "TEXT"),
                         ("levers", "TEXT"))   # levers: schema version 3
_JSON_COLUMNS = ("rule_ids", "redactions", "guard_findings", "budget", "levers")
# Optional entry key read only by Metrics.observe_request(): "retrieval_stages",
# a dict {stage: seconds} with stages from RETRIEVAL_STAGES.

_REQLOG_MAX_ERROR_CHARS = 4096
_REQLOG_MAX_QUERY_CHARS = 16384
_REQLOG_BATCH_MAX = 500
# The writer wakes on this period, not on each entry: woken per entry, it took
# the GIL for its SQLite work while the request it logged was still being
# answered (measured: +~0.1 ms at 1 client in bench/proxy_overhead.py 'slow').
_REQLOG_WRITE_INTERVAL = 0.25
_REQLOG_SCHEMA_VERSION = 3
_REQLOG_SCHEMA = """
CREATE TABLE IF NOT EXISTS requests (
    id INTEGER PRIMARY KEY,
    time REAL NOT NULL,
    client TEXT,
    model TEXT,
    upstream TEXT,
    endpoint TEXT,
    kbs TEXT,
    retrieval_mode TEXT,
    outcome TEXT,
    chunk_ids TEXT,
    context_tokens INTEGER,
    retrieval_ms REAL,
    upstream_ms REAL,
    total_ms REAL,
    status INTEGER,
    streamed INTEGER,
    error TEXT,
    query TEXT,
    findings INTEGER,
    rule_ids TEXT,
    dropped INTEGER,
    denied TEXT,
    redactions TEXT,
    guard_findings TEXT,
    budget TEXT,
    levers TEXT
);
CREATE INDEX IF NOT EXISTS requests_time ON requests (time);
"""
_REQLOG_INSERT = "INSERT INTO requests ({}) VALUES ({})".format(
    ", ".join(REQUEST_LOG_FIELDS), ", ".join("?" * len(REQUEST_LOG_FIELDS)))


class _FlushMarker:
    """Put on the queue by flush(); the writer sets it once everything before it is committed."""

    __slots__ = ("done",)

    def __init__(self):
        self.done = threading.Event()


_REQLOG_STOP = object()


def _text_or_none(value, limit=None):
    if value is None:
        return None
    text = value if isinstance(value, str) else str(value)
    return text[:limit] if limit else text


def _number_or_none(value, kind=float):
    if value is None or value == "":
        return None
    try:
        return kind(value)
    except (TypeError, ValueError):
        return None


def _kbs_text(value):
    if value is None:
        return None
    if isinstance(value, str):
        return value or None
    return ",".join(str(k) for k in value) or None


# One encoder for every row: json.dumps given options builds an encoder on each call,
# and a row has a few of these columns.
_encode_json = json.JSONEncoder(default=str, sort_keys=True).encode


def _same_none(value):
    return value


def _json_or_none(value):
    return None if value is None else _encode_json(value)


def _row_values(entry, log_query):
    """The INSERT parameters for one entry dict, in REQUEST_LOG_FIELDS order."""
    chunk_ids = entry.get("chunk_ids")
    return (
        float(entry["time"]),
        _text_or_none(entry.get("client")),
        _text_or_none(entry.get("model")),
        _text_or_none(entry.get("upstream")),
        _text_or_none(entry.get("endpoint")),
        _kbs_text(entry.get("kbs")),
        _text_or_none(entry.get("retrieval_mode")),
        _text_or_none(entry.get("outcome")),
        _encode_json(list(chunk_ids) if chunk_ids else []),
        _number_or_none(entry.get("context_tokens"), int),
        _number_or_none(entry.get("retrieval_ms")),
        _number_or_none(entry.get("upstream_ms")),
        _number_or_none(entry.get("total_ms")),
        _number_or_none(entry.get("status"), int),
        1 if entry.get("streamed") else 0,
        _text_or_none(entry.get("error"), _REQLOG_MAX_ERROR_CHARS),
        _text_or_none(entry.get("query"), _REQLOG_MAX_QUERY_CHARS) if log_query else None,
        _number_or_none(entry.get("findings"), int),
        _json_or_none(entry.get("rule_ids")),
        _number_or_none(entry.get("dropped"), int),
        _text_or_none(entry.get("denied")),
        _json_or_none(entry.get("redactions")),
        _json_or_none(_findings_kept(entry.get("guard_findings"), log_query)),
        _json_or_none(entry.get("budget")),
        _json_or_none(entry.get("levers") or None),
    )


def _findings_kept(findings, log_query):
    """Guard findings as stored: without the text they matched unless security.log_query allows it."""
    if not findings or log_query:
        return findings or None
    return [{k: v for k, v in f.items() if k != "excerpt"} for f in findings if isinstance(f, dict)]


def _row_dict(row):
    """A stored row back as the entry-shaped dict (lists for kbs and chunk_ids, bool streamed)."""
    out = dict(row)
    out["kbs"] = out["kbs"].split(",") if out["kbs"] else []
    try:
        out["chunk_ids"] = json.loads(out["chunk_ids"]) if out["chunk_ids"] else []
    except ValueError:
        out["chunk_ids"] = []
    out["streamed"] = bool(out["streamed"])
    for column in _JSON_COLUMNS:
        try:
            out[column] = json.loads(out[column]) if out.get(column) else None
        except ValueError:
            out[column] = None
    return out


class _StatsTally:
    """Running figures for one slice of the stats (all requests, one model, one KB, one hour)."""

    __slots__ = ("requests", "attempts", "hits", "errors", "latency_sum", "latency_n")

    def __init__(self):
        self.requests = self.attempts = self.hits = self.errors = self.latency_n = 0
        self.latency_sum = 0.0

    def add(self, outcome, n, errors, latency_sum, latency_n):
        """Add ``n`` requests that share one outcome (a GROUP BY row of the stats query)."""
        self.requests += n
        self.errors += errors
        if outcome in RETRIEVAL_ATTEMPTED:
            self.attempts += n
            if outcome in _RETRIEVAL_HITS:
                self.hits += n
            if latency_n:
                self.latency_sum += latency_sum
                self.latency_n += latency_n

    def average(self):
        return self.latency_sum / self.latency_n if self.latency_n else None

    def summary(self):
        return {
            "requests": self.requests,
            "retrieval_attempts": self.attempts,
            "retrieval_hits": self.hits,
            "hit_rate": self.hits / self.attempts if self.attempts else None,
            "retrieval_ms_avg": self.average(),
            "errors": self.errors,
        }


# Aggregated in SQL: a day can hold 100k rows, and GROUP BY over them takes about
# half the time of fetching them and tallying in Python (~0.3 s against ~0.65 s).
_STATS_GROUPS = """
SELECT model, kbs, outcome, CAST((time - :since) / 3600 AS INTEGER) AS hour, count(*),
       sum(CASE WHEN (error IS NOT NULL AND error <> '') OR coalesce(status, 0) >= 400 THEN 1 ELSE 0 END),
       sum(retrieval_ms), count(retrieval_ms)
FROM requests WHERE time >= :since AND time <= :until
GROUP BY model, kbs, outcome, hour
"""
_STATS_P95 = """
SELECT retrieval_ms FROM requests
WHERE time >= :since AND time <= :until AND retrieval_ms IS NOT NULL AND outcome IN ({})
ORDER BY retrieval_ms LIMIT 1 OFFSET :skip
""".format(", ".join("'%s'" % o for o in sorted(RETRIEVAL_ATTEMPTED)))


class RequestLog:
    """The request log: an SQLite database in WAL mode, written by one background thread.

    ``record(entry)`` never blocks: when the bounded queue is full the entry is
    dropped and counted in ``dropped``.  Retention (``retention_days``,
    ``max_rows``; 0 disables either) is enforced by the writer at start-up and
    then every ``prune_interval`` seconds of ``clock`` time (and after every
    max(1000, max_rows/10) rows, so a burst cannot overshoot far), never per insert.
    Readers (query, get, stats) open their own connection per call, so any
    thread may call them.  ``start=False`` leaves the writer stopped until
    ``start()`` (tests use it to fill the queue deterministically).
    """

    def __init__(self, path=DEFAULT_REQUEST_LOG_PATH, clock=time.time, retention_days=30, max_rows=100_000,
                 log_query=False, queue_size=10_000, prune_interval=60.0, start=True,
                 write_interval=_REQLOG_WRITE_INTERVAL):
        self.path = os.fspath(path)
        self.clock = clock
        self.retention_days = retention_days
        self.max_rows = max_rows
        self.log_query = bool(log_query)
        self.prune_interval = prune_interval
        self.write_interval = write_interval
        self.dropped = 0        # entries refused because the queue was full (or the log closed)
        self.written = 0        # rows committed
        self.failed = 0         # entries the writer could not store (bad values, SQLite errors)
        self.pruned = 0         # rows deleted by retention
        # A deque, not a queue.Queue: the writer polls it on its own schedule,
        # so the per-request append needs no lock or condition to wake anyone.
        self._queue = collections.deque()
        self._queue_size = max(1, int(queue_size))
        self._wake = threading.Event()   # flush() and close() need the writer now
        self._lock = threading.Lock()
        self._closed = False
        self._warned = set()
        directory = os.path.dirname(os.path.abspath(self.path))
        os.makedirs(directory, exist_ok=True)
        # Opened here so a bad path fails at start-up, not silently in the thread.
        self._conn = self._connect()
        self._prepare()
        self._thread = threading.Thread(target=self._run, name="ragproxy-reqlog", daemon=True)
        if start:
            self.start()

    def _prepare(self):
        """WAL mode and the schema, tried again while another process is doing the same
        (files.retry_while_locked): four processes opening a new log at once failed 3 rounds
        in 50 before the retries."""
        def prepare():
            self._conn.execute("PRAGMA journal_mode=WAL")
            self._conn.execute("PRAGMA synchronous=NORMAL")
            with self._conn:
                self._conn.executescript(_REQLOG_SCHEMA)
                self._add_columns()
                self._conn.execute(f"PRAGMA user_version={_REQLOG_SCHEMA_VERSION}")
        retry_while_locked(prepare)

    def _add_columns(self):
        """A database made by an older version gets the columns added since (its rows read NULL there)."""
        import sqlite3  # here: see the module docstring
        for name, kind in _REQLOG_ADDED_COLUMNS:
            have = {row[1] for row in self._conn.execute("PRAGMA table_info(requests)")}
            if name in have:
                continue
            try:
                self._conn.execute(f"ALTER TABLE requests ADD COLUMN {name} {kind}")
            except sqlite3.OperationalError:   # another process (the CLI, a second proxy) added it first
                if name not in {row[1] for row in self._conn.execute("PRAGMA table_info(requests)")}:
                    raise

    def _connect(self):
        import sqlite3  # here: see the module docstring
        # The rows name clients' keys (and hold queries with security.log_query), so
        # the file is its owner's alone; SQLite gives its -wal and -shm files the same mode.
        os.close(os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600))
        # Most of a row's columns are NULL (a pass-through request's fourteen of them), and sqlite3
        # binds a None only after asking for an adapter, then its type for __adapt__ and the None
        # for __conform__: two AttributeErrors raised and cleared per column, more than a third of
        # inserting the row (6.0 -> 3.8 us, Python 3.11).  An adapter found at once answers the
        # same None, so every sqlite3 user in the process, which this registration reaches, binds
        # it as it did.
        sqlite3.register_adapter(type(None), _same_none)
        conn = sqlite3.connect(self.path, timeout=10, check_same_thread=False, isolation_level=None)
        conn.execute("PRAGMA busy_timeout=10000")
        return conn

    # -- writing ----------------------------------------------------------

    def start(self):
        """Start the writer thread (done by the constructor unless ``start=False``)."""
        with self._lock:
            if not self._thread.is_alive() and not self._thread.ident:
                self._thread.start()

    def record(self, entry):
        """Queue one entry dict (see REQUEST_LOG_FIELDS); returns False if it was dropped."""
        if self._closed:
            self._count_drop()
            return False
        item = dict(entry)
        if item.get("time") is None:
            item["time"] = self.clock()
        if not self.log_query:
            item.pop("query", None)   # never keep the text around, even in memory
            if item.get("guard_findings"):
                item["guard_findings"] = _findings_kept(item["guard_findings"], False)
        if len(self._queue) >= self._queue_size:
            self._count_drop()
            return False
        self._queue.append(item)
        return True

    def _count_drop(self):
        with self._lock:
            self.dropped += 1
            first = self.dropped == 1
        if first:
            log.warning("request log: queue full, dropping entries (see RequestLog.dropped)")

    def flush(self, timeout=5.0):
        """Wait until everything recorded so far is committed; False on timeout or a stopped writer."""
        if not self._thread.is_alive():
            return False
        marker = _FlushMarker()
        self._queue.append(marker)  # control items pass the size limit
        self._wake.set()
        return marker.done.wait(timeout)

    def close(self, timeout=10.0):
        """Write what is queued, stop the writer and close the database.  Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self.start()    # a never-started writer still owes its queue to the database
        self._queue.append(_REQLOG_STOP)
        self._wake.set()
        self._thread.join(timeout)
        if not self._thread.is_alive():
            self._conn.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _run(self):
        self._prune_logged()
        last_prune = self.clock()
        # A burst can outrun the clock-based period; bound the overshoot too.
        prune_every_rows = max(1000, (self.max_rows or 0) // 10)
        written_at_prune = self.written
        batch = []
        while True:
            if len(batch) < _REQLOG_BATCH_MAX:   # a full batch means more is waiting: no pause
                self._wake.wait(self.write_interval)
                self._wake.clear()
            batch = []
            while len(batch) < _REQLOG_BATCH_MAX and self._queue:
                batch.append(self._queue.popleft())
            if not batch:
                continue
            try:
                entries = [b for b in batch if isinstance(b, dict)]
                if entries:
                    self._write(entries)
                if (self.prune_interval is not None and self.clock() - last_prune >= self.prune_interval) \
                        or (self.max_rows and self.written - written_at_prune >= prune_every_rows):
                    self._prune_logged()
                    last_prune, written_at_prune = self.clock(), self.written
            except Exception as exc:   # the writer must outlive any one bad batch
                self._warn_once("writer", f"request log: writer error: {exc!r}")
            stop = False
            for item in batch:
                if isinstance(item, _FlushMarker):
                    item.done.set()
                elif item is _REQLOG_STOP:
                    stop = True
            if stop:
                return

    def _write(self, entries):
        import sqlite3  # here: see the module docstring
        rows = []
        for entry in entries:
            try:
                rows.append(_row_values(entry, self.log_query))
            except Exception as exc:   # one malformed entry must not lose the batch
                self.failed += 1
                self._warn_once("entry", f"request log: skipping a malformed entry ({exc!r})")
        if not rows:
            return
        try:
            self._conn.execute("BEGIN")
            self._conn.executemany(_REQLOG_INSERT, rows)
            self._conn.execute("COMMIT")
            self.written += len(rows)
        except sqlite3.Error as exc:
            with contextlib.suppress(sqlite3.Error):
                self._conn.execute("ROLLBACK")
            self.failed += len(rows)
            self._warn_once("sqlite", f"request log: cannot write to {self.path}: {exc}")

    def _warn_once(self, kind, message):
        if kind not in self._warned:
            self._warned.add(kind)
            log.warning("%s", message)

    def _prune_logged(self):
        import sqlite3  # here: see the module docstring
        try:
            self.pruned += self._prune(self._conn, self.clock())
        except sqlite3.Error as exc:
            self._warn_once("prune", f"request log: retention failed on {self.path}: {exc}")

    def _prune(self, conn, now):
        deleted = 0
        conn.execute("BEGIN")
        try:
            if self.retention_days:
                cur = conn.execute("DELETE FROM requests WHERE time < ?", (now - self.retention_days * 86400.0,))
                deleted += cur.rowcount
            if self.max_rows:
                # Rows beyond the newest max_rows, in insertion order.
                cur = conn.execute(
                    "DELETE FROM requests WHERE id <= "
                    "(SELECT id FROM requests ORDER BY id DESC LIMIT 1 OFFSET ?)", (int(self.max_rows),))
                deleted += cur.rowcount
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        return deleted

    # -- reading ----------------------------------------------------------

    @contextlib.contextmanager
    def _reader(self):
        import sqlite3  # here: see the module docstring
        conn = sqlite3.connect(self.path, timeout=10)
        try:
            conn.row_factory = sqlite3.Row
            conn.execute("PRAGMA query_only=1")
            yield conn
        finally:
            conn.close()

    def query(self, since=None, until=None, model=None, kb=None, outcome=None, client=None, limit=100, offset=0):
        """Logged requests, newest first.  ``outcome`` may be one name or a list of names."""
        where, params = [], []
        if since is not None:
            where.append("time >= ?")
            params.append(float(since))
        if until is not None:
            where.append("time <= ?")
            params.append(float(until))
        if model is not None:
            where.append("model = ?")
            params.append(model)
        if client is not None:
            where.append("client = ?")
            params.append(client)
        if kb is not None:
            # Exact name inside the comma list; instr() has no wildcards to escape.
            where.append("instr(',' || kbs || ',', ',' || ? || ',') > 0")
            params.append(kb)
        if outcome is not None:
            names = [outcome] if isinstance(outcome, str) else list(outcome)
            where.append("outcome IN ({})".format(", ".join("?" * len(names)) or "NULL"))
            params.extend(names)
        sql = "SELECT * FROM requests"
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += " ORDER BY time DESC, id DESC LIMIT ? OFFSET ?"
        params += [max(0, int(limit)), max(0, int(offset))]
        with self._reader() as conn:
            return [_row_dict(r) for r in conn.execute(sql, params)]

    def get(self, row_id):
        """One logged request by its ``id``, or None."""
        with self._reader() as conn:
            row = conn.execute("SELECT * FROM requests WHERE id = ?", (int(row_id),)).fetchone()
        return _row_dict(row) if row is not None else None

    def count(self):
        """Rows currently stored."""
        with self._reader() as conn:
            return conn.execute("SELECT count(*) FROM requests").fetchone()[0]

    def stats(self, now=None, hours=24):
        """Figures for the last ``hours`` hours (``since <= time <= now``).

        Hit rate is (retrieved + cached + stale) over requests that attempted
        retrieval (every outcome except skipped / none); latency figures are over
        those same requests.  p95 is the nearest-rank percentile.  ``trend`` has
        one bucket per hour, oldest first, bucket i covering
        ``[since + i*3600, since + (i+1)*3600)`` (the last one also holds ``now``).
        """
        now = self.clock() if now is None else float(now)
        hours = max(1, int(hours))
        since = now - hours * 3600.0
        params = {"since": since, "until": now}
        overall = _StatsTally()
        buckets = [_StatsTally() for _ in range(hours)]
        models = collections.defaultdict(_StatsTally)
        kbs = collections.defaultdict(_StatsTally)
        outcomes = collections.Counter()
        with self._reader() as conn:
            for model, kb_text, outcome, hour, *figures in conn.execute(_STATS_GROUPS, params):
                args = (outcome, *figures)
                overall.add(*args)
                buckets[min(hours - 1, hour)].add(*args)
                models[model or ""].add(*args)
                for name in (kb_text.split(",") if kb_text else ()):
                    kbs[name].add(*args)
                outcomes[outcome or "none"] += figures[0]
            p95 = None
            if overall.latency_n:
                # Nearest rank: the ceil(0.95 n)-th smallest value.
                rank = max(1, math.ceil(0.95 * overall.latency_n))
                p95 = conn.execute(_STATS_P95, dict(params, skip=rank - 1)).fetchone()[0]
        result = overall.summary()
        result.update({
            "since": since,
            "until": now,
            "hours": hours,
            "retrieval_ms_p95": p95,
            "outcomes": dict(outcomes),
            "trend": [{"start": since + i * 3600.0, "requests": b.requests, "hits": b.hits,
                       "retrieval_ms_avg": b.average()} for i, b in enumerate(buckets)],
            "models": {name: tally.summary() for name, tally in sorted(models.items())},
            "kbs": {name: tally.summary() for name, tally in sorted(kbs.items())},
            "dropped": self.dropped,
        })
        return result
