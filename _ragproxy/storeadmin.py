"""The admin API's vector-store endpoints: connection tests of a knowledge base's store and of a Chroma server.

admin.py routes ``POST /admin/api/kbs/{kb}/store/test`` and
``POST /admin/api/vectorstore/test`` here.  A test that ran answers 200 with
``ok`` true or false and what to fix, as the provider test does: an
unreachable Chroma server is the test's finding, not an error of the admin
API.  A body the test cannot use is a 400 in the admin API's error shape.

The Chroma token never leaves: it is sent only to the configured server
(a base_url typed into the test gets none, or a panel session could send
the token to an address of its choosing), and no answer names it.

May import: api, chroma, config.
"""
from __future__ import annotations

import time
import urllib.parse

from . import chroma
from .api import ClientError, json_response
from .config import loggable_url

_SERVER_FIELDS = ("base_url", "tenant", "database")
_NAME_MAX = 128


class StoreAdmin:
    """The vector-store endpoints; ``clock`` times a failed test, ``client_factory`` makes ChromaClients."""

    def __init__(self, clock=time.perf_counter, client_factory=None):
        self.clock = clock
        self.client_factory = client_factory

    def test_kb_store(self, kb):
        """The knowledge base's own live test (KnowledgeBase.test_store(), which never raises for the store)."""
        result = dict(kb.test_store())
        result["kb"] = kb.spec.name
        return json_response(200, result)

    def test_server(self, config, body):
        """Connect to a Chroma server (the body's base_url, tenant, database over the configured ones)."""
        unknown = sorted(set(body) - set(_SERVER_FIELDS))
        if unknown:
            raise ClientError(400, f"unknown field {unknown[0]!r} (a vector store test takes "
                                   f"{', '.join(_SERVER_FIELDS)}, each optional)", "invalid_field")
        configured = config.raw["vectorstore"]["chroma_http"]
        settings = {}
        for key in _SERVER_FIELDS:
            value = body.get(key)
            if value is None or (value == "" and key == "base_url"):
                value = configured[key]
            settings[key] = _checked(key, value)
        if not settings["base_url"]:
            raise ClientError(400, "no Chroma server to test: send 'base_url', or set "
                                   "vectorstore.chroma_http.base_url in the config", "invalid_field")
        same_server = settings["base_url"] == configured["base_url"]
        factory = self.client_factory or chroma.ChromaClient
        answer = {"base_url": loggable_url(settings["base_url"]), "tenant": settings["tenant"],
                  "database": settings["database"], "configured": same_server}
        started = self.clock()
        try:
            client = factory(settings["base_url"], tenant=settings["tenant"], database=settings["database"],
                             timeout=configured["timeout"], token=configured["token"] if same_server else "")
        except ValueError as exc:   # what the client refuses before any call
            raise ClientError(400, str(exc), "invalid_field") from None
        try:
            found = client.check()
        except chroma.ChromaError as exc:
            return json_response(200, {**answer, "ok": False, "message": str(exc), "reason": exc.reason,
                                        "status": exc.status,
                                        "latency_ms": round((self.clock() - started) * 1000.0, 2)})
        finally:
            client.close()
        return json_response(200, {**answer, "ok": True, "reason": None, "status": None,
                                    "message": f"Chroma {found['version']} answered; tenant and database exist",
                                    "version": found["version"], "latency_ms": round(found["latency_ms"], 2),
                                    "max_batch_size": found["max_batch_size"]})


def _checked(key, value):
    """One field of a server test, as the config would take it; ClientError 400 otherwise."""
    if not isinstance(value, str):
        raise ClientError(400, f"'{key}' must be a string", "invalid_field")
    value = value.strip()
    if key == "base_url":
        if not value:
            return value
        parts = urllib.parse.urlsplit(value)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ClientError(400, "'base_url' must be an http:// or https:// URL (http://chroma:8000)",
                              "invalid_field")
        return value.rstrip("/")
    if not value or len(value) > _NAME_MAX or any(ord(c) < 32 or c == "\x7f" for c in value):
        raise ClientError(400, f"'{key}' must be a Chroma {key} name (1 to {_NAME_MAX} printable characters)",
                          "invalid_field")
    return value
