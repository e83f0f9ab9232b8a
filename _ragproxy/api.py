"""The client APIs ragproxy speaks: endpoints, dialects, and the transport-neutral request and response.

The four client APIs (OpenAI, Responses, Anthropic, Ollama) differ in error
shapes, stream framing and how a failure after the first byte is reported.
Everything format-specific the proxy, the admin API and the server need
lives here, keyed by dialect name, with the types that pass between a
transport and the application: Request, Response, StreamResponse and
ClientError (a refusal rendered in the client's own error shape).

May import: nothing (the standard library only).
"""
from __future__ import annotations

import dataclasses
import json
import re

_OPENAI_ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                       404: "invalid_request_error", 408: "timeout", 411: "invalid_request_error",
                       413: "invalid_request_error", 415: "invalid_request_error", 429: "rate_limit_error",
                       431: "invalid_request_error"}
_ANTHROPIC_ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                          404: "not_found_error", 408: "timeout_error", 411: "invalid_request_error",
                          413: "request_too_large", 415: "invalid_request_error", 429: "rate_limit_error",
                          431: "invalid_request_error", 504: "timeout_error", 529: "overloaded_error"}


def _error_body(dialect, status, message, code=None):
    """The JSON error body a client of ``dialect`` expects for ``status``."""
    if dialect == "anthropic":
        etype = _ANTHROPIC_ERROR_TYPES.get(status, "api_error")
        obj = {"type": "error", "error": {"type": etype, "message": message}}
    elif dialect == "ollama":
        obj = {"error": message}
    else:  # openai chat, responses and the generic /v1 pass-through
        etype = _OPENAI_ERROR_TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
        obj = {"error": {"message": message, "type": etype, "param": None, "code": code}}
    return json_bytes(obj)


# json.dumps with options builds an encoder per call (~0.6 us of a 4 KB
# message's 7.7); one encoder holds no state between calls, so threads share it.
_compact_encode = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode


def json_text(obj):
    return _compact_encode(obj)


def json_bytes(obj):
    try:
        return json_text(obj).encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate a client sent as an escape: keep it one
        return json.dumps(obj, separators=(",", ":")).encode("ascii")


class StreamTracker:
    """Watches a relayed stream just enough to report a late failure in-band.

    A Responses stream is numbered (``sequence_number``) and belongs to one
    response id; the failure event must continue both or Codex rejects it.
    """

    _SEQ = re.compile(rb'"sequence_number"\s*:\s*(\d+)')
    _RESP_ID = re.compile(rb'"id"\s*:\s*"(resp_[^"]*)"')

    def __init__(self, dialect):
        self.dialect = dialect
        self.sequence = -1
        self.response_id = None
        self.last = b""  # the last piece relayed (see _hang_up)

    @property
    def watches(self):
        """Whether feed() needs the stream's bytes (only Responses events carry state)."""
        return self.dialect == "responses"

    def feed(self, data):
        """Note a Responses stream's sequence number and response id (see watches)."""
        seqs = self._SEQ.findall(data)
        if seqs:
            self.sequence = int(seqs[-1])
        if self.response_id is None:
            m = self._RESP_ID.search(data)
            if m:
                self.response_id = m.group(1).decode("ascii", "replace")

    def error_event(self, message, code="upstream_error"):
        """Bytes that tell a streaming client of ``dialect`` the stream failed."""
        if self.dialect == "anthropic":
            body = json_bytes({"type": "error", "error": {"type": "api_error", "message": message}})
            return b"event: error\ndata: " + body + b"\n\n"
        if self.dialect == "ollama":
            return json_bytes({"error": message}) + b"\n"
        if self.dialect == "responses":
            self.sequence += 1
            event = {"type": "response.failed", "sequence_number": self.sequence,
                     "response": {"id": self.response_id or "resp_ragproxy_failed", "object": "response",
                                  "status": "failed", "output": [],
                                  "error": {"code": "server_error", "message": message}}}
            return b"event: response.failed\ndata: " + json_bytes(event) + b"\n\n"
        body = json_bytes({"error": {"message": message, "type": "server_error", "param": None, "code": code}})
        return b"data: " + body + b"\n\n"


@dataclasses.dataclass(frozen=True)
class Endpoint:
    """A client-facing API operation the proxy understands."""

    name: str
    dialect: str           # error shape and stream framing: openai, responses, anthropic, ollama
    required: tuple = ()   # body fields that must be present
    list_fields: tuple = ()  # of those, the ones that must be JSON arrays


ENDPOINTS = {
    ("POST", "/v1/chat/completions"): Endpoint("chat", "openai", ("model", "messages"), ("messages",)),
    ("POST", "/v1/completions"): Endpoint("completions", "openai", ("model",)),
    ("POST", "/v1/responses"): Endpoint("responses", "responses", ("model",)),
    ("POST", "/v1/embeddings"): Endpoint("embeddings", "openai", ("model", "input")),
    ("POST", "/v1/messages"): Endpoint("messages", "anthropic", ("model", "messages"), ("messages",)),
    ("POST", "/v1/messages/count_tokens"): Endpoint("count_tokens", "anthropic", ("model", "messages"),
                                                    ("messages",)),
    ("POST", "/api/chat"): Endpoint("ollama_chat", "ollama", ("model",)),
    ("POST", "/api/generate"): Endpoint("ollama_generate", "ollama", ("model",)),
    ("POST", "/api/embed"): Endpoint("ollama_embed", "ollama", ("model",)),
    ("POST", "/api/embeddings"): Endpoint("ollama_embed", "ollama", ("model",)),
    ("POST", "/api/show"): Endpoint("ollama_show", "ollama", ()),
}

#: Paths some clients send without the /v1 prefix.
_UNPREFIXED = ("/chat/completions", "/completions", "/responses", "/messages", "/models", "/embeddings")


#: A key carried in the path, for clients that can set a base URL but no header
#: (``http://HOST:PORT/k/KEY/api/chat``).  The prefix is taken off before routing
#: and never forwarded; loggable_path() masks it wherever a path is logged.
KEY_PREFIX = "/k/"


def split_key_prefix(path):
    """``(key, rest)`` for a path that starts ``/k/KEY/``; ``(None, path)`` for any other."""
    if not path.startswith(KEY_PREFIX):
        return None, path
    key, slash, rest = path[len(KEY_PREFIX):].partition("/")
    return key, slash + rest if slash else "/"


def loggable_path(path):
    """``path`` with a key prefix masked, so a key never reaches a log line."""
    key, rest = split_key_prefix(path)
    return path if key is None else KEY_PREFIX + "***" + rest


def normalize_path(path):
    """Map the path variants clients use onto one canonical form."""
    if len(path) > 1:
        path = path.rstrip("/")
    if path.startswith(_UNPREFIXED):
        path = "/v1" + path
    return path


def dialect_for_path(path):
    if path.startswith("/v1/messages"):
        return "anthropic"
    if path.startswith("/api/"):
        return "ollama"
    if path.startswith("/v1/responses"):
        return "responses"
    return "openai"


def dialect_of(path):
    """The API dialect, hence error shape, of a request path as sent."""
    return dialect_for_path(normalize_path(path))


def is_event_stream(content_type):
    ct = content_type.split(";", 1)[0].strip().lower()
    return ct in ("text/event-stream", "application/x-ndjson", "application/jsonl", "application/json-seq")


@dataclasses.dataclass
class Request:
    """A parsed HTTP request; ``headers`` has lower-case names."""

    method: str
    path: str
    query: str = ""
    headers: dict = dataclasses.field(default_factory=dict)
    body: bytes = b""
    client: str = ""
    stream: object = None  # uploads: a reader of the unread body instead of ``body``
    path_key: str = None  # a key taken off the path (/k/KEY/...); never forwarded or logged


@dataclasses.dataclass
class Response:
    """A complete response.  A transport calls ``after()``, when set, once
    the bytes are sent (or failed to send): the request log and metrics are
    kept there, off the client's clock, as a server logs after it answers."""

    status: int
    headers: list = dataclasses.field(default_factory=list)
    body: bytes = b""
    after: object = None


@dataclasses.dataclass
class StreamResponse:
    """A response whose body arrives piece by piece; ``close()`` stops the upstream.

    ``on_hangup``, when set, is called instead of ``close()`` if the client
    goes away while the stream is relayed.
    """

    status: int
    headers: list
    chunks: object  # iterator of bytes
    close: object = lambda: None
    on_hangup: object = None


class ClientError(Exception):
    """A request the proxy refuses; rendered in the client's API error shape."""

    def __init__(self, status, message, code=None, headers=()):
        super().__init__(message)
        self.status, self.message, self.code, self.headers = status, message, code, list(headers)


def json_response(status, obj, headers=()):
    return Response(status, [("Content-Type", "application/json")] + list(headers), json_bytes(obj))


def error_response(dialect, status, message, code=None, headers=()):
    return Response(status, [("Content-Type", "application/json")] + list(headers),
                    _error_body(dialect, status, message, code))
