"""The admin API's route table, which is also its OpenAPI document.

Owns each endpoint's method, path pattern, handler (an Admin method's name),
summary, success status, further error statuses and body; matching a request's path against the table, where every
segment, once decoded, is refused if it could climb out of where it is used
(refuse_traversal, which the handlers use on names from a query string too);
and the OpenAPI 3.1 document generated from the table.  admin.Admin
dispatches through it.

May import: api.
"""
from __future__ import annotations

import dataclasses
import re
import urllib.parse

from . import __version__
from .api import ClientError


@dataclasses.dataclass(frozen=True)
class AdminRoute:
    """One endpoint: ``Admin.handle`` calls the method named ``handler`` with the pattern's {names}."""

    method: str
    pattern: str          # "kbs/{kb}/files": segments after /admin/api/
    handler: str          # Admin method name
    summary: str
    public: bool = False  # reachable without a session token
    status: str = "200"   # a success's status
    errors: tuple = ()    # error statuses beside 400 and 404 (and 401 where a token is needed)
    body: str = ""        # a POST or PUT's body: "json", "optional" (JSON that may be left out), "files"


ADMIN_ROUTES = (
    AdminRoute("POST", "login", "login", "Exchange the panel secret key for a session token", public=True,
                errors=("429",), body="json"),
    AdminRoute("GET", "session", "session", "The current session token's expiry"),
    AdminRoute("GET", "openapi.json", "openapi", "This document"),
    AdminRoute("GET", "overview", "overview", "Version, features, models and knowledge bases"),
    AdminRoute("GET", "providers", "list_providers", "Every provider, keys masked"),
    AdminRoute("POST", "providers/{kind}", "create_provider", "Add a provider (kind: llm, embedding, rerank)",
                status="201", body="json"),
    AdminRoute("PUT", "providers/{kind}/{name}", "update_provider", "Change a provider's settings", body="json"),
    AdminRoute("DELETE", "providers/{kind}/{name}", "delete_provider", "Remove a provider"),
    AdminRoute("POST", "providers/{kind}/{name}/test", "test_provider",
                "Call the provider once; latency and the error text", body="json"),
    AdminRoute("GET", "models", "list_models", "The model mappings, in order"),
    AdminRoute("POST", "models", "create_model", "Add a model mapping", status="201", body="json"),
    AdminRoute("PUT", "models/{name}", "update_model", "Change a model mapping", body="json"),
    AdminRoute("DELETE", "models/{name}", "delete_model", "Remove a model mapping"),
    AdminRoute("GET", "keys", "list_keys", "Client API keys, masked, with their scopes"),
    AdminRoute("POST", "keys", "create_key", "Add a client API key (generated; the answer shows it once)",
                status="201", errors=("409",), body="json"),   # 409: the name is taken
    AdminRoute("PUT", "keys/{name}", "update_key",
                "Rename a key or change its scope; rotate: true replaces the key (shown once)",
                errors=("409",), body="json"),   # 409: the name is taken, or the key is the environment's
    AdminRoute("DELETE", "keys/{name}", "delete_key", "Remove a client API key"),
    AdminRoute("GET", "kbs", "list_kbs", "Knowledge bases with counts, size and indexing state"),
    AdminRoute("POST", "kbs", "create_kb", "Create a knowledge base", status="201", body="json"),
    AdminRoute("GET", "kbs/{kb}", "get_kb", "One knowledge base"),
    AdminRoute("PUT", "kbs/{kb}", "update_kb", "Change a knowledge base's settings", body="json"),
    AdminRoute("DELETE", "kbs/{kb}", "delete_kb", "Delete a knowledge base, its index and its uploads"),
    AdminRoute("POST", "kbs/{kb}/reindex", "reindex_kb", "Re-index now (incremental, or full)", status="202",
                body="optional"),
    AdminRoute("GET", "kbs/{kb}/files", "list_files", "Indexed and uploaded files"),
    AdminRoute("DELETE", "kbs/{kb}/files", "delete_file", "Delete an uploaded file (?source=)"),
    AdminRoute("GET", "kbs/{kb}/chunks", "list_chunks", "Chunks of one file (?source=&offset=&limit=)"),
    AdminRoute("POST", "kbs/{kb}/upload", "upload", "Upload files, folders and archives (multipart/form-data)",
                # 409: the upload manifest cannot be read; 413: a file, or the whole upload, over a cap
                status="201", errors=("409", "413"), body="files"),
    AdminRoute("POST", "kbs/{kb}/search", "search_kb",
                "Retrieval test: per chunk the lexical, dense, fused and rerank scores", body="json"),
    AdminRoute("POST", "kbs/{kb}/store/test", "test_kb_store",
                "Test the knowledge base's vector store live: reachable, collection, vectors, latency",
                body="optional"),
    AdminRoute("POST", "vectorstore/test", "test_vectorstore",
                "Connect to a Chroma server (body: base_url, tenant, database; each defaults to the config)",
                body="optional"),
    AdminRoute("GET", "logs", "list_logs", "The request log, newest first, filtered"),
    AdminRoute("GET", "logs/{id}", "get_log", "One logged request and the chunks it injected"),
    AdminRoute("GET", "stats", "stats", "Volume, hit rate, latency, hourly trend, per model and per KB"),
    AdminRoute("GET", "compression", "compression",
                "Compression profiles and their levers, each model's choice, the session state, lever counters"),
    AdminRoute("GET", "settings", "get_settings", "config.yaml as text, its keys masked"),
    AdminRoute("PUT", "settings", "put_settings",
                "Replace config.yaml (validated first; previous file kept; masked keys keep the stored ones)",
                body="json"),
    AdminRoute("POST", "settings/validate", "validate_settings", "Validate config.yaml text without saving",
                body="json"),
)


def refuse_traversal(name, what):
    """A name from a URL must not climb out of where it is used: 400, before anything is looked up."""
    parts = name.replace("\\", "/").split("/")
    if name.startswith(("/", "\\")) or any(p in (".", "..") for p in parts) or "\0" in name \
            or re.match(r"[A-Za-z]:[\\/]", name):
        raise ClientError(400, f"{what} {name!r} is not allowed: no '..', '.', absolute paths or NUL",
                          "invalid_name")
    return name


def match_route(method, rest):
    """``(route, params)`` for ``rest`` (the path after /admin/api/); ClientError 400/404/405 otherwise."""
    segments = [refuse_traversal(urllib.parse.unquote(raw, errors="strict"), "path segment")
                for raw in rest.split("/")]
    allowed = []
    for route in ADMIN_ROUTES:
        pattern = route.pattern.split("/")
        if len(pattern) != len(segments):
            continue
        params = {}
        for want, got in zip(pattern, segments):
            if want.startswith("{") and got:
                params[want[1:-1]] = got
            elif want != got:
                break
        else:
            if route.method == method:
                return route, params
            allowed.append(route.method)
    if allowed:
        raise ClientError(405, f"{method} is not allowed here (use {', '.join(sorted(set(allowed)))})",
                          "method_not_allowed", headers=[("Allow", ", ".join(sorted(set(allowed))))])
    raise ClientError(404, f"no such admin endpoint: {method} /admin/api/{rest}", "not_found")


def openapi_document():
    """OpenAPI 3.1 for the admin API, generated from the route table."""
    paths = {}
    error = {"description": "Error",
             "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}
    ok = {"description": "OK", "content": {"application/json": {"schema": {"type": "object"}}}}
    for route in ADMIN_ROUTES:
        path = "/admin/api/" + route.pattern
        names = re.findall(r"\{(\w+)\}", route.pattern)
        op = {"operationId": route.handler, "summary": route.summary,
              "parameters": [{"name": n, "in": "path", "required": True, "schema": {"type": "string"}} for n in names],
              "responses": {route.status: ok, "400": error, "404": error}}
        if not route.public:
            op["responses"]["401"] = error
        if route.body == "files":
            op["responses"]["200"] = {"description": "Nothing new: every file was stored already (unchanged)",
                                      "content": {"application/json": {"schema": {"type": "object"}}}}
            op["requestBody"] = {"required": True, "content": {"multipart/form-data": {"schema": {
                "type": "object", "properties": {"files": {"type": "array", "items":
                                                           {"type": "string", "format": "binary"}}}}}}}
        elif route.body:
            op["requestBody"] = {"required": route.body == "json",
                                 "content": {"application/json": {"schema": {"type": "object"}}}}
        op["responses"].update(dict.fromkeys(route.errors, error))
        if route.public:
            op["security"] = []
        paths.setdefault(path, {})[route.method.lower()] = op
    return {
        "openapi": "3.1.0",
        "info": {"title": "ragproxy admin API", "version": __version__},
        "paths": paths,
        "security": [{"session": []}],
        "components": {
            "securitySchemes": {"session": {"type": "http", "scheme": "bearer", "bearerFormat": "JWT"}},
            "schemas": {"Error": {"type": "object", "required": ["error"], "properties": {"error": {
                "type": "object", "required": ["message", "type"],
                "properties": {"message": {"type": "string"}, "type": {"type": "string"},
                               "code": {"type": ["string", "null"]},
                               "errors": {"type": "array", "items": {"type": "object"}}}}}}},
        },
    }
