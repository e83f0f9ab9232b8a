"""The MCP server: JSON-RPC 2.0 over Streamable HTTP and stdio, and the knowledge-base tools.

An agent in the middle of a task knows better than ragproxy's guess what it
needs to read, so the knowledge bases the proxy injects from are also served
as Model Context Protocol tools: ``search``, ``list_knowledge_bases`` and
``read_source``.  McpServer is transport-neutral: ``handle(request, key)``
serves the Streamable HTTP endpoint (``POST`` and ``DELETE /mcp``, an
api.Request in, an api.Response or StreamResponse out), ``serve_stdio``
the newline-delimited stdio transport, and both come down to
``handle_payload(payload, session)``.

The protocol is the handshake revisions (initialize, then requests in a
session): PROTOCOL_VERSIONS, the newest first.  A client asking for another
revision is answered with the newest.  JSON-RPC batches are taken in the
revisions that had them (2024-11-05, 2025-03-26) and refused in later ones.
Sessions live here, in memory, bound to the API key that opened them, and
expire when idle; there are at most MAX_SESSIONS.

The app (proxy.App, or the one ``ragproxy.py mcp --stdio`` makes) is used
duck-typed: ``knowledge_bases``, ``retriever``, ``readable_kbs(key)``,
``config``, ``metrics``, ``request_log`` and ``clock``.  A tool answers only
from the knowledge bases ``readable_kbs`` names for the caller's key; one
that names another is a tool error, as a knowledge base still being indexed
or failing is.

May import: api, embeddings, metrics, npy.
"""
from __future__ import annotations

import collections
import dataclasses
import hashlib
import ipaddress
import json
import logging
import os
import secrets
import threading
import time
import urllib.parse

from . import __version__
from .api import Response, StreamResponse, json_bytes
from .embeddings import Deadline, EmbeddingError, RerankError
from .metrics import MCP_TOOLS
from .npy import StoreError

log = logging.getLogger("ragproxy")


#: The revisions served, newest first: initialize gets the client's if it is here, else the first.
PROTOCOL_VERSIONS = ("2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05")
_BATCH_VERSIONS = frozenset(("2024-11-05", "2025-03-26"))        # 2025-06-18 removed JSON-RPC batches
_STRUCTURED_VERSIONS = frozenset(("2025-06-18", "2025-11-25"))  # outputSchema, structuredContent, title

MAX_MESSAGE_BYTES = 1024 * 1024   # one POST body or stdio line; server.max_body_bytes is far larger
MAX_BATCH = 64
MAX_SESSIONS = 1024
SESSION_IDLE_SECONDS = 24 * 3600.0
MAX_TOP_K = 50
SEARCH_TEXT_BUDGET = 24_000       # characters of passage text in one search answer
READ_LINE_LIMIT = 400             # lines, and characters, of one read_source answer
READ_CHAR_LIMIT = 32_000

#: The requests this server answers (initialize opens the session the others need).
_SESSION_METHODS = frozenset(("initialize", "ping", "tools/list", "tools/call"))
PARSE_ERROR, INVALID_REQUEST, METHOD_NOT_FOUND, INVALID_PARAMS, INTERNAL_ERROR = \
    -32700, -32600, -32601, -32602, -32603
_UNAUTHORIZED = -32001  # the implementation-defined range: no standard code says "no key"

_INSTRUCTIONS = (
    "ragproxy serves the project's knowledge bases (indexed documentation and code). Call search with the "
    "words a passage would contain (identifiers, error messages, terms) before answering from memory; "
    "read_source reads more of a document around a hit; list_knowledge_bases says what each holds.")

_SEARCH_FAILED = ("the search failed (details are in ragproxy's log); try again, or search another knowledge base")


# -- JSON-RPC messages -------------------------------------------------------

def _result(mid, result):
    return {"jsonrpc": "2.0", "id": mid, "result": result}


def _error(mid, code, message, data=None):
    error = {"code": code, "message": message}
    if data is not None:
        error["data"] = data
    return {"jsonrpc": "2.0", "id": mid, "error": error}


def _valid_id(value):
    # MCP: a string or an integer, never null (JSON-RPC's fractional numbers are refused too).
    return isinstance(value, str) or (isinstance(value, int) and not isinstance(value, bool))


def _shown(value, limit=80):
    """``value`` quoted for an error message, cut short: clients' strings can be anything."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _reject_constant(name):
    raise ValueError(f"{name} is not JSON")


def parse_message(data):
    """The JSON value of one message's bytes; ValueError if they are not UTF-8 JSON."""
    return json.loads(data.decode("utf-8"), parse_constant=_reject_constant)


# -- tools -------------------------------------------------------------------

class _ToolError(Exception):
    """A tool call that failed in a way the model can act on; ``outcome`` is error or denied."""

    def __init__(self, message, outcome="error"):
        super().__init__(message)
        self.outcome = outcome


@dataclasses.dataclass
class _Call:
    """What one tool call did, for the request log."""

    tool: str
    kbs: list = dataclasses.field(default_factory=list)
    mode: str = None
    query: str = None
    chunk_ids: list = dataclasses.field(default_factory=list)
    search_ms: float = None


_STRING, _INTEGER, _NUMBER, _BOOLEAN = {"type": "string"}, {"type": "integer"}, {"type": "number"}, \
    {"type": "boolean"}

_SEARCH_INPUT = {
    "type": "object",
    "properties": {
        "query": {"type": "string", "minLength": 1, "description":
                  "What to look for, in the words the passage would use: identifiers, error messages, "
                  "terms of the domain. Plain words, not a question to a person."},
        "kb": {"type": "string", "minLength": 1, "description":
               "Search only this knowledge base (a name from list_knowledge_bases). Default: every one "
               "this client may read, merged in their configured order."},
        "top_k": {"type": "integer", "minimum": 1, "maximum": MAX_TOP_K, "description":
                  "How many passages to return (1-50). Default: the server's rag.top_k."},
        "mode": {"type": "string", "enum": ["lexical", "dense", "hybrid"], "description":
                 "lexical: BM25 on words (best for identifiers); dense: embedding similarity (meaning); "
                 "hybrid: both fused. Default: each knowledge base's own. dense and hybrid need a "
                 "knowledge base with embeddings."},
    },
    "required": ["query"],
    "additionalProperties": False,
}
_SEARCH_OUTPUT = {
    "type": "object",
    "properties": {
        "query": _STRING,
        "kbs": {"type": "array", "items": _STRING, "description": "The knowledge bases searched."},
        "results": {"type": "array", "items": {
            "type": "object",
            "properties": {
                "rank": _INTEGER, "kb": _STRING, "source": _STRING, "id": _STRING, "score": _NUMBER,
                "lines": {"type": "string", "description": "start-end, 1-based, when known"},
                "line_start": _INTEGER, "line_end": _INTEGER, "symbol": _STRING, "title": _STRING,
                "section": _STRING, "text": _STRING, "truncated": _BOOLEAN,
            },
            "required": ["rank", "kb", "source", "id", "score", "text"],
        }},
        "truncated": {"type": "boolean", "description": "Results or text were left out to stay within the "
                                                        "answer's size budget."},
        "notes": {"type": "array", "items": _STRING},
    },
    "required": ["query", "kbs", "results", "truncated", "notes"],
}
_LIST_INPUT = {"type": "object", "properties": {}, "additionalProperties": False}
_LIST_OUTPUT = {
    "type": "object",
    "properties": {"knowledge_bases": {"type": "array", "items": {
        "type": "object",
        "properties": {
            "name": _STRING,
            "retrieval": {"type": "string", "description": "lexical, dense or hybrid"},
            "state": {"type": "string", "enum": ["ready", "indexing", "failed", "not_indexed"]},
            "files": _INTEGER, "chunks": _INTEGER,
            "last_indexed": {"type": ["string", "null"], "description": "ISO 8601, UTC"},
            "sources": {"type": "array", "items": {
                "type": "object", "properties": {"name": _STRING, "files": _INTEGER},
                "required": ["name", "files"]}},
            "note": _STRING,
        },
        "required": ["name", "retrieval", "state", "files", "chunks", "last_indexed", "sources"],
    }}},
    "required": ["knowledge_bases"],
}
_READ_INPUT = {
    "type": "object",
    "properties": {
        "kb": {"type": "string", "minLength": 1, "description": "The knowledge base, as search results name it."},
        "source": {"type": "string", "minLength": 1, "description":
                   "The document, exactly as search results give its source (e.g. 'docs/guide/install.md')."},
        "start_line": {"type": "integer", "minimum": 1, "description": "First line wanted (1-based). Default 1."},
        "end_line": {"type": "integer", "minimum": 1, "description": "Last line wanted. Default: as far as one "
                                                                      "answer goes."},
    },
    "required": ["kb", "source"],
    "additionalProperties": False,
}
_READ_OUTPUT = {
    "type": "object",
    "properties": {
        "kb": _STRING, "source": _STRING, "text": _STRING,
        "line_start": _INTEGER, "line_end": _INTEGER,
        "last_line": {"type": "integer", "description": "The document's last indexed line (0: no line numbers)."},
        "truncated": _BOOLEAN,
        "next_start_line": {"type": ["integer", "null"], "description": "Pass as start_line to read on; null at "
                                                                        "the end."},
    },
    "required": ["kb", "source", "text", "line_start", "line_end", "last_line", "truncated", "next_start_line"],
}

_TOOLS = {
    "search": ("Search the knowledge bases", (
        "Search the project's knowledge bases (its indexed documentation and code) for passages about "
        "something. Use it before answering questions about this project from memory, and when you need "
        "an API, a config key, an error message or a design decision. Returns ranked passages, each with its "
        "knowledge base, source path, line range, symbol (for code), score and text; the whole answer is "
        f"bounded to about {SEARCH_TEXT_BUDGET:,} characters of text. To read more around a hit, call "
        "read_source with its kb and source and a line range."), _SEARCH_INPUT, _SEARCH_OUTPUT),
    "list_knowledge_bases": ("List the knowledge bases", (
        "List the knowledge bases this client may search: name, retrieval mode, files, chunks, state "
        "(ready, indexing, failed, not_indexed), when last indexed, and the source folders each covers. "
        "Call it to choose a kb for search or read_source, or when a search finds nothing."),
        _LIST_INPUT, _LIST_OUTPUT),
    "read_source": ("Read an indexed document", (
        "Read the indexed text of one document of a knowledge base, optionally only a line range, to read "
        "around a search hit. Give kb and source exactly as search results give them. One answer holds at "
        f"most {READ_LINE_LIMIT} lines and {READ_CHAR_LIMIT:,} characters; it says which start_line to ask "
        "for next. Text is as indexed: runs of blank lines may be collapsed."), _READ_INPUT, _READ_OUTPUT),
}
assert tuple(_TOOLS) == MCP_TOOLS, "the metrics' closed label set must name exactly these tools"

_JSON_TYPES = {"string": str, "integer": int, "number": (int, float), "boolean": bool, "object": dict,
               "array": list}


def _argument_problems(schema, args):
    """What is wrong with ``args`` for an input schema of the kind above (flat, typed properties)."""
    problems = []
    properties = schema["properties"]
    for name in schema.get("required", ()):
        if name not in args:
            problems.append(f"'{name}' is required")
    for name, value in args.items():
        spec = properties.get(name)
        if spec is None:
            known = ", ".join(properties) or "none"
            problems.append(f"unknown argument {_shown(name, 40)} (arguments: {known})")
            continue
        kind = spec["type"]
        if not isinstance(value, _JSON_TYPES[kind]) or (kind in ("integer", "number") and isinstance(value, bool)):
            problems.append(f"'{name}' must be {'an' if kind[0] in 'aeiou' else 'a'} {kind}, "
                            f"not {_json_type(value)}")
            continue
        if "enum" in spec and value not in spec["enum"]:
            problems.append(f"'{name}' must be one of {', '.join(spec['enum'])}, not {_shown(value, 40)}")
        if "minLength" in spec and len(value.strip()) < spec["minLength"]:
            problems.append(f"'{name}' must not be empty")
        if "minimum" in spec and value < spec["minimum"] or "maximum" in spec and value > spec["maximum"]:
            low, high = spec.get("minimum"), spec.get("maximum")
            problems.append(f"'{name}' must be {f'from {low} to {high}' if high is not None else f'at least {low}'}"
                            f", not {value}")
    return problems


def _json_type(value):
    for name, kind in (("null", type(None)), ("a boolean", bool), ("an integer", int), ("a number", float),
                       ("a string", str), ("an array", list), ("an object", dict)):
        if isinstance(value, kind):
            return name
    return type(value).__name__


def _cut(text, limit):
    """``text`` cut to at most ``limit`` characters, at a line break when one is near."""
    if len(text) <= limit:
        return text
    at = text.rfind("\n", 0, limit)
    return text[:at if at > limit // 2 else limit]


def _overlap(before, text, probe=16):
    """How many leading characters of ``text`` repeat the end of ``before`` (chunks overlap)."""
    head = text[:probe]
    if not head:
        return 0
    at = before.find(head)
    while at >= 0:
        if text.startswith(before[at:]):
            return len(before) - at
        at = before.find(head, at + 1)
    return 0


def _iso(timestamp):
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(timestamp)) if timestamp else None


# -- sessions ----------------------------------------------------------------

class Session:
    """One client's MCP session: the negotiated revision, and whose key opened it.

    ``key`` is the api_keys entry of the caller (None when api_key_auth is
    off, and on stdio, whose user owns the data directory); ``owner`` a digest
    of it, so that a session id is worth nothing with another key.
    """

    def __init__(self, session_id="", key=None, now=0.0, transport="http"):
        self.id = session_id
        self.key = key
        self.owner = _owner(key)
        self.transport = transport
        self.version = None       # set by initialize
        self.initialized = False  # notifications/initialized arrived
        self.client = {}
        self.last_used = now


def _owner(key):
    secret = key.get("key", "") if isinstance(key, dict) else ""
    return hashlib.sha256(secret.encode("utf-8", "surrogatepass")).hexdigest()


def _media_types(accept):
    """The media ranges an Accept header lists (q=0 ones left out), lower case."""
    types = set()
    for item in accept.split(","):
        kind, *params = [p.strip() for p in item.split(";")]
        if any(p.replace(" ", "").lower() in ("q=0", "q=0.0", "q=0.00", "q=0.000") for p in params):
            continue
        if kind:
            types.add(kind.lower())
    return types


# -- the server --------------------------------------------------------------

class McpServer:
    """The MCP tools over an app's knowledge bases; see the module docstring.

    ``clock`` times session expiry, ``rng`` makes session ids (a
    cryptographic source by default; both injectable for tests).
    ``indexer`` says whether something in this process indexes the knowledge
    bases: a KB without a committed index is then "indexing", else
    "not_indexed".  ``allowed_origins`` are browser origins let in besides
    loopback ones (``http://host:port``).
    """

    def __init__(self, app, clock=time.monotonic, rng=None, indexer=True, allowed_origins=(),
                 max_sessions=MAX_SESSIONS, idle_seconds=SESSION_IDLE_SECONDS):
        self.app = app
        self.clock = clock
        self.rng = rng if rng is not None else secrets.SystemRandom()
        self.indexer = indexer
        self.allowed_origins = frozenset(o.lower().rstrip("/") for o in allowed_origins)
        self.max_sessions = max_sessions
        self.idle_seconds = idle_seconds
        self._sessions = collections.OrderedDict()  # id -> Session, least recently used first
        self._lock = threading.Lock()

    # -- HTTP: the Streamable HTTP transport -------------------------------

    def refuse_origin(self, request):
        """A 403 for a browser page of another origin (DNS rebinding), else None."""
        origin = request.headers.get("origin")
        if origin is None or self._origin_allowed(origin):
            return None
        return _http_error(403, f"Origin {_shown(origin)} may not use this MCP endpoint: only pages served "
                                "from a loopback address (localhost, 127.0.0.1, [::1]) may")

    def _origin_allowed(self, origin):
        if origin.lower().rstrip("/") in self.allowed_origins:
            return True
        try:
            parts = urllib.parse.urlsplit(origin)
            host = parts.hostname
        except ValueError:
            return False
        if parts.scheme not in ("http", "https") or not host:
            return False
        if host == "localhost" or host.endswith(".localhost"):
            return True
        try:
            return ipaddress.ip_address(host).is_loopback
        except ValueError:
            return False

    @staticmethod
    def unauthorized(message):
        """The 401 for a request without a valid API key, with the challenge clients expect."""
        return _http_error(401, message, _UNAUTHORIZED, [("WWW-Authenticate", 'Bearer realm="ragproxy"')])

    def handle(self, request, key=None):
        """Serve one HTTP request to the MCP endpoint from an authenticated caller (``key``)."""
        if request.method == "POST":
            return self._post(request, key)
        if request.method == "DELETE":
            session, refused = self._http_session(request, key)
            if refused is not None:
                return refused
            with self._lock:
                self._sessions.pop(session.id, None)
            return Response(200, [], b"")
        message = ("this MCP server opens no server-to-client stream: send JSON-RPC messages with POST"
                   if request.method == "GET" else f"{request.method} is not served at the MCP endpoint")
        return _http_error(405, message, headers=[("Allow", "POST, DELETE")])

    def _post(self, request, key):
        content_type = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
        if content_type != "application/json":
            return _http_error(415, "MCP messages are JSON: send Content-Type: application/json")
        accepted = _media_types(request.headers.get("accept", "*/*"))
        wants_json = bool(accepted & {"application/json", "application/*", "*/*"})
        wants_sse = bool(accepted & {"text/event-stream", "text/*", "*/*"})
        if not (wants_json or wants_sse):
            return _http_error(406, "send Accept: application/json, text/event-stream (the answer is one or "
                                    "the other)")
        if len(request.body) > MAX_MESSAGE_BYTES:
            return _http_error(413, f"the message is {len(request.body)} bytes; an MCP message may have at most "
                                    f"{MAX_MESSAGE_BYTES}")
        try:
            payload = parse_message(request.body)
        except (ValueError, UnicodeDecodeError, RecursionError):
            return _http_error(400, "parse error: the body is not UTF-8 JSON", PARSE_ERROR)
        if isinstance(payload, dict) and payload.get("method") == "initialize" and "id" in payload:
            return self._initialize_http(payload, key, wants_json)
        if isinstance(payload, dict) and _valid_id(payload.get("id")) and "mcp-session-id" not in request.headers \
                and isinstance(payload.get("method"), str) and payload["method"] not in _SESSION_METHODS:
            # A method of a revision this server does not speak, asked before any session (Claude
            # Code probes for 2026-07-28's server/discover so): the JSON-RPC answer a client falls
            # back on, not a complaint about a session it had no reason to open.
            return _reply(200, _error(payload["id"], METHOD_NOT_FOUND, f"method not found: {_shown(payload['method'])} "
                                      "(this server speaks MCP up to 2025-11-25: start with initialize)"),
                          not wants_json)
        session, refused = self._http_session(request, key)
        if refused is not None:
            return refused
        if isinstance(payload, list) and session.version not in _BATCH_VERSIONS:
            return _http_error(400, f"JSON-RPC batches are not part of MCP {session.version}: send one message "
                                    "per request")
        if self._streams_progress(payload, wants_sse):
            return self._progress_stream(payload, session)
        replies = self.handle_payload(payload, session)
        if replies is None:
            return Response(202, [], b"")
        # A message that is no valid request is a 400; a request's own failure is its answer (200).
        refused = isinstance(replies, dict) and replies.get("error", {}).get("code") in (PARSE_ERROR, INVALID_REQUEST)
        status = 400 if refused else 200
        return _reply(status, replies, not wants_json)

    def _initialize_http(self, payload, key, wants_json):
        session = Session(self._new_session_id(), key, self.clock())
        reply = self.handle_message(payload, session)
        headers = []
        if "result" in reply:
            self._keep(session)
            headers.append(("Mcp-Session-Id", session.id))
        return _reply(200, reply, not wants_json, headers)

    def _http_session(self, request, key):
        """``(session, None)`` for the request's Mcp-Session-Id, or ``(None, refusal)``."""
        session_id = request.headers.get("mcp-session-id")
        if not session_id:
            return None, _http_error(400, "the Mcp-Session-Id header is missing: start a session with initialize "
                                          "and send its id with every later request")
        now = self.clock()
        with self._lock:
            self._expire(now)
            session = self._sessions.get(session_id)
            if session is not None and secrets.compare_digest(session.owner, _owner(key)):
                self._sessions.move_to_end(session_id)
                session.last_used = now
                session.key = key  # the entry as configured now (a reload may have changed it)
            else:
                session = None
        if session is None:
            return None, _http_error(404, "no such MCP session (it ended or expired): start a new one with "
                                          "initialize")
        version = request.headers.get("mcp-protocol-version")
        if version is not None and version != session.version:
            if version not in PROTOCOL_VERSIONS:
                detail = f"MCP-Protocol-Version {_shown(version, 40)} is not supported"
            else:
                detail = f"MCP-Protocol-Version {version} is not the one this session negotiated"
            return None, _http_error(400, f"{detail}; this session speaks {session.version}",
                                     data={"supported": list(PROTOCOL_VERSIONS), "requested": version})
        return session, None

    def _new_session_id(self):
        return "%032x" % self.rng.getrandbits(128)

    def _keep(self, session):
        with self._lock:
            self._expire(session.last_used)
            while len(self._sessions) >= self.max_sessions:
                self._sessions.popitem(last=False)  # the least recently used: it re-initializes on its 404
            self._sessions[session.id] = session

    def _expire(self, now):
        sessions = self._sessions
        while sessions:
            oldest = next(iter(sessions.values()))
            if now - oldest.last_used <= self.idle_seconds:
                break
            sessions.popitem(last=False)

    def session_count(self):
        with self._lock:
            return len(self._sessions)

    @staticmethod
    def _streams_progress(payload, wants_sse):
        # A tool call that asks for progress is answered as an SSE stream: the
        # progress notifications, then the result.  Anything else is one JSON body.
        if not (wants_sse and isinstance(payload, dict) and payload.get("method") == "tools/call"):
            return False
        params = payload.get("params")
        meta = params.get("_meta") if isinstance(params, dict) else None
        token = meta.get("progressToken") if isinstance(meta, dict) else None
        return _valid_id(token) and _valid_id(payload.get("id"))

    def _progress_stream(self, payload, session):
        token = payload["params"]["_meta"]["progressToken"]
        gone = threading.Event()

        def events():
            yield _sse(_progress(token, 0, "working"))
            if gone.is_set():
                return
            reply = self.handle_payload(payload, session, streamed=True)
            yield _sse(_progress(token, 1, "done"))
            yield _sse(reply)

        return StreamResponse(200, [("Content-Type", "text/event-stream"), ("Cache-Control", "no-cache"),
                                    ("X-Accel-Buffering", "no")], events(), on_hangup=gone.set)

    # -- JSON-RPC, whatever the transport -----------------------------------

    def handle_payload(self, payload, session, streamed=False):
        """The reply to one parsed message or batch: a dict, a list, or None (nothing to answer)."""
        if not isinstance(payload, list):
            return self.handle_message(payload, session, streamed)
        if not payload:
            return _error(None, INVALID_REQUEST, "an empty batch is not a request")
        if len(payload) > MAX_BATCH:
            return _error(None, INVALID_REQUEST, f"a batch may hold at most {MAX_BATCH} messages")
        replies = []
        for message in payload:
            if isinstance(message, dict) and message.get("method") == "initialize":
                mid = message.get("id") if _valid_id(message.get("id")) else None
                replies.append(_error(mid, INVALID_REQUEST, "initialize must not be part of a batch"))
                continue
            reply = self.handle_message(message, session, streamed)
            if reply is not None:
                replies.append(reply)
        return replies or None

    def handle_message(self, message, session, streamed=False):
        """The reply to one JSON-RPC message (a dict), or None for a notification or a response.

        Never raises: whatever goes wrong is a JSON-RPC error object.
        """
        try:
            return self._message(message, session, streamed)
        except Exception:
            log.exception("MCP: internal error handling %s", _shown(message.get("method")) if
                          isinstance(message, dict) else "a message")
            if not isinstance(message, dict) or "id" not in message:
                return None
            mid = message["id"] if _valid_id(message["id"]) else None
            return _error(mid, INTERNAL_ERROR, "internal error in ragproxy (details are in its log)")

    def _message(self, message, session, streamed):
        if not isinstance(message, dict):
            return _error(None, INVALID_REQUEST, "a JSON-RPC message is an object")
        has_id = "id" in message
        mid = message.get("id")
        if message.get("jsonrpc") != "2.0":
            return _error(mid if has_id and _valid_id(mid) else None, INVALID_REQUEST,
                          "not JSON-RPC 2.0: 'jsonrpc' must be \"2.0\"")
        if has_id and not _valid_id(mid):
            return _error(None, INVALID_REQUEST, "'id' must be a string or an integer")
        method = message.get("method")
        if method is None:
            if has_id and ("result" in message or "error" in message):
                return None  # an answer to a request this server never sends
            return _error(mid if has_id else None, INVALID_REQUEST, "a request needs a 'method'")
        if not isinstance(method, str):
            return _error(mid if has_id else None, INVALID_REQUEST, "'method' must be a string")
        params = message.get("params")
        if params is None:
            params = {}
        if not isinstance(params, dict):
            return _error(mid, INVALID_PARAMS, "'params' must be an object") if has_id else None
        if not has_id:
            if method == "notifications/initialized" and session.version is not None:
                session.initialized = True
            return None  # cancellations, progress, roots changes: nothing here acts on them
        return self._request(mid, method, params, session, streamed)

    def _request(self, mid, method, params, session, streamed):
        if method == "initialize":
            return self._initialize(mid, params, session)
        if method == "ping":
            return _result(mid, {})
        if session.version is None:
            return _error(mid, INVALID_REQUEST, "the session is not initialized: send initialize first")
        if method == "tools/list":
            return _result(mid, {"tools": self._tool_list(session.version)})
        if method == "tools/call":
            return self._call(mid, params, session, streamed)
        return _error(mid, METHOD_NOT_FOUND, f"method not found: {_shown(method)} (this server has tools only: "
                                             "tools/list, tools/call, and ping)")

    def _initialize(self, mid, params, session):
        if session.version is not None:
            return _error(mid, INVALID_REQUEST, "the session is initialized already")
        requested = params.get("protocolVersion")
        if not isinstance(requested, str):
            return _error(mid, INVALID_PARAMS, "initialize needs 'protocolVersion' (a string)")
        version = requested if requested in PROTOCOL_VERSIONS else PROTOCOL_VERSIONS[0]
        info = params.get("clientInfo")
        if isinstance(info, dict):
            session.client = {k: info[k][:200] for k in ("name", "version") if isinstance(info.get(k), str)}
        session.version = version
        server_info = {"name": "ragproxy", "version": __version__}
        if version in _STRUCTURED_VERSIONS:
            server_info["title"] = "ragproxy knowledge bases"
        return _result(mid, {"protocolVersion": version, "capabilities": {"tools": {"listChanged": False}},
                             "serverInfo": server_info, "instructions": _INSTRUCTIONS})

    @staticmethod
    def _tool_list(version):
        structured = version in _STRUCTURED_VERSIONS
        tools = []
        for name, (title, description, input_schema, output_schema) in _TOOLS.items():
            tool = {"name": name, "description": description, "inputSchema": input_schema}
            if version != "2024-11-05":  # annotations came with 2025-03-26
                tool["annotations"] = {"title": title, "readOnlyHint": True, "openWorldHint": False}
            if structured:
                tool.update(title=title, outputSchema=output_schema)
            tools.append(tool)
        return tools

    def _call(self, mid, params, session, streamed):
        name = params.get("name")
        if not isinstance(name, str):
            return _error(mid, INVALID_PARAMS, "tools/call needs the tool's 'name' (a string)")
        if name not in _TOOLS:
            return _error(mid, INVALID_PARAMS, f"unknown tool: {_shown(name)} (tools: {', '.join(_TOOLS)})")
        args = params.get("arguments")
        if args is None:
            args = {}
        if not isinstance(args, dict):
            return _error(mid, INVALID_PARAMS, "'arguments' must be an object")
        call = _Call(name)
        started = time.perf_counter()
        outcome, error = "ok", None
        try:
            problems = _argument_problems(_TOOLS[name][2], args)
            if problems:
                raise _ToolError(f"invalid arguments for {name}: " + "; ".join(problems) + ".")
            structured, text = getattr(self, "_tool_" + name)(args, session, call)
        except _ToolError as exc:
            outcome, error = exc.outcome, str(exc)
        except Exception as exc:  # a bug here must not end the session: the model gets a tool error
            log.exception("MCP tool %s failed", name)
            outcome, error = "error", f"{name} failed: internal error in ragproxy (details are in its log): " \
                                      f"{type(exc).__name__}"
        seconds = time.perf_counter() - started
        self._observe(call, outcome, seconds, error, session, streamed)
        if error is not None:
            return _result(mid, {"content": [{"type": "text", "text": error}], "isError": True})
        result = {"content": [{"type": "text", "text": text}], "isError": False}
        if session.version in _STRUCTURED_VERSIONS:
            result["structuredContent"] = structured
        return _result(mid, result)

    def _observe(self, call, outcome, seconds, error, session, streamed):
        app = self.app
        app.metrics.observe_tool_call(call.tool, outcome, seconds)
        if app.request_log is None:
            return
        key = session.key
        client = key.get("name", "") if isinstance(key, dict) else "stdio" if session.transport == "stdio" else ""
        app.request_log.record({
            "time": app.clock() - seconds, "client": client,
            "model": call.tool, "upstream": None, "endpoint": "mcp_tool", "kbs": call.kbs,
            "retrieval_mode": call.mode, "outcome": outcome, "chunk_ids": call.chunk_ids,
            "retrieval_ms": call.search_ms, "total_ms": seconds * 1000.0, "status": 200, "streamed": streamed,
            "error": error, "query": call.query})

    # -- knowledge bases -----------------------------------------------------

    def _readable(self, session):
        if self.app.knowledge_bases is None:
            return []
        return [n for n in self.app.readable_kbs(session.key) if self.app.knowledge_bases.get(n) is not None]

    def _readable_kb(self, name, readable):
        """The KnowledgeBase ``name`` if the caller may read it; a tool error (the same either way) if not."""
        if name in readable:
            return self.app.knowledge_bases.get(name)
        exists = self.app.knowledge_bases is not None and self.app.knowledge_bases.get(name) is not None
        raise _ToolError(f"no knowledge base {_shown(name, 60)} is available to this client (available: "
                         f"{', '.join(readable) or 'none'}); list_knowledge_bases describes them",
                         "denied" if exists else "error")

    def _state(self, kb):
        """``(state, generation)``: ready, indexing, failed or not_indexed, and the committed generation."""
        try:
            generation, _ = kb.current()
        except Exception as exc:  # a damaged index on disk: failing, as far as a client can tell
            log.warning("kb %s: cannot open its index: %s", kb.spec.name, exc)
            return "failed", None
        if generation is not None:
            return "ready", generation
        if kb.status.get("last_error"):
            return "failed", None
        if self.indexer or kb.status.get("state") in ("indexing", "queued"):
            return "indexing", None
        return "not_indexed", None

    @staticmethod
    def _unavailable(name, state):
        if state == "indexing":
            return f"knowledge base {name!r} is still being indexed; try again shortly"
        if state == "failed":
            return (f"knowledge base {name!r} is failing: its indexing failed (details are in ragproxy's log); "
                    "whoever runs ragproxy must fix it")
        return (f"knowledge base {name!r} has not been indexed yet: run 'python ragproxy.py index {name}', or "
                "'python ragproxy.py serve', which indexes")

    def _tool_list_knowledge_bases(self, args, session, call):
        out, lines = [], []
        for name in self._readable(session):
            kb = self.app.knowledge_bases.get(name)
            state, generation = self._state(kb)
            manifest = generation.manifest if generation is not None else {}
            sources = []
            for label, _ in kb.source_roots():
                prefix = label + "/"
                sources.append({"name": label, "files": sum(1 for s in manifest if s == label or
                                                            s.startswith(prefix))})
            when = kb.status.get("last_indexed") or (_mtime(generation.dir) if generation is not None else None)
            item = {"name": name, "retrieval": kb.spec.retrieval, "state": state, "files": len(manifest),
                    "chunks": len(generation) if generation is not None else 0, "last_indexed": _iso(when),
                    "sources": sources}
            if state != "ready":
                item["note"] = self._unavailable(name, state)
            elif kb.status.get("last_error"):
                item["note"] = ("its last indexing run failed (details are in ragproxy's log); searches use the "
                                "last complete index")
            out.append(item)
            held = ", ".join(f"{s['name']} ({s['files']} files)" for s in sources)
            lines.append(f"- {name}: {item['retrieval']}, {state}, {item['files']} files, {item['chunks']} chunks, "
                         f"last indexed {item['last_indexed'] or 'never'}; sources: {held}"
                         + (f". {item['note']}" if "note" in item else ""))
            call.kbs.append(name)
        text = (f"{len(out)} knowledge base{'s' if len(out) != 1 else ''} this client may read:\n" + "\n".join(lines)
                if out else "No knowledge base is available to this client.")
        return {"knowledge_bases": out}, text

    def _ready_kbs(self, names, explicit, mode):
        """The KnowledgeBases of ``names`` that can answer now, and notes on the others.

        A knowledge base named by the caller that cannot answer is a tool error.
        """
        ready, notes = [], []
        for name in names:
            kb = self.app.knowledge_bases.get(name)
            state, _ = self._state(kb)
            problem = None
            if state != "ready":
                problem = self._unavailable(name, state)
            elif mode in ("dense", "hybrid") and kb.embedder is None:
                problem = (f"knowledge base {name!r} is lexical only (it has no embedding provider): search it "
                           "with mode 'lexical', or leave mode out")
            if problem is None:
                ready.append(kb)
            elif explicit:
                raise _ToolError(problem)
            else:
                notes.append(problem)
        if not ready:
            raise _ToolError(" ".join(notes) or "no knowledge base is available to this client")
        return ready, notes

    def _tool_search(self, args, session, call):
        rag = self.app.config.rag
        query = args["query"].strip()
        if len(query.encode("utf-8", "surrogatepass")) > rag["max_query_bytes"]:
            raise _ToolError(f"the query is longer than {rag['max_query_bytes']} bytes (rag.max_query_bytes): "
                             "search with fewer, more telling words")
        top_k = min(args.get("top_k") or rag["top_k"], MAX_TOP_K)
        mode = args.get("mode")
        readable = self._readable(session)
        names = [self._readable_kb(args["kb"], readable).spec.name] if "kb" in args else readable
        call.query = query
        ready, notes = self._ready_kbs(names, "kb" in args, mode)
        call.kbs = [kb.spec.name for kb in ready]
        call.mode = "+".join(sorted({mode or kb.spec.retrieval for kb in ready}))
        deadline = Deadline(rag["timeout_ms"] / 1000.0)
        started = time.perf_counter()
        try:
            hits = self._ranked(ready, query, top_k, mode, deadline)
        except Exception as exc:
            expected = isinstance(exc, (EmbeddingError, RerankError, StoreError, OSError, ValueError))
            late = deadline.remaining() <= 0
            log.warning("MCP search in %s failed: %s", ",".join(call.kbs), exc, exc_info=not (expected or late))
            raise _ToolError(f"the search ran out of time (rag.timeout_ms is {rag['timeout_ms']} ms); try again "
                             "shortly" if late else _SEARCH_FAILED) from None
        call.search_ms = (time.perf_counter() - started) * 1000.0
        results, used, truncated = [], 0, False
        for rank, hit in enumerate(hits, 1):
            item = _result_item(rank, hit)
            room = SEARCH_TEXT_BUDGET - used
            if len(item["text"]) > room:
                truncated = True
                if results:
                    break
                item["text"], item["truncated"] = _cut(item["text"], room), True
            used += len(item["text"])
            results.append(item)
        if truncated:
            left = len(hits) - len(results)
            notes.append(f"the answer is limited to {SEARCH_TEXT_BUDGET:,} characters of text: "
                         + (f"{left} more result{'s' if left != 1 else ''} left out; " if left else "")
                         + "read a passage in full with read_source, or ask for fewer results (top_k)")
        call.chunk_ids = [r["id"] for r in results]
        where = ", ".join(call.kbs)
        if results:
            blocks = [f"{len(results)} passage{'s' if len(results) != 1 else ''} from {where} for {query!r}:"]
            blocks += [_result_block(r) for r in results]
        else:
            blocks = [f"No passage in {where} matches {query!r}. Try other words (identifiers, error messages, "
                      "terms the documents would use), or list_knowledge_bases to see what is indexed."]
        blocks += [f"Note: {n}" for n in notes]
        structured = {"query": query, "kbs": call.kbs, "results": results, "truncated": truncated, "notes": notes}
        return structured, "\n\n".join(blocks)

    def _ranked(self, kbs, query, top_k, mode, deadline):
        """The proxy's own search: the same ranking, thresholds and merge (no route: no rerank)."""
        return self.app.retriever.search([kb.spec.name for kb in kbs], query, None, top_k, deadline=deadline,
                                         mode=mode)

    def _tool_read_source(self, args, session, call):
        kb = self._readable_kb(args["kb"], self._readable(session))
        name = kb.spec.name
        call.kbs = [name]
        call.query = args["source"]
        self._ready_kbs([name], True, None)
        start, end = args.get("start_line", 1), args.get("end_line")
        if end is not None and end < start:
            raise _ToolError(f"end_line ({end}) is before start_line ({start})")
        found = kb.source_chunks(args["source"])
        if found is None:
            raise _ToolError(f"no indexed document {_shown(args['source'], 120)} in knowledge base {name!r}: give "
                             "the source exactly as search results give it (search finds documents; "
                             "list_knowledge_bases names the source folders)")
        _, chunks = found
        source = chunks[0].get("source", args["source"]) if chunks else args["source"]
        last_line = max((c.get("line_end") or 0 for c in chunks), default=0)
        if last_line:
            picked = [c for c in chunks if (c.get("line_end") or 0) >= start
                      and (end is None or (c.get("line_start") or 0) <= end)]
            if not picked:
                raise _ToolError(f"{source} has lines 1-{last_line} as indexed; start_line {start} is past its end")
        else:
            picked = chunks
        text, first, last, truncated, rest = _assemble(picked)
        call.chunk_ids = [c.get("id") for c in picked[:len(picked) - rest]]
        next_start = last + 1 if rest and last else None
        structured = {"kb": name, "source": source, "text": text, "line_start": first, "line_end": last,
                      "last_line": last_line, "truncated": truncated or bool(rest), "next_start_line": next_start}
        where = f"lines {first}-{last} of {last_line}" if last_line else "no line numbers"
        parts = [f"{source} ({where}, knowledge base {name}):", text]
        if truncated:
            parts.append(f"[a passage was longer than {READ_CHAR_LIMIT:,} characters and was cut]")
        if next_start is not None:
            parts.append(f"[more: call read_source with start_line={next_start}]")
        return structured, "\n\n".join(parts)


def _assemble(chunks):
    """``(text, first_line, last_line, cut, rest)``: the chunks' text in order within the
    per-call limits, each overlap with the chunk before given once; ``rest`` chunks did not fit."""
    pieces, size, first, last, before = [], 0, 0, 0, None
    cut = False
    for n, chunk in enumerate(chunks):
        start, end = chunk.get("line_start") or 0, chunk.get("line_end") or 0
        text = chunk.get("text", "")
        if before is None:
            add = text
        elif start and start <= last:
            skip = _overlap(before, text)
            add = text[skip:] if skip else "\n" + text
        else:
            add = ("\n\n" if start > last + 1 else "\n") + text
        if pieces and (size + len(add) > READ_CHAR_LIMIT or (first and end - first + 1 > READ_LINE_LIMIT)):
            return "".join(pieces), first, last, cut, len(chunks) - n
        if size + len(add) > READ_CHAR_LIMIT:
            add, cut = _cut(add, READ_CHAR_LIMIT), True
        pieces.append(add)
        size += len(add)
        first = first or start
        last = max(last, end)
        before = text
    return "".join(pieces), first, last, cut, 0


def _result_item(rank, hit):
    chunk = hit.chunk
    item = {"rank": rank, "kb": hit.kb, "source": str(chunk.get("source", "")), "id": str(hit.id),
            "score": round(float(hit.score), 4)}
    start, end = chunk.get("line_start") or 0, chunk.get("line_end") or 0
    if start and end:
        item.update(lines=f"{start}-{end}", line_start=start, line_end=end)
    for key in ("symbol", "title"):
        if chunk.get(key):
            item[key] = str(chunk[key])
    if chunk.get("headings"):
        item["section"] = " > ".join(str(h) for h in chunk["headings"])
    item["text"] = str(chunk.get("text", ""))
    return item


def _result_block(item):
    where = item["source"] + (f" lines {item['lines']}" if "lines" in item else "")
    about = [f"kb {item['kb']}"] + [f"{key} {item[key]}" for key in ("symbol", "section") if key in item]
    about.append(f"score {item['score']:g}")
    text = item["text"] + ("\n[cut: read_source has the rest]" if item.get("truncated") else "")
    return f"[{item['rank']}] {where} ({', '.join(about)})\n{text}"


def _mtime(path):
    try:
        return os.stat(path).st_mtime
    except OSError:
        return None


def _progress(token, progress, message):
    return {"jsonrpc": "2.0", "method": "notifications/progress",
            "params": {"progressToken": token, "progress": progress, "total": 1, "message": message}}


def _sse(message):
    return b"event: message\ndata: " + json_bytes(message) + b"\n\n"


def _reply(status, replies, as_sse, headers=()):
    if as_sse:
        events = b"".join(_sse(r) for r in (replies if isinstance(replies, list) else [replies]))
        return Response(status, [("Content-Type", "text/event-stream"), ("Cache-Control", "no-cache")]
                        + list(headers), events)
    return Response(status, [("Content-Type", "application/json")] + list(headers), json_bytes(replies))


def _http_error(status, message, code=INVALID_REQUEST, headers=(), data=None):
    return Response(status, [("Content-Type", "application/json")] + list(headers),
                    json_bytes(_error(None, code, message, data)))


# -- stdio -------------------------------------------------------------------

def serve_stdio(server, stdin, stdout):
    """Serve one client on newline-delimited JSON-RPC until ``stdin`` ends.

    ``stdin`` and ``stdout`` are binary streams; nothing but JSON-RPC
    messages is ever written to ``stdout``.  The one session belongs to the
    local user who launched the process (no API key).
    """
    session = Session(transport="stdio", now=server.clock())
    while True:
        line = stdin.readline(MAX_MESSAGE_BYTES + 1)
        if not line:
            return
        if len(line) > MAX_MESSAGE_BYTES and not line.endswith(b"\n"):
            while True:  # the rest of the line is the same message: skip it
                more = stdin.readline(MAX_MESSAGE_BYTES)
                if not more or more.endswith(b"\n"):
                    break
            reply = _error(None, INVALID_REQUEST, f"a message may have at most {MAX_MESSAGE_BYTES} bytes")
        elif not line.strip():
            continue
        else:
            try:
                payload = parse_message(line)
            except (ValueError, UnicodeDecodeError, RecursionError):
                reply = _error(None, PARSE_ERROR, "parse error: the line is not UTF-8 JSON")
            else:
                if isinstance(payload, list) and session.version is not None \
                        and session.version not in _BATCH_VERSIONS:
                    reply = _error(None, INVALID_REQUEST, f"JSON-RPC batches are not part of MCP {session.version}")
                else:
                    reply = server.handle_payload(payload, session)
        if reply is not None:
            stdout.write(json_bytes(reply) + b"\n")
            stdout.flush()
