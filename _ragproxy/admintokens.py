"""The admin API's sessions: HS256 JWTs signed with the panel secret key, and the login throttle.

issue_token and verify_token are the whole of the token format (a header
that names any algorithm other than HS256 is refused, not verified some
other way); LoginThrottle slows down key guessing per client address.
SharedLoginThrottle does the same for several processes (serve --workers)
through one SQLite file, so that N workers do not allow N times the guesses;
sqlite3 is imported when it is first used, so a Python built without it
still starts (the throttle then works per process and says so in the log).
b64url is also what the admin API makes random client keys readable with.

May import: api, files.
"""
from __future__ import annotations

import base64
import collections
import hashlib
import hmac
import json
import logging
import os
import threading

from .api import json_bytes
from .files import retry_while_locked

_TOKEN_HEAD = {"alg": "HS256", "typ": "JWT"}
TOKEN_AUDIENCE = "ragproxy-admin"

log = logging.getLogger("ragproxy")


def b64url(data):
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _b64url_decode(text):
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def issue_token(secret, claims):
    """A compact JWS (JWT, HS256) over ``claims``."""
    signing_input = b64url(json_bytes(_TOKEN_HEAD)) + "." + b64url(json_bytes(claims))
    signature = hmac.new(secret.encode("utf-8"), signing_input.encode("ascii"), hashlib.sha256).digest()
    return signing_input + "." + b64url(signature)


def verify_token(secret, token, now, audience=TOKEN_AUDIENCE):
    """The claims of a genuine, unexpired token for ``audience``; None for anything else.

    The header must say HS256 exactly: a token that names another algorithm
    ("none" included) is refused, not verified some other way.
    """
    parts = token.split(".")
    if len(parts) != 3 or not all(parts):
        return None
    signing_input = (parts[0] + "." + parts[1]).encode("ascii", "replace")
    expected = hmac.new(secret.encode("utf-8"), signing_input, hashlib.sha256).digest()
    try:
        if not hmac.compare_digest(_b64url_decode(parts[2]), expected):
            return None  # checked first: nothing from an unsigned token is parsed
        header = json.loads(_b64url_decode(parts[0]))
        claims = json.loads(_b64url_decode(parts[1]))
    except (ValueError, UnicodeDecodeError):
        return None
    if header != _TOKEN_HEAD or not isinstance(claims, dict):
        return None
    expires = claims.get("exp")
    if not isinstance(expires, (int, float)) or isinstance(expires, bool) or now >= expires:
        return None
    if claims.get("aud") != audience:
        return None
    return claims


class LoginThrottle:
    """Slows down key guessing per client address.

    The first ``free`` failures within ``window`` seconds cost nothing; each
    further one doubles the wait before the next attempt (up to ``max_wait``).
    ``free`` is passed with each failure: it is admin.max_login_failures as
    the config says at that moment, so a reload changes it at once.
    """

    def __init__(self, clock, window=900.0, max_wait=300.0, max_clients=10_000):
        self.clock, self.window, self.max_wait = clock, window, max_wait
        self.max_clients = max_clients
        self._lock = threading.Lock()
        self._clients = collections.OrderedDict()  # client -> [failures, last failure, blocked until]

    def wait(self, client):
        """Seconds ``client`` must wait before its next attempt (0: go ahead)."""
        with self._lock:
            state = self._clients.get(client)
            return max(0.0, state[2] - self.clock()) if state else 0.0

    def failed(self, client, free):
        now = self.clock()
        with self._lock:
            state = self._clients.pop(client, None)
            if state is None or now - state[1] > self.window:
                state = [0, now, 0.0]
            state[0] += 1
            state[1] = now
            if state[0] >= free:
                state[2] = now + min(self.max_wait, 2.0 ** (state[0] - free))
            self._clients[client] = state
            while len(self._clients) > self.max_clients:  # a flood of addresses must not eat memory
                self._clients.popitem(last=False)

    def succeeded(self, client):
        with self._lock:
            self._clients.pop(client, None)


_THROTTLE_SCHEMA = """
CREATE TABLE IF NOT EXISTS login_failures (
    client TEXT PRIMARY KEY,
    failures INTEGER NOT NULL,
    last_failure REAL NOT NULL,
    blocked_until REAL NOT NULL
)"""


class SharedLoginThrottle:
    """LoginThrottle's rules, with the state in one SQLite file that several processes share.

    Every worker of ``serve --workers N`` opens the same ``path``: a failure
    counted by one makes the others wait, and a success on one clears the
    address for all.  Each call is one short transaction (``failed`` a
    ``BEGIN IMMEDIATE`` read-modify-write, so two workers counting at once
    both count).  The addresses kept are bounded by ``max_clients`` as in
    LoginThrottle: the one whose last failure is oldest goes first.

    When the file cannot be used (unwritable, disk full, locked for longer
    than ``busy_timeout``, no sqlite3), the calls go to an in-memory
    LoginThrottle of this process instead: one warning when that starts,
    one info line when the file works again.  Not a refusal of every login: the panel is how an
    operator repairs a full disk or a bad data directory, and a shared file
    that anyone able to fill the disk could break would then lock them out.
    Not unlimited either: each worker still throttles what it sees, which is
    what a single process has always done.
    """

    def __init__(self, path, clock, window=900.0, max_wait=300.0, max_clients=10_000, busy_timeout=2.0):
        self.path, self.clock, self.window, self.max_wait = str(path), clock, window, max_wait
        self.max_clients, self.busy_timeout = max_clients, busy_timeout
        self._lock = threading.Lock()
        self._db = None
        self._db_pid = None
        self._local = LoginThrottle(clock, window, max_wait, max_clients)
        self.degraded = False   # True while the calls go to the in-memory throttle
        # Tried now so that a bad path is in the log at start-up, not at the first login; the connection
        # is not kept, because a supervisor may build this before it forks and a SQLite connection must
        # not cross a fork.
        with self._lock:
            self._use(lambda db: None)
            self._close()

    def wait(self, client):
        """Seconds ``client`` must wait before its next attempt (0: go ahead)."""
        now = self.clock()
        with self._lock:
            row = self._use(lambda db: db.execute("SELECT blocked_until FROM login_failures WHERE client = ?",
                                                  (client,)).fetchone())
        shared = 0.0 if not row else row[0] - now
        # The file outlives the process and the clock it was written with (a monotonic clock restarts at
        # boot, a wall clock can be set back): no stored row may ask for more than the longest wait.
        shared = min(self.max_wait, max(0.0, shared))
        # Failures counted while the file was failing are only in memory; they still count.
        return max(shared, self._local.wait(client))

    def failed(self, client, free):
        now = self.clock()

        def count(db):
            db.execute("BEGIN IMMEDIATE")
            try:
                row = db.execute("SELECT failures, last_failure, blocked_until FROM login_failures"
                                 " WHERE client = ?", (client,)).fetchone()
                failures, blocked = (0, 0.0) if row is None or now - row[1] > self.window else (row[0], row[2])
                failures += 1
                if failures >= free:
                    blocked = now + min(self.max_wait, 2.0 ** (failures - free))
                # Deleted and inserted again, not updated: the rowid order is then the order of the last
                # failures, which is what the pruning below lets go of first (LoginThrottle's OrderedDict).
                db.execute("DELETE FROM login_failures WHERE client = ?", (client,))
                db.execute("INSERT INTO login_failures (client, failures, last_failure, blocked_until)"
                           " VALUES (?, ?, ?, ?)", (client, failures, now, blocked))
                # Rows that can no longer throttle anyone: keeps the file small between floods.
                db.execute("DELETE FROM login_failures WHERE last_failure < ? AND blocked_until <= ?",
                           (now - self.window, now))
                extra = db.execute("SELECT COUNT(*) FROM login_failures").fetchone()[0] - self.max_clients
                if extra > 0:
                    db.execute("DELETE FROM login_failures WHERE rowid IN"
                               " (SELECT rowid FROM login_failures ORDER BY rowid LIMIT ?)", (extra,))
            except BaseException:
                try:
                    db.execute("ROLLBACK")
                except Exception:   # a broken connection: the error that broke it is the one to report
                    pass
                raise
            db.execute("COMMIT")
            return True

        with self._lock:
            if self._use(count) is None:
                self._local.failed(client, free)

    def succeeded(self, client):
        self._local.succeeded(client)
        with self._lock:
            self._use(lambda db: db.execute("DELETE FROM login_failures WHERE client = ?", (client,)))

    def close(self):
        with self._lock:
            self._close()

    # -- the file -------------------------------------------------------------

    def _use(self, work):
        """``work(db)``'s result, or None (with one warning per outage) when the file cannot be used."""
        try:
            import sqlite3  # here: see the module docstring
        except ImportError as exc:
            return self._unavailable(exc)
        try:
            out = work(self._connection(sqlite3))
        except (OSError, sqlite3.Error) as exc:
            self._close()   # the next call opens it again: the file may be fixed by then
            return self._unavailable(exc)
        if self.degraded:
            self.degraded = False
            log.info("admin login throttle: %s works again; failed logins are shared by every worker once more",
                     self.path)
        return out

    def _connection(self, sqlite3):
        if self._db is not None and self._db_pid == os.getpid():
            return self._db
        # A connection inherited through fork belongs to the parent: left alone, not closed or used.
        self._db = None
        parent = os.path.dirname(os.path.abspath(self.path))
        os.makedirs(parent, mode=0o700, exist_ok=True)
        # Created 0600 before SQLite opens it: the rows are client addresses.  SQLite gives its -wal and
        # -shm files the database file's mode.
        os.close(os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600))
        db = sqlite3.connect(self.path, timeout=self.busy_timeout, isolation_level=None, check_same_thread=False)
        try:
            db.execute("PRAGMA busy_timeout=%d" % int(self.busy_timeout * 1000))
            retry_while_locked(lambda: db.execute("PRAGMA journal_mode=WAL"))   # serve's workers open it together
            db.execute(_THROTTLE_SCHEMA)
        except BaseException:
            db.close()
            raise
        self._db, self._db_pid = db, os.getpid()
        return db

    def _close(self):
        if self._db is not None and self._db_pid == os.getpid():
            self._db.close()
        self._db = None

    def _unavailable(self, exc):
        if not self.degraded:
            self.degraded = True
            log.warning("admin login throttle: cannot use %s (%s); until it works again each worker "
                        "throttles failed logins on its own, so N workers allow up to N times the guesses",
                        self.path, _reason(exc))
        return None


def _reason(exc):
    """An exception as a short phrase: its class, and the strerror or SQLite's message."""
    if isinstance(exc, OSError) and exc.strerror:
        return "%s: %s" % (type(exc).__name__, exc.strerror)
    return "%s: %s" % (type(exc).__name__, exc)
