"""Admin API: sessions, config CRUD written to config.yaml, knowledge bases, logs, settings.

Most tests drive the real server over sockets with AdminClient (as the panel
does); token expiry uses an injected clock through the transport-neutral
Admin.handle().
"""
import base64
import json
import os
import re
import time

import openai
import pytest

import ragproxy
from _ragproxy import reqlog as ragproxy_reqlog
from _ragproxy.adminroutes import ADMIN_ROUTES
from _ragproxy.admintokens import SharedLoginThrottle, b64url
from conftest import ADMIN_KEY, API_KEY, AdminClient, logged_rows, multipart_body, proxy_config

GUIDE = """# Runbook

## Pager rotation

The on-call engineer rotates the pager every Tuesday at noon; the escalation
contact is the duty manager.

## Backups

Nightly backups land in the cold bucket and are verified weekly.
"""


def _wait(predicate, timeout=20.0):
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError("condition not met in time")


def _wait_indexed(admin, kb, files):
    def done():
        status, _, body = admin.get(f"/admin/api/kbs/{kb}")
        assert status == 200, body
        return body if body["files"] == files and body["state"] == "idle" else None
    return _wait(done)


# -- sessions ---------------------------------------------------------------

def test_every_admin_endpoint_needs_a_token(admin_proxy):
    client = AdminClient(admin_proxy.url)
    for route in ADMIN_ROUTES:
        if route.public:
            continue
        path = "/admin/api/" + route.pattern.format(kind="llm", name="x", kb="docs", id="1")
        for headers in ({}, {"Authorization": "Bearer " + API_KEY}, {"Authorization": "Bearer a.b.c"},
                        {"x-api-key": API_KEY}):
            status, resp, body = client.request(route.method, path, headers=headers,
                                                body={} if route.method in ("POST", "PUT") else None)
            assert status == 401, (route, headers, body)
            assert body["error"]["code"] == "invalid_token" and resp.getheader("WWW-Authenticate")


def test_login_gives_a_jwt_that_the_proxy_endpoints_refuse(admin_proxy):
    admin = admin_proxy.admin()
    header, payload, _ = admin.token.split(".")
    pad = lambda s: s + "=" * (-len(s) % 4)  # noqa: E731
    assert json.loads(base64.urlsafe_b64decode(pad(header))) == {"alg": "HS256", "typ": "JWT"}
    claims = json.loads(base64.urlsafe_b64decode(pad(payload)))
    assert claims["sub"] == "admin" and claims["exp"] - claims["iat"] == 43200
    status, _, body = admin.get("/admin/api/session")
    assert status == 200 and body["expires_at"] == claims["exp"]
    # The admin token is not an API key: the proxy endpoints refuse it.
    client = openai.OpenAI(base_url=admin_proxy.url + "/v1", api_key=admin.token, max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        client.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "hi"}])


def test_wrong_key_then_throttled_with_retry_after(admin_proxy):
    client = AdminClient(admin_proxy.url)
    for _ in range(4):
        status, _, body = client.post("/admin/api/login", {"key": "wrong"})
        assert status == 401 and body["error"]["code"] == "invalid_key"
    status, _, body = client.post("/admin/api/login", {"key": "wrong"})  # the fifth failure starts the wait
    assert status == 401
    status, resp, body = client.post("/admin/api/login", {"key": ADMIN_KEY})  # even the right key waits
    assert status == 429 and body["error"]["code"] == "rate_limited"
    assert int(resp.getheader("Retry-After")) >= 1
    for bad in (b"{", b"[]", b'{"key": 5}', "\u00e9".encode("latin-1")):
        status, _, body = client.request("POST", "/admin/api/login", raw=bad,
                                         headers={"Content-Type": "application/json"})
        assert status in (400, 401, 429) and "error" in body


class _Clock:
    def __init__(self):
        self.now = 1_800_000_000.0

    def __call__(self):
        return self.now


def _in_process_admin(tmp_path, fake_url):
    path = tmp_path / "config.yaml"
    path.write_text(proxy_config(fake_url))
    clock = _Clock()
    config_file = ragproxy.ConfigFile(str(path), environ={})
    app = ragproxy.App(config_file.load(), data_dir=str(tmp_path), clock=clock)
    admin = ragproxy.Admin(app, ADMIN_KEY, config_file)
    return app, admin, clock


def _call(app, method, path, body=None, token=None, client="10.0.0.1"):
    headers = {"authorization": "Bearer " + token} if token else {}
    raw = json.dumps(body).encode() if body is not None else b""
    response = app.handle(ragproxy.Request(method, path, "", headers, raw, client))
    return response.status, json.loads(response.body) if response.body else None


def test_tokens_expire_and_forgeries_fail(tmp_path, fake):
    app, admin, clock = _in_process_admin(tmp_path, fake.url)
    app.admin = admin
    try:
        status, body = _call(app, "POST", "/admin/api/login", {"key": ADMIN_KEY})
        token = body["token"]
        assert _call(app, "GET", "/admin/api/session", token=token)[0] == 200
        clock.now += 43199
        assert _call(app, "GET", "/admin/api/session", token=token)[0] == 200
        clock.now += 1
        assert _call(app, "GET", "/admin/api/session", token=token)[0] == 401
        clock.now -= 100
        # Tampered claims, another key's signature and "alg": "none" are all refused.
        head, payload, sig = token.split(".")
        claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
        longer = b64url(json.dumps(dict(claims, exp=claims["exp"] + 10**6)).encode())
        assert _call(app, "GET", "/admin/api/session", token=f"{head}.{longer}.{sig}")[0] == 401
        other = ragproxy.issue_token("another-key", claims)
        assert _call(app, "GET", "/admin/api/session", token=other)[0] == 401
        none_head = b64url(b'{"alg":"none","typ":"JWT"}')
        assert _call(app, "GET", "/admin/api/session", token=f"{none_head}.{payload}.")[0] == 401
        assert _call(app, "GET", "/admin/api/session", token=f"{none_head}.{payload}.{sig}")[0] == 401
        # An unsigned token is refused before any of it is parsed: a hostile one is a 401, not a 500.
        deep = b64url(b"[" * 100_000)
        assert _call(app, "GET", "/admin/api/session", token=f"{deep}.{deep}.{sig}")[0] == 401
    finally:
        app.close()


def test_throttle_is_per_client_and_forgets(tmp_path, fake):
    app, admin, clock = _in_process_admin(tmp_path, fake.url)
    app.admin = admin
    try:
        for _ in range(5):
            assert _call(app, "POST", "/admin/api/login", {"key": "nope"}, client="10.0.0.9")[0] == 401
        assert _call(app, "POST", "/admin/api/login", {"key": ADMIN_KEY}, client="10.0.0.9")[0] == 429
        assert _call(app, "POST", "/admin/api/login", {"key": ADMIN_KEY}, client="10.0.0.8")[0] == 200
        clock.now += 1.5
        assert _call(app, "POST", "/admin/api/login", {"key": "nope"}, client="10.0.0.9")[0] == 401
        assert _call(app, "POST", "/admin/api/login", {"key": ADMIN_KEY}, client="10.0.0.9")[0] == 429
        clock.now += 2.5  # the sixth failure doubled the wait to 2 s
        assert _call(app, "POST", "/admin/api/login", {"key": ADMIN_KEY}, client="10.0.0.9")[0] == 200
    finally:
        app.close()


def test_a_reload_changes_max_login_failures_at_once(tmp_path, fake):
    app, admin, clock = _in_process_admin(tmp_path, fake.url)
    app.admin = admin
    try:
        for _ in range(2):
            assert _call(app, "POST", "/admin/api/login", {"key": "nope"})[0] == 401
        assert _call(app, "POST", "/admin/api/login", {"key": ADMIN_KEY})[0] == 200   # 2 of 5 free failures
        app.reload(ragproxy.Config.from_text(proxy_config(fake.url) + "admin: {max_login_failures: 1}\n"))
        assert _call(app, "POST", "/admin/api/login", {"key": "nope"})[0] == 401
        assert _call(app, "POST", "/admin/api/login", {"key": ADMIN_KEY})[0] == 429   # the new limit holds
    finally:
        app.close()


def test_two_workers_on_one_throttle_file_count_each_others_failed_logins(tmp_path, fake):
    shared = str(tmp_path / "run" / "login-throttle.sqlite3")
    workers = []
    for name in ("one", "two"):   # serve --workers 2: a whole App and Admin each, one file between them
        (tmp_path / name).mkdir()
        app, admin, clock = _in_process_admin(tmp_path / name, fake.url)
        app.admin = ragproxy.Admin(app, ADMIN_KEY, admin.config_file, throttle=SharedLoginThrottle(shared, clock))
        workers.append((app, clock))
    (one, _), (two, _) = workers
    try:
        for i in range(5):   # five free failures in all, which neither worker reaches on its own
            assert _call(one if i % 2 else two, "POST", "/admin/api/login", {"key": "nope"})[0] == 401
        for app in (one, two):
            status, body = _call(app, "POST", "/admin/api/login", {"key": ADMIN_KEY})
            assert status == 429 and body["error"]["code"] == "rate_limited"
        for _, clock in workers:
            clock.now += 1.5
        assert _call(two, "POST", "/admin/api/login", {"key": ADMIN_KEY})[0] == 200
        # The success on one worker cleared the address for both: one failure is free again.
        assert _call(one, "POST", "/admin/api/login", {"key": "nope"})[0] == 401
        assert _call(one, "POST", "/admin/api/login", {"key": ADMIN_KEY})[0] == 200
    finally:
        for app, _ in workers:
            app.admin.throttle.close()
            app.close()


# -- providers and models -----------------------------------------------------

def test_provider_crud_is_written_to_config_yaml(admin_proxy, fake):
    admin = admin_proxy.admin()
    status, _, body = admin.post("/admin/api/providers/llm",
                                 {"name": "gw", "type": "openai", "base_url": fake.url + "/v1",
                                  "api_key": "sk-gateway-secret-1234"})
    assert status == 201, body
    assert body["api_key"] != "sk-gateway-secret-1234" and body["api_key"].endswith("1234") and body["has_api_key"]
    assert "gw" in admin_proxy.app.config.providers["llm"]
    on_disk = ragproxy.Config.load(str(admin_proxy.config_path), environ={})
    assert on_disk.providers["llm"]["gw"].api_key == "sk-gateway-secret-1234"
    assert os.path.exists(str(admin_proxy.config_path) + ".bak")
    # The masked key sent back unchanged keeps the stored key; other fields change.
    status, _, body = admin.put("/admin/api/providers/llm/gw", {"api_key": body["api_key"], "read_timeout": 7})
    assert status == 200 and body["read_timeout"] == 7
    on_disk = ragproxy.Config.load(str(admin_proxy.config_path), environ={})
    assert on_disk.providers["llm"]["gw"].api_key == "sk-gateway-secret-1234"
    status, _, listing = admin.get("/admin/api/providers")
    assert [p["name"] for p in listing["llm"]] == ["oa", "an", "ol", "gw"]
    assert "sk-gateway-secret-1234" not in json.dumps(listing)
    status, _, body = admin.post("/admin/api/providers/llm", {"name": "gw", "type": "openai", "base_url": "http://x"})
    assert status == 409
    status, _, body = admin.post("/admin/api/providers/llm", {"name": "bad", "type": "gpt", "base_url": "http://x"})
    assert status == 400 and body["error"]["code"] == "invalid_config"
    assert body["error"]["errors"][0]["path"] == "providers.llm.bad.type"
    status, _, body = admin.delete("/admin/api/providers/llm/oa")  # models still use it
    assert status == 400 and "oa" in body["error"]["message"]
    assert "oa" in ragproxy.Config.load(str(admin_proxy.config_path), environ={}).providers["llm"]
    status, _, body = admin.delete("/admin/api/providers/llm/gw")
    assert status == 200 and "gw" not in admin_proxy.app.config.providers["llm"]
    assert admin.delete("/admin/api/providers/llm/gw")[0] == 404
    assert admin.get("/admin/api/providers/nope")[0] == 405 or admin.post("/admin/api/providers/nope", {})[0] == 404


def test_provider_connection_test_reports_latency_and_errors(admin_proxy, fake):
    admin = admin_proxy.admin()
    for name in ("oa", "an", "ol"):
        status, _, body = admin.post(f"/admin/api/providers/llm/{name}/test")
        assert status == 200 and body["ok"] is True and body["status"] == 200, body
        assert body["latency_ms"] > 0
    admin.post("/admin/api/providers/llm", {"name": "dead", "type": "openai", "base_url": "http://127.0.0.1:9/v1",
                                            "connect_timeout": 1})
    status, _, body = admin.post("/admin/api/providers/llm/dead/test")
    assert status == 200 and body["ok"] is False and body["error"]
    fake.fail_next(401, json.dumps({"error": {"message": "bad upstream key", "type": "invalid_request_error"}}))
    status, _, body = admin.post("/admin/api/providers/llm/oa/test")
    assert body["ok"] is False and body["status"] == 401 and "bad upstream key" in body["error"]


def test_the_overview_lists_the_outcomes_the_logs_page_filters_by(admin_proxy):
    status, _, body = admin_proxy.admin().get("/admin/api/overview")
    # Every outcome a request-log row can hold, retrieval's and an MCP tool call's, from the server's own lists.
    assert status == 200 and body["outcomes"][:len(ragproxy_reqlog.RETRIEVAL_OUTCOMES)] == \
        list(ragproxy_reqlog.RETRIEVAL_OUTCOMES)
    assert {"over_budget", "out_of_scope", "ok", "error", "denied"} <= set(body["outcomes"])
    assert len(body["outcomes"]) == len(set(body["outcomes"]))


def test_model_mapping_crud(admin_proxy):
    admin = admin_proxy.admin()
    status, _, body = admin.post("/admin/api/models", {"name": "coder-*", "upstream": ["oa"], "upstream_model": "qwen"})
    # Defaults filled in (kb_merge's default is chosen by bench/multi_kb.py's measurement, so read, not repeated).
    assert status == 201 and body["upstream"] == ["oa"] and body["kb_merge"] == ragproxy.ModelRoute.kb_merge
    listed = admin.get("/admin/api/models")[2]
    names = [m["name"] for m in listed["models"]]
    assert names[-2:] == ["coder-*", "*"]  # before the catch-all
    # What the panel's form offers: the schema's choices and defaults, not a copy of them.
    assert listed["fields"]["kb_merge"] == {"default": ragproxy.ModelRoute.kb_merge,
                                            "choices": ["priority", "concat", "rrf"]}
    assert listed["fields"]["inject_mode"]["default"] == ragproxy.ModelRoute.inject_mode
    assert admin_proxy.app.resolve_route("coder-7b").upstream_model == "qwen"
    status, _, body = admin.put("/admin/api/models/coder-%2A", {"upstream": ["an"], "rerank": False})
    assert status == 200 and body["upstream"] == ["an"]
    status, _, body = admin.put("/admin/api/models/coder-%2A", {"upstream": ["missing"]})
    assert status == 400 and "missing" in body["error"]["message"]
    assert admin.post("/admin/api/models", {"name": "coder-*", "upstream": ["oa"]})[0] == 409
    assert admin.delete("/admin/api/models/coder-%2A")[0] == 200
    assert admin_proxy.app.resolve_route("coder-7b").name == "*"
    assert admin.delete("/admin/api/models/coder-%2A")[0] == 404
    saved = ragproxy.Config.load(str(admin_proxy.config_path), environ={})
    assert [m.name for m in saved.models] == [m.name for m in admin_proxy.app.config.models]


def test_a_restart_comes_back_to_the_same_state(make_admin_proxy, tmp_path):
    first = make_admin_proxy()
    admin = first.admin()
    admin.post("/admin/api/kbs", {"name": "notes", "retrieval": "lexical"})
    admin.post("/admin/api/models", {"name": "notes-model", "upstream": ["oa"], "kb": ["notes"]})
    admin.put("/admin/api/providers/llm/oa", {"read_timeout": 42})
    reloaded = ragproxy.Config.load(str(first.config_path), environ={})
    assert reloaded.raw == first.app.config.raw


# -- knowledge bases ----------------------------------------------------------

def test_kb_lifecycle_search_and_chunks(admin_proxy):
    admin = admin_proxy.admin()
    status, _, body = admin.post("/admin/api/kbs", {"name": "ops", "retrieval": "lexical",
                                                   "chunking": {"chunk_size": 64}})
    assert status == 201, body
    assert body["config"]["chunking"]["chunk_size"] == 64 and os.path.isdir(body["documents_dir"])
    (admin_proxy.data_dir / "documents" / "ops" / "runbook.md").write_text(GUIDE)
    assert admin.post("/admin/api/kbs/ops/reindex", {})[0] == 202
    kb = _wait_indexed(admin, "ops", 1)
    assert kb["chunks"] >= 1 and kb["last_indexed"] and kb["bytes"] > 0
    status, _, files = admin.get("/admin/api/kbs/ops/files")
    assert [f["source"] for f in files["files"]] == ["ops/runbook.md"] and files["files"][0]["uploaded"] is False
    status, _, chunks = admin.get("/admin/api/kbs/ops/chunks?source=ops%2Frunbook.md&limit=1")
    assert status == 200 and chunks["total"] == kb["chunks"] and len(chunks["chunks"]) == 1
    status, _, found = admin.post("/admin/api/kbs/ops/search", {"query": "who rotates the pager?", "top_k": 3})
    assert status == 200 and found["mode"] == "lexical"
    top = found["hits"][0]
    assert "Tuesday" in top["text"] and top["lexical"] > 0 and top["lexical_rank"] == 1 and top["fused_rank"] == 1
    assert top["dense"] is None and "pager" in found["terms"] and found["timings_ms"]["lexical"] >= 0
    assert admin.post("/admin/api/kbs/ops/search", {"query": ""})[0] == 400
    assert admin.post("/admin/api/kbs/ops/search", {"query": "x", "mode": "dense"})[0] == 502
    # Settings change: chunk size written to config.yaml, then a full re-index.
    status, _, body = admin.put("/admin/api/kbs/ops", {"chunking": {"chunk_size": 512}})
    assert status == 200 and body["config"]["chunking"] == {"strategy": "auto", "chunk_size": 512, "chunk_overlap": 32}
    assert admin.put("/admin/api/kbs/ops", {"retrieval": "dense"})[0] == 400  # no embedding provider
    assert admin.post("/admin/api/kbs", {"name": "ops"})[0] == 409
    status, _, body = admin.delete("/admin/api/kbs/ops")
    assert status == 200
    assert not (admin_proxy.data_dir / "vectordb" / "ops").exists()
    assert not (admin_proxy.data_dir / "documents" / "ops").exists()
    assert admin.get("/admin/api/kbs/ops")[0] == 404
    assert "ops" not in ragproxy.Config.load(str(admin_proxy.config_path), environ={}).knowledge_bases


TRAVERSAL = ["..", ".", "../etc", "..%2F..%2Fconfig", "%2e%2e", "a%00b", "%2E%2E%2Fconfig", "C:%5Cwindows",
             "%2Fetc", "%5C%5Cserver%5Cshare"]


@pytest.mark.parametrize("name", TRAVERSAL + ["x" * 65, "-lead", "a%2Fb", "a b"])
def test_path_traversal_in_kb_names_is_refused(admin_proxy, name):
    admin = admin_proxy.admin()
    admin.post("/admin/api/kbs", {"name": "docs"})
    _wait(lambda: admin.get("/admin/api/kbs/docs")[2]["state"] == "idle")  # the indexer is done with it
    before = _tree(admin_proxy.data_dir)
    endpoints = [("GET", f"/admin/api/kbs/{name}"), ("DELETE", f"/admin/api/kbs/{name}"),
                 ("PUT", f"/admin/api/kbs/{name}"), ("GET", f"/admin/api/kbs/{name}/files"),
                 ("POST", f"/admin/api/kbs/{name}/reindex"), ("POST", f"/admin/api/kbs/{name}/search")]
    if name in TRAVERSAL:  # other names are fine for providers and models, just not there
        endpoints += [("DELETE", f"/admin/api/providers/llm/{name}"), ("PUT", f"/admin/api/models/{name}")]
    for method, path in endpoints:
        status, _, body = admin.request(method, path.replace(" ", "%20"),
                                        body={} if method in ("POST", "PUT") else None)
        assert status == 400 and body["error"]["code"] == "invalid_name", (method, path, status, body)
    status, _, body = admin.post("/admin/api/kbs", {"name": urllib_unquote(name)})
    assert status == 400
    if name in TRAVERSAL:  # and in file names (query parameters) of an existing KB
        plain = urllib_unquote(name)
        for source in [plain] + (["docs/" + plain + "/x.md"] if plain.split("/")[0] in (".", "..") else []):
            for method, path in (("GET", "/admin/api/kbs/docs/chunks?source="),
                                 ("DELETE", "/admin/api/kbs/docs/files?source=")):
                status, _, body = admin.request(method, path + urllib_quote(source))
                assert status == 400, (method, path, source, body)
    assert _tree(admin_proxy.data_dir) == before


def urllib_quote(text):
    import urllib.parse
    return urllib.parse.quote(text, safe="")


def urllib_unquote(text):
    import urllib.parse
    return urllib.parse.unquote(text)


def test_only_uploaded_files_can_be_deleted(admin_proxy):
    admin = admin_proxy.admin()
    admin.post("/admin/api/kbs", {"name": "ops"})
    (admin_proxy.data_dir / "documents" / "ops" / "runbook.md").write_text(GUIDE)
    admin.post("/admin/api/kbs/ops/reindex", {})
    _wait_indexed(admin, "ops", 1)
    for source in ("ops/runbook.md", "ops/../../config/config.yaml", "../x", ""):
        status, _, body = admin.delete("/admin/api/kbs/ops/files?source=" + source)
        assert status == 400 and body["error"]["code"] in ("not_uploaded", "invalid_name")
    assert (admin_proxy.data_dir / "documents" / "ops" / "runbook.md").exists()
    assert admin_proxy.config_path.exists()


# -- request log, stats, injected chunks -------------------------------------------

def test_a_proxied_request_appears_in_the_log_with_its_chunks(admin_proxy, fake):
    admin = admin_proxy.admin()
    admin.post("/admin/api/kbs", {"name": "ops"})
    admin.put("/admin/api/models/%2A", {"kb": ["ops"]})
    (admin_proxy.data_dir / "documents" / "ops" / "runbook.md").write_text(GUIDE)
    admin.post("/admin/api/kbs/ops/reindex", {})
    _wait_indexed(admin, "ops", 1)
    fake.secrets = ["every Tuesday at noon"]
    client = openai.OpenAI(base_url=admin_proxy.url + "/v1", api_key=API_KEY, max_retries=0)
    reply = client.chat.completions.create(model="llama3", messages=[{"role": "user",
                                                                      "content": "When does the pager rotate?"}])
    assert "FOUND: every Tuesday at noon" in reply.choices[0].message.content
    logged_rows(admin_proxy.app, 1)
    status, _, logs = admin.get("/admin/api/logs?kb=ops&outcome=retrieved")
    assert status == 200 and len(logs["entries"]) == 1
    entry = logs["entries"][0]
    assert entry["model"] == "llama3" and entry["kbs"] == ["ops"] and entry["status"] == 200
    status, _, detail = admin.get(f"/admin/api/logs/{entry['id']}")
    assert status == 200 and any("Tuesday" in (c["text"] or "") for c in detail["chunks"])
    assert admin.get("/admin/api/logs?outcome=failed")[2]["entries"] == []
    assert admin.get("/admin/api/logs?since=abc")[0] == 400
    assert admin.get("/admin/api/logs/999999")[0] == 404
    assert admin.get("/admin/api/logs/x")[0] == 400
    assert admin.get("/admin/api/logs/%C2%B9")[0] == 400  # a superscript digit passes str.isdigit()
    status, _, stats = admin.get("/admin/api/stats?hours=24")
    assert status == 200 and stats["requests"] == 1 and stats["hit_rate"] == 1.0
    assert len(stats["trend"]) == 24 and stats["kbs"]["ops"]["requests"] == 1


# -- settings ---------------------------------------------------------------

def test_settings_edit_validates_with_line_numbers_and_keeps_a_backup(admin_proxy):
    admin = admin_proxy.admin()
    status, _, body = admin.get("/admin/api/settings")
    original, stored = body["text"], admin_proxy.config_path.read_text()   # the text has its keys masked
    assert status == 200 and "providers:" in original and body["path"] == str(admin_proxy.config_path)
    broken = original.replace("api_key_auth: true", "api_key_auth: true\nrag:\n  top_k: lots")
    status, _, body = admin.put("/admin/api/settings", {"text": broken})
    assert status == 400 and body["error"]["code"] == "invalid_config"
    err = body["error"]["errors"][0]
    assert err["path"] == "rag.top_k" and err["line"] == broken.splitlines().index("  top_k: lots") + 1
    assert admin_proxy.config_path.read_text() == stored
    status, _, body = admin.post("/admin/api/settings/validate", {"text": "models: [\n"})
    assert status == 400 and body["error"]["errors"][0]["line"] is not None
    assert admin.post("/admin/api/settings/validate", {"text": original})[2] == {"ok": True, "warnings": []}
    # What loads but not as written is said, with its line, before and after saving.
    line = '  - {name: "claude-*", upstream: an, rerank: true}'   # and no providers.rerank entry
    rerank = original.replace('  - {name: "claude-*", upstream: an}', line)
    body = admin.post("/admin/api/settings/validate", {"text": rerank})[2]
    assert body["ok"] and [w["key"] for w in body["warnings"]] == ["models[0].rerank"]
    assert body["warnings"][0]["line"] == rerank.splitlines().index(line) + 1
    edited = original.replace("api_key_auth: true", "api_key_auth: true\nrag:\n  top_k: 9")
    status, _, body = admin.put("/admin/api/settings", {"text": edited})
    assert status == 200 and body["backup"].endswith(".bak")
    assert admin_proxy.app.config.rag["top_k"] == 9
    assert admin_proxy.config_path.read_text() == stored.replace("api_key_auth: true",
                                                                 "api_key_auth: true\nrag:\n  top_k: 9")
    with open(body["backup"]) as f:
        assert f.read() == stored
    assert admin.put("/admin/api/settings", {"text": 5})[0] == 400


# -- documents ------------------------------------------------------------------

def test_openapi_document_lists_every_route(admin_proxy):
    status, _, doc = admin_proxy.admin().get("/admin/api/openapi.json")
    assert status == 200 and doc["openapi"].startswith("3.1")
    for route in ADMIN_ROUTES:
        assert route.method.lower() in doc["paths"]["/admin/api/" + route.pattern]
    assert doc["paths"]["/admin/api/login"]["post"]["security"] == []
    assert {"200", "201", "400", "409", "413"} <= set(doc["paths"]["/admin/api/kbs/{kb}/upload"]["post"]["responses"])
    from openapi_spec_validator import validate
    validate(doc)  # raises on anything OpenAPI 3.1 does not allow


def test_readme_lists_every_endpoint():
    here = os.path.dirname(os.path.abspath(__file__))
    with open(os.path.join(here, "..", "README.md"), encoding="utf-8") as f:
        readme = f.read()
    for route in ADMIN_ROUTES:
        assert f"{route.method} /admin/api/{route.pattern}" in readme, route


def test_panel_is_served_at_the_root_with_a_strict_csp(admin_proxy):
    status, resp, body = AdminClient(admin_proxy.url).get("/")
    assert status == 200 and resp.getheader("Content-Type").startswith("text/html")
    assert b"<html" in body.lower()[:500] and b"/admin/api" in body
    csp = resp.getheader("Content-Security-Policy")
    assert "default-src 'none'" in csp and "connect-src 'self'" in csp
    # Nothing is fetched from elsewhere (the SVG namespace URI is a name, not a fetch).
    assert not re.search(rb"""(src|href|action)\s*=\s*["']?\s*(https?:)?//""", body, re.I)
    assert not re.search(rb"@import|url\(\s*['\"]?\s*(https?:)?//|fetch\(\s*['\"]https?:", body, re.I)


def test_admin_api_is_off_without_a_secret_key(proxy):
    status, _, body = AdminClient(proxy.url).post("/admin/api/login", {"key": "x"})
    assert status == 404 and "admin API is off" in body["error"]["message"]


# -- uploads through the endpoint ------------------------------------------------

def _zip(members):
    import io
    import zipfile
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in members:
            if isinstance(data, int):  # a symlink entry pointing nowhere good
                info = zipfile.ZipInfo(name)
                info.external_attr = (0o120777 << 16)
                zf.writestr(info, "/etc/passwd")
            else:
                zf.writestr(name, data)
    return buf.getvalue()


def _tar(members, gz=True):
    import io
    import tarfile
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz" if gz else "w") as tf:
        for name, kind, data in members:
            info = tarfile.TarInfo(name)
            info.type = kind
            if kind == tarfile.REGTYPE:
                info.size = len(data)
                tf.addfile(info, io.BytesIO(data))
            else:
                info.linkname = data.decode()
                tf.addfile(info)
    return buf.getvalue()


def _upload(admin, kb, body, ctype):
    return admin.request("POST", f"/admin/api/kbs/{kb}/upload", raw=body, headers={"Content-Type": ctype})


def _tree(root):
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def test_upload_files_folder_and_archive_then_search(admin_proxy):
    admin = admin_proxy.admin()
    admin.post("/admin/api/kbs", {"name": "ops"})
    archive = _zip([("guides/backup.md", "# Backups\n\nRestores are rehearsed every quarter by the storage team.\n"),
                    ("guides/logo.png", b"\x89PNG...")])
    body, ctype = multipart_body([("runbook.md", GUIDE.encode()), ("team/folder/notes.txt", b"The kettle is blue."),
                              ("bundle.zip", archive)])
    status, _, result = _upload(admin, "ops", body, ctype)
    assert status == 201, result
    assert sorted(f["name"] for f in result["stored"]) == ["bundle.zip/guides/backup.md", "runbook.md",
                                                           "team/folder/notes.txt"]
    assert [s["name"] for s in result["skipped"]] == ["bundle.zip/guides/logo.png"]
    docs = admin_proxy.data_dir / "documents" / "ops"
    manifest = json.loads((docs / "manifest.json").read_text())["files"]
    for item in result["stored"]:
        assert (docs / item["stored_as"]).exists() and manifest[item["stored_as"]]["name"] == item["name"]
        assert re.fullmatch(r"[0-9a-f]{32}\.(md|txt)", item["stored_as"])
    _wait_indexed(admin, "ops", 3)
    files = admin.get("/admin/api/kbs/ops/files")[2]["files"]
    assert sorted(f["name"] for f in files) == sorted(i["name"] for i in result["stored"])
    assert all(f["uploaded"] and f["chunks"] >= 1 for f in files)  # manifest.json itself is not indexed
    hits = admin.post("/admin/api/kbs/ops/search", {"query": "who rehearses restores"})[2]["hits"]
    assert "quarter" in hits[0]["text"]
    assert hits[0]["source"] == "ops/bundle.zip/guides/backup.md"  # cited by its uploaded name
    victim = next(f for f in files if f["name"] == "runbook.md")
    assert admin.delete("/admin/api/kbs/ops/files?source=" + victim["source"])[0] == 200
    _wait_indexed(admin, "ops", 2)
    assert victim["source"].split("/")[1] not in json.loads((docs / "manifest.json").read_text())["files"]


def _bomb():
    import io
    import zipfile
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("zeros.txt", b"\0" * (60 * 1024 * 1024))
    return buf.getvalue()


@pytest.mark.parametrize("case", [
    "traversal_name", "absolute_name", "zip_traversal", "zip_symlink", "tar_symlink", "tar_hardlink",
    "tar_device", "truncated_tgz", "truncated_zip", "zip_bomb", "bad_extension", "malformed_multipart",
    "missing_final_boundary", "no_boundary", "empty",
])
def test_hostile_uploads_are_refused_and_leave_nothing(admin_proxy, case):
    import tarfile
    admin = admin_proxy.admin()
    admin.post("/admin/api/kbs", {"name": "ops"})
    good = ("ok.md", b"# fine\n")
    tgz = _tar([("a.md", tarfile.REGTYPE, b"x" * 5000)])
    bodies = {
        "traversal_name": [good, ("../../config/config.yaml.md", b"x")],
        "absolute_name": [good, ("/etc/cron.d/x.md", b"x")],
        "zip_traversal": [good, ("evil.zip", _zip([("../../escape.md", "x")]))],
        "zip_symlink": [good, ("evil.zip", _zip([("link.md", 0)]))],
        "tar_symlink": [good, ("evil.tar.gz", _tar([("link.md", tarfile.SYMTYPE, b"/etc/passwd")]))],
        "tar_hardlink": [good, ("evil.tar", _tar([("hard.md", tarfile.LNKTYPE, b"/etc/passwd")], gz=False))],
        "tar_device": [good, ("evil.tar", _tar([("dev.md", tarfile.CHRTYPE, b"")], gz=False))],
        "truncated_tgz": [good, ("cut.tar.gz", tgz[: len(tgz) // 2])],
        "truncated_zip": [good, ("cut.zip", _zip([("a.md", "y" * 5000)])[:-30])],
        "zip_bomb": [good, ("bomb.zip", _bomb())],
        "bad_extension": [("tool.exe", b"MZ")],   # alone: with others it is skipped, they are stored
        "empty": [],
    }
    docs = admin_proxy.data_dir / "documents"
    # Uploads write under documents/ only; the rest of the data dir is the indexer's, busy meanwhile.
    before = _tree(docs)
    if case in bodies:
        body, ctype = multipart_body(bodies[case])
    elif case == "malformed_multipart":
        body, ctype = b"--XYZ\r\nContent-Type: text/plain\r\n\r\nno disposition\r\n--XYZ--\r\n", \
            "multipart/form-data; boundary=XYZ"
    elif case == "missing_final_boundary":
        body, ctype = multipart_body([good])
        body = body[: body.rindex(b"\r\n--")]
    else:
        body, ctype = multipart_body([good])
        ctype = "multipart/form-data"
    status, _, result = _upload(admin, "ops", body, ctype)
    assert status in (400, 413), (case, result)
    assert result["error"]["code"] == "upload_rejected" and result["error"]["message"]
    assert _tree(docs) == before, case
    assert not list(docs.glob(".staging-*"))


def test_upload_caps_come_from_the_config(make_admin_proxy, fake):
    proxy = make_admin_proxy(proxy_config(fake.url, extra="uploads: {max_file_bytes: 1000, max_files: 2}\n"))
    admin = proxy.admin()
    admin.post("/admin/api/kbs", {"name": "ops"})
    body, ctype = multipart_body([("big.md", b"x" * 1001)])
    status, _, result = _upload(admin, "ops", body, ctype)
    assert status == 413 and result["error"]["code"] == "upload_rejected"
    body, ctype = multipart_body([("a.md", b"a"), ("b.md", b"b"), ("c.md", b"c")])
    assert _upload(admin, "ops", body, ctype)[0] in (400, 413)
    assert not list((proxy.data_dir / "documents" / "ops").iterdir())


def _kb_proxy(make_admin_proxy, fake, kb_settings="{retrieval: lexical}"):
    return make_admin_proxy(proxy_config(fake.url, extra=f"knowledge_bases:\n  ops: {kb_settings}\n"))


def test_a_file_over_the_kbs_max_file_bytes_is_refused_at_upload_not_stored_then_skipped(make_admin_proxy, fake):
    proxy = _kb_proxy(make_admin_proxy, fake, "{retrieval: lexical, max_file_bytes: 2000}")
    admin = proxy.admin()
    big = b"# Big\n\n" + b"lorem ipsum " * 300   # 3.5 KiB: under uploads.max_file_bytes, over the KB's cap
    status, _, result = _upload(admin, "ops", *multipart_body([("big.md", big)]))
    assert status == 413 and result["error"]["code"] == "upload_rejected"
    assert result["error"]["message"] == ("'big.md' is 3.5 KiB, over the knowledge base's limit of 2.0 KiB per file "
                                          "(raise knowledge_bases.ops.max_file_bytes to index larger files)")
    assert admin.get("/admin/api/kbs/ops")[2]["upload_max_file_bytes"] == 2000
    # Beside other files, and inside an archive, it is skipped with that reason and the rest stored.
    body, ctype = multipart_body([("guides/big.md", big), ("runbook.md", GUIDE.encode()),
                              ("more.zip", _zip([("huge.md", big), ("small.md", "# Small\n\nfits.\n")]))])
    status, _, result = _upload(admin, "ops", body, ctype)
    assert status == 201, result
    assert [s["name"] for s in result["stored"]] == ["runbook.md", "more.zip/small.md"]
    assert [s["name"] for s in result["skipped"]] == ["guides/big.md", "more.zip/huge.md"]
    assert all("knowledge_bases.ops.max_file_bytes" in s["reason"] for s in result["skipped"])
    kb = _wait_indexed(admin, "ops", 2)
    assert kb["skipped"] == []   # everything stored was indexed: nothing silently dropped
    names = sorted(f["name"] for f in admin.get("/admin/api/kbs/ops/files")[2]["files"])
    assert names == ["more.zip/small.md", "runbook.md"]


def test_one_unsupported_file_no_longer_fails_a_folder_upload(admin_proxy):
    admin = admin_proxy.admin()
    admin.post("/admin/api/kbs", {"name": "ops"})
    folder = [("site/index.md", GUIDE.encode()), ("site/img/logo.png", b"\x89PNG\r\n"), ("site/random.bin", b"\0\1"),
              ("site/notes.txt", b"The kettle is blue.")]
    status, _, result = _upload(admin, "ops", *multipart_body(folder))
    assert status == 201, result
    assert [s["name"] for s in result["stored"]] == ["site/index.md", "site/notes.txt"]
    assert result["skipped"] == [{"name": "site/img/logo.png", "reason": "file type '.png' is not accepted"},
                                 {"name": "site/random.bin", "reason": "file type '.bin' is not accepted"}]
    _wait_indexed(admin, "ops", 2)
    # The one file alone is still an error, in the admin API's error shape.
    status, _, result = _upload(admin, "ops", *multipart_body([("random.bin", b"\0")]))
    assert status == 400 and result["error"]["code"] == "upload_rejected"
    assert "'random.bin': file type '.bin' is not accepted" in result["error"]["message"]
    status, _, result = _upload(admin, "ops", *multipart_body([("a.png", b"x"), ("b.bin", b"y")]))
    assert status == 400 and "no accepted documents" in result["error"]["message"]


def test_the_same_upload_twice_is_stored_once_and_an_edit_replaces_it(admin_proxy):
    admin = admin_proxy.admin()
    admin.post("/admin/api/kbs", {"name": "ops"})
    body, ctype = multipart_body([("guide.md", GUIDE.encode()), ("team/notes.txt", b"The kettle is blue.")])
    status, _, first = _upload(admin, "ops", body, ctype)
    assert status == 201 and len(first["stored"]) == 2
    _wait_indexed(admin, "ops", 2)
    status, _, again = _upload(admin, "ops", body, ctype)
    assert status == 200 and again["stored"] == [] and again["skipped"] == []
    assert [(u["name"], u["stored_as"]) for u in again["unchanged"]] == [(s["name"], s["stored_as"])
                                                                         for s in first["stored"]]
    files = admin.get("/admin/api/kbs/ops/files")[2]["files"]
    assert sorted(f["name"] for f in files) == ["guide.md", "team/notes.txt"]
    # An edited guide.md replaces the stored one: same stored name, new text found, old text gone.
    edited = GUIDE.replace("every Tuesday at noon", "every Friday at dawn")
    status, _, third = _upload(admin, "ops", *multipart_body([("guide.md", edited.encode())]))
    assert status == 201 and third["stored"][0]["replaced"] is True
    assert third["stored"][0]["stored_as"] == first["stored"][0]["stored_as"]

    def reindexed():
        hits = admin.post("/admin/api/kbs/ops/search", {"query": "when does the pager rotate"})[2]["hits"]
        return hits if hits and "Friday" in hits[0]["text"] else None
    hits = _wait(reindexed)
    assert not any("Tuesday" in h["text"] for h in hits)
    files = admin.get("/admin/api/kbs/ops/files")[2]["files"]
    assert sorted(f["name"] for f in files) == ["guide.md", "team/notes.txt"]


def test_kb_views_show_sources_warnings_and_skipped_files_by_their_uploaded_names(make_admin_proxy, fake, tmp_path):
    missing = tmp_path / "does-not-exist"
    proxy = _kb_proxy(make_admin_proxy, fake, f"{{retrieval: lexical, sources: ['{missing}']}}")
    admin = proxy.admin()
    body, ctype = multipart_body([("manuals/broken.docx", b"not a zip at all"), ("runbook.md", GUIDE.encode())])
    assert _upload(admin, "ops", body, ctype)[0] == 201
    kb = _wait_indexed(admin, "ops", 1)
    listed = next(k for k in admin.get("/admin/api/kbs")[2]["kbs"] if k["name"] == "ops")
    for view in (kb, listed):
        assert view["last_indexed"] is not None
        assert [(s["kind"], s["state"]) for s in view["sources"]] == [("documents", "ok"), ("source", "missing")]
        source = view["sources"][1]
        assert source["source"] == str(missing) and source["files"] == 0 and str(missing) in source["message"]
        assert any(str(missing) in w for w in view["warnings"])
        assert view["skipped"] == [{"file": "ops/manuals/broken.docx", "reason": "corrupt DOCX (not a zip archive)"}]
        assert view["deferred"] == []
    files = {f["name"]: f for f in admin.get("/admin/api/kbs/ops/files")[2]["files"]}
    assert files["manuals/broken.docx"]["skipped"] == "corrupt DOCX (not a zip archive)"
    assert files["manuals/broken.docx"]["chunks"] is None and files["runbook.md"]["skipped"] is None


def test_last_indexed_survives_a_restart(make_admin_proxy, fake, _running):
    first = _kb_proxy(make_admin_proxy, fake)
    admin = first.admin()
    assert _upload(admin, "ops", *multipart_body([("runbook.md", GUIDE.encode())]))[0] == 201
    before = _wait_indexed(admin, "ops", 1)
    assert before["last_indexed"] is not None and before["generation"]
    first.app.knowledge_bases.stop()
    # A new App over the same data directory, as after `ragproxy serve` is restarted.
    config_file = ragproxy.ConfigFile(str(first.config_path), environ={})
    app = ragproxy.App(config_file.load(), data_dir=str(first.data_dir))
    app.admin = ragproxy.Admin(app, ADMIN_KEY, config_file)
    second = _running(app)
    admin = AdminClient(second.url).login()
    for view in (admin.get("/admin/api/kbs/ops")[2],
                 next(k for k in admin.get("/admin/api/kbs")[2]["kbs"] if k["name"] == "ops")):
        assert view["generation"] == before["generation"]
        assert view["last_indexed"] == pytest.approx(before["last_indexed"], abs=1.0)
        assert view["files"] == 1


def test_upload_without_a_token_is_refused_before_the_body_is_read(admin_proxy):
    import socket
    host, port = admin_proxy.url.split("//")[1].split(":")
    with socket.create_connection((host, int(port)), timeout=5) as sock:
        # Claims a 1 GB body and sends none of it: the 401 must come back at once.
        sock.sendall(b"POST /admin/api/kbs/docs/upload HTTP/1.1\r\nHost: x\r\n"
                     b"Content-Type: multipart/form-data; boundary=b\r\nContent-Length: 1000000000\r\n\r\n")
        reply = sock.recv(65536)
    assert reply.startswith(b"HTTP/1.1 401") and b"invalid_token" in reply
    admin = admin_proxy.admin()
    status, _, body = admin.request("POST", "/admin/api/kbs/docs/upload", raw=b"x",
                                    headers={"Content-Type": "multipart/form-data; boundary=b",
                                             "Transfer-Encoding": "chunked"})
    assert status in (400, 411)


def test_upload_to_a_missing_or_hostile_kb_name(admin_proxy):
    admin = admin_proxy.admin()
    body, ctype = multipart_body([("a.md", b"a")])
    before = _tree(admin_proxy.data_dir)
    for kb in ("nope", "..", "%2E%2E", "a%2Fb"):
        status, _, result = _upload(admin, kb, body, ctype)
        assert status in (400, 404), kb
    assert _tree(admin_proxy.data_dir) == before


@pytest.mark.parametrize("route", [r for r in ADMIN_ROUTES if r.method in ("POST", "PUT")],
                         ids=lambda r: f"{r.method} {r.pattern}")
@pytest.mark.parametrize("body", [b"{", b"[1, 2]", b"\xff\xfe", b'"text"', b"null"], ids=["cut", "array", "binary",
                                                                                        "string", "null"])
def test_malformed_bodies_get_400_in_the_error_shape(admin_proxy, route, body):
    admin = admin_proxy.admin()
    admin.post("/admin/api/kbs", {"name": "docs"})
    path = "/admin/api/" + route.pattern.format(kind="llm", name="oa" if "providers" in route.pattern else "%2A",
                                                kb="docs", id="1")
    config_before = admin_proxy.config_path.read_text()
    ctype = "multipart/form-data; boundary=x" if route.handler == "upload" else "application/json"
    status, _, reply = admin.request(route.method, path, raw=body, headers={"Content-Type": ctype})
    assert status == 400, (route, body, reply)
    assert isinstance(reply["error"]["message"], str) and reply["error"]["message"]
    assert "Traceback" not in reply["error"]["message"]
    assert admin_proxy.config_path.read_text() == config_before


def test_a_kb_deletion_cut_short_is_finished_at_the_next_start(tmp_path):
    for sub in ("vectordb", "documents"):
        half = tmp_path / sub / ".deleted-ops-0badcafe" / "g000001"
        half.mkdir(parents=True)
        (half / "chunks.jsonl").write_text("{}\n")
        (tmp_path / sub / "keep").mkdir()
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (tmp_path / "vectordb" / ".deleted-link").symlink_to(outside)  # never followed
    removed = ragproxy.remove_deleted_kbs(str(tmp_path))
    assert sorted(os.path.relpath(p, tmp_path) for p in removed) == [
        os.path.join("documents", ".deleted-ops-0badcafe"), os.path.join("vectordb", ".deleted-ops-0badcafe")]
    assert _tree(tmp_path) == sorted(["documents", "documents/keep", "elsewhere", "vectordb", "vectordb/.deleted-link",
                                      "vectordb/keep"])
    assert ragproxy.remove_deleted_kbs(str(tmp_path / "missing")) == []


# -- secrets ----------------------------------------------------------------------

def _config_with_secrets(fake_url):
    return f"""\
# ragproxy for the team
api_keys:
  - {API_KEY}            # the laptops
  - {{key: "ci-client-key-5678", name: ci}}
providers:
  llm:
    oa:
      type: openai
      base_url: "{fake_url}/v1"
      api_key: upstream-openai-key     # from the vendor console
      headers: {{X-Upstream-Auth: "hdr-secret-value-42", X-Tenant: acme}}
    env: {{type: openai, base_url: "{fake_url}/v1", api_key: "${{NO_SUCH_KEY:-}}"}}
models:
  - {{name: "*", upstream: oa}}
"""


SECRETS = (API_KEY, "ci-client-key-5678", "upstream-openai-key", "hdr-secret-value-42")


def test_settings_text_masks_every_key_and_a_save_keeps_the_stored_ones(make_admin_proxy, fake):
    proxy = make_admin_proxy(_config_with_secrets(fake.url))
    stored = proxy.config_path.read_text()
    admin = proxy.admin()
    status, _, body = admin.get("/admin/api/settings")
    text = body["text"]
    assert status == 200
    for secret in SECRETS:
        assert secret not in text, secret
    assert "upstream-openai-key" in stored   # what the file holds is unchanged by showing it
    # Masked in place: the same lines, the comments kept, what is not a key shown as written.
    assert len(text.splitlines()) == len(stored.splitlines())
    assert "ups\u2022\u2022\u2022\u2022-key     # from the vendor console" in text
    assert "# the laptops" in text and "X-Tenant: acme" in text and "${NO_SUCH_KEY:-}" in text
    assert admin.post("/admin/api/settings/validate", {"text": text})[2] == {"ok": True, "warnings": []}
    # Saved back with one edit: the file has the real keys again, and the edit.
    edited = text.replace("# ragproxy for the team", "# ragproxy for the team\nrag: {top_k: 7}")
    status, _, body = admin.put("/admin/api/settings", {"text": edited})
    assert status == 200, body
    assert proxy.config_path.read_text() == stored.replace("# ragproxy for the team",
                                                           "# ragproxy for the team\nrag: {top_k: 7}")
    assert proxy.app.config.rag["top_k"] == 7
    if os.name != "nt":
        for path in (str(proxy.config_path), body["backup"]):
            assert os.stat(path).st_mode & 0o777 == 0o600, path
    # The running proxy still takes the client key and sends the upstream its own key and header.
    client = openai.OpenAI(base_url=proxy.url + "/v1", api_key="ci-client-key-5678", max_retries=0)
    client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    assert fake.last.headers["authorization"] == "Bearer upstream-openai-key"
    assert fake.last.headers["x-upstream-auth"] == "hdr-secret-value-42"


def test_a_masked_key_that_matches_no_stored_one_is_refused_with_its_line(make_admin_proxy, fake):
    proxy = make_admin_proxy(_config_with_secrets(fake.url))
    stored = proxy.config_path.read_text()
    admin = proxy.admin()
    text = admin.get("/admin/api/settings")[2]["text"]
    forged = text.replace("ups\u2022\u2022\u2022\u2022-key", "abc\u2022\u2022\u2022\u2022-key")
    for method in (admin.put, lambda path, body: admin.post(path + "/validate", body)):
        status, _, body = method("/admin/api/settings", {"text": forged})
        assert status == 400 and body["error"]["code"] == "invalid_config", body
        (error,) = body["error"]["errors"]
        assert error["path"] == "providers.llm.oa.api_key" and "matches no stored key" in error["message"]
        assert error["line"] == forged.splitlines().index("      api_key: abc\u2022\u2022\u2022\u2022-key     "
                                                           "# from the vendor console") + 1
    assert proxy.config_path.read_text() == stored
    # A key typed over its mask is the new key.
    typed = text.replace("ups\u2022\u2022\u2022\u2022-key", "a-new-upstream-key")
    assert admin.put("/admin/api/settings", {"text": typed})[0] == 200
    assert "api_key: a-new-upstream-key     # from the vendor console" in proxy.config_path.read_text()


def test_settings_of_a_file_that_does_not_parse_are_not_shown(make_admin_proxy, fake):
    proxy = make_admin_proxy(_config_with_secrets(fake.url))
    admin = proxy.admin()
    proxy.config_path.write_text(proxy.config_path.read_text() + "models: [\n")
    status, _, body = admin.get("/admin/api/settings")
    assert status == 409 and body["error"]["code"] == "invalid_config" and "text" not in body
    assert "does not parse" in body["error"]["message"] and "upstream-openai-key" not in json.dumps(body)


def test_provider_views_mask_credential_headers_and_keep_them_when_sent_back(make_admin_proxy, fake):
    proxy = make_admin_proxy(_config_with_secrets(fake.url))
    admin = proxy.admin()
    status, _, listing = admin.get("/admin/api/providers")
    (oa,) = [p for p in listing["llm"] if p["name"] == "oa"]
    assert oa["headers"] == {"X-Upstream-Auth": "hdr\u2022\u2022\u2022\u2022e-42", "X-Tenant": "acme"}
    for secret in SECRETS:
        assert secret not in json.dumps(listing), secret
    # The panel's editor sends the whole form back: masked values unchanged, one header edited.
    status, _, body = admin.put("/admin/api/providers/llm/oa", {
        "api_key": oa["api_key"], "headers": dict(oa["headers"], **{"X-Tenant": "umbrella"})})
    assert status == 200, body
    on_disk = ragproxy.Config.load(str(proxy.config_path), environ={}).providers["llm"]["oa"]
    assert on_disk.api_key == "upstream-openai-key"
    assert dict(on_disk.headers) == {"X-Upstream-Auth": "hdr-secret-value-42", "X-Tenant": "umbrella"}
    assert body["headers"]["X-Upstream-Auth"] == "hdr\u2022\u2022\u2022\u2022e-42"


def test_models_show_a_reranker_switched_off_by_a_permanent_error(make_admin_proxy, fake):
    from conftest import proxy_config
    text = proxy_config(fake.url, extra="knowledge_bases:\n  notes: {retrieval: lexical}\n").replace(
        "providers:\n", f'providers:\n  rerank:\n    rr: {{type: openai, base_url: "{fake.url}/v1", model: m}}\n', 1
    ).replace('  - {name: "*", upstream: [ol, oa]}', '  - {name: "*", upstream: [ol, oa], kb: [notes], rerank: true}')
    proxy = make_admin_proxy(text)
    notes = proxy.data_dir / "documents" / "notes"
    notes.mkdir(parents=True, exist_ok=True)
    (notes / "kettle.md").write_text("# Kettle\n\nThe copper kettle whistles at dawn.\n")
    proxy.app.knowledge_bases.index_all()
    admin = proxy.admin()

    def status():
        return {m["name"]: m["rerank_status"] for m in admin.get("/admin/api/models")[2]["models"]}["*"]

    assert status() == {"requested": True, "active": True, "provider": "rr", "reason": None}
    fake.fail_next(401, path="/v1/rerank")
    proxy.app.retriever.search(["notes"], "copper kettle", proxy.app.resolve_route("anything"))
    off = status()
    assert off["active"] is False and off["provider"] == "rr" and "switched off" in off["reason"]


# -- client API keys ------------------------------------------------------------

OPS_DOC = "# Pager\n\nThe pager rotates every Tuesday at noon; payroll questions go to the duty manager.\n"
HR_DOC = "# Payroll\n\nPayroll closes on the twentieth: payroll corrections after the payroll close wait a month.\n"


def _scoped_proxy(make_admin_proxy, fake, extra_keys=""):
    """Two KBs (ops, hr) behind the gpt-* models, each with one document, indexed."""
    text = proxy_config(fake.url, extra="knowledge_bases:\n  ops: {retrieval: lexical}\n  hr: {retrieval: lexical}\n")
    text = text.replace('  - {name: "gpt-*", upstream: oa}', '  - {name: "gpt-*", upstream: oa, kb: [ops, hr]}')
    if extra_keys:
        text = text.replace(f"api_keys: [{API_KEY}]", "api_keys:\n" + extra_keys)
    proxy = make_admin_proxy(text)
    for kb, doc in (("ops", OPS_DOC), ("hr", HR_DOC)):
        folder = proxy.data_dir / "documents" / kb
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{kb}.md").write_text(doc)
    proxy.app.knowledge_bases.index_all()
    return proxy


def _sent_upstream(fake):
    return json.dumps(fake.last.json)


def _ask(proxy, key, model="gpt-4o", **kw):
    client = openai.OpenAI(base_url=proxy.url + "/v1", api_key=key, max_retries=0, timeout=10)
    return client.chat.completions.create(model=model, messages=[{"role": "user", "content":
                                                                  "When does payroll close, and the pager?"}], **kw)


def test_a_key_made_in_the_admin_api_is_shown_once_and_reads_only_its_kbs(make_admin_proxy, fake):
    proxy = _scoped_proxy(make_admin_proxy, fake)
    admin = proxy.admin()
    answers = []   # every admin answer but the one-time ones must lack the key

    def call(method, path, body=None):
        status, resp, reply = admin.request(method, path, body)
        answers.append(json.dumps(reply))
        return status, resp, reply

    # Unscoped, the old key reads both KBs: the payroll passage reaches the model.
    _ask(proxy, API_KEY)
    assert "payroll corrections" in _sent_upstream(fake)

    status, resp, made = admin.post("/admin/api/keys", {"name": "team-ops", "kbs": ["ops"], "models": ["gpt-*"]})
    assert status == 201, made
    key = made["key"]
    assert key.startswith("rp-") and len(key) >= 32 and resp.getheader("Cache-Control") == "no-store"
    assert made["masked_key"] == key[:3] + "\u2022" * 4 + key[-4:]
    assert {k: made[k] for k in ("name", "kbs", "models", "explicit")} == \
        {"name": "team-ops", "kbs": ["ops"], "models": ["gpt-*"], "explicit": True}
    written = ragproxy.Config.load(str(proxy.config_path), environ={}).api_keys
    assert written[-1] == {"key": key, "name": "team-ops", "kbs": ["ops"], "models": ["gpt-*"], "explicit": True}

    status, _, listing = call("GET", "/admin/api/keys")
    assert status == 200 and listing["require_acl"] is False and listing["api_key_auth"] is True
    assert [(k["name"], k["kbs"], k["models"], k["explicit"]) for k in listing["keys"]] == [
        ("key1", "*", ["*"], False), ("team-ops", ["ops"], ["gpt-*"], True)]
    assert listing["keys"][0]["masked_key"] == API_KEY[:3] + "\u2022" * 4 + API_KEY[-4:]
    assert call("GET", "/admin/api/settings")[2]["text"].count(made["masked_key"]) == 1

    # The key works at once, for its KB only; the other KB and other models are refused.
    _ask(proxy, key)
    assert "Tuesday at noon" in _sent_upstream(fake) and "payroll corrections" not in _sent_upstream(fake)
    with pytest.raises(openai.PermissionDeniedError):
        _ask(proxy, key, extra_headers={"X-Ragproxy-KB": "hr"})
    with pytest.raises(openai.PermissionDeniedError):
        _ask(proxy, key, model="claude-3-haiku")

    # Rename and widen: the key itself is unchanged, and not in the answer.
    status, resp, changed = call("PUT", "/admin/api/keys/team-ops", {"name": "team-all", "kbs": ["ops", "hr"]})
    assert status == 200 and "key" not in changed and changed["name"] == "team-all"
    assert changed["kbs"] == ["ops", "hr"] and changed["models"] == ["gpt-*"]
    _ask(proxy, key)
    assert "payroll corrections" in _sent_upstream(fake)
    assert call("PUT", "/admin/api/keys/team-ops", {"kbs": "*"})[0] == 404

    # Rotation: a new key, shown in that answer; the old one stops working.
    status, resp, rotated = admin.put("/admin/api/keys/team-all", {"rotate": True})
    assert status == 200 and resp.getheader("Cache-Control") == "no-store"
    new_key = rotated["key"]
    assert new_key != key and new_key.startswith("rp-") and rotated["kbs"] == ["ops", "hr"]
    with pytest.raises(openai.AuthenticationError):
        _ask(proxy, key)
    _ask(proxy, new_key)

    status, _, body = call("DELETE", "/admin/api/keys/team-all")
    assert status == 200 and body == {"deleted": "team-all"}
    with pytest.raises(openai.AuthenticationError):
        _ask(proxy, new_key)
    assert call("DELETE", "/admin/api/keys/team-all")[0] == 404
    assert [k["name"] for k in call("GET", "/admin/api/keys")[2]["keys"]] == ["key1"]
    for answer in answers:
        assert key not in answer and new_key not in answer and API_KEY not in answer
    assert ragproxy.Config.load(str(proxy.config_path), environ={}).raw == proxy.app.config.raw


@pytest.mark.parametrize("body, status, code", [
    ({"kbs": ["ops"]}, 400, "invalid_name"),                                      # no name
    ({"name": "key1"}, 409, "conflict"),                                          # the existing key's name
    ({"name": "has space"}, 400, "invalid_name"),
    ({"name": "x", "kbs": ["nope"]}, 400, "invalid_scope"),                       # no such KB
    ({"name": "x", "kbs": "ops"}, 400, "invalid_scope"),                          # a list, or "*"
    ({"name": "x", "kbs": [1]}, 400, "invalid_scope"),
    ({"name": "x", "models": [""]}, 400, "invalid_scope"),
    ({"name": "x", "models": "gpt-*"}, 400, "invalid_scope"),
    ({"name": "x", "key": "my-own-key-123456"}, 400, "invalid_key_field"),        # keys are generated
    ({"name": "x", "scope": "*"}, 400, None),
])
def test_a_bad_key_request_is_refused_and_changes_nothing(make_admin_proxy, fake, body, status, code):
    proxy = _scoped_proxy(make_admin_proxy, fake)
    admin = proxy.admin()
    before = proxy.config_path.read_text()
    got, _, reply = admin.post("/admin/api/keys", body)
    assert got == status, reply
    assert reply["error"]["message"] and reply["error"]["type"] and reply["error"]["code"] == code
    assert proxy.config_path.read_text() == before and len(proxy.app.config.api_keys) == 1


def test_a_bad_key_change_is_refused_and_changes_nothing(make_admin_proxy, fake):
    proxy = _scoped_proxy(make_admin_proxy, fake, extra_keys=f"  - {API_KEY}\n  - {{key: other-key-0002, name: ci}}\n")
    admin = proxy.admin()
    before = proxy.config_path.read_text()
    for path, body, status in (("ci", {"name": "key1"}, 409),          # taken by the plain key
                               ("ci", {"rotate": "yes"}, 400),
                               ("ci", {"kbs": ["nope"]}, 400),
                               ("ci", {"key": "typed-key-123456"}, 400),
                               ("nobody", {"kbs": "*"}, 404)):
        got, _, reply = admin.put(f"/admin/api/keys/{path}", body)
        assert got == status and reply["error"]["message"], (path, body, reply)
    assert proxy.config_path.read_text() == before


def test_a_config_error_from_a_key_change_comes_back_in_the_admin_shape(make_admin_proxy, fake):
    # require_acl: a key must name both its KBs and its models.
    text = proxy_config(fake.url, extra="security: {require_acl: true}\n").replace(
        f"api_keys: [{API_KEY}]", f"api_keys: [{{key: {API_KEY}, name: laptop, kbs: '*', models: '*'}}]")
    proxy = make_admin_proxy(text)
    admin = proxy.admin()
    assert admin.get("/admin/api/keys")[2]["require_acl"] is True
    status, _, reply = admin.post("/admin/api/keys", {"name": "half", "kbs": "*"})
    assert status == 400 and reply["error"]["code"] == "invalid_config", reply
    assert "api_keys[1]" in reply["error"]["message"] and "Traceback" not in reply["error"]["message"]
    status, _, made = admin.post("/admin/api/keys", {"name": "whole", "kbs": "*", "models": ["*"]})
    assert status == 201 and made["explicit"] is True


def test_keys_from_the_environment_stay_references(make_admin_proxy, fake):
    keys = ('  - "${CLIENT_KEY:-env-client-key-0001}"\n'
            '  - plain-client-key-0002\n'
            '  - {key: "${CI_KEY:-env-ci-key-000003}", name: ci}\n')
    proxy = _scoped_proxy(make_admin_proxy, fake, extra_keys=keys)
    admin = proxy.admin()
    listing = admin.get("/admin/api/keys")[2]["keys"]
    assert [(k["name"], k["masked_key"], k["from_environment"]) for k in listing] == [
        ("key1", "${CLIENT_KEY:-env-client-key-0001}", True), ("key2", "pla\u2022\u2022\u2022\u20220002", False),
        ("ci", "${CI_KEY:-env-ci-key-000003}", True)]
    # A scope change keeps the reference as written; rotating it would drop it, so it is refused.
    status, _, body = admin.put("/admin/api/keys/key1", {"kbs": ["hr"], "models": ["*"]})
    assert status == 200 and body["masked_key"] == "${CLIENT_KEY:-env-client-key-0001}", body
    status, _, body = admin.put("/admin/api/keys/ci", {"rotate": True})
    assert status == 409 and "environment" in body["error"]["message"] and "key" not in body
    written = proxy.config_path.read_text()
    assert "${CLIENT_KEY:-env-client-key-0001}" in written and "${CI_KEY:-env-ci-key-000003}" in written
    _ask(proxy, "env-client-key-0001")
    assert "payroll corrections" in _sent_upstream(fake) and "Tuesday" not in _sent_upstream(fake)
    # Deleting the first key leaves the next one its name (key2), not the first's.
    assert admin.delete("/admin/api/keys/key1")[0] == 200
    assert [k["name"] for k in admin.get("/admin/api/keys")[2]["keys"]] == ["key2", "ci"]
    assert {e["name"]: e["key"] for e in proxy.app.config.api_keys} == {"key2": "plain-client-key-0002",
                                                                       "ci": "env-ci-key-000003"}
    assert "${CI_KEY:-env-ci-key-000003}" in proxy.config_path.read_text()


def test_keys_come_from_the_injected_rng_else_the_system_csprng(tmp_path, fake):
    import random
    import secrets
    app, admin, _ = _in_process_admin(tmp_path, fake.url)
    assert isinstance(admin.key_rng, secrets.SystemRandom) and admin.key_rng is not app.rng
    seeded = ragproxy.Admin(app, ADMIN_KEY, admin.config_file, rng=random.Random(7))
    app.admin = seeded
    token = _call(app, "POST", "/admin/api/login", {"key": ADMIN_KEY})[1]["token"]
    status, made = _call(app, "POST", "/admin/api/keys", {"name": "seeded"}, token=token)
    replay = random.Random(7)
    replay.getrandbits(128)   # the login's token id
    expected = "rp-" + b64url(replay.getrandbits(192).to_bytes(24, "big"))
    assert status == 201 and made["key"] == expected


# -- the vector store (issue 16) -------------------------------------------------

def _dead_url():
    """An http URL of a local port nothing listens on (bound, then closed)."""
    import socket
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{sock.getsockname()[1]}"


class _TokenCatcher:
    """A local HTTP server that answers 404 to everything and keeps the X-Chroma-Token of each request."""

    def __init__(self):
        import http.server
        import threading
        seen = self.tokens = []

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                seen.append(self.headers.get("X-Chroma-Token"))
                body = b'{"error":"NotFound","message":"no such route"}'
                self.send_response(404)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def test_the_vectorstore_test_reports_a_dead_server_without_its_address(admin_proxy):
    admin = admin_proxy.admin()
    status, _, body = admin.post("/admin/api/vectorstore/test", {})
    assert status == 400 and "vectorstore.chroma_http.base_url" in body["error"]["message"], body
    dead = _dead_url()
    status, _, body = admin.post("/admin/api/vectorstore/test", {"base_url": dead + "/"})
    assert status == 200 and body["ok"] is False and body["reason"] == "unreachable", body
    assert body["base_url"] == dead and body["configured"] is False and body["latency_ms"] >= 0
    assert "unreachable" in body["message"] and dead.rsplit(":", 1)[1] not in body["message"]


def test_a_chroma_server_that_never_answers_is_a_timeout_after_the_configured_seconds(make_admin_proxy, fake):
    import socket
    with socket.socket() as silent:   # the kernel completes the connect; nothing ever reads or answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        url = f"http://127.0.0.1:{silent.getsockname()[1]}"
        proxy = make_admin_proxy(proxy_config(fake.url, extra=(
            f"vectorstore:\n  chroma_http:\n    base_url: {url}\n    timeout: 0.3\n")))
        status, _, body = proxy.admin().post("/admin/api/vectorstore/test")
    assert status == 200 and body["ok"] is False and body["reason"] == "timeout", body
    assert "0.3s" in body["message"] and "vectorstore.chroma_http.timeout" in body["message"]


@pytest.mark.parametrize("body, fragment", [
    ({"base_url": "chroma:8000"}, "http:// or https:// URL"),
    ({"base_url": 8000}, "'base_url' must be a string"),
    ({"base_url": "http://127.0.0.1:99999"}, "port"),
    ({"base_url": "http://127.0.0.1:1", "tenant": ""}, "'tenant' must be a Chroma tenant name"),
    ({"base_url": "http://127.0.0.1:1", "database": "a\nb"}, "'database' must be a Chroma database name"),
    ({"base_url": "http://127.0.0.1:1", "collection": "x"}, "unknown field 'collection'"),
])
def test_a_bad_vectorstore_test_body_is_a_400_in_the_error_shape(admin_proxy, body, fragment):
    status, _, reply = admin_proxy.admin().post("/admin/api/vectorstore/test", body)
    assert status == 400 and fragment in reply["error"]["message"], reply
    assert reply["error"]["code"] == "invalid_field"


def test_the_chroma_token_goes_only_to_the_configured_server(make_admin_proxy, fake):
    configured, other = _TokenCatcher(), _TokenCatcher()
    try:
        proxy = make_admin_proxy(proxy_config(fake.url, extra=(
            "vectorstore:\n  chroma_http:\n"
            f"    base_url: {configured.url}\n    token: ck-the-chroma-token-123\n")))
        admin = proxy.admin()
        status, _, body = admin.post("/admin/api/vectorstore/test", {})
        assert status == 200 and body["ok"] is False and body["configured"] is True, body
        assert "v2 API" in body["message"] and configured.tokens == ["ck-the-chroma-token-123"]
        status, _, body = admin.post("/admin/api/vectorstore/test", {"base_url": other.url})
        assert status == 200 and body["ok"] is False and body["configured"] is False
        assert other.tokens == [None]
        for path in ("/admin/api/overview", "/admin/api/kbs", "/admin/api/providers"):
            status, _, view = admin.get(path)
            assert status == 200 and "ck-the-chroma-token-123" not in json.dumps(view), path
        status, _, view = admin.get("/admin/api/overview")
        assert view["vectorstore"]["configured"] == "simple"
        assert view["vectorstore"]["chroma_http"]["base_url"] == configured.url
        assert view["vectorstore"]["chroma_http"]["has_token"] is True
    finally:
        configured.close()
        other.close()


def _store_proxy(make_admin_proxy, fake, chroma_url, prefix):
    text = proxy_config(fake.url, extra=(
        "vectorstore:\n  chroma_http:\n"
        f"    base_url: {chroma_url}\n    collection_prefix: {prefix}\n    timeout: 3\n"
        "knowledge_bases:\n  small: {retrieval: lexical}\n"
        "  big: {retrieval: dense, embedding: em, vectorstore: chroma_http}\n")).replace(
        "providers:\n", f"providers:\n  embedding:\n    em: {{type: openai, base_url: '{fake.url}/v1', model: emb}}\n", 1)
    return make_admin_proxy(text)


def test_the_kb_store_test_and_views_against_a_real_chroma_then_a_dead_one(make_admin_proxy, fake, chroma_server,
                                                                           chroma_prefix):
    proxy = _store_proxy(make_admin_proxy, fake, chroma_server.url, chroma_prefix)
    admin = proxy.admin()
    body, ctype = multipart_body([("runbook.md", GUIDE.encode())])
    assert _upload(admin, "big", body, ctype)[0] == 201
    kb = _wait_indexed(admin, "big", 1)
    assert kb["store"]["type"] == "chroma_http" and kb["store"]["collection"] == chroma_prefix + "big"
    assert kb["vectorstore"]["configured"] == "chroma_http"
    assert kb["vectorstore"]["set_by"] == "knowledge_bases.big.vectorstore"
    assert kb["vectorstore"]["chroma_http"]["base_url"] == chroma_server.url
    views = {view["name"]: view for view in admin.get("/admin/api/kbs")[2]["kbs"]}
    assert views["small"]["store"]["type"] == "simple" and views["small"]["vectorstore"]["configured"] == "simple"
    assert views["big"]["store"]["collection"] == chroma_prefix + "big"

    status, _, result = admin.post("/admin/api/kbs/big/store/test")
    assert status == 200 and result["ok"] is True and result["kb"] == "big", result
    assert result["collection"] == chroma_prefix + "big" and result["vectors"] == kb["chunks"] > 0
    assert result["version"] and result["latency_ms"] >= 0
    status, _, result = admin.post("/admin/api/kbs/small/store/test")
    assert status == 200 and result["ok"] is True and result["kb"] == "small", result
    assert admin.post("/admin/api/kbs/nope/store/test")[0] == 404

    dead = _dead_url()
    text = proxy.config_path.read_text().replace(chroma_server.url, dead)
    assert admin.put("/admin/api/settings", {"text": text})[0] == 200
    status, _, result = admin.post("/admin/api/kbs/big/store/test")
    assert status == 200 and result["ok"] is False and result["message"], result
    assert dead.rsplit(":", 1)[1] not in result["message"]
    store = admin.get("/admin/api/kbs/big")[2]["store"]
    assert store["reachable"] is False and store["error"] and dead.rsplit(":", 1)[1] not in store["error"]


def test_the_chroma_token_is_masked_in_the_settings_text_and_kept_on_save(make_admin_proxy, fake):
    text = proxy_config(fake.url, extra=(
        "vectorstore:\n  chroma_http:\n    base_url: http://127.0.0.1:1\n    token: ck-the-chroma-token-123\n"))
    proxy = make_admin_proxy(text)
    admin = proxy.admin()
    shown = admin.get("/admin/api/settings")[2]["text"]
    assert "ck-the-chroma-token-123" not in shown and "ck-\u2022\u2022\u2022\u2022-123" in shown
    status, _, body = admin.put("/admin/api/settings", {"text": shown.replace("127.0.0.1:1", "127.0.0.1:2")})
    assert status == 200, body
    assert "token: ck-the-chroma-token-123" in proxy.config_path.read_text()
    assert proxy.app.config.raw["vectorstore"]["chroma_http"]["token"] == "ck-the-chroma-token-123"
