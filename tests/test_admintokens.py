"""The admin API's session tokens and login throttle (_ragproxy.admintokens), in-process.

test_admin drives both through /admin/api/login and /admin/api/session; these
pin the token format and the throttle's arithmetic on their own.
"""
import base64
import json

import pytest

from _ragproxy.admintokens import TOKEN_AUDIENCE, LoginThrottle, b64url, issue_token, verify_token
from conftest import ManualClock

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
