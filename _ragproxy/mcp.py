"""The MCP server: JSON-RPC 2.0 over Streamable HTTP and stdio, sessions and version negotiation.

The knowledge bases the proxy injects from are also served as Model Context
Protocol tools; what the tools are, check and answer is mcptools'
KnowledgeTools, which McpServer holds and asks for ``tool_list(version)``
and ``call(...)``.  McpServer is transport-neutral: ``handle(request, key)``
serves the Streamable HTTP endpoint (``POST`` and ``DELETE /mcp``, an
api.Request in, an api.Response or StreamResponse out), ``serve_stdio``
the newline-delimited stdio transport, and both come down to
``handle_payload(payload, session)``.

Two eras of the protocol are served side by side.  The handshake revisions
(initialize, then requests in a session): PROTOCOL_VERSIONS, the newest
first; a client asking for another revision is answered with the newest.
And the stateless one, 2026-07-28 (MODERN_VERSIONS): no initialize and no
session, every request names its revision and the client's capabilities in
``params._meta`` (checked per request, and on HTTP against the
MCP-Protocol-Version, Mcp-Method and Mcp-Name headers), ``server/discover``
says which revisions are served, and every result has a ``resultType``.  A
message is taken as stateless when its ``_meta`` names a revision, when it
is ``server/discover``, or when its MCP-Protocol-Version header is a
stateless revision.  JSON-RPC batches are taken in the
revisions that had them (2024-11-05, 2025-03-26) and refused in later ones.
Sessions are kept in this process's memory, bound to the API key that
opened them: at most MAX_SESSIONS, the least recently used dropped first, and
one idle for SESSION_IDLE_SECONDS dropped too.  Without a session secret
that is all there is: an id is good in the process that made it until it is
ended (DELETE), expires or is crowded out, and then gets a 404.  With one
(``session_secret``: the same bytes in every worker of ``serve --workers``,
which share one listening socket, so any of them may get a session's next
request), an id carries its negotiated revision and a random nonce, with an
HMAC-SHA256 over them and the digest of the caller's key: a worker adopts an
id it never issued when it verifies for the caller, and no other key can use
it.  The table is then a cache: expiry and the cap free memory and end no
session, since a later request re-adopts the id.  A DELETE is known only to
the worker that saw it, which refuses the id from then on (it remembers the
last MAX_ENDED_SESSIONS ids it ended); the other workers still accept it.
Nobody gains by that: the id stays bound to its key, whose holder could as
well initialize a new session.

The app (proxy.App, or the one ``ragproxy.py mcp --stdio`` makes) is
KnowledgeTools' (see mcptools); this module reads nothing of it itself.

May import: api, mcptools.
"""
from __future__ import annotations

import base64
import collections
import hashlib
import hmac
import ipaddress
import json
import logging
import secrets
import threading
import time
import urllib.parse

from . import __version__
from .api import Response, StreamResponse, json_bytes
from .mcptools import STRUCTURED_VERSIONS, KnowledgeTools, ToolError, shown

log = logging.getLogger("ragproxy")


#: The revisions served, newest first: initialize gets the client's if it is here, else the first.
PROTOCOL_VERSIONS = ("2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05")
#: The stateless revisions: per-request _meta instead of initialize and sessions.
MODERN_VERSIONS = ("2026-07-28",)
_VERSION_KEY = "io.modelcontextprotocol/protocolVersion"
_CAPABILITIES_KEY = "io.modelcontextprotocol/clientCapabilities"
_CLIENT_INFO_KEY = "io.modelcontextprotocol/clientInfo"
_SERVER_INFO_KEY = "io.modelcontextprotocol/serverInfo"
_MODERN_METHODS = frozenset(("server/discover", "tools/list", "tools/call"))  # 2026-07-28 removed ping
TOOLS_TTL_MS = 60_000  # a config reload may change the knowledge bases the descriptions name
_BATCH_VERSIONS = frozenset(("2024-11-05", "2025-03-26"))        # 2025-06-18 removed JSON-RPC batches

MAX_MESSAGE_BYTES = 1024 * 1024   # one POST body or stdio line; server.max_body_bytes is far larger
MAX_BATCH = 64
MAX_SESSIONS = 1024
SESSION_IDLE_SECONDS = 24 * 3600.0
MAX_ENDED_SESSIONS = 4096  # signed ids a worker refuses after their DELETE; older ones are accepted again
_SIGNED_ID_LABEL = b"ragproxy mcp session id 1\0"  # no other HMAC under the secret can pass for an id
_NONCE_BYTES = _MAC_BYTES = 16

#: The requests this server answers (initialize opens the session the others need).
_SESSION_METHODS = frozenset(("initialize", "ping", "tools/list", "tools/call"))
PARSE_ERROR, INVALID_REQUEST, METHOD_NOT_FOUND, INVALID_PARAMS, INTERNAL_ERROR = \
    -32700, -32600, -32601, -32602, -32603
_UNAUTHORIZED = -32001  # the implementation-defined range: no standard code says "no key"
HEADER_MISMATCH, UNSUPPORTED_VERSION = -32020, -32022  # 2026-07-28's own codes


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


def _reject_constant(name):
    raise ValueError(f"{name} is not JSON")


def parse_message(data):
    """The JSON value of one message's bytes; ValueError if they are not UTF-8 JSON."""
    return json.loads(data.decode("utf-8"), parse_constant=_reject_constant)


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
        self.modern = False       # a stateless (2026-07-28) request's: version read from each _meta


def _stateless(key=None, transport="http", now=0.0):
    """The throwaway Session one stateless request is served in: nothing of it outlives the request."""
    session = Session(key=key, now=now, transport=transport)
    session.modern = True
    return session


def _meta_of(message):
    params = message.get("params") if isinstance(message, dict) else None
    meta = params.get("_meta") if isinstance(params, dict) else None
    return meta if isinstance(meta, dict) else None


def is_stateless(message, header_version=None):
    """Whether ``message`` is of the stateless era (see the module docstring)."""
    if not isinstance(message, dict) or message.get("method") == "initialize":
        return False
    meta = _meta_of(message)
    return message.get("method") == "server/discover" or (meta is not None and _VERSION_KEY in meta) \
        or header_version in MODERN_VERSIONS


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
    """The MCP endpoint of an app's knowledge-base tools; see the module docstring.

    ``clock`` times session expiry, ``rng`` makes session ids (a
    cryptographic source by default; both injectable for tests).
    ``session_secret`` (bytes, at least 16), when given, makes session ids
    that every McpServer with the same secret accepts (see the module
    docstring); without it an id is good only here.
    ``indexer`` is KnowledgeTools' (whether something in this process
    indexes the knowledge bases).  ``allowed_origins`` are browser origins
    let in besides loopback ones (``http://host:port``), as are the config's
    ``mcp.allowed_origins`` (read per request, so a reload applies at once).
    """

    def __init__(self, app, clock=time.monotonic, rng=None, indexer=True, allowed_origins=(),
                 max_sessions=MAX_SESSIONS, idle_seconds=SESSION_IDLE_SECONDS, session_secret=None):
        if session_secret is not None and not (isinstance(session_secret, bytes) and len(session_secret) >= 16):
            # A short or empty HMAC key would let anyone mint ids that every worker accepts.
            raise ValueError("session_secret must be bytes, at least 16 of them")
        self.app = app
        self.clock = clock
        self.rng = rng if rng is not None else secrets.SystemRandom()
        self.tools = KnowledgeTools(app, indexer)
        self.allowed_origins = frozenset(o.lower().rstrip("/") for o in allowed_origins)
        self.max_sessions = max_sessions
        self.idle_seconds = idle_seconds
        self._sessions = collections.OrderedDict()  # id -> Session, least recently used first
        self._session_secret = session_secret
        self._ended = collections.OrderedDict()  # signed ids DELETEd here, oldest first (values unused)
        self._lock = threading.Lock()

    # -- HTTP: the Streamable HTTP transport -------------------------------

    def refuse_origin(self, request):
        """A 403 for a browser page of another origin (DNS rebinding), else None."""
        origin = request.headers.get("origin")
        if origin is None or self._origin_allowed(origin):
            return None
        return _http_error(403, f"Origin {shown(origin)} may not use this MCP endpoint: only pages served "
                                "from a loopback address (localhost, 127.0.0.1, [::1]) may")

    def _origin_allowed(self, origin):
        wanted = origin.lower().rstrip("/")
        if wanted in self.allowed_origins or wanted in (
                o.lower().rstrip("/") for o in self.app.config.raw["mcp"]["allowed_origins"]):
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
                if self._session_secret is not None:
                    # Without this the id would verify again on its next request and be adopted anew.
                    self._ended[session.id] = None
                    while len(self._ended) > MAX_ENDED_SESSIONS:
                        self._ended.popitem(last=False)
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
        if is_stateless(payload, request.headers.get("mcp-protocol-version")):
            return self._stateless_http(payload, request.headers, key, wants_json, wants_sse)
        if isinstance(payload, dict) and _valid_id(payload.get("id")) and "mcp-session-id" not in request.headers \
                and isinstance(payload.get("method"), str) and payload["method"] not in _SESSION_METHODS:
            # A method of no revision here, asked before any session: JSON-RPC's answer, not a
            # complaint about a session the client had no reason to open.
            return _reply(200, _error(payload["id"], METHOD_NOT_FOUND, f"method not found: {shown(payload['method'])} "
                                      "(start with initialize, or name 2026-07-28 in params._meta)"),
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

    def _stateless_http(self, payload, headers, key, wants_json, wants_sse):
        # No session is looked up, made or named (an Mcp-Session-Id sent along is ignored).
        session = _stateless(key, "http", self.clock())
        problem = _meta_problem(payload)
        meta_ok = problem is None
        # The headers are checked once the _meta is readable, before its revision: a client that
        # contradicts itself is told so rather than that the body's revision is not served.
        readable = meta_ok or problem[0] == UNSUPPORTED_VERSION
        mismatch = _header_mismatch(payload, headers) if readable else None
        if mismatch is not None:
            return _reply(400, _error(payload.get("id") if _valid_id(payload.get("id")) else None,
                                      HEADER_MISMATCH, mismatch), not wants_json)
        if meta_ok and self._streams_progress(payload, wants_sse):
            return self._progress_stream(payload, session)
        reply = self.handle_message(payload, session)
        if reply is None:
            return Response(202, [], b"")
        code = reply.get("error", {}).get("code")
        # 2026-07-28: a malformed request, or one of a revision not served, is a 400; an unknown method a 404.
        status = 200 if code is None else 404 if code == METHOD_NOT_FOUND else 400 if (
            not meta_ok or code in (PARSE_ERROR, INVALID_REQUEST)) else 200
        return _reply(status, reply, not wants_json)

    def _initialize_http(self, payload, key, wants_json):
        session = Session(self._new_session_id(), key, self.clock())
        reply = self.handle_message(payload, session)
        headers = []
        if "result" in reply:
            if self._session_secret is not None:
                # The random id made above becomes the nonce: the revision the id must carry is known only now.
                session.id = self._signed_id(session.version, bytes.fromhex(session.id), session.owner)
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
            if session is None:
                session = self._adopt(session_id, key, now)
            elif secrets.compare_digest(session.owner, _owner(key)):
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
                detail = f"MCP-Protocol-Version {shown(version, 40)} is not supported"
            else:
                detail = f"MCP-Protocol-Version {version} is not the one this session negotiated"
            return None, _http_error(400, f"{detail}; this session speaks {session.version}",
                                     data={"supported": list(PROTOCOL_VERSIONS), "requested": version})
        return session, None

    def _new_session_id(self):
        return "%032x" % self.rng.getrandbits(128)

    def _signed_id(self, version, nonce, owner):
        mac = hmac.new(self._session_secret, _SIGNED_ID_LABEL + version.encode("ascii") + b"\0" + nonce
                       + owner.encode("ascii"), hashlib.sha256).digest()[:_MAC_BYTES]
        # base64url and the revision's digits and dashes: visible ASCII (0x21-0x7E), as the spec asks of an id.
        return version + "." + base64.urlsafe_b64encode(nonce + mac).rstrip(b"=").decode("ascii")

    def _verified_version(self, session_id, owner):
        """The revision a signed id carries if it verifies for ``owner``, else None."""
        version, dot, token = session_id.partition(".")
        if not dot or version not in PROTOCOL_VERSIONS or len(token) > 64:
            return None
        try:
            raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
        except ValueError:  # binascii.Error is one, and so is a str that is not ASCII
            return None
        if len(raw) != _NONCE_BYTES + _MAC_BYTES:
            return None
        expected = self._signed_id(version, raw[:_NONCE_BYTES], owner)
        # Compared whole, so that one id has one spelling: a different last character that
        # decodes to the same bytes, or stray characters base64 would skip, are not it.
        return version if hmac.compare_digest(expected, session_id) else None

    def _adopt(self, session_id, key, now):
        """The Session for a signed id another worker issued (or this one forgot), or None. Under the lock."""
        if self._session_secret is None or session_id in self._ended:
            return None
        owner = _owner(key)
        version = self._verified_version(session_id, owner)
        if version is None:
            return None
        session = Session(session_id, key, now)
        session.version = version
        # notifications/initialized went to the worker that answered initialize; clientInfo stayed
        # there too (session.client is only kept, never read, so an empty one changes no answer).
        session.initialized = True
        self._insert(session)
        return session

    def _keep(self, session):
        with self._lock:
            self._insert(session)

    def _insert(self, session):
        self._expire(session.last_used)
        while len(self._sessions) >= self.max_sessions:
            # The least recently used: it re-initializes on its 404 (a signed id is adopted again instead).
            self._sessions.popitem(last=False)
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
            log.exception("MCP: internal error handling %s", shown(message.get("method")) if
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
        if session.modern:
            return self._stateless_request(mid, method, params, session, streamed)
        if method == "initialize":
            return self._initialize(mid, params, session)
        if method == "ping":
            return _result(mid, {})
        if session.version is None:
            return _error(mid, INVALID_REQUEST, "the session is not initialized: send initialize first")
        if method == "tools/list":
            return _result(mid, {"tools": self.tools.tool_list(session.version)})
        if method == "tools/call":
            return self._call(mid, params, session, streamed)
        return _error(mid, METHOD_NOT_FOUND, f"method not found: {shown(method)} (this server has tools only: "
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
        if version in STRUCTURED_VERSIONS:
            server_info["title"] = "ragproxy knowledge bases"
        return _result(mid, {"protocolVersion": version, "capabilities": {"tools": {"listChanged": False}},
                             "serverInfo": server_info, "instructions": self.tools.instructions})

    def _stateless_request(self, mid, method, params, session, streamed):
        problem = _meta_problem({"params": params})
        if problem is not None:
            code, message, data = problem
            return _error(mid, code, message, data)
        session.version = params["_meta"][_VERSION_KEY]
        info = params["_meta"].get(_CLIENT_INFO_KEY)
        if isinstance(info, dict):
            session.client = {k: info[k][:200] for k in ("name", "version") if isinstance(info.get(k), str)}
        if method == "server/discover":
            reply = _result(mid, {"supportedVersions": list(MODERN_VERSIONS + PROTOCOL_VERSIONS),
                                  "capabilities": {"tools": {}}, "instructions": self.tools.instructions,
                                  "ttlMs": TOOLS_TTL_MS, "cacheScope": "private"})
        elif method == "tools/list":
            reply = _result(mid, {"tools": self.tools.tool_list(session.version), "ttlMs": TOOLS_TTL_MS,
                                  "cacheScope": "private"})  # private: behind an API key
        elif method == "tools/call":
            reply = self._call(mid, params, session, streamed)
        else:
            return _error(mid, METHOD_NOT_FOUND, f"method not found: {shown(method)} (MCP {session.version} here "
                                                 f"has {', '.join(sorted(_MODERN_METHODS))})")
        if "result" in reply:
            reply["result"]["resultType"] = "complete"
            reply["result"]["_meta"] = {_SERVER_INFO_KEY: {"name": "ragproxy", "version": __version__}}
        return reply

    def _call(self, mid, params, session, streamed):
        name = params.get("name")
        if not isinstance(name, str):
            return _error(mid, INVALID_PARAMS, "tools/call needs the tool's 'name' (a string)")
        if name not in self.tools.names:
            return _error(mid, INVALID_PARAMS, f"unknown tool: {shown(name)} (tools: {', '.join(self.tools.names)})")
        args = params.get("arguments")
        if args is None:
            args = {}
        if not isinstance(args, dict):
            return _error(mid, INVALID_PARAMS, "'arguments' must be an object")
        try:
            structured, text = self.tools.call(name, args, session.key, session.transport, streamed)
        except ToolError as exc:
            return _result(mid, {"content": [{"type": "text", "text": str(exc)}], "isError": True})
        result = {"content": [{"type": "text", "text": text}], "isError": False}
        if session.version in STRUCTURED_VERSIONS:
            result["structuredContent"] = structured
        return _result(mid, result)


def _meta_problem(message):
    """None if ``message``'s _meta is a stateless request's, else ``(code, message, data)``.

    2026-07-28: a missing or malformed _meta is invalid params, a revision not
    served UnsupportedProtocolVersion with the ones that are (both a 400 on HTTP).
    """
    meta = _meta_of(message)
    if meta is None:
        return INVALID_PARAMS, (f"params._meta must be an object with {_VERSION_KEY!r} and {_CAPABILITIES_KEY!r} "
                                "(MCP 2026-07-28), or start a session with initialize"), None
    missing = [k for k in (_VERSION_KEY, _CAPABILITIES_KEY) if k not in meta]
    if missing:
        return INVALID_PARAMS, f"params._meta lacks {', '.join(map(repr, missing))}", None
    version = meta[_VERSION_KEY]
    if not isinstance(version, str):
        return INVALID_PARAMS, f"params._meta[{_VERSION_KEY!r}] must be a string", None
    if not isinstance(meta[_CAPABILITIES_KEY], dict):
        return INVALID_PARAMS, f"params._meta[{_CAPABILITIES_KEY!r}] must be an object", None
    if version not in MODERN_VERSIONS:
        hint = " (that revision starts with initialize)" if version in PROTOCOL_VERSIONS else ""
        return UNSUPPORTED_VERSION, f"Unsupported protocol version: {shown(version, 40)}{hint}", {
            "supported": list(MODERN_VERSIONS + PROTOCOL_VERSIONS), "requested": version}
    return None


def _header_mismatch(message, headers):
    """What the MCP-Protocol-Version, Mcp-Method and Mcp-Name headers contradict in the body, or None."""
    version = message["params"]["_meta"][_VERSION_KEY]
    method = message.get("method")
    if headers.get("mcp-protocol-version") != version:
        return (f"Header mismatch: MCP-Protocol-Version {shown(headers.get('mcp-protocol-version'), 40)} "
                f"is not the request's {_VERSION_KEY} {shown(version, 40)}")
    if "id" not in message:
        return None  # 2026-07-28 defines no header rules for notifications
    if headers.get("mcp-method") != method:
        return f"Header mismatch: Mcp-Method {shown(headers.get('mcp-method'), 60)} is not the body's {shown(method, 60)}"
    if method == "tools/call":
        name = message["params"].get("name")
        sent = _header_value(headers.get("mcp-name"))
        if sent != name:
            return f"Header mismatch: Mcp-Name {shown(headers.get('mcp-name'), 60)} is not the body's {shown(name, 60)}"
    return None


def _header_value(value):
    # Values that are not plain ASCII come as =?base64?...?= (2026-07-28, Streamable HTTP).
    if isinstance(value, str) and value.startswith("=?base64?") and value.endswith("?="):
        try:
            return base64.b64decode(value[9:-2], validate=True).decode("utf-8")
        except (ValueError, UnicodeDecodeError):
            return None
    return value


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
                if is_stateless(payload):
                    reply = server.handle_message(payload, _stateless(transport="stdio", now=server.clock()))
                elif isinstance(payload, list) and session.version is not None \
                        and session.version not in _BATCH_VERSIONS:
                    reply = _error(None, INVALID_REQUEST, f"JSON-RPC batches are not part of MCP {session.version}")
                else:
                    reply = server.handle_payload(payload, session)
        if reply is not None:
            stdout.write(json_bytes(reply) + b"\n")
            stdout.flush()
