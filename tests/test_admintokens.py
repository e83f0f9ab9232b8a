"""The admin API's session tokens and login throttle (_ragproxy.admintokens), in-process.

test_admin drives both through /admin/api/login and /admin/api/session; these
pin the token format and the throttle's arithmetic on their own.  Two
SharedLoginThrottle objects on one file stand for two workers of
serve --workers (a forked pair for the concurrent counting).
"""
import base64
import contextlib
import json
import logging
import os
import sqlite3

import pytest

from _ragproxy.admintokens import (TOKEN_AUDIENCE, LoginThrottle, SharedLoginThrottle, b64url, issue_token,
                                   verify_token)
from conftest import ManualClock, at_once

SECRET = "panel-secret"


def _claims(**more):
    return {"sub": "admin", "aud": TOKEN_AUDIENCE, "exp": 1000, **more}


def test_a_token_verifies_until_it_expires_and_only_with_its_key_and_audience():
    token = issue_token(SECRET, _claims())
    assert verify_token(SECRET, token, 999.5) == _claims()
    assert verify_token(SECRET, token, 1000) is None                  # exp is the first instant refused
    assert verify_token("another-secret", token, 0) is None
    assert verify_token(SECRET, token, 0, audience="elsewhere") is None
    assert verify_token(SECRET, issue_token(SECRET, _claims(aud="elsewhere")), 0) is None


def test_the_token_is_a_compact_hs256_jws_without_padding():
    head, body, signature = issue_token(SECRET, _claims()).split(".")
    assert "=" not in head + body + signature
    assert json.loads(base64.urlsafe_b64decode(head + "==")) == {"alg": "HS256", "typ": "JWT"}
    assert json.loads(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4))) == _claims()


NONE_HEAD = b64url(b'{"alg":"none","typ":"JWT"}')
HS512_HEAD = b64url(b'{"alg":"HS512","typ":"JWT"}')


@pytest.mark.parametrize("forge", [
    lambda h, b, s: f"{NONE_HEAD}.{b}.",                                          # alg none, unsigned
    lambda h, b, s: f"{NONE_HEAD}.{b}.{s}",
    lambda h, b, s: f"{HS512_HEAD}.{b}.{s}",                                      # another algorithm named
    lambda h, b, s: f"{h}.{b64url(json.dumps(_claims(exp=10**9)).encode())}.{s}",  # claims changed
    lambda h, b, s: f"{h}.{b}",
    lambda h, b, s: f"{h}.{b}.{s}.",
    lambda h, b, s: f"{h}.{b}.{s[:-2]}",
    lambda h, b, s: "not a token",
    lambda h, b, s: f"{b64url(b'[' * 100_000)}.{b}.{s}",                        # parsed only once signed
])
def test_forged_or_malformed_tokens_are_refused(forge):
    head, body, signature = issue_token(SECRET, _claims()).split(".")
    assert verify_token(SECRET, forge(head, body, signature), 0) is None


@pytest.mark.parametrize("claims", [[1, 2], {"aud": TOKEN_AUDIENCE}, _claims(exp="1000"), _claims(exp=True)])
def test_signed_claims_that_are_not_an_object_with_a_numeric_expiry_are_refused(claims):
    assert verify_token(SECRET, issue_token(SECRET, claims), 0) is None


def test_the_throttle_lets_the_free_failures_through_then_doubles_the_wait_up_to_its_cap():
    clock = ManualClock(0.0)
    throttle = LoginThrottle(clock, window=900.0, max_wait=8.0)
    waits = []
    for _ in range(7):
        throttle.failed("10.0.0.1", free=3)
        waits.append(throttle.wait("10.0.0.1"))
    assert waits == [0.0, 0.0, 1.0, 2.0, 4.0, 8.0, 8.0]
    assert throttle.wait("10.0.0.2") == 0.0                             # per address
    clock.advance(3.0)
    assert throttle.wait("10.0.0.1") == 5.0
    throttle.succeeded("10.0.0.1")
    assert throttle.wait("10.0.0.1") == 0.0


def test_the_throttle_forgets_after_its_window_and_keeps_a_bounded_number_of_addresses():
    clock = ManualClock(0.0)
    throttle = LoginThrottle(clock, window=60.0, max_clients=3)
    throttle.failed("a", free=1)
    assert throttle.wait("a") == 1.0
    clock.advance(61)
    throttle.failed("a", free=2)     # the earlier failure is out of the window: this is the first again
    assert throttle.wait("a") == 0.0
    for client in ("b", "c", "d"):
        throttle.failed(client, free=1)
    assert throttle.wait("a") == 0.0 and throttle.wait("d") > 0      # the oldest address was let go


# -- the shared throttle (serve --workers) ------------------------------------

@pytest.fixture
def workers(tmp_path):
    """``workers(clock, **settings)``: two SharedLoginThrottles on one file under tmp_path/run."""
    made = []

    def make(clock, **settings):
        path = str(tmp_path / "run" / "login-throttle.sqlite3")
        made.extend([SharedLoginThrottle(path, clock, **settings), SharedLoginThrottle(path, clock, **settings)])
        return made[-2:]
    yield make
    for throttle in made:
        throttle.close()


def _rows(path, sql):
    with contextlib.closing(sqlite3.connect(path)) as db:
        return db.execute(sql).fetchall()


def test_failures_counted_by_one_worker_make_the_other_wait_and_a_success_on_either_clears_both(workers):
    clock = ManualClock(0.0)
    one, two = workers(clock, window=900.0, max_wait=8.0)
    waits = []
    for i in range(7):
        (one if i % 2 else two).failed("10.0.0.1", free=3)
        waits.append((one.wait("10.0.0.1"), two.wait("10.0.0.1")))
    # The single-process sequence, seen alike by both: neither worker has had three failures on its own.
    assert waits == [(w, w) for w in (0.0, 0.0, 1.0, 2.0, 4.0, 8.0, 8.0)]
    assert one.wait("10.0.0.2") == two.wait("10.0.0.2") == 0.0          # per address
    clock.advance(3.0)
    assert one.wait("10.0.0.1") == two.wait("10.0.0.1") == 5.0
    two.succeeded("10.0.0.1")
    assert one.wait("10.0.0.1") == 0.0
    one.failed("10.0.0.1", free=3)                                        # counting starts again from one
    assert two.wait("10.0.0.1") == 0.0
    assert not one.degraded and not two.degraded


SCRIPT = [("failed", "a", 1), ("wait", "a"), ("advance", 0.5), ("failed", "a", 1), ("wait", "a"),
          ("failed", "a", 1), ("failed", "a", 1), ("failed", "a", 1), ("wait", "a"),   # 16 s, capped at 10
          ("advance", 4), ("wait", "a"), ("advance", 57), ("wait", "a"),
          ("failed", "a", 2), ("wait", "a"),                          # 61 s after the last: the window is over
          ("failed", "a", 2), ("wait", "a"),
          ("failed", "b", 1), ("failed", "c", 1), ("failed", "d", 1), ("failed", "e", 1),
          ("wait", "a"), ("wait", "b"), ("wait", "c"), ("wait", "e"),   # three kept: the oldest two let go
          ("failed", "b", 3), ("wait", "b")]


def _play(recorder, checker, clock):
    seen = []
    for step in SCRIPT:
        if step[0] == "advance":
            clock.advance(step[1])
        elif step[0] == "failed":
            recorder.failed(step[1], free=step[2])
        else:
            seen.append(checker.wait(step[1]))
    return seen


def test_the_shared_throttle_keeps_the_in_memory_ones_window_cap_and_address_bound(workers):
    settings = {"window": 60.0, "max_wait": 10.0, "max_clients": 3}
    clock = ManualClock(0.0)
    alone = LoginThrottle(clock, **settings)
    expected = _play(alone, alone, clock)
    assert expected == [1.0, 2.0, 10.0, 6.0, 0.0, 0.0, 1.0, 0.0, 0.0, 1.0, 1.0, 0.0]   # the script means something
    clock = ManualClock(0.0)
    one, two = workers(clock, **settings)
    assert _play(one, two, clock) == expected
    assert _rows(one.path, "SELECT COUNT(*) FROM login_failures") == [(3,)]


def test_a_stored_wait_never_exceeds_max_wait_when_the_clock_is_behind_the_file(workers):
    clock = ManualClock(1_000_000.0)
    one, two = workers(clock, max_wait=30.0)
    for _ in range(3):
        one.failed("10.0.0.1", free=1)
    clock.now = 50.0   # a monotonic clock after a reboot, or a wall clock set back
    assert two.wait("10.0.0.1") == 30.0


def test_the_throttle_file_is_its_owners_alone(workers):
    old = os.umask(0)
    try:
        one, _ = workers(ManualClock(0.0))
        one.failed("10.0.0.1", free=1)
    finally:
        os.umask(old)
    assert oct(os.stat(one.path).st_mode & 0o777) == oct(0o600)
    for extra in ("-wal", "-shm"):
        if os.path.exists(one.path + extra):
            assert oct(os.stat(one.path + extra).st_mode & 0o777) == oct(0o600)
    assert oct(os.stat(os.path.dirname(one.path)).st_mode & 0o777) == oct(0o700)


def test_forked_workers_failing_at_once_lose_no_count(workers):
    # Built and used before the fork, as a supervisor might: each child must open its own connection.
    throttle, _ = workers(ManualClock(0.0), max_wait=10**9)
    throttle.failed("10.0.0.1", free=1)
    pids = []
    for _ in range(2):
        pid = os.fork()
        if pid == 0:   # pragma: no cover - the child's coverage is not collected
            code = 1
            try:
                for _ in range(100):
                    throttle.failed("10.0.0.1", free=1)
                code = 0 if not throttle.degraded else 2
            finally:
                os._exit(code)
        pids.append(pid)
    assert [os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) for pid in pids] == [0, 0]
    assert _rows(throttle.path, "SELECT failures FROM login_failures") == [(201,)]


def test_an_unusable_throttle_file_falls_back_to_this_process_with_one_warning(tmp_path, workers, caplog):
    (tmp_path / "run").write_text("a file where the directory should be")
    clock = ManualClock(0.0)
    caplog.set_level(logging.INFO, logger="ragproxy")
    one, two = workers(clock, max_wait=8.0)
    assert one.degraded and two.degraded
    for _ in range(3):
        one.failed("10.0.0.1", free=1)
    assert one.wait("10.0.0.1") == 4.0        # still throttled: never unlimited
    assert two.wait("10.0.0.1") == 0.0        # but per worker, which is what the warning says
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING and "login throttle" in r.getMessage()]
    assert len(warnings) == 2, warnings       # one per worker, not one per call
    assert one.path in warnings[0].getMessage() and "times the guesses" in warnings[0].getMessage()
    caplog.clear()
    (tmp_path / "run").unlink()               # repaired: the next call uses the file again
    one.failed("10.0.0.1", free=1)
    assert not one.degraded and two.wait("10.0.0.1") == 1.0   # the other worker sees it: shared again
    assert one.wait("10.0.0.1") == 4.0        # the three counted in memory still hold in this worker
    assert [r.getMessage() for r in caplog.records if "works again" in r.getMessage()]


def test_a_throttle_file_locked_past_the_timeout_falls_back_and_does_not_raise(workers, caplog):
    clock = ManualClock(0.0)
    one, two = workers(clock, busy_timeout=0.05)
    one.failed("10.0.0.1", free=1)
    holder = sqlite3.connect(one.path, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    try:
        two.failed("10.0.0.1", free=1)        # cannot write: counted in this worker's memory instead
        assert two.degraded
        assert two.wait("10.0.0.1") >= 1.0
        two.succeeded("10.0.0.1")             # nor may a success raise
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert [r for r in caplog.records if r.levelno == logging.WARNING and "database is locked" in r.getMessage()]
    assert one.wait("10.0.0.1") == 1.0        # the locked-out failure did not reach the file
    two.failed("10.0.0.1", free=1)
    assert not two.degraded and one.wait("10.0.0.1") == 2.0


def test_workers_opening_a_new_throttle_file_at_once_all_share_it(tmp_path):
    """serve's workers make their throttles together at start.  Before the WAL switch was retried, 14
    rounds of 100 left one of four on its in-memory throttle ("database is locked")."""
    for round_ in range(60):
        path = str(tmp_path / f"throttle-{round_}.sqlite3")
        made = at_once(lambda: SharedLoginThrottle(path, ManualClock()))
        assert [t.degraded for t in made] == [False] * 4, f"round {round_}: {made}"
        for throttle in made:
            throttle.close()
