"""Retrieval end to end: real SDKs -> ragproxy (with knowledge bases) -> fake upstream.

The fake upstream answers "FOUND: <sentence>" only when that sentence reached
it, so a passing test proves the passage was retrieved and injected.
"""
import json
import urllib.error
import urllib.request

import anthropic
import openai
import pytest

import ragproxy
from _ragproxy import jsonbody
from conftest import API_KEY, proxy_config

SECRET = "the purple elephant sings at midnight"
OTHER = "the copper kettle whistles twice"

GUIDE = f"""# Operations guide

## Elephants

When asked about the elephant: {SECRET}. This is the only known fact about it.

## Kettles

Kitchen trivia: {OTHER}.
"""

CODE = '''"""Key rotation helpers."""


def rotate_signing_key(store, days=90):
    """Rotate the signing key after ``days``; the old key stays valid for verification."""
    return store.rotate(days)
'''


def kb_config(fake_url, kbs="docs", extra_kb="", rag="", model_extra=""):
    extra = f"""
knowledge_bases:
  docs:
    retrieval: lexical
  code:
    retrieval: lexical
{extra_kb}
rag:
  top_k: 3
{rag}
"""
    text = proxy_config(fake_url, extra=extra)
    return text.replace('  - {name: "*", upstream: [ol, oa]}',
                        f'  - {{name: "*", upstream: [ol, oa], kb: [{kbs}]{model_extra}}}')


@pytest.fixture
def data_dir(tmp_path):
    docs = tmp_path / "documents" / "docs"
    docs.mkdir(parents=True)
    (docs / "guide.md").write_text(GUIDE)
    code = tmp_path / "documents" / "code"
    code.mkdir(parents=True)
    (code / "keys.py").write_text(CODE)
    return tmp_path


@pytest.fixture
def rag_proxy(make_proxy, fake, data_dir):
    fake.secrets = [SECRET, OTHER, "rotate_signing_key"]
    p = make_proxy(kb_config(fake.url), data_dir=data_dir)
    p.app.knowledge_bases.index_all()
    return p


def _openai(p):
    return openai.OpenAI(base_url=p.url + "/v1", api_key=API_KEY, max_retries=0)


def test_openai_chat_gets_the_passage(rag_proxy, fake):
    raw = _openai(rag_proxy).chat.completions.with_raw_response.create(
        model="llama3", messages=[{"role": "system", "content": "be brief"},
                                  {"role": "user", "content": "What does the purple elephant do?"}])
    assert raw.parse().choices[0].message.content == "FOUND: " + SECRET
    sources = raw.headers["x-ragproxy-sources"].split(",")
    assert sources and all(sources)
    sent = fake.last.json["messages"]
    assert sent[0] == {"role": "system", "content": "be brief"}  # the client's system prompt untouched
    assert sent[-1]["content"].endswith("What does the purple elephant do?")


def test_anthropic_stream_gets_the_passage(rag_proxy, fake):
    client = anthropic.Anthropic(base_url=rag_proxy.url, api_key=API_KEY, max_retries=0)
    with client.messages.stream(model="llama3", max_tokens=64,
                                system=[{"type": "text", "text": "x-anthropic-billing-header: cc_version=1"},
                                        {"type": "text", "text": "You are Claude Code.",
                                         "cache_control": {"type": "ephemeral"}}],
                                messages=[{"role": "user", "content": [
                                    {"type": "text", "text": "<system-reminder>ctx</system-reminder>"},
                                    {"type": "text", "text": "what does the elephant sing"}]}]) as stream:
        assert "".join(stream.text_stream) == "FOUND: " + SECRET
    system = fake.last.json["system"]
    assert system[0]["text"].startswith("x-anthropic-billing-header")  # first block stays first
    assert len(system) == 2


def test_responses_and_ollama_get_the_passage(rag_proxy, fake):
    resp = _openai(rag_proxy).responses.create(model="llama3", input="tell me about the purple elephant")
    assert resp.output_text == "FOUND: " + SECRET
    fake.secrets = [OTHER]
    req = urllib.request.Request(rag_proxy.url + "/api/chat", method="POST", data=json.dumps(
        {"model": "llama3", "stream": False,
         "messages": [{"role": "user", "content": "which kettle whistles"}]}).encode(),
        headers={"Authorization": "Bearer " + API_KEY})
    with urllib.request.urlopen(req, timeout=5) as r:
        assert json.loads(r.read())["message"]["content"] == "FOUND: " + OTHER


def test_injection_leaves_every_other_byte_of_the_body_as_sent(rag_proxy, fake):
    """Only the turn that gets the passage is encoded again; the client's spacing, number
    forms and escapes elsewhere (what a provider's prompt cache keys on) reach the upstream."""
    head = (b'{"model": "llama3", "max_tokens": 64, "temperature": 1.50,\n "system": [{"type": "text", '
            b'"text": "caf\\u00e9"}],\n "messages": [{"role": "user", "content": "hi"}, '
            b'{"role": "assistant", "content": [{"type": "text", "text": "1e400"}]}, ')
    turn = b'{"role": "user", "content": "what does the purple elephant do?"}'
    tail = b'],\n "metadata": {"user_id": "u-1"}}'
    req = urllib.request.Request(rag_proxy.url + "/v1/messages", method="POST", data=head + turn + tail,
                                 headers={"x-api-key": API_KEY, "anthropic-version": "2023-06-01"})
    with urllib.request.urlopen(req, timeout=5) as r:
        assert SECRET in r.read().decode()
    sent = fake.last.body
    assert sent.startswith(head) and sent.endswith(tail)
    injected = json.loads(sent[len(head):-len(tail)])
    assert injected["role"] == "user" and injected["content"].endswith("what does the purple elephant do?")
    assert SECRET in injected["content"]


def test_kb_header_off_and_model_suffix(rag_proxy, fake):
    client = _openai(rag_proxy)
    off = client.chat.completions.create(model="llama3", messages=[{"role": "user", "content": "purple elephant?"}],
                                         extra_headers={"X-Ragproxy-KB": "off"})
    assert off.choices[0].message.content == "ECHO: purple elephant?"
    assert "x-ragproxy-kb" not in fake.last.headers
    # "model+kb" picks the code KB ad hoc; the suffix never reaches the upstream
    reply = client.chat.completions.create(model="llama3+code",
                                           messages=[{"role": "user", "content": "how to rotate the signing key"}])
    assert reply.choices[0].message.content == "FOUND: rotate_signing_key"
    assert fake.last.json["model"] == "llama3"


def test_unknown_kb_in_header_is_400(rag_proxy, fake):
    with pytest.raises(openai.BadRequestError) as info:
        _openai(rag_proxy).chat.completions.create(model="llama3", messages=[{"role": "user", "content": "x"}],
                                                   extra_headers={"X-Ragproxy-KB": "nope"})
    assert info.value.body["code"] == "unknown_knowledge_base"
    assert fake.requests == []


def test_no_match_forwards_unchanged(rag_proxy, fake):
    body = {"model": "llama3", "messages": [{"role": "user", "content": "zzzqqq xyzzy"}]}
    raw = _openai(rag_proxy).chat.completions.with_raw_response.create(**body)
    assert "x-ragproxy-sources" not in raw.headers
    assert fake.last.json["messages"] == body["messages"]


def test_agent_loop_prefixes_are_byte_identical(rag_proxy, fake, data_dir):
    """Tool rounds of one human turn re-inject the same bytes at the same place."""
    client = _openai(rag_proxy)
    tools = [{"type": "function", "function": {"name": "read_file", "parameters": {"type": "object",
                                                                                  "properties": {}}}}]
    messages = [{"role": "system", "content": "agent"},
                {"role": "user", "content": "What does the purple elephant do? CALL_TOOL"}]
    first = client.chat.completions.create(model="llama3", messages=messages, tools=tools)
    call = first.choices[0].message.tool_calls[0]
    bodies = [fake.last.body]
    # The KB changes mid-turn: the turn still sees what it saw first.
    (data_dir / "documents" / "docs" / "guide.md").write_text(GUIDE.replace("midnight", "noon"))
    rag_proxy.app.knowledge_bases.index_all()
    for round_ in range(2):
        messages = messages + [{"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
                               {"role": "tool", "tool_call_id": call.id, "content": f"file contents {round_}"}]
        client.chat.completions.create(model="llama3", messages=messages, tools=tools)
        bodies.append(fake.last.body)
    for earlier, later in zip(bodies, bodies[1:]):
        members, _ = jsonbody._json_members(earlier.decode(), 0)
        close = members["messages"][1] - 1  # the earlier message list's closing bracket
        assert later.startswith(earlier[:close])  # every byte before it, the injected turn included
    # A new human turn retrieves afresh and sees the edit.
    fresh = client.chat.completions.create(model="llama3", messages=messages + [
        {"role": "assistant", "content": "done"},
        {"role": "user", "content": "And the purple elephant, again?"}])
    assert fresh.choices[0].message.content
    assert "sings at noon" in fake.last.json["messages"][-1]["content"]


def test_a_reload_applies_turn_cache_size_at_once(make_proxy, fake, data_dir):
    fake.secrets = [SECRET]
    proxy = make_proxy(kb_config(fake.url), data_dir=data_dir)
    proxy.app.knowledge_bases.index_all()
    client = _openai(proxy)
    turn = [{"role": "user", "content": "What does the purple elephant do?"}]

    def injected():
        client.chat.completions.create(model="llama3", messages=turn)
        return fake.last.json["messages"][-1]["content"]

    assert "sings at midnight" in injected()
    (data_dir / "documents" / "docs" / "guide.md").write_text(GUIDE.replace("midnight", "noon"))
    proxy.app.knowledge_bases.index_all()
    assert "sings at midnight" in injected()   # the same human turn: served from the per-turn cache
    proxy.app.reload(ragproxy.Config.from_text(kb_config(fake.url, rag="  turn_cache_size: 0\n")))
    assert len(proxy.app.retriever.turns) == 0
    assert "sings at noon" in injected()       # no cache now: retrieved again, and the edit shows
    assert len(proxy.app.retriever.turns) == 0


def _failing_embedding_config(fake, policy, port=9):
    extra_kb = """  vec:
    retrieval: hybrid
    embedding: emb
"""
    text = kb_config(fake.url, kbs="vec", extra_kb=extra_kb, rag=f"  on_failure: {policy}\n")
    return text.replace("  embedding: {}", "").replace(
        "providers:\n", f'providers:\n  embedding:\n    emb: {{type: openai, base_url: "{fake.url}/v1", '
                        f'model: fake-embed, read_timeout: 2}}\n', 1)


def _vec_dir(data_dir):
    vec = data_dir / "documents" / "vec"
    vec.mkdir(parents=True, exist_ok=True)
    (vec / "guide.md").write_text(GUIDE)
    return data_dir


@pytest.mark.parametrize("compact", ["", "binary"])
def test_dense_hybrid_with_an_embedding_server(make_proxy, fake, data_dir, compact):
    fake.secrets = [SECRET]
    config = _failing_embedding_config(fake, "degrade")
    if compact:  # sign-bit codes scanned first, then re-scored in float32
        config = config.replace("    embedding: emb\n", f"    embedding: emb\n    compact: {compact}\n", 1)
    p = make_proxy(config, data_dir=_vec_dir(data_dir))
    p.app.knowledge_bases.index_all()
    generation, _ = p.app.knowledge_bases.get("vec").current()
    assert generation.compact_kind == ("b1" if compact else None)
    assert any(r.path == "/v1/embeddings" for r in fake.requests)
    hits = p.app.knowledge_bases.get("vec").search("purple elephant midnight", 2)
    assert set(hits[0].scores) == {"lexical", "dense", "fused"}  # default fusion: zscore
    reply = _openai(p).chat.completions.create(model="llama3", messages=[
        {"role": "user", "content": "what does the purple elephant do"}])
    assert reply.choices[0].message.content == "FOUND: " + SECRET


@pytest.mark.parametrize("policy", ["degrade", "fail_closed", "use_stale"])
def test_failure_policies(make_proxy, fake, data_dir, policy):
    fake.secrets = [SECRET]
    p = make_proxy(_failing_embedding_config(fake, policy), data_dir=_vec_dir(data_dir))
    p.app.knowledge_bases.index_all()
    client = _openai(p)
    question = [{"role": "user", "content": "what does the purple elephant do"}]
    assert client.chat.completions.create(model="llama3", messages=question).choices[0].message.content \
        == "FOUND: " + SECRET
    fake.fail_next(500, path="/v1/embeddings", count=5)
    again = [{"role": "user", "content": "what does the purple elephant do, once more"}]
    if policy == "fail_closed":
        with pytest.raises(openai.APIStatusError) as info:
            client.chat.completions.create(model="llama3", messages=again)
        assert info.value.status_code == 502 and info.value.body["code"] == "rag_retrieval_failed"
        assert not any(r.path == "/v1/chat/completions" and "once more" in r.body.decode()
                       for r in fake.requests)
    elif policy == "degrade":
        reply = client.chat.completions.create(model="llama3", messages=again)
        assert reply.choices[0].message.content.startswith("ECHO")  # forwarded unchanged
        assert fake.last.json["messages"] == again
    else:
        # a different query: no stale context for it, so the request fails closed
        with pytest.raises(openai.APIStatusError):
            client.chat.completions.create(model="llama3", messages=again)
        # the same query as before (new turn): the last good context is reused
        reply = client.chat.completions.create(model="llama3", messages=[
            {"role": "assistant", "content": "earlier"}] + question)
        assert reply.choices[0].message.content == "FOUND: " + SECRET


def test_rerank_reorders_and_falls_back(make_proxy, fake, data_dir):
    text = kb_config(fake.url, kbs="docs", model_extra=", rerank: true").replace(
        "  rerank: {}", "") .replace("providers:\n", f'providers:\n  rerank:\n    rr: {{type: openai, base_url: '
                                                    f'"{fake.url}/v1", model: fake-rerank}}\n', 1)
    p = make_proxy(text, data_dir=data_dir)
    p.app.knowledge_bases.index_all()
    route = p.app.resolve_route("llama3")
    hits = p.app.retriever.search(["docs"], "copper kettle whistles", route)
    assert fake.last.path == "/v1/rerank"
    assert "rerank" in hits[0].scores and OTHER in hits[0].chunk["text"]
    fake.fail_next(503, path="/v1/rerank")
    fallback = p.app.retriever.search(["docs"], "copper kettle whistles", route)
    assert fallback and "rerank" not in fallback[0].scores  # fused order kept
    fake.fail_next(401, path="/v1/rerank")
    p.app.retriever.search(["docs"], "copper kettle", route)
    calls = len([r for r in fake.requests if r.path == "/v1/rerank"])
    p.app.retriever.search(["docs"], "copper kettle", route)
    assert len([r for r in fake.requests if r.path == "/v1/rerank"]) == calls  # disabled after a 401


@pytest.mark.parametrize("merge", ["priority", "concat", "rrf"])
def test_kb_merge_modes(make_proxy, fake, data_dir, merge):
    text = kb_config(fake.url, kbs="docs, code", model_extra=f", kb_merge: {merge}")
    p = make_proxy(text, data_dir=data_dir)
    p.app.knowledge_bases.index_all()
    route = p.app.resolve_route("llama3")
    hits = p.app.retriever.search(["docs", "code"], "rotate the signing key elephant", route, top_k=3)
    kbs = [h.kb for h in hits]
    assert set(kbs) <= {"docs", "code"} and len({h.id for h in hits}) == len(hits)
    if merge == "priority":
        assert kbs[0] == "docs"  # the first KB's results come first
    else:
        assert "code" in kbs  # merged across KBs


# -- tiktoken never reaches the internet -------------------------------------------

class _FakeTiktoken:
    """Stands in for the tiktoken module: records whether an encoding was asked for
    (the real get_encoding downloads the file when it is not cached)."""

    def __init__(self):
        self.asked = []

    def get_encoding(self, name):
        self.asked.append(name)

        class Encoding:
            @staticmethod
            def encode(text, disallowed_special=()):
                return text.split()
        return Encoding()


def test_tiktoken_without_a_cached_encoding_is_not_asked_for_it(tmp_path):
    from _ragproxy.retrieval import _tiktoken_counter
    fake = _FakeTiktoken()
    assert _tiktoken_counter(fake, {"TIKTOKEN_CACHE_DIR": str(tmp_path)}) is None
    assert _tiktoken_counter(fake, {"TIKTOKEN_CACHE_DIR": ""}) is None  # tiktoken's "no cache"
    assert fake.asked == []


def test_tiktoken_with_its_cached_encoding_counts_exactly(tmp_path):
    import hashlib
    import os

    from _ragproxy.retrieval import _tiktoken_cache_file, _tiktoken_counter
    environ = {"DATA_GYM_CACHE_DIR": str(tmp_path)}
    path = _tiktoken_cache_file(environ)
    assert os.path.dirname(path) == str(tmp_path)
    with open(path, "wb") as f:
        f.write(b"the encoding file")
    fake = _FakeTiktoken()
    # A file that fails the published hash is one tiktoken would download again.
    assert _tiktoken_counter(fake, environ) is None and fake.asked == []
    count = _tiktoken_counter(fake, environ, expected_sha256=hashlib.sha256(b"the encoding file").hexdigest())
    assert fake.asked == ["cl100k_base"] and count("three words here") == 3
