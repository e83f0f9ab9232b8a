"""The admin API's sessions: HS256 JWTs signed with the panel secret key, and the login throttle.

issue_token and verify_token are the whole of the token format (a header
that names any algorithm other than HS256 is refused, not verified some
other way); LoginThrottle slows down key guessing per client address.
b64url is also what the admin API makes random client keys readable with.

May import: api.
"""
from __future__ import annotations

import base64
import collections
import hashlib
import hmac
import json
import threading

from .api import json_bytes

_TOKEN_HEAD = {"alg": "HS256", "typ": "JWT"}
TOKEN_AUDIENCE = "ragproxy-admin"


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
