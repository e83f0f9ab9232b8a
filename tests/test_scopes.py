"""API key scopes end to end: real SDKs -> ragproxy (two knowledge bases) -> fake upstream.

A key's ``kbs`` and ``models`` (config.key_allows_kb / key_allows_model) bind
what proxy.App and retrieval.Retriever.select_kbs do for it: the model
mapping's KBs cut down to the scope, a KB the client names outside it a 403
in each API's own error shape, a key with no KB scope passed through without
context, a model outside its globs a 403 and absent from the listings, and the
per-turn and stale caches keyed by the scope.  The fake upstream answers
"FOUND: <sentence>" only when that sentence reached it.
"""
import json
import urllib.request

import anthropic
import ollama
import openai
import pytest

import ragproxy
from _ragproxy.embeddings import EmbeddingError
from conftest import API_KEY, logged_rows, proxy_config

DOCS_FACT = "the purple elephant sings at midnight"
CODE_FACT = "rotate_signing_key"
DOCS_KEY, NO_KB_KEY, GPT_KEY, BOTH_KEY = "rp-docs-only-0001", "rp-no-kb-0002", "rp-gpt-only-0003", "rp-both-0004"

KEYS = f"""api_keys:
  - {API_KEY}
  - {{key: {DOCS_KEY}, name: docs-team, kbs: [docs], models: "*"}}
  - {{key: {NO_KB_KEY}, name: outsider, kbs: [], models: "*"}}
  - {{key: {GPT_KEY}, name: gpt-team, models: ["gpt-*"]}}
  - {{key: {BOTH_KEY}, name: both, kbs: [docs, code], models: "*"}}"""


def scoped_config(fake_url, kb="docs, code", rag=""):
    extra = f"""
knowledge_bases:
  docs: {{retrieval: lexical}}
  code: {{retrieval: lexical}}
rag:
  top_k: 3
{rag}"""
    text = proxy_config(fake_url, extra=extra).replace(f"api_keys: [{API_KEY}]", KEYS)
    return text.replace('  - {name: "*", upstream: [ol, oa]}', f'  - {{name: "*", upstream: [ol, oa], kb: [{kb}]}}')


def fill(data_dir):
    (data_dir / "documents" / "docs").mkdir(parents=True)
    (data_dir / "documents" / "docs" / "guide.md").write_text(
        f"# Guide\n\n## Elephants\n\nWhen asked about the elephant: {DOCS_FACT}.\n")
    (data_dir / "documents" / "code").mkdir(parents=True)
    (data_dir / "documents" / "code" / "keys.py").write_text(
        f'def {CODE_FACT}(store, days=90):\n    """Rotate the signing key after ``days``."""\n'
        "    return store.rotate(days)\n")
    return data_dir


@pytest.fixture
def scoped(make_proxy, fake, tmp_path):
    fake.secrets = [DOCS_FACT, CODE_FACT]
    proxy = make_proxy(scoped_config(fake.url), data_dir=fill(tmp_path))
    proxy.app.knowledge_bases.index_all()
    return proxy


def oai(proxy, key):
    return openai.OpenAI(base_url=proxy.url + "/v1", api_key=key, max_retries=0, timeout=10)


def ask(proxy, key, content, model="llama3", **kw):
    return oai(proxy, key).chat.completions.create(model=model, messages=[{"role": "user", "content": content}],
                                                   **kw).choices[0].message.content


def chats(fake):
    return [r for r in fake.requests if r.path in ("/v1/chat/completions", "/api/chat", "/v1/messages",
                                                   "/v1/responses")]


def test_a_scoped_key_gets_only_its_knowledge_bases_passages(scoped, fake):
    # The model maps to docs and code; the docs-only key's requests never search code.
    assert ask(scoped, DOCS_KEY, "how to rotate the signing key") == "ECHO: how to rotate the signing key"
    assert CODE_FACT not in fake.last.body.decode()
    raw = oai(scoped, DOCS_KEY).chat.completions.with_raw_response.create(
        model="llama3", messages=[{"role": "user", "content": "what does the purple elephant do"}])
    assert raw.parse().choices[0].message.content == "FOUND: " + DOCS_FACT
    assert raw.headers["x-ragproxy-sources"]
    # An unscoped key on the same mapping reads both, as before scopes existed.
    assert ask(scoped, API_KEY, "how to rotate the signing key") == "FOUND: " + CODE_FACT
    rows = logged_rows(scoped.app, 3)
    by_client = {r["client"]: r for r in rows}
    assert by_client["docs-team"]["kbs"] == ["docs"] and by_client["key1"]["kbs"] == ["docs", "code"]


def openai_403(call):
    with pytest.raises(openai.PermissionDeniedError) as info:
        call()
    return info.value.body


def test_naming_a_kb_outside_the_scope_is_403_in_each_apis_shape_and_never_reaches_the_upstream(scoped, fake):
    client = oai(scoped, DOCS_KEY)
    messages = [{"role": "user", "content": "how to rotate the signing key"}]
    for body in (openai_403(lambda: client.chat.completions.create(model="llama3+code", messages=messages)),
                 openai_403(lambda: client.chat.completions.create(
                     model="llama3", messages=messages, extra_headers={"X-Ragproxy-KB": "docs,code"})),
                 openai_403(lambda: client.responses.create(model="llama3+code", input="rotate the key"))):
        assert body["code"] == "kb_not_in_scope" and body["type"] == "permission_error"
        assert "code" in body["message"] and "may read: docs" in body["message"]
    with pytest.raises(anthropic.PermissionDeniedError) as info:
        anthropic.Anthropic(base_url=scoped.url, api_key=DOCS_KEY, max_retries=0).messages.create(
            model="claude-x", max_tokens=32, messages=messages, extra_headers={"X-Ragproxy-KB": "code"})
    assert info.value.body["type"] == "error" and info.value.body["error"]["type"] == "permission_error"
    with pytest.raises(ollama.ResponseError) as info:
        ollama.Client(host=f"{scoped.url}/k/{DOCS_KEY}").chat(model="llama3+code", messages=messages)
    assert info.value.status_code == 403 and "outside this API key's scope" in info.value.error
    assert chats(fake) == []
    # An unknown KB is still a 400 (before the scope is looked at), for a scoped key too.
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model="llama3", messages=messages, extra_headers={"X-Ragproxy-KB": "nope"})
    assert info.value.body["code"] == "unknown_knowledge_base"
    # What is in scope works the same ways.
    assert client.chat.completions.create(model="llama3+docs", messages=[
        {"role": "user", "content": "what does the purple elephant do"}]).choices[0].message.content \
        == "FOUND: " + DOCS_FACT


def test_a_key_without_kb_scope_passes_through_and_the_log_says_so(scoped, fake):
    messages = [{"role": "user", "content": "what does the purple elephant do"}]
    reply = oai(scoped, NO_KB_KEY).chat.completions.with_raw_response.create(model="llama3", messages=messages)
    assert reply.parse().choices[0].message.content == "ECHO: what does the purple elephant do"
    assert fake.last.json["messages"] == messages and "x-ragproxy-sources" not in reply.headers
    with pytest.raises(openai.PermissionDeniedError):
        oai(scoped, NO_KB_KEY).chat.completions.create(model="llama3+docs", messages=messages)
    passed, refused = sorted(logged_rows(scoped.app, 2), key=lambda r: r["id"])
    assert passed["client"] == "outsider" and passed["outcome"] == "out_of_scope" and passed["kbs"] == []
    assert passed["status"] == 200 and refused["status"] == 403


def test_a_model_outside_the_keys_globs_is_403_and_not_listed(scoped, fake):
    assert ask(scoped, GPT_KEY, "hi", model="gpt-4o") == "ECHO: hi"
    body = openai_403(lambda: ask(scoped, GPT_KEY, "hi", model="llama3"))
    assert body["code"] == "model_not_in_scope" and "gpt-*" in body["message"]
    openai_403(lambda: ask(scoped, GPT_KEY, "hi", model="llama3+docs"))   # the name without its KBs counts
    with pytest.raises(anthropic.PermissionDeniedError):
        anthropic.Anthropic(base_url=scoped.url, api_key=GPT_KEY, max_retries=0).messages.create(
            model="claude-x", max_tokens=32, messages=[{"role": "user", "content": "hi"}])
    gpt_ollama = ollama.Client(host=f"{scoped.url}/k/{GPT_KEY}")
    with pytest.raises(ollama.ResponseError) as info:
        gpt_ollama.chat(model="llama3", messages=[{"role": "user", "content": "hi"}])
    assert info.value.status_code == 403
    with pytest.raises(ollama.ResponseError) as info:
        gpt_ollama.show("llama3")   # a model-naming pass-through call is checked too
    assert info.value.status_code == 403
    assert len(chats(fake)) == 1
    openai_403(lambda: oai(scoped, GPT_KEY).models.retrieve("llama3"))
    # The listings are ragproxy's own (upstream names merged with the configured ones): filtered.
    listed = [m.id for m in oai(scoped, GPT_KEY).models.list()]
    everything = [m.id for m in oai(scoped, API_KEY).models.list()]
    assert listed and all(n.startswith("gpt-") for n in listed) and set(listed) < set(everything)
    tags = [m.model for m in gpt_ollama.list().models]
    assert all(n.startswith("gpt-") for n in tags) and "gpt-renamed" in tags
    assert "fake-model" in [m.model for m in ollama.Client(host=f"{scoped.url}/k/{API_KEY}").list().models]


TOOL_ROUND = [{"role": "assistant", "content": None, "tool_calls": [
    {"id": "call_1", "type": "function", "function": {"name": "read_file", "arguments": "{}"}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "file contents"}]


def test_the_per_turn_cache_never_hands_one_keys_context_to_another(scoped, fake):
    """One conversation, one model, two keys: a later round by the second key is never served
    what the first key's request retrieved."""
    turn = [{"role": "user", "content": "how to rotate the signing key"}]
    assert ask(scoped, API_KEY, turn[0]["content"]) == "FOUND: " + CODE_FACT
    oai(scoped, DOCS_KEY).chat.completions.create(model="llama3", messages=turn + TOOL_ROUND)
    assert CODE_FACT not in fake.last.body.decode()
    # The same KBs searched (the header names docs for both), scopes that differ: still not shared.
    elephant = [{"role": "user", "content": "what does the purple elephant do"}]
    docs = {"X-Ragproxy-KB": "docs"}
    oai(scoped, BOTH_KEY).chat.completions.create(model="llama3", messages=elephant, extra_headers=docs)
    oai(scoped, DOCS_KEY).chat.completions.create(model="llama3", messages=elephant + TOOL_ROUND, extra_headers=docs)
    oai(scoped, BOTH_KEY).chat.completions.create(model="llama3", messages=elephant + TOOL_ROUND, extra_headers=docs)
    rows = sorted(logged_rows(scoped.app, 5), key=lambda r: r["id"])
    assert [(r["client"], r["outcome"]) for r in rows] == [
        ("key1", "retrieved"), ("docs-team", "no_match"),
        ("both", "retrieved"), ("docs-team", "retrieved"), ("both", "cached")]


def test_a_reload_that_narrows_a_scope_applies_to_a_turn_already_cached(scoped, fake):
    turn = [{"role": "user", "content": "how to rotate the signing key"}]
    assert ask(scoped, BOTH_KEY, turn[0]["content"]) == "FOUND: " + CODE_FACT
    scoped.app.reload(ragproxy.Config.from_text(scoped_config(fake.url).replace("kbs: [docs, code]", "kbs: [docs]")))
    oai(scoped, BOTH_KEY).chat.completions.create(model="llama3", messages=turn + TOOL_ROUND)
    assert CODE_FACT not in fake.last.body.decode()
    with pytest.raises(openai.PermissionDeniedError):
        ask(scoped, BOTH_KEY, "x", model="llama3+code")


def test_stale_context_is_kept_per_scope(make_proxy, fake, tmp_path, monkeypatch):
    fake.secrets = [DOCS_FACT]
    proxy = make_proxy(scoped_config(fake.url, rag="  on_failure: use_stale\n"), data_dir=fill(tmp_path))
    proxy.app.knowledge_bases.index_all()
    question = "what does the purple elephant do"
    assert ask(proxy, API_KEY, question) == "FOUND: " + DOCS_FACT   # good context, kept for use_stale

    # The guide changes (a new generation: no cached search or render answers for it) while
    # the knowledge bases cannot be searched, as when their embedding server is down.
    guide = tmp_path / "documents" / "docs" / "guide.md"
    guide.write_text(guide.read_text() + "\n## Giraffes\n\nGiraffes are tall.\n")
    proxy.app.knowledge_bases.index_all()

    def unreachable(*args, **kwargs):
        raise EmbeddingError("embedding server unreachable")

    for kb in proxy.app.knowledge_bases.kbs.values():
        monkeypatch.setattr(kb, "search", unreachable)
    # Another scope (docs and code, the same KBs searched) has no stale context of its own: it fails closed.
    with pytest.raises(openai.APIStatusError) as info:
        ask(proxy, BOTH_KEY, question)
    assert info.value.status_code == 502 and info.value.body["code"] == "rag_retrieval_failed"
    assert ask(proxy, API_KEY, question) == "FOUND: " + DOCS_FACT   # the first scope's own, reused


def test_the_request_log_names_the_key_never_shows_it(scoped, fake):
    ask(scoped, DOCS_KEY, "what does the purple elephant do")
    req = urllib.request.Request(scoped.url + "/v1/chat/completions", method="POST", data=json.dumps(
        {"model": "llama3", "messages": [{"role": "user", "content": "hi"}]}).encode(),
        headers={"x-api-key": NO_KB_KEY, "Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=5):
        pass
    rows = logged_rows(scoped.app, 2)
    assert sorted(r["client"] for r in rows) == ["docs-team", "outsider"]
    text = json.dumps(rows)
    assert DOCS_KEY not in text and NO_KB_KEY not in text
