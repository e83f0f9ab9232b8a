"""The proxy: App, the transport-neutral core that routes and forwards each request.

App.handle() takes a parsed Request and returns a Response or a
StreamResponse; the HTTP server is a thin adapter around it.  Routing picks
a model's provider, rewriters (retrieval first) change the request between
parsing and forwarding (App.rewriters), and the answer is relayed event by
event.  The request log and the metrics are kept after the answer is sent.
/mcp, after the same API-key check, is the MCP server's (mcp.McpServer).

May import: api, config, deps, jsonbody, knowledgebases, levers, mcp, metrics, ollama, reqlog, retrieval, upstream.
"""
from __future__ import annotations

import contextlib
import dataclasses
import fnmatch
import functools
import hmac
import json
import logging
import os
import random
import re
import threading
import time

from . import __version__, deps
from .api import (
    ENDPOINTS,
    ClientError,
    Endpoint,
    Request,
    Response,
    StreamResponse,
    StreamTracker,
    dialect_for_path,
    error_response,
    is_event_stream,
    json_bytes,
    json_response,
    normalize_path,
    split_key_prefix,
)
from .config import ModelRoute, Provider, key_allows_kb, key_allows_model
from .jsonbody import (
    PARSE_MEMO_MIN_BODY,
    ParseMemo,
    json_object_of,
    json_object_with_members,
    leading_model,
    with_edits,
    with_model,
)
from .knowledgebases import KnowledgeBases
from .levers import Runner as CompressionRunner
from .levers import Selector as CompressionSelector
from .levers import outcome_fields
from .metrics import Metrics, store_samples
from .ollama import translate_ollama_call
from .reqlog import DEFAULT_REQUEST_LOG_PATH, RequestLog
from .retrieval import RetrievalFailed, Retriever, split_model_kbs
from .upstream import MAX_UPSTREAM_BODY, UpstreamError, make_http_pool, upstream_url

log = logging.getLogger("ragproxy")


_HOP_BY_HOP = frozenset((
    "connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "proxy-connection",
    "te", "trailer", "trailers", "transfer-encoding", "upgrade"))
# Never forwarded upstream: framing we recompute, the client's own credentials
# (each provider sends its own key) and our control headers.
_DROP_UPSTREAM = _HOP_BY_HOP | {"host", "content-length", "accept-encoding", "authorization", "x-api-key",
                                "expect", "x-compression"}
_DROP_DOWNSTREAM = _HOP_BY_HOP | {"content-length"}


def _connection_options(value):
    """The header names a Connection header lists: hop-by-hop for this connection only
    (RFC 9110 section 7.6.1), so a proxy removes them as it removes Connection itself."""
    if not value:
        return frozenset()
    return frozenset(name.strip().lower() for name in value.split(",")) - {"", "close", "keep-alive"}
_NATIVE_PROVIDER = {"openai": "openai", "responses": "openai", "anthropic": "anthropic", "ollama": "ollama"}


@dataclasses.dataclass
class Exchange:
    """One proxied call while it is being prepared: what rewriters see and change.

    A rewriter that changes ``payload`` says where, adding to ``edits`` the
    paths as inject returns them, and only those values are encoded again.
    One that sets ``changed`` instead has the whole payload encoded again.
    """

    request: Request
    endpoint: Endpoint
    payload: dict
    route: ModelRoute
    provider: Provider
    model: str
    changed: bool = False
    edits: tuple = ()
    response_headers: list = dataclasses.field(default_factory=list)
    kb_override: list = None   # from a "model+kb1+kb2" name
    retrieval: dict = None     # what retrieval did, for the request log
    key: dict = None           # the caller's api_keys entry (None: api_key_auth is off); its scope binds retrieval
    members: object = None     # a jsonbody.Members of request.body a rewriter found (the splice reuses it)
    encoded: dict = None       # path -> (value, its JSON text), for the splice: what a rewriter knows encoded
    compression: object = None  # the levers.Profile this request gets (None: no compression)
    compression_outcomes: list = None   # a compress.Outcome per lever that ran, in order


@dataclasses.dataclass
class _Trace:
    """What the request log and the metrics learn about one call."""

    started: float
    client: str = ""
    key: dict = None   # the caller's api_keys entry
    exchange: Exchange = None
    upstream_ms: float = None


_NO_ROUTE = object()


class App:
    """The proxy: configuration, upstream connections and request handling."""

    def __init__(self, config, data_dir=None, clock=time.time, rng=None, http_pool=None, check_shared=None):
        self.config = config
        self.data_dir = data_dir
        self.clock = clock
        self.rng = rng or random.Random()
        self.http = http_pool or make_http_pool()
        self.started = clock()
        self.metrics = Metrics()
        self.knowledge_bases = None
        self.request_log = None
        self.admin = None  # an Admin serves the panel and /admin/api/ once attached
        self._mcp = None   # the MCP endpoint's server, made on its first request
        # Set by a serve worker: the key its MCP session ids are signed with, so that a session
        # opened on one worker process is taken by the others (mcp.McpServer's session_secret).
        self.mcp_session_secret = None
        # Set by a serve worker: its slot and where the supervisor writes every worker's state
        # (workers.Supervisor), for the admin API.  None: serving alone.
        self.worker = None
        # Set by serve: which CPU its connection threads run on (placement.CpuPlacement), for the admin API.
        self.placement = None
        self._mcp_lock = threading.Lock()
        self._routes = (None, {})  # (config, model name -> route): resolved once per config
        # What large bodies, and those retrieval reads, repeat of earlier ones: shared, read-only values.
        # ``check_shared`` (default: RAGPROXY_CHECK_SHARED=1, which the test suite sets) checks that
        # nothing edits them in place (ParseMemo).
        if check_shared is None:
            check_shared = os.environ.get("RAGPROXY_CHECK_SHARED") == "1"
        self.parsed = ParseMemo(check=check_shared)
        if data_dir:
            self.knowledge_bases = KnowledgeBases(config, data_dir, self.http, clock, on_report=self._observe_index)
            try:
                self.request_log = RequestLog(os.path.join(data_dir, DEFAULT_REQUEST_LOG_PATH), clock=clock,
                                              log_query=config.raw["security"]["log_query"])
            except ImportError as exc:   # this Python has no sqlite3: serve all the same
                log.warning("request log off: this Python cannot import sqlite3 (%s)", exc)
            self.metrics.add_collector(self._collect_gauges)
        self.retriever = Retriever(self, self.knowledge_bases) if self.knowledge_bases else None
        # Callables(exchange) run between parsing and forwarding: the compression profile is picked
        # first (retrieval renders its own chunks by it), its levers run last, over the final list.
        self.compression = CompressionRunner(self)
        self.rewriters = [CompressionSelector(self)] + ([self.retriever] if self.retriever else []) \
            + [self.compression]

    def close(self):
        """Flush the request log and drop pooled connections; with ``check_shared``, raise
        SharedValueEdited if a request edited a shared parsed value in place."""
        if self.knowledge_bases is not None:
            self.knowledge_bases.stop()
        if self.request_log is not None:
            self.request_log.close()
        self.compression.close()
        self.http.close()
        self.parsed.verify()

    def reload(self, config):
        """Switch to a new config; requests in flight finish on the old one."""
        self.config = config
        if self.knowledge_bases is not None:
            self.knowledge_bases.configure(config)
            self.retriever.reconfigure(config)
        if self.request_log is not None:
            self.request_log.log_query = config.raw["security"]["log_query"]

    # -- entry point --------------------------------------------------------

    def handle(self, request):
        path_key, path = split_key_prefix(request.path)
        if path_key is not None:
            request = dataclasses.replace(request, path=path, path_key=path_key)
        path = normalize_path(path)
        dialect = dialect_for_path(path)
        trace = _Trace(self.clock())
        try:
            response = self._dispatch(request, path, dialect, trace)
        except ClientError as exc:
            response = error_response(dialect, exc.status, exc.message, exc.code, exc.headers)
        except RetrievalFailed as exc:
            response = exc.response(dialect)  # the cause is in the log, not for the client
        except UpstreamError as exc:
            status = 504 if exc.kind == "timeout" else 502
            provider = exc.provider or "?"
            log.warning("upstream %s (provider %s) for %s %s: %s", exc.kind, provider, request.method, path, exc)
            # The provider's name tells the user which one to fix; its address
            # and the socket error are for the log only.
            what = "did not answer in time" if exc.kind == "timeout" else "is unreachable"
            response = error_response(dialect, status, f"upstream provider '{provider}' {what} "
                                                       "(details are in ragproxy's log)", "upstream_" + exc.kind)
        if trace.exchange is None:
            return response
        if isinstance(response, StreamResponse):
            return dataclasses.replace(response, chunks=self._logged_stream(response, trace))
        error = response.body[:2000].decode("utf-8", "replace") if response.status >= 400 else None
        response.after = functools.partial(self._record, trace, response.status, False, error)
        return response

    def _logged_stream(self, response, trace):
        """The stream's chunks; the call is logged once the stream ends, however it ends."""
        error = None
        try:
            yield from response.chunks
        except GeneratorExit:
            error = "client disconnected mid-stream"
            raise
        finally:
            self._record(trace, response.status, True, error)

    def _record(self, trace, status, streamed, error=None):
        exchange = trace.exchange
        retrieval = exchange.retrieval or {}
        entry = {"time": trace.started, "client": trace.client, "model": exchange.model,
                 "upstream": exchange.provider.name, "endpoint": exchange.endpoint.name,
                 "kbs": retrieval.get("kbs", []), "retrieval_mode": retrieval.get("mode"),
                 "outcome": retrieval.get("outcome", "none"), "chunk_ids": list(retrieval.get("sources", ())),
                 "context_tokens": retrieval.get("context_tokens"), "retrieval_ms": retrieval.get("ms"),
                 "retrieval_stages": retrieval.get("stages"), "upstream_ms": trace.upstream_ms,
                 "total_ms": (self.clock() - trace.started) * 1000.0, "status": status, "streamed": streamed,
                 # A failed retrieval's client error is the same every time; its cause is for the log.
                 "error": retrieval["error"] if retrieval.get("outcome") == "failed" else
                 error or retrieval.get("error"), "query": retrieval.get("query"),
                 # What the guardrails found, dropped, refused and redacted, and the token budget.
                 **(retrieval.get("guardrails") or {}),
                 "levers": [outcome_fields(o) for o in exchange.compression_outcomes or ()]}
        self.metrics.observe_request(entry)
        if self.request_log is not None:
            self.request_log.record(entry)

    def _observe_index(self, report):
        self.metrics.observe_index(report.kb, indexed=report.added + report.changed, skipped=len(report.skipped),
                                   deferred=len(report.deferred), redactions=report.redactions)

    def _collect_gauges(self):
        out = []
        for name, kb in list(self.knowledge_bases.kbs.items()):
            stats = kb.stats()
            progress = stats["done"] / stats["total"] if stats["state"] == "indexing" and stats["total"] else 1.0
            out += [("ragproxy_kb_chunks", {"kb": name}, stats["chunks"]),
                    ("ragproxy_kb_bytes", {"kb": name}, stats["bytes"]),
                    ("ragproxy_indexing_progress", {"kb": name}, progress)]
            out += store_samples(name, stats.get("store"))
        if self.request_log is not None:
            out.append(("ragproxy_request_log_dropped_total", {}, self.request_log.dropped))
        return out

    def _dispatch(self, request, path, dialect, trace):
        method = request.method
        if method == "HEAD" and path == "/":
            return Response(200, [("Content-Type", "text/plain; charset=utf-8")])
        if path == "/health" and method in ("GET", "HEAD"):
            return json_response(200, self._health())
        if self.admin is not None and (path in ("/", "/panel") or path.startswith("/admin/")):
            return self.admin.handle(request, path)
        if path == "/" and method == "GET":
            return json_response(200, {"name": "ragproxy", "version": __version__})
        if path.startswith("/admin/"):
            raise ClientError(404, "the admin API is off: it needs a data directory and a panel secret key",
                              "not_found")
        if path == "/mcp":
            return self._mcp_call(request, trace)
        if path == "/metrics" and method == "GET":
            return Response(200, [("Content-Type", Metrics.CONTENT_TYPE)], self.metrics.render().encode("utf-8"))
        if not (path.startswith("/v1/") or path.startswith("/api/")):
            raise ClientError(404, f"no such endpoint: {method} {path}", "not_found")
        if not (path == "/api/version" and method == "GET"):
            trace.key = self._authenticate(request)
            trace.client = trace.key["name"] if trace.key else ""
        endpoint = ENDPOINTS.get((method, path))
        if endpoint is not None:
            return self._proxy(request, path, endpoint, trace)
        if method == "GET" and path == "/v1/models":
            return self._list_models(request, trace.key)
        if method == "GET" and path in ("/api/tags", "/api/version"):
            return self._ollama_listing(request, path, trace.key)
        if method == "OPTIONS":
            return Response(204, [("Allow", "GET, POST, HEAD, OPTIONS")])
        return self._forward_other(request, path, dialect, trace.key)

    # -- authentication -----------------------------------------------------

    def _authenticate(self, request):
        config = self.config
        if not config.api_key_auth:
            return None
        presented = request.headers.get("x-api-key", "")
        auth = request.headers.get("authorization", "")
        if not presented and auth[:7].lower() == "bearer ":
            presented = auth[7:].strip()
        presented = presented or request.path_key or ""
        if not config.api_keys:
            raise ClientError(401, "api_key_auth is on but no api_keys are configured: add one under "
                                   "api_keys in config.yaml, or set api_key_auth: false", "invalid_api_key")
        if not presented:
            raise ClientError(401, "missing API key: send 'Authorization: Bearer KEY' or 'x-api-key: KEY', "
                                   "or put it in the base URL as http://HOST:PORT/k/KEY", "invalid_api_key")
        matched = None
        for entry in config.api_keys:  # compare against every key: timing reveals nothing
            if hmac.compare_digest(entry["key"].encode(), presented.encode()):
                matched = entry
        if matched is None:
            raise ClientError(401, "invalid API key", "invalid_api_key")
        return matched

    def readable_kbs(self, key):
        """The knowledge bases a client with ``key`` (an api_keys entry, or None when
        api_key_auth is off) may read: the served ones its ``kbs`` scope names."""
        if self.knowledge_bases is None:
            return []
        return [name for name in self.knowledge_bases.kbs if key_allows_kb(key, name)]

    @staticmethod
    def check_model_scope(key, model):
        """A 403 unless the api_keys entry ``key`` may use ``model`` (its ``models`` globs)."""
        if not key_allows_model(key, model):
            raise ClientError(403, f"model '{model}' is outside this API key's scope (key '{key['name']}' may use: "
                                   f"{', '.join(key['models']) or 'no model'})", "model_not_in_scope")

    # -- MCP ------------------------------------------------------------------

    def mcp_server(self):
        """The McpServer behind /mcp, made on first use."""
        if self._mcp is None:
            with self._mcp_lock:
                if self._mcp is None:
                    from .mcp import McpServer
                    self._mcp = McpServer(self, session_secret=self.mcp_session_secret)
        return self._mcp

    def _mcp_call(self, request, trace):
        server = self.mcp_server()
        refused = server.refuse_origin(request)  # before the key: a rebinding page gets nothing to try keys on
        if refused is not None:
            return refused
        try:
            key = self._authenticate(request)
        except ClientError as exc:
            return server.unauthorized(exc.message)
        trace.client = key["name"] if key else ""
        return server.handle(request, key)

    # -- routing ------------------------------------------------------------

    def resolve_route(self, model):
        """The ``models`` entry for ``model``: exact name, else the first glob, ``*`` last."""
        config = self.config
        cached_for, routes = self._routes
        if cached_for is not config:  # a reload starts a fresh table
            routes = {}
            self._routes = (config, routes)
        route = routes.get(model, _NO_ROUTE)
        if route is _NO_ROUTE:
            route = self._match_route(config.models, model)
            if len(routes) < 1024:  # names come from clients: keep the table small
                routes[model] = route
        return route

    @staticmethod
    def _match_route(routes, model):
        for route in routes:
            if not route.is_glob and route.name == model:
                return route
        for route in routes:
            if route.is_glob and route.name != "*" and fnmatch.fnmatchcase(model, route.name):
                return route
        for route in routes:
            if route.name == "*":
                return route
        return None

    def _pick_provider(self, route, dialect):
        providers = self.config.providers["llm"]
        native = _NATIVE_PROVIDER[dialect]
        for name in route.upstream:
            if providers[name].type == native:
                return providers[name]
        return providers[route.upstream[0]]

    def _catch_all_provider(self, dialect):
        route = self.resolve_route("")  # only "*" matches the empty name
        return self._pick_provider(route, dialect) if route else None

    # -- proxied calls ------------------------------------------------------

    def _parse_body(self, request, endpoint):
        if not request.body:
            raise ClientError(400, "request body is empty; expected a JSON object")
        members = None
        # A large body is most likely an agent loop's, which repeats its last round's: whatever
        # its route, taking what it repeats from App.parsed is cheaper than parsing it all.
        if len(request.body) >= PARSE_MEMO_MIN_BODY or self._may_retrieve(request):
            payload, members = json_object_with_members(request.body, ("messages", "input"), self.parsed)
        else:
            payload = json_object_of(request.body)
        for field in endpoint.required:
            if payload.get(field) in (None, ""):
                raise ClientError(400, f"missing required field '{field}'", "missing_required_parameter")
        for field in endpoint.list_fields:
            if not isinstance(payload[field], list):
                raise ClientError(400, f"'{field}' must be an array", "invalid_type")
        if "model" in payload and not isinstance(payload["model"], str):
            raise ClientError(400, "'model' must be a string", "invalid_type")
        return payload, members

    def _may_retrieve(self, request):
        """Whether retrieval will likely read this body: its model, read before parsing, has KBs.

        Such a body is parsed in one pass that also finds where its messages
        lie (the turn key and the splice need that), taking what it repeats
        of earlier bodies (App.parsed); any other keeps the plain parse, which
        is cheaper for a body seen once.  A body that does not name its model
        first (the SDKs put it after the messages) may retrieve if this proxy
        has knowledge bases.  Only a guess at the parser: the parsed payload,
        not this, names the route.
        """
        header = request.headers.get("x-ragproxy-kb", "").strip().lower()
        if header:
            return header != "off"
        leading = leading_model(request.body)
        if leading is None:
            return self.retriever is not None
        model, kbs = split_model_kbs(leading)
        if kbs:
            return True
        route = self.resolve_route(model) if model else None
        return bool(route is not None and route.kb)

    def _proxy(self, request, path, endpoint, trace):
        payload, members = self._parse_body(request, endpoint)
        model, kb_override = split_model_kbs(payload.get("model", ""))
        route = self.resolve_route(model)
        if route is None:
            raise ClientError(404, f"model '{model}' is not configured in ragproxy (add it under models, "
                                   "or a '*' catch-all)", "model_not_found")
        self.check_model_scope(trace.key, model)
        provider = self._pick_provider(route, endpoint.dialect)
        exchange = Exchange(request, endpoint, payload, route, provider, model, kb_override=kb_override,
                            key=trace.key, members=members)
        trace.exchange = exchange
        sent_model = payload.get("model", "")
        upstream_model = route.upstream_model or model
        renamed = upstream_model != sent_model
        if renamed:
            payload["model"] = upstream_model
        for rewrite in self.rewriters:
            rewrite(exchange)
        if endpoint.name == "count_tokens" and provider.type != "anthropic":
            sent = json_bytes(payload) if exchange.changed or exchange.edits else request.body
            return json_response(200, {"input_tokens": _estimate_body_tokens(sent)})
        if endpoint.dialect == "ollama" and provider.type != "ollama":
            return translate_ollama_call(self, exchange)
        body = request.body
        try:
            if exchange.changed:
                body = json_bytes(payload)
            elif exchange.edits:
                paths = exchange.edits + (("model",),) if renamed else exchange.edits
                body = with_edits(body, payload, paths, exchange.members, exchange.encoded, parts=True) \
                    or json_bytes(payload)
            elif renamed:
                body = with_model(body, sent_model, upstream_model) or json_bytes(payload)
        except RecursionError:  # nesting json parsed with a few levels to spare, and cannot encode again
            raise ClientError(400, "request body is nested too deeply") from None
        url = upstream_url(provider, path, request.query)
        sent = self.clock()
        response = self._send(request, endpoint.dialect, provider, "POST", url, body, exchange.response_headers)
        trace.upstream_ms = (self.clock() - sent) * 1000.0  # to the response headers
        return response

    def _forward_other(self, request, path, dialect, key=None):
        """Any other /v1 or /api path: to the requested model's provider, else the catch-all."""
        provider = None
        if path.startswith("/v1/models/"):   # one model's card: a scoped key sees only its own models'
            self.check_model_scope(key, path[len("/v1/models/"):])
        if request.body and request.headers.get("content-type", "").startswith("application/json"):
            payload = None
            with contextlib.suppress(ValueError, UnicodeDecodeError, RecursionError):
                payload = json.loads(request.body)
            if isinstance(payload, dict):
                # Ollama's older calls (/api/show, /api/pull, /api/delete) name the model "name".
                for field in ("model", "name") if path.startswith("/api/") else ("model",):
                    if isinstance(payload.get(field), str):
                        self.check_model_scope(key, payload[field])
                if isinstance(payload.get("model"), str):
                    route = self.resolve_route(payload["model"])
                    provider = route and self._pick_provider(route, dialect)
        provider = provider or self._catch_all_provider(dialect)
        if provider is None:
            raise ClientError(404, f"no upstream for {request.method} {path}: no model given and no '*' route")
        if path.startswith("/api/") and provider.type != "ollama":
            raise ClientError(404, f"{path} is an Ollama API path but the upstream is {provider.type}")
        url = upstream_url(provider, path, request.query)
        return self._send(request, dialect, provider, request.method, url, request.body or None, [])

    def wants_body_stream(self, method, path):
        """True when the request body should be read by the handler, not buffered (uploads)."""
        return self.admin is not None and self.admin.wants_body_stream(method, normalize_path(path))

    def upstream_headers(self, request, provider):
        named = _connection_options(request.headers.get("connection"))
        headers = {name: value for name, value in request.headers.items()
                   if name not in _DROP_UPSTREAM and not name.startswith("x-ragproxy-") and name not in named}
        headers["accept-encoding"] = "identity"
        key = provider.api_key
        if provider.pass_client_key and not self.config.api_key_auth:
            key = key or request.headers.get("x-api-key", "") or \
                request.headers.get("authorization", "")[7:].strip()
        if key:
            if provider.type == "anthropic":
                headers["x-api-key"] = key
            else:
                headers["authorization"] = "Bearer " + key
        if provider.type == "anthropic" and "anthropic-version" not in headers:
            headers["anthropic-version"] = "2023-06-01"
        for name, value in provider.headers:
            headers[name.lower()] = value
        return headers

    def open_upstream(self, request, provider, method, url, body, content_type=None):
        """Send ``body`` to ``provider`` with the client's forwardable headers; the UpstreamResponse."""
        headers = self.upstream_headers(request, provider)
        if body is not None:
            headers["content-length"] = str(len(body))
            if content_type:
                headers["content-type"] = content_type
            else:
                headers.setdefault("content-type", "application/json")
        try:
            return self.http.request(method, url, headers, body, provider.connect_timeout, provider.read_timeout,
                                     provider.tls)
        except UpstreamError as exc:
            exc.provider = provider.name
            raise

    def _send(self, request, dialect, provider, method, url, body, extra_headers):
        upstream = self.open_upstream(request, provider, method, url, body)
        named = _connection_options(upstream.header("connection"))
        out_headers = [(k, v) for k, v in upstream.headers
                       if k.lower() not in _DROP_DOWNSTREAM and k.lower() not in named]
        out_headers += extra_headers
        content_type = upstream.header("content-type")
        if upstream.status < 400 and is_event_stream(content_type):
            out_headers = [(k, v) for k, v in out_headers if k.lower() not in ("cache-control", "x-accel-buffering")]
            out_headers += [("Cache-Control", "no-cache"), ("X-Accel-Buffering", "no")]
            tracker = StreamTracker(dialect)
            sse = not content_type.lower().startswith(("application/x-ndjson", "application/jsonl"))
            return StreamResponse(upstream.status, out_headers, _relay_events(upstream, tracker, sse),
                                  upstream.close, functools.partial(_hang_up, upstream, tracker, sse))
        # Errors included: status and body go back byte for byte, since clients
        # (Claude Code's retry logic among them) read the upstream's wording.
        try:
            body = upstream.read_all(MAX_UPSTREAM_BODY)
        except UpstreamError as exc:
            exc.provider = provider.name
            raise
        return Response(upstream.status, out_headers, body)

    # -- local answers ------------------------------------------------------

    def _health(self):
        return {"status": "ok", "version": __version__, "features": deps.FEATURES,
                "uptime_s": round(self.clock() - self.started, 3),
                "models": [r.name for r in self.config.models]}

    def _list_models(self, request, key=None):
        names = [r.name for r in self.config.models if not r.is_glob]
        for route in self.config.models:
            if route.is_glob:
                for model_id in self._upstream_model_ids(self._pick_provider(route, "openai")):
                    if fnmatch.fnmatchcase(model_id, route.name) and model_id not in names \
                            and self.resolve_route(model_id) is route:
                        names.append(model_id)
        names = [n for n in names if key_allows_model(key, n)]   # a key sees only the models it may use
        created = int(self.started)
        if "anthropic-version" in request.headers:
            stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(created))
            data = [{"type": "model", "id": n, "display_name": n, "created_at": stamp} for n in names]
            return json_response(200, {"data": data, "has_more": False,
                                       "first_id": names[0] if names else None,
                                       "last_id": names[-1] if names else None})
        data = [{"id": n, "object": "model", "created": created, "owned_by": "ragproxy"} for n in names]
        return json_response(200, {"object": "list", "data": data})

    def _upstream_model_ids(self, provider):
        """What a glob route's provider serves; a down upstream just lists nothing."""
        try:
            status, _, names = self.upstream_models(provider, 3.0, 5.0)
        except UpstreamError:
            return []
        return names if status == 200 and names is not None else []

    def upstream_models(self, provider, connect_timeout, read_timeout):
        """Ask an LLM provider for its models: ``(status, body, names)``; names is None if
        the answer was no model list.  Timeouts are capped at the provider's own."""
        if provider.type == "ollama":
            url, key = provider.base_url + "/api/tags", "models"
        else:
            url, key = upstream_url(provider, "/v1/models", ""), "data"
        resp = self.http.request("GET", url, self.upstream_headers(Request("GET", "/"), provider), None,
                                 min(provider.connect_timeout, connect_timeout),
                                 min(provider.read_timeout, read_timeout), provider.tls)
        body = resp.read_all(16 * 1024 * 1024)
        try:
            items = json.loads(body).get(key) or []
        except (ValueError, AttributeError):
            return resp.status, body, None
        return resp.status, body, [str(m.get("name") or m.get("id")) for m in items if isinstance(m, dict)]

    def _ollama_listing(self, request, path, key=None):
        provider = self._catch_all_provider("ollama")
        if provider is not None and provider.type == "ollama":
            with contextlib.suppress(UpstreamError):
                resp = self._send(request, "ollama", provider, "GET", provider.base_url + path, None, [])
                if path == "/api/version" or resp.status != 200:
                    return resp
                return self._merge_tags(resp, key)
        if path == "/api/version":
            return json_response(200, {"version": "0.12.0"})
        return json_response(200, {"models": [_ollama_tag(r.name, self.started) for r in self.config.models
                                              if not r.is_glob and key_allows_model(key, r.name)]})

    def _merge_tags(self, resp, key=None):
        try:
            listing = json.loads(resp.body)
            models = listing.setdefault("models", [])
            have = {m.get("name") for m in models if isinstance(m, dict)}
        except (ValueError, AttributeError):
            # Not a listing ragproxy can read: a scoped key gets no names it could not use.
            return resp if key is None or key["models"] == ["*"] else json_response(200, {"models": []})
        models.extend(_ollama_tag(r.name, self.started) for r in self.config.models
                      if not r.is_glob and r.name not in have)
        if key is not None and key["models"] != ["*"]:
            listing["models"] = [m for m in models if isinstance(m, dict) and isinstance(m.get("name"), str)
                                 and key_allows_model(key, m["name"])]
        return json_response(200, listing)


def _ollama_tag(name, created):
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(created))
    return {"name": name, "model": name, "modified_at": stamp, "size": 0, "digest": "",
            "details": {"format": "", "family": "ragproxy", "parameter_size": "", "quantization_level": ""}}


def _estimate_body_tokens(data):
    """A tokenizer-free estimate: about four bytes of JSON per token."""
    return max(1, (len(data) + 3) // 4)


def _relay_events(upstream, tracker, sse):
    """Yield whole events as soon as each arrives; report a late failure in-band.

    Passing on only complete events costs no latency (a client can use nothing
    less) and means a failure report never lands inside a half-sent event.
    An event that spans reads is kept as a list of them and joined once, and
    each read is searched once: one event of many MiB (hundreds of reads)
    costs time linear in its size, where adding every read to one buffer and
    searching all of it again was quadratic.
    """
    pending, tail = [], b""  # the reads since the last event's end (none holds one), and their last bytes
    feed = tracker.feed if tracker.watches else None
    try:
        while True:
            data = upstream.read1()
            if not data:
                if pending:
                    yield b"".join(pending)
                return
            cut = _last_event_end(data, sse, tail)
            if not cut:
                pending.append(data)
                tail = (tail + data[-3:])[-3:]
                continue
            rest = data[cut:] if cut < len(data) else b""  # usually a read ends on an event's end: no copies
            if rest:
                data = data[:cut]
            if pending:
                pending.append(data)
                data = b"".join(pending)
            pending, tail = ([rest], rest[-3:]) if rest else ([], b"")
            if feed is not None:
                feed(data)
            tracker.last = data
            yield data
    except UpstreamError as exc:
        yield tracker.error_event(f"upstream failed mid-stream: {exc}")


# The last event of a stream, at a line start (a JSON string cannot hold a raw
# newline, so a model's text cannot fake one): OpenAI chat, Anthropic and
# Responses events, and Ollama's NDJSON line that says it is done.
_FINAL_SSE_EVENT = re.compile(
    rb"^(?:data: ?\[DONE\]|event: ?(?:message_stop|response\.(?:completed|failed|incomplete)|error))\r?$", re.M)
_FINAL_NDJSON_LINE = re.compile(rb'"done": ?true')


def _hang_up(upstream, tracker, sse):
    """The client left mid-stream: stop the upstream, so a model stops generating.

    Not when the answer's last event has been relayed already: the OpenAI SDK
    closes its connection as soon as it reads [DONE], often before the
    upstream's end of body has arrived.  Dropping the upstream connection then
    stops nothing and costs the next call a new connection (a TLS handshake
    to a gateway); left alone, the relay reads the end and pools it.
    """
    if (_FINAL_SSE_EVENT if sse else _FINAL_NDJSON_LINE).search(tracker.last):
        return
    upstream.close()


def _last_event_end(buf, sse, before=b""):
    """Offset just past the last complete event in ``buf`` (0: none yet).

    ``before`` ends with the bytes not yet passed on that came just ahead of
    ``buf`` (three are enough): an SSE blank line can be split between reads.
    Only ``buf`` and the few bytes at the seam are searched, never what came
    before again.
    """
    if not sse:
        return buf.rfind(b"\n") + 1
    if buf.endswith(b"\n\n"):
        return len(buf)
    lf, crlf = buf.rfind(b"\n\n"), buf.rfind(b"\r\n\r\n")
    end = max(lf + 2 if lf >= 0 else 0, crlf + 4 if crlf >= 0 else 0)
    if before and end < 3:
        tail = before[-3:]
        seam = tail + buf[:3]
        for mark in (b"\n\n", b"\r\n\r\n"):
            at = seam.rfind(mark)
            if at >= 0:
                end = max(end, at + len(mark) - len(tail))
    return end
