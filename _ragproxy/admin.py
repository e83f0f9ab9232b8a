"""The admin API under /admin/api/ and the web panel at /.

Sessions are HS256 JWTs signed with the panel secret key (admintokens);
every change goes through ConfigFile (validated, atomic, previous file
kept), so a restart comes back to the same state.  The route table is also the OpenAPI
document.  The panel itself is static/panel.html, read beside the package.
Keys (client api_keys, providers' api_key and credential headers) leave it
masked, in the views and in config.yaml's text alike; a masked key sent back
unchanged keeps the stored one (see masking).  A client key made here (created
or rotated) is random and is shown in full once, in that answer, never again.

May import: adminroutes, admintokens, api, config, deps, docfolder, embeddings, files, http1, jsonbody, masking, metrics,
reqlog, schema, storeadmin, uploads, upstream, workers, yamlish.
"""
from __future__ import annotations

import contextlib
import hmac
import logging
import math
import os
import re
import secrets
import shutil
import time
import urllib.parse

from . import __version__, deps
from .adminroutes import match_route, openapi_document, refuse_traversal
from .admintokens import TOKEN_AUDIENCE, LoginThrottle, b64url, issue_token, verify_token
from .api import ClientError, Response, json_response
from .config import KB_NAME, ConfigError, copy_default, loggable_url, valid_kb_name
from .docfolder import read_manifest
from .embeddings import EmbeddingClient, EmbeddingError, RerankClient, RerankError
from .files import remove_leftover_dirs
from .http1 import parse_content_length
from .jsonbody import json_object_of
from .masking import MaskError, is_secret_header, mask_secret, mask_text, restore, restore_text
from .metrics import MCP_OUTCOMES
from .reqlog import RETRIEVAL_OUTCOMES
from .schema import model_field_choices
from .storeadmin import StoreAdmin
from .uploads import UploadError, UploadLimits, Uploads
from .upstream import UpstreamError
from .workers import read_status as read_workers_status
from .yamlish import YAMLError, load_yaml

log = logging.getLogger("ragproxy")


_PROVIDER_KINDS = ("llm", "embedding", "rerank")
_PROVIDER_NAME = KB_NAME
_KEY_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.@-]{0,63}$")
_PANEL_HEADERS = [
    ("Content-Type", "text/html; charset=utf-8"),
    ("Cache-Control", "no-store"),
    ("X-Content-Type-Options", "nosniff"),
    ("Referrer-Policy", "no-referrer"),
    ("X-Frame-Options", "DENY"),
    # Everything the panel needs is inline or same-origin; nothing else may load.
    ("Content-Security-Policy", "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
                                "img-src data:; connect-src 'self'; form-action 'none'; frame-ancestors 'none'; "
                                "base-uri 'none'"),
]


def _json_object(request):
    """The admin request's JSON object; no body counts as ``{}``."""
    return json_object_of(request.body) if request.body else {}


def _query_params(request):
    try:
        return dict(urllib.parse.parse_qsl(request.query, keep_blank_values=True, strict_parsing=False))
    except ValueError as exc:
        raise ClientError(400, f"bad query string: {exc}") from None


def _int_param(params, name, default, low, high):
    text = params.get(name)
    if text in (None, ""):
        return default
    try:
        value = int(text)
    except ValueError:
        raise ClientError(400, f"'{name}' must be an integer") from None
    return min(high, max(low, value))


def _float_param(params, name):
    text = params.get(name)
    if text in (None, ""):
        return None
    try:
        value = float(text)
    except ValueError:
        raise ClientError(400, f"'{name}' must be a number") from None
    if not math.isfinite(value):
        raise ClientError(400, f"'{name}' must be a finite number")
    return value


def _config_error_response(exc, with_lines=True):
    errors = [{"path": path or None, "line": line if with_lines else None, "message": message}
              for path, line, message in exc.errors]
    first = errors[0] if errors else {"path": None, "line": None, "message": str(exc)}
    where = (f"line {first['line']}: " if first["line"] else "") + (f"{first['path']}: " if first["path"] else "")
    summary = where + first["message"] + (f" (and {len(errors) - 1} more)" if len(errors) > 1 else "")
    return json_response(400, {"error": {"message": "invalid configuration: " + summary,
                                          "type": "invalid_request_error", "code": "invalid_config",
                                          "errors": errors}})


def _panel_html():
    """static/panel.html beside the package (a checkout, the .pyz or its extracted copy); None if absent."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    with contextlib.suppress(OSError):
        # The package's own loader reads files from a directory and from inside a zip alike.
        return __loader__.get_data(os.path.join(root, "static", "panel.html"))
    return None


class Admin:
    """The admin API and the panel; attached to an App with ``app.admin = Admin(...)``."""

    def __init__(self, app, secret_key, config_file, clock=None, rng=None, throttle=None):
        if not secret_key:
            raise ValueError("the admin API needs a secret key")
        self.app = app
        self.secret_key = secret_key
        self.config_file = config_file
        self.clock = clock or app.clock
        self.rng = rng or app.rng
        # Client keys come from the system's CSPRNG unless a test injects one: app.rng is a Mersenne
        # Twister, and the session tokens' jti values would give its state away.
        self.key_rng = rng if rng is not None else secrets.SystemRandom()
        self.throttle = throttle if throttle is not None else LoginThrottle(self.clock)
        self.uploads = Uploads(clock=self.clock)  # one per process: its locks order manifest updates
        self.stores = StoreAdmin()

    # -- entry point --------------------------------------------------------

    def handle(self, request, path):
        if path in ("/", "/panel") and request.method in ("GET", "HEAD"):
            html = _panel_html()
            if html is None:
                raise ClientError(404, "the web panel (static/panel.html) is not installed beside ragproxy.py")
            return Response(200, list(_PANEL_HEADERS), b"" if request.method == "HEAD" else html)
        if not path.startswith("/admin/api/"):
            raise ClientError(404, f"no such endpoint: {request.method} {path}", "not_found")
        try:
            route, params = match_route(request.method, path[len("/admin/api/"):])
        except UnicodeDecodeError:
            raise ClientError(400, "the path is not valid UTF-8 once decoded") from None
        if not route.public:
            self._check_token(request)
        try:
            return getattr(self, route.handler)(request, **params)
        except ConfigError as exc:
            return _config_error_response(exc, with_lines=route.handler.endswith("_settings"))

    def _check_token(self, request):
        auth = request.headers.get("authorization", "")
        if auth[:7].lower() != "bearer " or not auth[7:].strip():
            raise ClientError(401, "admin endpoints need 'Authorization: Bearer <token>' from POST /admin/api/login",
                              "invalid_token", headers=[("WWW-Authenticate", 'Bearer realm="ragproxy-admin"')])
        claims = verify_token(self.secret_key, auth[7:].strip(), self.clock())
        if claims is None:
            raise ClientError(401, "the session token is invalid or has expired; log in again", "invalid_token",
                              headers=[("WWW-Authenticate", 'Bearer realm="ragproxy-admin", error="invalid_token"')])
        return claims

    def wants_body_stream(self, method, path):
        """True for uploads: their bodies go to disk as they arrive instead of into memory."""
        return method == "POST" and path.startswith("/admin/api/kbs/") and path.endswith("/upload")

    # -- session ------------------------------------------------------------

    def login(self, request):
        client = request.client or "?"
        wait = self.throttle.wait(client)
        if wait > 0:
            raise ClientError(429, f"too many failed logins; try again in {math.ceil(wait)} s", "rate_limited",
                              headers=[("Retry-After", str(math.ceil(wait)))])
        key = _json_object(request).get("key")
        if not isinstance(key, str) or not hmac.compare_digest(key.encode("utf-8"),
                                                               self.secret_key.encode("utf-8")):
            self.throttle.failed(client, self.app.config.raw["admin"]["max_login_failures"])
            log.warning("admin login failed from %s", client)
            raise ClientError(401, "wrong panel key (it is in DATA_DIR/config/secret_key.yaml, or "
                                   "RAGPROXY_SECRET_KEY)", "invalid_key")
        self.throttle.succeeded(client)
        now = self.clock()
        ttl = float(self.app.config.raw["admin"]["token_ttl"])
        expires = int(now + ttl)
        token = issue_token(self.secret_key, {"sub": "admin", "aud": TOKEN_AUDIENCE, "iat": int(now),
                                              "exp": expires, "jti": "%032x" % self.rng.getrandbits(128)})
        return json_response(200, {"token": token, "token_type": "Bearer", "expires_at": expires,
                                    "expires_in": int(ttl)})

    def session(self, request):
        claims = self._check_token(request)
        return json_response(200, {"subject": claims.get("sub"), "expires_at": claims.get("exp")})

    def overview(self, request):
        config = self.app.config
        return json_response(200, {
            "version": __version__, "features": deps.FEATURES, "uptime_s": round(self.clock() - self.app.started, 3),
            "models": [route.name for route in config.models], "kbs": sorted(config.knowledge_bases),
            "vectorstore": config.vectorstore_status(),
            "config_path": self.config_file.path, "request_log": self.app.request_log is not None,
            # What the logs page filters by: retrieval's outcomes, then an MCP tool call's.
            "outcomes": list(dict.fromkeys(RETRIEVAL_OUTCOMES + MCP_OUTCOMES)),
            "workers": self._workers(),
            "cpu_placement": self.app.placement.state() if self.app.placement is not None else None})

    def _workers(self):
        """The serving processes: this one's slot, and what the supervisor says of each (serve --workers)."""
        worker = self.app.worker
        if worker is None:
            return {"count": 1, "this": {"slot": 0, "pid": os.getpid()}, "workers": []}
        status = read_workers_status(worker["status_path"]) or {"error": "the supervisor has written no status"}
        return {"count": status.get("count", self.app.config.server["workers"]), "error": status.get("error"),
                "this": {"slot": worker["slot"], "pid": os.getpid()}, "workers": status.get("workers", [])}

    def openapi(self, request):
        return json_response(200, openapi_document())

    # -- config changes -----------------------------------------------------

    def _change(self, change):
        """Apply ``change(data)`` to config.yaml and switch the running proxy to the result."""
        config = self.config_file.update(change)
        self.app.reload(config)
        return config

    # -- providers ----------------------------------------------------------

    @staticmethod
    def _provider_view(name, spec):
        view = {"name": name, **copy_default(spec)}
        view["has_api_key"] = bool(spec.get("api_key"))
        view["api_key"] = mask_secret(spec.get("api_key", ""))
        if isinstance(view.get("headers"), dict):
            view["headers"] = {name: mask_secret(value) if is_secret_header(name) and isinstance(value, str)
                               else value for name, value in view["headers"].items()}
        return view

    def list_providers(self, request):
        raw = self.app.config.raw["providers"]
        return json_response(200, {kind: [self._provider_view(name, spec) for name, spec in raw[kind].items()]
                                    for kind in _PROVIDER_KINDS})

    @staticmethod
    def _kind(kind):
        if kind not in _PROVIDER_KINDS:
            raise ClientError(404, f"no provider kind {kind!r} (use llm, embedding or rerank)", "not_found")
        return kind

    def _existing_provider(self, kind, name):
        providers = self.app.config.raw["providers"][self._kind(kind)]
        if name not in providers:
            raise ClientError(404, f"no {kind} provider {name!r}", "not_found")
        return providers[name]

    def create_provider(self, request, kind):
        kind = self._kind(kind)
        body = _json_object(request)
        name = body.pop("name", None)
        if not isinstance(name, str) or not _PROVIDER_NAME.match(name):
            raise ClientError(400, "'name' is required: letters, digits, '_', '-' and '.' (64 at most)")

        def change(data):
            providers = _config_map(data, "providers", kind)
            if name in providers:
                raise ClientError(409, f"a {kind} provider named {name!r} exists already", "conflict")
            providers[name] = body

        config = self._change(change)
        return json_response(201, self._provider_view(name, config.raw["providers"][kind][name]))

    def update_provider(self, request, kind, name):
        stored = self._existing_provider(kind, name)
        body = _json_object(request)
        body.pop("name", None)
        if body.get("api_key") is None or restore(body["api_key"], stored.get("api_key")) != body["api_key"]:
            body.pop("api_key", None)  # the panel sends back the masked key unchanged
        headers = body.get("headers")
        running = stored.get("headers") or {}

        def change(data):
            providers = _config_map(data, "providers", kind)
            if not isinstance(providers.get(name), dict):
                raise ClientError(404, f"no {kind} provider {name!r} in the config file", "not_found")
            if isinstance(headers, dict):
                # A masked header sent back unchanged keeps the value as written (perhaps ${VAR}),
                # which the running config holds substituted.
                written = providers[name].get("headers") if isinstance(providers[name].get("headers"), dict) \
                    else {}
                for header, value in headers.items():
                    if is_secret_header(header) and restore(value, running.get(header)) != value:
                        headers[header] = written.get(header, running[header])
            providers[name].update(body)

        config = self._change(change)
        return json_response(200, self._provider_view(name, config.raw["providers"][kind][name]))

    def delete_provider(self, request, kind, name):
        self._existing_provider(kind, name)

        def change(data):
            _config_map(data, "providers", kind).pop(name, None)

        self._change(change)
        return json_response(200, {"deleted": name})

    def test_provider(self, request, kind, name):
        self._existing_provider(kind, name)
        _json_object(request)  # takes no fields, but a garbled body is still an error
        provider = self.app.config.providers[kind][name]
        started = time.perf_counter()
        status, error, detail = None, None, ""
        try:
            status, detail = self._probe_provider(kind, provider)
        except (UpstreamError, EmbeddingError, RerankError) as exc:
            error = str(exc)
            status = getattr(exc, "status", None)
        latency = (time.perf_counter() - started) * 1000.0
        ok = error is None and status is not None and status < 400
        if error is None and not ok:
            error = f"HTTP {status}: {detail}"
        return json_response(200, {"ok": ok, "latency_ms": round(latency, 2), "status": status,
                                    "error": error, "detail": detail})

    def _probe_provider(self, kind, provider):
        """One cheap real call: ``(status, what it said)``."""
        if kind == "embedding":
            client = EmbeddingClient(provider, self.app.http, batch_size=1, max_concurrency=1)
            vectors = client.embed_query("ragproxy connection test")
            return 200, f"{len(vectors)}-dimensional embeddings from {provider.model or 'the default model'}"
        if kind == "rerank":
            order = RerankClient(provider, self.app.http).rerank("connection test", ["connection", "test"], 2)
            return 200, f"reranked {len(order)} documents"
        status, body, names = self.app.upstream_models(provider, 5.0, 10.0)
        if status >= 400:
            return status, body[:500].decode("utf-8", "replace")
        if names is None:
            return status, "answered, but not with a model list"
        return status, f"{len(names)} models" + (": " + ", ".join(names[:10]) if names else "")

    # -- model mappings -----------------------------------------------------

    def list_models(self, request):
        config = self.app.config
        return json_response(200, {"models": [self._model_view(config, m["name"]) for m in config.raw["models"]],
                                   "fields": model_field_choices()})

    def _model_index(self, models, name):
        for i, entry in enumerate(models):
            if isinstance(entry, dict) and entry.get("name") == name:
                return i
        raise ClientError(404, f"no model mapping named {name!r}", "not_found")

    def _model_view(self, config, name):
        """The mapping as configured, plus ``rerank_status``: whether its rerank is in effect, and why not
        (no rerank provider configured, or the one there switched off by a permanent error)."""
        index = next(i for i, m in enumerate(config.raw["models"]) if m["name"] == name)
        status = config.rerank_status(config.models[index])
        retriever = self.app.retriever
        off = retriever.disabled_rerankers.get(status["provider"]) if retriever and status["active"] else None
        if off is not None:
            status = dict(status, active=False, reason=f"reranker {status['provider']!r} was switched off after a "
                                                       f"permanent error, until the config is reloaded: {off}")
        return {**copy_default(config.raw["models"][index]), "rerank_status": status}

    def create_model(self, request):
        body = _json_object(request)
        name = body.get("name")
        if not isinstance(name, str) or not name:
            raise ClientError(400, "'name' is required (a model name or a glob such as 'claude-*')")

        def change(data):
            models = _config_list(data, "models")
            if any(isinstance(m, dict) and m.get("name") == name for m in models):
                raise ClientError(409, f"a model mapping named {name!r} exists already", "conflict")
            # A new mapping goes before the catch-all, where a reader expects it.
            at = next((i for i, m in enumerate(models) if isinstance(m, dict) and m.get("name") == "*"),
                      len(models))
            models.insert(at, body)

        return json_response(201, self._model_view(self._change(change), name))

    def update_model(self, request, name):
        body = _json_object(request)
        self._model_index(self.app.config.raw["models"], name)
        new_name = body.get("name", name)

        def change(data):
            models = _config_list(data, "models")
            models[self._model_index(models, name)].update(body)

        return json_response(200, self._model_view(self._change(change), new_name))

    def delete_model(self, request, name):
        self._model_index(self.app.config.raw["models"], name)

        def change(data):
            models = _config_list(data, "models")
            del models[self._model_index(models, name)]

        self._change(change)
        return json_response(200, {"deleted": name})

    # -- client API keys ----------------------------------------------------

    def _written_keys(self):
        """api_keys as config.yaml writes them (``${VAR}`` unreplaced); None if the file cannot say."""
        try:
            data, _ = load_yaml(self.config_file.read_text())
        except (OSError, UnicodeDecodeError, YAMLError):
            return None
        keys = data.get("api_keys") if isinstance(data, dict) else None
        return keys if isinstance(keys, list) else None

    @staticmethod
    def _key_view(entry, written=None):
        """One key as the admin API shows it: masked (an ``${VAR}`` reference as written), its scope."""
        from_environment = isinstance(written, str) and "${" in written
        return {"name": entry["name"], "masked_key": mask_secret(written if from_environment else entry["key"]),
                "kbs": entry.get("kbs", "*"), "models": entry.get("models", ["*"]),
                "explicit": bool(entry.get("explicit", False)), "from_environment": from_environment}

    def _key_views(self, config):
        written = self._written_keys()
        if written is None or len(written) != len(config.api_keys):
            written = [None] * len(config.api_keys)   # the file changed meanwhile: show what runs
        return [self._key_view(entry, item.get("key") if isinstance(item, dict) else item)
                for entry, item in zip(config.api_keys, written)]

    def _key_answer(self, config, name, key=None):
        """The view of the key now named ``name``; with ``key``, the key itself, this once."""
        index = next(i for i, entry in enumerate(config.api_keys) if entry["name"] == name)
        view = self._key_views(config)[index]
        if key is not None:
            view["key"] = key
        # The one answer that holds a usable key: no cache along the way may keep it.
        return view, [("Cache-Control", "no-store")]

    def _new_key(self):
        return "rp-" + b64url(self.key_rng.getrandbits(192).to_bytes(24, "big"))

    def _key_fields(self, body, allowed, current_kbs=()):
        """The scope fields of a key request, checked; ClientError 400 for anything else.

        A KB name must be one the proxy knows, or already in the key's scope (``current_kbs``):
        a KB deleted since stays until it is unticked, as config.py only warns about it.
        """
        if "key" in body:
            raise ClientError(400, "a key is generated, never sent: create one, or rotate it with "
                                   "'rotate': true", "invalid_key_field")
        unknown = sorted(set(body) - set(allowed))
        if unknown:
            raise ClientError(400, f"unknown field {unknown[0]!r} (a key takes {', '.join(allowed)})")
        fields = {}
        if "name" in body:
            name = body["name"]
            if not isinstance(name, str) or not _KEY_NAME.match(name):
                raise ClientError(400, "'name' must be letters, digits, '_', '-', '.' and '@' (64 at most, "
                                       "starting with a letter or digit)", "invalid_name")
            fields["name"] = name
        if "kbs" in body:
            kbs = body["kbs"]
            if kbs != "*":
                if not isinstance(kbs, list) or not all(isinstance(k, str) for k in kbs):
                    raise ClientError(400, "'kbs' must be \"*\" (every knowledge base) or a list of knowledge "
                                           "base names ([] for none: requests pass through without context)",
                                      "invalid_scope")
                known = self.app.config.knowledge_bases
                for kb in kbs:
                    if kb not in known and kb not in current_kbs:
                        raise ClientError(400, f"no knowledge base {kb!r} (there are: "
                                               f"{', '.join(sorted(known)) or 'none'})", "invalid_scope")
                kbs = list(dict.fromkeys(kbs))
            fields["kbs"] = kbs
        if "models" in body:
            models = ["*"] if body["models"] == "*" else body["models"]
            if not isinstance(models, list) or not all(isinstance(m, str) and m.strip() for m in models):
                raise ClientError(400, "'models' must be \"*\" or a list of model names or globs "
                                       "('gpt-*')", "invalid_scope")
            fields["models"] = list(dict.fromkeys(m.strip() for m in models))
        return fields

    @staticmethod
    def _key_names(keys):
        # The name a key without one goes by (in the request log too): its place in the list,
        # as config's api_keys check names it.
        return [(str(item["name"]) if isinstance(item, dict) and item.get("name") is not None else "")
                or f"key{i + 1}" for i, item in enumerate(keys)]

    def _key_index(self, keys, name):
        found = [i for i, written in enumerate(self._key_names(keys)) if written == name]
        if not found:
            raise ClientError(404, f"no API key named {name!r}", "not_found")
        if len(found) > 1:
            raise ClientError(409, f"{len(found)} API keys are named {name!r}: give them different names in "
                                   "the settings editor first", "conflict")
        return found[0]

    def list_keys(self, request):
        config = self.app.config
        return json_response(200, {"keys": self._key_views(config), "api_key_auth": config.api_key_auth,
                                   "require_acl": bool(config.raw["security"].get("require_acl", False))})

    def create_key(self, request):
        fields = self._key_fields(_json_object(request), ("name", "kbs", "models"))
        name = fields.get("name")
        if name is None:
            raise ClientError(400, "'name' is required (it names the key in the request log)", "invalid_name")
        key = self._new_key()

        def change(data):
            keys = _config_list(data, "api_keys")
            if name in self._key_names(keys):
                raise ClientError(409, f"an API key named {name!r} exists already", "conflict")
            keys.append({"key": key, **fields})

        config = self._change(change)
        log.info("API key %r added through the admin API from %s", name, request.client)
        view, headers = self._key_answer(config, name, key)
        return json_response(201, view, headers)

    def update_key(self, request, name):
        body = _json_object(request)
        rotate = body.pop("rotate", False)
        if not isinstance(rotate, bool):
            raise ClientError(400, "'rotate' must be true or false")
        current = next((entry for entry in self.app.config.api_keys if entry["name"] == name), {})
        kept = current.get("kbs") if isinstance(current.get("kbs"), list) else ()
        fields = self._key_fields(body, ("name", "kbs", "models"), current_kbs=kept)
        new_name = fields.get("name", name)
        key = self._new_key() if rotate else None

        def change(data):
            keys = _config_list(data, "api_keys")
            i = self._key_index(keys, name)
            if new_name != name and new_name in self._key_names(keys):
                raise ClientError(409, f"an API key named {new_name!r} exists already", "conflict")
            entry = keys[i] if isinstance(keys[i], dict) else {"key": keys[i]}
            if rotate and "${" in str(entry.get("key")):
                raise ClientError(409, f"the key {name!r} is read from the environment ({entry['key']}): "
                                       "change the variable, or delete this key and create one", "conflict")
            entry = {**entry, **fields, "name": new_name}
            if rotate:
                entry["key"] = key
            keys[i] = entry

        config = self._change(change)
        log.info("API key %r %s through the admin API from %s", name,
                 "rotated" if rotate else "changed" if new_name == name else f"renamed to {new_name!r}",
                 request.client)
        view, headers = self._key_answer(config, new_name, key)
        return json_response(200, view, headers)

    def delete_key(self, request, name):
        _json_object(request)

        def change(data):
            keys = _config_list(data, "api_keys")
            i = self._key_index(keys, name)
            # A key without a name goes by its place; the ones after it keep theirs.
            for j, written in enumerate(self._key_names(keys)[i + 1:], i + 1):
                item = keys[j]
                if not (isinstance(item, dict) and item.get("name")):
                    keys[j] = {**(item if isinstance(item, dict) else {"key": item}), "name": written}
            del keys[i]

        self._change(change)
        log.info("API key %r removed through the admin API from %s", name, request.client)
        return json_response(200, {"deleted": name})

    # -- knowledge bases ----------------------------------------------------

    def _kb(self, name):
        if not valid_kb_name(name):
            raise ClientError(400, f"invalid knowledge base name {name!r}: letters, digits, '_', '-' and '.' "
                                   "(64 at most, starting with a letter or digit)", "invalid_name")
        kbs = self.app.knowledge_bases
        kb = kbs.get(name) if kbs is not None else None
        if kb is None:
            raise ClientError(404, f"no knowledge base {name!r}", "not_found")
        return kb

    def _kb_view(self, kb):
        config, name = self.app.config, kb.spec.name
        view = {**kb.stats(), "config": copy_default(config.knowledge_bases.get(name, {})),
                "documents_dir": kb.documents_dir, "declared": name not in config.undeclared_kbs,
                "vectorstore": config.vectorstore_status(name),
                # What the panel tells an uploader: larger files are refused or skipped at upload.
                "upload_max_file_bytes": self._upload_limits(kb).file_cap()}
        if not view["declared"]:   # POST /kbs with its name declares it, settings and all
            view["named_by"] = config.undeclared_kbs[name][0]
        return view

    def list_kbs(self, request):
        kbs = self.app.knowledge_bases
        items = [self._kb_view(kb) for _, kb in sorted(kbs.kbs.items())] if kbs is not None else []
        return json_response(200, {"kbs": items})

    def get_kb(self, request, kb):
        return json_response(200, self._kb_view(self._kb(kb)))

    def create_kb(self, request):
        body = _json_object(request)
        name = body.pop("name", None)
        if not valid_kb_name(name):
            raise ClientError(400, "'name' is required: letters, digits, '_', '-' and '.' (64 at most, "
                                   "starting with a letter or digit)", "invalid_name")

        def change(data):
            kbs = _config_map(data, "knowledge_bases")
            if name in kbs:
                raise ClientError(409, f"a knowledge base named {name!r} exists already", "conflict")
            kbs[name] = body

        self._change(change)
        kb = self._kb(name)
        os.makedirs(kb.documents_dir, exist_ok=True)
        self.app.knowledge_bases.request_index(name)
        return json_response(201, self._kb_view(kb))

    def update_kb(self, request, kb):
        name = self._kb(kb).spec.name
        body = _json_object(request)
        body.pop("name", None)

        def change(data):
            entry = _config_map(data, "knowledge_bases").get(name)
            if not isinstance(entry, dict):
                raise ClientError(404, f"knowledge base {name!r} is not in the config file (a model's kb names "
                                       "it): declare it first with POST /admin/api/kbs, the panel's Declare button",
                                  "not_found")
            for key, value in body.items():
                if isinstance(value, dict) and isinstance(entry.get(key), dict):
                    entry[key].update(value)  # chunking, bm25, weights: change only what was sent
                else:
                    entry[key] = value

        self._change(change)
        self.app.knowledge_bases.request_index(name)
        return json_response(200, self._kb_view(self._kb(name)))

    def delete_kb(self, request, kb):
        old = self._kb(kb)
        name = old.spec.name

        def change(data):
            _config_map(data, "knowledge_bases").pop(name, None)

        self._change(change)
        # Move aside first (one rename each), then delete: a reader or the
        # indexer that still holds the old KB never sees a half-deleted tree.
        for path in (old.root, old.documents_dir):
            if os.path.isdir(path):
                trash = os.path.join(os.path.dirname(path), f"{_DELETED_PREFIX}{name}-{self.rng.getrandbits(32):08x}")
                os.replace(path, trash)
                shutil.rmtree(trash, ignore_errors=True)
        return json_response(200, {"deleted": name})

    def reindex_kb(self, request, kb):
        name = self._kb(kb).spec.name
        full = _json_object(request).get("full", False)
        if not isinstance(full, bool):
            raise ClientError(400, "'full' must be true or false")
        self.app.knowledge_bases.request_index(name, full=full)
        return json_response(202, {"queued": True, "full": full})

    def list_files(self, request, kb):
        kb = self._kb(kb)
        generation, _ = kb.current()
        uploaded = read_manifest(kb.documents_dir)
        label = kb.documents_label
        prefix = label + "/"
        stats = kb.stats()
        # By the name chunks would cite: an upload's original name.
        left_out = {item["file"]: (what, item["reason"]) for what in ("skipped", "deferred")
                    for item in stats.get(what) or ()}
        files, seen = [], set()
        for source, entry in sorted((generation.manifest if generation else {}).items()):
            stored = source[len(prefix):] if source.startswith(prefix) else None
            upload = uploaded.get(stored) if stored else None
            seen.add(stored)
            # Indexed, yet perhaps deferred this run (its previous chunks kept) or since skipped.
            what, reason = left_out.get(f"{label}/{upload['name']}" if upload else source, (None, None))
            files.append({"source": source, "path": source, "name": upload["name"] if upload else source,
                          "size": entry.get("size"), "chunks": len(entry.get("chunk_ids", ())),
                          "sha256": entry.get("hash"), "uploaded": upload is not None,
                          "uploaded_at": upload.get("uploaded_at") if upload else None,
                          "skipped": reason if what == "skipped" else None,
                          "deferred": reason if what == "deferred" else None})
        for stored, upload in sorted(uploaded.items()):
            if stored not in seen:  # uploaded, not indexed (yet, or skipped by the indexer)
                what, reason = left_out.get(f"{label}/{upload['name']}", (None, None))
                files.append({"source": prefix + stored, "path": prefix + stored, "name": upload["name"],
                              "size": upload.get("size"), "chunks": None, "sha256": upload.get("sha256"),
                              "uploaded": True, "uploaded_at": upload.get("uploaded_at"),
                              "skipped": reason if what == "skipped" else None,
                              "deferred": reason if what == "deferred" else None})
        return json_response(200, {"files": files})

    def list_chunks(self, request, kb):
        kb = self._kb(kb)
        params = _query_params(request)
        source = refuse_traversal(params.get("source", ""), "source")
        generation, _ = kb.current()
        entry = generation.manifest.get(source) if generation is not None else None
        if entry is None:
            raise ClientError(404, f"no indexed file {source!r} in {kb.spec.name!r}", "not_found")
        offset = _int_param(params, "offset", 0, 0, 10**9)
        limit = _int_param(params, "limit", 50, 1, 500)
        ids = entry.get("chunk_ids", [])
        if "row" in entry:
            rows = list(range(entry["row"], entry["row"] + len(ids)))[offset:offset + limit]
        else:
            rows = generation.rows_for_ids(ids[offset:offset + limit])
        chunks = [{"id": c.get("id"), "row": row, "ordinal": offset + i, "title": c.get("title") or None,
                   "text": c.get("text", "")}
                  for i, (row, c) in enumerate(zip(rows, generation.chunks.get_many(rows)))]
        return json_response(200, {"source": source, "total": len(ids), "offset": offset, "chunks": chunks})

    def delete_file(self, request, kb):
        kb = self._kb(kb)
        source = refuse_traversal(_query_params(request).get("source", ""), "source")
        prefix = kb.documents_label + "/"
        stored = source[len(prefix):] if source.startswith(prefix) else ""
        if not stored or stored not in read_manifest(kb.documents_dir):
            raise ClientError(400, f"{source!r} is not an uploaded document of {kb.spec.name!r}; files from "
                                   "configured sources are removed at their source", "not_uploaded")
        try:
            self.uploads.remove(kb.documents_dir, stored)
        except UploadError as exc:
            raise ClientError(exc.status, exc.message, "not_uploaded" if exc.status == 400 else "conflict") from None
        self.app.knowledge_bases.request_index(kb.spec.name)
        return json_response(200, {"deleted": source})

    def upload(self, request, kb):
        kb = self._kb(kb)
        if request.stream is None:
            raise ClientError(400, "uploads need a request body (multipart/form-data)")
        limits = self._upload_limits(kb)
        try:
            length = parse_content_length(request.headers.get("content-length", ""))
        except ValueError:  # none, or one the server would have refused: ingest reads to the end
            length = None
        try:
            result = self.uploads.ingest(request.stream, request.headers.get("content-type", ""), length,
                                         kb.documents_dir, limits)
        except UploadError as exc:
            raise ClientError(exc.status, exc.message, "upload_rejected") from None
        if result["stored"]:
            self.app.knowledge_bases.request_index(kb.spec.name)
        log.info("kb %s: %d file(s) uploaded from %s (%d replacing an earlier upload), %d unchanged, %d skipped",
                 kb.spec.name, len(result["stored"]), request.client,
                 sum(1 for item in result["stored"] if item["replaced"]), len(result["unchanged"]),
                 len(result["skipped"]))
        for item in result["skipped"][:20]:
            log.info("  skipped %s: %s", item["name"], item["reason"])
        # 201 only when something was stored: the same files again create nothing.
        return json_response(201 if result["stored"] else 200, result)

    def _upload_limits(self, kb):
        """The upload caps of the moment, with the KB's own per-file cap beside them."""
        caps = self.app.config.raw["uploads"]
        return UploadLimits(max_file_bytes=caps["max_file_bytes"], max_files=caps["max_files"],
                            max_total_bytes=caps["max_total_bytes"], max_ratio=caps["max_ratio"],
                            kb_max_file_bytes=kb.spec.max_file_bytes,
                            kb_key=f"knowledge_bases.{kb.spec.name}.max_file_bytes")

    def search_kb(self, request, kb):
        kb = self._kb(kb)
        body = _json_object(request)
        query = body.get("query")
        if not isinstance(query, str) or not query.strip():
            raise ClientError(400, "'query' is required")
        top_k = body.get("top_k", 10)
        if not isinstance(top_k, int) or isinstance(top_k, bool) or not 1 <= top_k <= 100:
            raise ClientError(400, "'top_k' must be an integer from 1 to 100")
        mode = body.get("mode") or kb.spec.retrieval
        if mode not in ("lexical", "dense", "hybrid"):
            raise ClientError(400, "'mode' must be lexical, dense or hybrid")
        timings = {}
        started = time.perf_counter()
        try:
            hits = kb.search(query, top_k=top_k, mode=mode, timings=timings)
        except EmbeddingError as exc:
            raise ClientError(502, f"{mode} search needs the embedding provider, which failed: {exc}",
                              "embedding_failed") from None
        if body.get("rerank") and hits and self.app.retriever is not None:
            rerank_started = time.perf_counter()
            hits = self.app.retriever.rerank(query, hits)
            timings["rerank"] = time.perf_counter() - rerank_started
        timings["total"] = time.perf_counter() - started
        out = []
        for rank, hit in enumerate(hits, 1):
            chunk = hit.chunk
            out.append({"rank": rank, "id": hit.id, "source": chunk.get("source"), "title": chunk.get("title") or None,
                        "text": chunk.get("text", ""), "score": hit.score,
                        "lexical": hit.scores.get("lexical"), "lexical_rank": hit.ranks.get("lexical"),
                        "dense": hit.scores.get("dense"), "dense_rank": hit.ranks.get("dense"),
                        "fused": hit.scores.get("fused", hit.scores.get("rrf")), "fused_rank": hit.ranks.get("fused"),
                        "rerank": hit.scores.get("rerank")})
        return json_response(200, {"query": query, "mode": mode, "terms": sorted(set(kb.analyzer.query_tokens(query))),
                                    "timings_ms": {k: round(v * 1000.0, 3) for k, v in timings.items()},
                                    "hits": out})

    # -- vector stores (storeadmin) -----------------------------------------

    def test_kb_store(self, request, kb):
        kb = self._kb(kb)
        _json_object(request)  # takes no fields, but a garbled body is still an error
        return self.stores.test_kb_store(kb)

    def test_vectorstore(self, request):
        return self.stores.test_server(self.app.config, _json_object(request))

    # -- request log --------------------------------------------------------

    def _request_log(self):
        if self.app.request_log is None:
            why = "no data directory" if self.app.data_dir is None else "this Python cannot import sqlite3"
            raise ClientError(404, f"the request log is off ({why})", "not_found")
        return self.app.request_log

    def list_logs(self, request):
        params = _query_params(request)
        limit = _int_param(params, "limit", 50, 1, 1000)
        offset = _int_param(params, "offset", 0, 0, 10**9)
        outcome = params.get("outcome") or None
        entries = self._request_log().query(
            since=_float_param(params, "since"), until=_float_param(params, "until"),
            model=params.get("model") or None, kb=params.get("kb") or None,
            outcome=outcome.split(",") if outcome else None, limit=limit, offset=offset)
        return json_response(200, {"entries": entries, "limit": limit, "offset": offset})

    def get_log(self, request, id):
        if not (id.isascii() and id.isdigit() and len(id) <= 18):  # isdigit() alone takes '\xb9'
            raise ClientError(400, "a log entry id is a number")
        entry = self._request_log().get(int(id))
        if entry is None:
            raise ClientError(404, f"no log entry {id}", "not_found")
        entry["chunks"] = self._injected_chunks(entry)
        return json_response(200, entry)

    def _injected_chunks(self, entry):
        """The logged chunk ids' text, from whichever of the request's KBs still has them."""
        wanted = list(entry.get("chunk_ids") or [])
        found = {}
        kbs = self.app.knowledge_bases
        for name in entry.get("kbs") or []:
            kb = kbs.get(name) if kbs is not None else None
            generation = kb.current()[0] if kb is not None else None
            missing = [cid for cid in wanted if cid not in found]
            if generation is None or not missing:
                continue
            rows = generation.rows_for_ids(missing)
            for chunk in generation.chunks.get_many(rows):
                found[chunk.get("id")] = {"id": chunk.get("id"), "kb": name, "source": chunk.get("source"),
                                          "text": chunk.get("text", "")}
        return [found.get(cid, {"id": cid, "kb": None, "source": None, "text": None}) for cid in wanted]

    def compression(self, request):
        config = self.app.config
        section = config.raw["compression"]
        state = dict(section["state"])
        # The Redis URL may carry a password: the admin API shows its address only.
        state["redis_url"] = loggable_url(state["redis_url"]) if state["redis_url"] else ""
        profiles = [{"name": "on", "levers": section["levers"]}] + [
            {"name": name, "levers": spec["levers"]} for name, spec in section["profiles"].items()]
        models = [{"name": r.name, "compression": r.compression, "context_window": r.context_window}
                  for r in config.models]
        return json_response(200, {"profiles": profiles, "models": models, "state": state,
                                   **self.app.metrics.compression_counts()})

    def stats(self, request):
        hours = _int_param(_query_params(request), "hours", 24, 1, 24 * 90)
        return json_response(200, self._request_log().stats(hours=hours))

    # -- settings -----------------------------------------------------------

    def _settings_text(self, request):
        """The submitted config.yaml, with the stored secrets back where it has them masked."""
        text = _json_object(request).get("text")
        if not isinstance(text, str):
            raise ClientError(400, "'text' (the whole config.yaml) is required")
        try:
            stored = self.config_file.read_text()
        except (OSError, UnicodeDecodeError):
            stored = None   # nothing to restore from: a masked value is then an error
        try:
            return restore_text(text, stored)
        except MaskError as exc:
            raise ConfigError(exc.errors, os.path.basename(self.config_file.path)) from None

    def get_settings(self, request):
        try:
            text = self.config_file.read_text()
        except (OSError, UnicodeDecodeError) as exc:
            raise ClientError(500, f"cannot read {self.config_file.path}: {exc}") from None
        try:
            text = mask_text(text)
        except YAMLError as exc:
            # Its keys cannot be found to be masked, so the text is not shown.
            raise ClientError(409, f"{self.config_file.path} does not parse (line {exc.line}: {exc.msg}), so "
                                   "its keys cannot be masked for the editor: fix it in the file itself",
                              "invalid_config") from None
        return json_response(200, {"text": text, "path": self.config_file.path})

    def validate_settings(self, request):
        config = self.config_file.validate(self._settings_text(request))
        return json_response(200, {"ok": True, "warnings": _warnings_view(config)})

    def put_settings(self, request):
        with self.config_file.lock:   # the file the masked values are restored from is the one replaced
            config = self.config_file.write(self._settings_text(request))
        self.app.reload(config)
        log.info("config.yaml replaced through the admin API from %s", request.client)
        return json_response(200, {"ok": True, "backup": self.config_file.path + ".bak",
                                   "warnings": _warnings_view(config)})


def _warnings_view(config):
    """What loads but not as written (a rerank with no provider, ...), as the editor shows it."""
    return [{"key": key, "line": line, "message": message} for key, line, message in config.warnings]


_DELETED_PREFIX = ".deleted-"


def remove_deleted_kbs(data_dir):
    """Finish deletions a crash interrupted: the ``.deleted-*`` folders delete_kb renamed aside.

    Run at start-up, before anything can be renaming a folder aside again.
    Returns the paths removed.
    """
    return [path for sub in ("vectordb", "documents")
            for path in remove_leftover_dirs(os.path.join(data_dir, sub), _DELETED_PREFIX)]


def _config_map(data, *keys):
    """``data[k1][k2]...`` as a dict, created when missing; a non-mapping there is a config error."""
    node = data
    for key in keys:
        if node.get(key) is None:
            node[key] = {}
        node = node[key]
        if not isinstance(node, dict):
            raise ConfigError([(".".join(keys), None, "expected a mapping in the config file")])
    return node


def _config_list(data, key):
    if data.get(key) is None:
        data[key] = []
    if not isinstance(data[key], list):
        raise ConfigError([(key, None, "expected a list in the config file")])
    return data[key]
