"""Per-session lever state for summary_buffer: SQLite under the data directory, or Redis for several replicas.

One record per state key (summary.py derives the key from the session id
and the caller's scope; this module never sees either): the summary text,
how many leading history messages it covers and a digest of them, and a
version.  Writers are serialised three ways, so that two replicas (or two
threads) summarising one session never overwrite each other with stale
work:

* a lease: ``acquire(key, seconds)`` takes it (Redis ``SET NX PX``; SQLite
  a row's ``lease_until``) or answers None while another holder has it;
* a fence: every lease comes with the next value of the key's monotonic
  counter (``HINCRBY``; a column), and ``put`` is refused once a newer
  lease has been handed out, so a holder whose lease ran out while it was
  waiting on the summarizer cannot write after its successor;
* a compare-and-set of the version read before the work began.

Redis runs each step as one Lua script (EVAL), SQLite in a ``BEGIN
IMMEDIATE`` transaction.  A record lives ``ttl`` seconds after its last
write or use (a read refreshes it: Redis on every read, SQLite at most once
per tenth of the ttl): Redis expires it itself; SQLite treats an expired row
as absent when it reads it and deletes such rows now and then while writing.

The Redis client is a small RESP2 client over one socket (AUTH with the
URL's user and password, SELECT of its database, connect and I/O
timeouts), so no redis package is needed at run time.  Any failure to
reach or use the store raises StateUnavailable (the lever fails open for
that request); after a failure Redis is not tried again for
``retry_interval`` seconds, then the next call reconnects.  Messages name
the host and port, never the password.

May import: defaults.
"""
from __future__ import annotations

import dataclasses
import os
import socket
import threading
import time
import urllib.parse

from .defaults import COMPRESSION_STATE_BACKENDS as BACKENDS, COMPRESSION_STATE_TTL as DEFAULT_TTL
SQLITE_FILE = "compression-state.sqlite3"
KEY_PREFIX = "ragproxy:summary:"


class StateUnavailable(Exception):
    """The state store cannot be reached or used now; the lever skips this request."""


@dataclasses.dataclass(frozen=True)
class Stored:
    """A key's record.  ``summary`` None: there is none (never written, or expired); ``version`` is what a
    ``put`` must name to replace it (0 for none)."""
    summary: str | None = None
    covered: int = 0
    digest: str = ""
    version: int = 0


NOTHING = Stored()


class SessionState:
    """The interface summary.py uses; see the module docstring for the guarantees."""
    backend = ""

    def get(self, key: str) -> Stored:
        raise NotImplementedError

    def acquire(self, key: str, seconds: float) -> int | None:
        """The fence token of a new lease on ``key`` for ``seconds``, or None while someone else holds one."""
        raise NotImplementedError

    def put(self, key: str, token: int, expected_version: int, summary: str, covered: int, digest: str) -> bool:
        """Write the record if ``token`` is still the newest lease's and the version is still
        ``expected_version``; False (nothing written) otherwise."""
        raise NotImplementedError

    def release(self, key: str, token: int) -> None:
        """End the lease ``token`` early (no effect once another holder has the key)."""
        raise NotImplementedError

    def check(self) -> None:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError


def open_state(spec, data_dir, clock=time.time):
    """A SessionState for ``spec`` ({"backend", "ttl", "path", "redis_url"}); ValueError for a bad spec.

    SQLite opens (and creates) its file now and raises StateUnavailable when
    it cannot; Redis connects on first use, so a Redis that is down at start
    only makes the lever skip until it answers.
    """
    spec = dict(spec or {})
    backend = spec.get("backend", "sqlite")
    ttl = spec.get("ttl", DEFAULT_TTL)
    if isinstance(ttl, bool) or not isinstance(ttl, (int, float)) or not ttl > 0:
        raise ValueError("state ttl must be a positive number of seconds")
    if backend == "sqlite":
        path = spec.get("path")
        if not path:
            if not data_dir:
                raise ValueError("sqlite session state needs a data directory or state.path")
            path = os.path.join(data_dir, SQLITE_FILE)
        return SqliteState(str(path), ttl, clock=clock)
    if backend == "redis":
        if not spec.get("redis_url"):
            raise ValueError("redis session state needs state.redis_url")
        return RedisState(spec["redis_url"], ttl, clock=clock)
    raise ValueError("state backend must be one of %s" % ", ".join(BACKENDS))


# -- SQLite ------------------------------------------------------------------

_SCHEMA = """
CREATE TABLE IF NOT EXISTS summary_state (
    key TEXT PRIMARY KEY,
    summary TEXT,
    covered INTEGER NOT NULL DEFAULT 0,
    digest TEXT NOT NULL DEFAULT '',
    version INTEGER NOT NULL DEFAULT 0,
    fence INTEGER NOT NULL DEFAULT 0,
    lease_until REAL NOT NULL DEFAULT 0,
    expires REAL NOT NULL
)"""


class SqliteState(SessionState):
    """The state in one SQLite file (mode 0600, WAL): survives restarts, and processes sharing the file
    are serialised by its write lock (``BEGIN IMMEDIATE``, waiting up to ``busy_timeout`` seconds)."""
    backend = "sqlite"

    def __init__(self, path, ttl=DEFAULT_TTL, clock=time.time, busy_timeout=5.0, sweep_interval=600.0):
        self.path, self.ttl, self.clock = path, float(ttl), clock
        self.sweep_interval = sweep_interval
        self._next_sweep = 0.0
        self._lock = threading.Lock()
        try:   # here, not at the top: a Python built without sqlite3 still serves (the lever then skips)
            import sqlite3
        except ImportError:
            raise StateUnavailable("sqlite state: this Python cannot import sqlite3 (use backend: redis)") from None
        self._sqlite = sqlite3
        try:
            if path != ":memory:":
                parent = os.path.dirname(os.path.abspath(path))
                os.makedirs(parent, mode=0o700, exist_ok=True)
                # Created 0600 before SQLite opens it: summaries quote the conversations.  SQLite gives its
                # -wal and -shm files the database file's mode.
                os.close(os.open(path, os.O_RDWR | os.O_CREAT, 0o600))
                os.chmod(path, 0o600)
            self._db = sqlite3.connect(path, timeout=busy_timeout, isolation_level=None, check_same_thread=False)
            self._busy_ms = int(busy_timeout * 1000)
            self._db.execute("PRAGMA busy_timeout=%d" % self._busy_ms)
            if path != ":memory:":
                self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute(_SCHEMA)
        except (OSError, sqlite3.Error) as exc:
            raise StateUnavailable("sqlite state %s: %s" % (path, _reason(exc))) from None

    def _run(self, work, write=False):
        with self._lock:
            db = self._db
            if db is None:
                raise StateUnavailable("sqlite state is closed")
            try:
                if not write:
                    return work(db)
                db.execute("BEGIN IMMEDIATE")
                try:
                    out = work(db)
                except BaseException:
                    db.execute("ROLLBACK")
                    raise
                db.execute("COMMIT")
                return out
            except self._sqlite.Error as exc:
                raise StateUnavailable("sqlite state: %s" % _reason(exc)) from None

    def get(self, key):
        now = self.clock()

        def read(db):
            row = db.execute("SELECT summary, covered, digest, version, expires FROM summary_state WHERE key = ?",
                             (key,)).fetchone()
            if row is None or row[4] <= now or row[0] is None:
                return NOTHING
            if row[4] - now < self.ttl * 0.9:
                # In use: it lives ttl from now.  Refreshed once per tenth of the ttl, not on every read,
                # so a session's rounds are reads; and a refresh that cannot have the lock is no error.
                db.execute("PRAGMA busy_timeout=0")  # a read does not wait for another writer to renew
                try:
                    db.execute("UPDATE summary_state SET expires = MAX(expires, ?) WHERE key = ?",
                               (now + self.ttl, key))
                except self._sqlite.OperationalError:
                    pass
                finally:
                    db.execute("PRAGMA busy_timeout=%d" % self._busy_ms)
            return Stored(row[0], row[1], row[2], row[3])
        return self._run(read)

    def acquire(self, key, seconds):
        now = self.clock()

        def take(db):
            row = db.execute("SELECT fence, lease_until, expires FROM summary_state WHERE key = ?",
                             (key,)).fetchone()
            if row is None:
                db.execute("INSERT INTO summary_state (key, fence, lease_until, expires) VALUES (?, 1, ?, ?)",
                           (key, now + seconds, now + self.ttl))
                return 1
            fence, lease_until, expires = row
            if lease_until > now:
                return None
            if expires <= now:  # an expired summary must not come back to life with the row's new expiry
                db.execute("UPDATE summary_state SET summary = NULL, covered = 0, digest = '' WHERE key = ?",
                           (key,))
            db.execute("UPDATE summary_state SET fence = ?, lease_until = ?, expires = MAX(expires, ?)"
                       " WHERE key = ?", (fence + 1, now + seconds, now + self.ttl, key))
            return fence + 1
        return self._run(take, write=True)

    def put(self, key, token, expected_version, summary, covered, digest):
        now = self.clock()

        def write(db):
            row = db.execute("SELECT fence, version, expires, summary FROM summary_state WHERE key = ?",
                             (key,)).fetchone()
            if row is None or row[0] != token:
                return False
            current = row[1] if (row[2] > now and row[3] is not None) else 0
            if current != expected_version:
                return False
            db.execute("UPDATE summary_state SET summary = ?, covered = ?, digest = ?, version = ?, expires = ?"
                       " WHERE key = ?", (summary, covered, digest, max(row[1], current) + 1, now + self.ttl, key))
            if now >= self._next_sweep:
                self._next_sweep = now + self.sweep_interval
                db.execute("DELETE FROM summary_state WHERE expires <= ? AND lease_until <= ?", (now, now))
            return True
        return self._run(write, write=True)

    def release(self, key, token):
        self._run(lambda db: db.execute("UPDATE summary_state SET lease_until = 0 WHERE key = ? AND fence = ?",
                                        (key, token)), write=True)

    def sweep(self):
        """Delete the expired rows now (put does it at most every ``sweep_interval`` seconds); how many."""
        now = self.clock()
        return self._run(lambda db: db.execute("DELETE FROM summary_state WHERE expires <= ? AND lease_until <= ?",
                                               (now, now)).rowcount, write=True)

    def count(self):
        """Rows in the table, expired or not (for tests and the panel)."""
        return self._run(lambda db: db.execute("SELECT COUNT(*) FROM summary_state").fetchone()[0])

    def check(self):
        self._run(lambda db: db.execute("SELECT 1").fetchone())

    def close(self):
        with self._lock:
            if self._db is not None:
                self._db.close()
                self._db = None


def _reason(exc):
    """An exception as a short phrase without request data: its class and, for OS errors, the strerror."""
    if isinstance(exc, OSError) and exc.strerror:
        return "%s (%s)" % (type(exc).__name__, exc.strerror)
    if type(exc).__module__ == "sqlite3":   # sqlite3 is imported only where SQLite is used
        return "%s: %s" % (type(exc).__name__, exc)
    return type(exc).__name__


# -- Redis -------------------------------------------------------------------

class RedisError(Exception):
    """An error reply (``-ERR ...``) from the server."""


class RespClient:
    """RESP2 over one TCP connection: ``call(*args)`` sends a command and returns its reply (bytes, int,
    list, None; an error reply raises RedisError; a broken connection OSError).  Not thread-safe."""

    MAX_LINE = 64 * 1024
    MAX_BULK = 512 * 1024 * 1024

    def __init__(self, host, port, password=None, username=None, db=0, connect_timeout=1.0, timeout=2.0):
        self.host, self.port, self.db = host, port, db
        self.password, self.username = password, username
        self.connect_timeout, self.timeout = connect_timeout, timeout
        self._sock = self._file = None

    @property
    def connected(self):
        return self._sock is not None

    def connect(self):
        self.close()
        sock = socket.create_connection((self.host, self.port), timeout=self.connect_timeout)
        try:
            sock.settimeout(self.timeout)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._sock, self._file = sock, sock.makefile("rb")
            if self.password is not None:
                self.call(*(("AUTH", self.username, self.password) if self.username else ("AUTH", self.password)))
            if self.db:
                self.call("SELECT", str(self.db))
        except BaseException:
            self.close()
            raise

    def close(self):
        if self._file is not None:
            self._file.close()
        if self._sock is not None:
            self._sock.close()
        self._sock = self._file = None

    def call(self, *args):
        if self._sock is None:
            self.connect()
        self._sock.sendall(encode_command(args))
        return self._reply()

    def _line(self):
        line = self._file.readline(self.MAX_LINE)
        if not line.endswith(b"\r\n"):
            raise ConnectionError("connection closed or bad RESP line")
        return line[:-2]

    def _reply(self):
        line = self._line()
        kind, rest = line[:1], line[1:]
        if kind == b"+":
            return rest
        if kind == b"-":
            raise RedisError(rest.decode("utf-8", "replace"))
        if kind == b":":
            return int(rest)
        if kind == b"$":
            n = int(rest)
            if n < 0:
                return None
            if n > self.MAX_BULK:
                raise ConnectionError("RESP bulk string too large")
            data = self._file.read(n + 2)
            if len(data) != n + 2 or data[-2:] != b"\r\n":
                raise ConnectionError("connection closed inside a RESP bulk string")
            return data[:-2]
        if kind == b"*":
            n = int(rest)
            if n < 0:
                return None
            return [self._reply() for _ in range(n)]
        raise ConnectionError("unexpected RESP reply type")


def encode_command(args):
    """A command as a RESP array of bulk strings (str is sent as UTF-8, int and float as their digits)."""
    out = [b"*%d\r\n" % len(args)]
    for arg in args:
        if isinstance(arg, bytes):
            data = arg
        elif isinstance(arg, str):
            data = arg.encode("utf-8", "surrogatepass")
        elif isinstance(arg, (int, float)) and not isinstance(arg, bool):
            data = repr(arg).encode()
        else:
            raise TypeError("a Redis argument must be bytes, str or a number")
        out.append(b"$%d\r\n%s\r\n" % (len(data), data))
    return b"".join(out)


def parse_redis_url(url):
    """``(host, port, username, password, db)`` of redis://[[user]:password@]host[:port][/db]; ValueError."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme != "redis":
        raise ValueError("redis_url must be redis://host:port/db (rediss:// and unix sockets are not supported)")
    try:
        port = parts.port or 6379
    except ValueError:
        raise ValueError("redis_url has a bad port") from None
    if not parts.hostname:
        raise ValueError("redis_url has no host")
    path = parts.path.strip("/")
    if path and not path.isdigit():
        raise ValueError("redis_url's path must be a database number")
    username = urllib.parse.unquote(parts.username) if parts.username else None
    password = urllib.parse.unquote(parts.password) if parts.password is not None else None
    return parts.hostname, port, username, password, int(path or 0)


# KEYS[1] the record.  ARGV: ttl ms.  A record in use lives ttl from its last read.
_GET = """
local r = redis.call('HMGET', KEYS[1], 'summary', 'covered', 'digest', 'version')
if r[1] then redis.call('PEXPIRE', KEYS[1], ARGV[1]) end
return r
"""
# KEYS[1] the record (a hash), KEYS[2] the lease.  ARGV: lease ms, ttl ms.
_ACQUIRE = """
if not redis.call('SET', KEYS[2], '0', 'NX', 'PX', ARGV[1]) then return 0 end
local token = redis.call('HINCRBY', KEYS[1], 'fence', 1)
redis.call('SET', KEYS[2], token, 'PX', ARGV[1])
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return token
"""
# KEYS[1] the record.  ARGV: token, expected version, summary, covered, digest, ttl ms.
_PUT = """
if tonumber(redis.call('HGET', KEYS[1], 'fence') or '0') ~= tonumber(ARGV[1]) then return -1 end
local version = 0
if redis.call('HEXISTS', KEYS[1], 'summary') == 1 then
  version = tonumber(redis.call('HGET', KEYS[1], 'version') or '0')
end
if version ~= tonumber(ARGV[2]) then return -2 end
redis.call('HSET', KEYS[1], 'summary', ARGV[3], 'covered', ARGV[4], 'digest', ARGV[5], 'version', version + 1)
redis.call('PEXPIRE', KEYS[1], ARGV[6])
return version + 1
"""
# KEYS[1] the lease.  ARGV: token.
_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


class RedisState(SessionState):
    """The state in Redis, shared by every replica pointed at it.  Keys: ``ragproxy:summary:{KEY}`` (a hash:
    summary, covered, digest, version, fence) and ``ragproxy:summary:{KEY}:lease``; the braces keep both
    in one Redis Cluster slot, as the scripts need."""
    backend = "redis"

    def __init__(self, url, ttl=DEFAULT_TTL, clock=time.time, connect_timeout=1.0, timeout=2.0,
                 retry_interval=1.0):
        host, port, username, password, db = parse_redis_url(url)
        self.where = "%s:%d" % (host, port)
        self.ttl, self.clock, self.retry_interval = float(ttl), clock, retry_interval
        self._client = RespClient(host, port, password, username, db, connect_timeout, timeout)
        self._lock = threading.Lock()
        self._down_until = None
        self._closed = False

    def _call(self, *args):
        with self._lock:
            if self._closed:
                raise StateUnavailable("redis state is closed")
            now = self.clock()
            if self._down_until is not None and now < self._down_until:
                raise StateUnavailable("redis at %s failed moments ago; next try in %.1fs"
                                       % (self.where, self._down_until - now))
            try:
                reply = self._client.call(*args)
            except RedisError as exc:
                # The connection is fine; the store refused (no scripting, wrong password, OOM...).
                self._fail(now)
                raise StateUnavailable("redis at %s refused: %s" % (self.where, _first_word(exc))) from None
            except (OSError, ValueError) as exc:
                self._fail(now)
                raise StateUnavailable("redis at %s unreachable: %s" % (self.where, _reason(exc))) from None
            self._down_until = None
            return reply

    def _fail(self, now):
        self._client.close()
        self._down_until = now + self.retry_interval

    @staticmethod
    def _record(key):
        return KEY_PREFIX + "{" + key + "}"

    def get(self, key):
        reply = self._call("EVAL", _GET, "1", self._record(key), str(int(self.ttl * 1000)))
        summary, covered, digest, version = reply
        if summary is None:
            return NOTHING
        try:
            return Stored(summary.decode("utf-8", "surrogatepass"), int(covered or 0),
                          (digest or b"").decode("ascii", "replace"), int(version or 0))
        except ValueError:
            return NOTHING  # a record someone else wrote by hand: treated as none, and overwritten

    def acquire(self, key, seconds):
        record = self._record(key)
        token = self._call("EVAL", _ACQUIRE, "2", record, record + ":lease", str(max(1, int(seconds * 1000))),
                           str(int(self.ttl * 1000)))
        return int(token) or None

    def put(self, key, token, expected_version, summary, covered, digest):
        out = self._call("EVAL", _PUT, "1", self._record(key), str(token), str(expected_version), summary,
                         str(covered), digest, str(int(self.ttl * 1000)))
        return int(out) > 0

    def release(self, key, token):
        self._call("EVAL", _RELEASE, "1", self._record(key) + ":lease", str(token))

    def check(self):
        if self._call("PING") != b"PONG":
            raise StateUnavailable("redis at %s did not answer PING with PONG" % self.where)

    def close(self):
        with self._lock:
            self._closed = True
            self._client.close()


def _first_word(exc):
    """A Redis error reply's code (ERR, NOAUTH, WRONGPASS, OOM...): its text may quote our arguments."""
    text = str(exc).split(" ", 1)[0]
    return "".join(c for c in text if c.isalnum() or c in "_-")[:32] or "error"
