"""Retrieval end to end: real SDKs -> ragproxy (with knowledge bases) -> fake upstream.

The fake upstream answers "FOUND: <sentence>" only when that sentence reached
it, so a passing test proves the passage was retrieved and injected.
"""
import copy
import dataclasses
import json
import logging
import re
import socket
import types
import urllib.error
import urllib.request

import anthropic
import openai
import pytest

import ragproxy
from _ragproxy import embeddings, jsonbody, retrieval
from conftest import API_KEY, logged_rows, proxy_config

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
    question = [{"role": "user", "content": "What does the purple elephant do?"}]
    tool_round = question + [  # a later round of the same human turn
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "read_file", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "file contents"}]

    def injected(messages):
        client.chat.completions.create(model="llama3", messages=messages)
        return fake.last.json["messages"][0]["content"]

    assert "sings at midnight" in injected(question)
    (data_dir / "documents" / "docs" / "guide.md").write_text(GUIDE.replace("midnight", "noon"))
    proxy.app.knowledge_bases.index_all()
    assert "sings at midnight" in injected(tool_round)   # the same human turn: served from the per-turn cache
    proxy.app.reload(ragproxy.Config.from_text(kb_config(fake.url, rag="  turn_cache_size: 0\n")))
    assert len(proxy.app.retriever.turns) == 0
    assert "sings at noon" in injected(tool_round)       # no cache now: retrieved again, and the edit shows
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
    # A question half of which each KB answers: both KBs pass the floor.
    text = kb_config(fake.url, kbs="docs, code", model_extra=f", kb_merge: {merge}")
    p = make_proxy(text, data_dir=data_dir)
    p.app.knowledge_bases.index_all()
    route = p.app.resolve_route("llama3")
    hits = p.app.retriever.search(["docs", "code"], "rotate signing key purple elephant sings midnight", route,
                                  top_k=3)
    kbs = [h.kb for h in hits]
    assert set(kbs) == {"docs", "code"} and len({h.id for h in hits}) == len(hits)
    if merge == "priority":
        assert kbs[0] == "docs"  # the first KB's results come first


# -- several knowledge bases: relevance decides, not the list order ------------------

CMAKE_DOCS = {
    "cxx_standard.md": "# CXX standard\n\ncmake language standard: set CMAKE_CXX_STANDARD to choose the language "
                       "standard of a target.\n",
    "c_standard.md": "# C standard\n\ncmake language standard for C sources: CMAKE_C_STANDARD.\n",
    "required.md": "# Required\n\ncmake language standard required: CMAKE_CXX_STANDARD_REQUIRED makes the standard "
                   "a requirement.\n",
    "extensions.md": "# Extensions\n\ncmake language extensions: CMAKE_CXX_EXTENSIONS turns off compiler extensions "
                     "of the language standard.\n",
    "minimum.md": "# Minimum version\n\ncmake_minimum_required declares which cmake language version and standard "
                  "policies apply.\n",
}
_NUMPY_TOPICS = ["reshape returns a view of the array", "concatenate joins arrays along an axis",
                 "argsort gives the sorting indices", "linspace spaces numbers evenly",
                 "einsum sums over labelled axes", "fft computes the discrete fourier transform",
                 "polyfit fits a polynomial by least squares", "histogram counts values into bins",
                 "meshgrid builds coordinate grids", "cumsum returns running totals",
                 "where picks from two arrays", "unique returns sorted distinct values"]
NUMPY_DOCS = dict({f"topic{i:02d}.md": f"# Topic {i}\n\nnumpy {t}.\n" for i, t in enumerate(_NUMPY_TOPICS)}, **{
    # Rare in this KB, so their raw BM25 scores beat every cmake chunk's; but they match
    # the question's commonest words only, and it is mostly about cmake.
    "std.md": "# std\n\nnumpy std: the standard deviation, a standard measure of spread; standard error is related.\n",
    "printoptions.md": "# printoptions\n\nnumpy set_printoptions: the setting that chooses how arrays print.\n",
    "language.md": "# dtype\n\nnumpy dtype language: the standard dtype names.\n",
})
CMAKE_QUESTION = "which cmake setting chooses the language standard"


def _two_kb_proxy(make_proxy, fake, tmp_path, folders, model_kbs, merge=None, retrieval="lexical"):
    """A proxy whose llama3 model searches ``model_kbs``, in that order; ``folders``: kb -> {file: text}.
    Dense and hybrid KBs embed with the fake upstream's word hashing."""
    for kb, files in folders.items():
        folder = tmp_path / "documents" / kb
        folder.mkdir(parents=True)
        for name, text in files.items():
            (folder / name).write_text(text)
    embedding = "" if retrieval == "lexical" else "    embedding: emb\n"
    declared = "".join(f"  {kb}:\n    retrieval: {retrieval}\n{embedding}" for kb in folders)
    text = proxy_config(fake.url, extra=f"knowledge_bases:\n{declared}rag:\n  top_k: 3\n")
    if embedding:
        text = text.replace("providers:\n", f'providers:\n  embedding:\n    emb: {{type: openai, base_url: '
                                              f'"{fake.url}/v1", model: fake-embed}}\n', 1)
    text = text.replace('  - {name: "*", upstream: [ol, oa]}', f'  - {{name: "*", upstream: [ol, oa], kb: '
                        f'[{", ".join(model_kbs)}]{f", kb_merge: {merge}" if merge else ""}}}')
    p = make_proxy(text, data_dir=tmp_path)
    p.app.knowledge_bases.index_all()
    return p


@pytest.mark.parametrize("merge", ["priority", "concat", "rrf"])
def test_a_weak_kb_listed_first_takes_no_slot_from_a_strong_one(make_proxy, fake, tmp_path, merge):
    # Before, priority gave numpy (listed first) every slot, concat sorted numpy's higher raw
    # BM25 scores first and rrf alternated the two lists.
    p = _two_kb_proxy(make_proxy, fake, tmp_path, {"cmake": CMAKE_DOCS, "numpy": NUMPY_DOCS}, ["numpy", "cmake"],
                      merge)
    alone = p.app.knowledge_bases.get("numpy").search(CMAKE_QUESTION, 3)
    assert len(alone) == 3   # numpy does match the question on its own
    hits = p.app.retriever.search(["numpy", "cmake"], CMAKE_QUESTION, p.app.resolve_route("llama3"))
    assert [h.kb for h in hits] == ["cmake"] * 3
    assert hits[0].chunk["source"] == "cmake/cxx_standard.md"


def test_hybrid_kbs_weigh_their_matches_on_one_scale(make_proxy, fake, tmp_path):
    # Each hit's share of the question (lexical) and its cosine (dense), averaged.
    p = _two_kb_proxy(make_proxy, fake, tmp_path, {"cmake": CMAKE_DOCS, "numpy": NUMPY_DOCS}, ["numpy", "cmake"],
                      retrieval="hybrid")
    assert len(p.app.knowledge_bases.get("numpy").search(CMAKE_QUESTION, 3)) == 3
    hits = p.app.retriever.search(["numpy", "cmake"], CMAKE_QUESTION, p.app.resolve_route("llama3"))
    assert [h.kb for h in hits] == ["cmake"] * 3
    assert hits[0].chunk["source"] == "cmake/cxx_standard.md"


def test_dense_kbs_are_merged_on_their_cosines(make_proxy, fake, tmp_path):
    # The fake embedder hashes words, so numpy's "setting ... chooses" is as near the
    # question as cmake's passages: both KBs pass the floor, and their hits interleave.
    p = _two_kb_proxy(make_proxy, fake, tmp_path, {"cmake": CMAKE_DOCS, "numpy": NUMPY_DOCS}, ["numpy", "cmake"],
                      retrieval="dense")
    both = [h for kb in ("numpy", "cmake") for h in p.app.knowledge_bases.get(kb).search(CMAKE_QUESTION, 3)]
    hits = p.app.retriever.search(["numpy", "cmake"], CMAKE_QUESTION, p.app.resolve_route("llama3"))
    assert [h.id for h in hits] == [h.id for h in sorted(both, key=lambda h: -h.scores["dense"])[:3]]
    assert {h.kb for h in hits} == {"numpy", "cmake"}


def test_by_default_a_request_gets_the_passages_of_the_kb_that_matched(make_proxy, fake, tmp_path):
    p = _two_kb_proxy(make_proxy, fake, tmp_path, {"cmake": CMAKE_DOCS, "numpy": NUMPY_DOCS}, ["numpy", "cmake"])
    assert p.app.resolve_route("llama3").kb_merge == "concat"
    fake.secrets = ["set CMAKE_CXX_STANDARD to choose"]
    raw = _openai(p).chat.completions.with_raw_response.create(
        model="llama3", messages=[{"role": "user", "content": CMAKE_QUESTION}])
    assert raw.parse().choices[0].message.content == "FOUND: set CMAKE_CXX_STANDARD to choose"
    sent = fake.last.json["messages"][-1]["content"]
    assert "cmake/cxx_standard.md" in sent and "numpy/" not in sent
    assert len(raw.headers["x-ragproxy-sources"].split(",")) == 3


ZEBRA_ONE = {"notes.md": "# Notes\n\nzebra stripes.\n", "other.md": "# Other\n\nlion mane.\n"}
ZEBRA_TWO = {"notes.md": "# Notes\n\nzebra hooves.\n", "other.md": "# Other\n\ntiger claws.\n"}


@pytest.mark.parametrize("merge", ["priority", "concat", "rrf"])
@pytest.mark.parametrize("order", [["one", "two"], ["two", "one"]])
def test_equally_relevant_kbs_tie_to_the_kb_listed_first(make_proxy, fake, tmp_path, merge, order):
    p = _two_kb_proxy(make_proxy, fake, tmp_path, {"one": ZEBRA_ONE, "two": ZEBRA_TWO}, order, merge)
    route = p.app.resolve_route("llama3")
    hits = p.app.retriever.search(order, "zebra", route)
    assert [h.kb for h in hits] == order   # the same score in both, so the list order decides
    assert [h.id for h in p.app.retriever.search(order, "zebra", route)] == [h.id for h in hits]


@pytest.mark.parametrize("merge", ["priority", "concat"])
def test_priority_keeps_the_list_order_for_a_kb_above_the_floor(make_proxy, fake, tmp_path, merge):
    # "one" matches a little less well (a longer passage) but well within the floor:
    # priority still serves it first, as listed; concat puts the better match first.
    one = dict(ZEBRA_ONE, **{"notes.md": "# Notes\n\nzebra stripes run from the neck down to the hooves.\n"})
    p = _two_kb_proxy(make_proxy, fake, tmp_path, {"one": one, "two": ZEBRA_TWO}, ["one", "two"], merge)
    scores = [p.app.knowledge_bases.get(kb).search("zebra", 1)[0].score for kb in ("one", "two")]
    assert scores[0] < scores[1]
    hits = p.app.retriever.search(["one", "two"], "zebra", p.app.resolve_route("llama3"))
    assert [h.kb for h in hits] == (["one", "two"] if merge == "priority" else ["two", "one"])


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


# -- the per-turn cache serves later rounds of a turn only ---------------------------

ZEBRA = "the zebrafish heart regrows within sixty days"
TOOL_ROUND = [{"role": "assistant", "content": None, "tool_calls": [
                  {"id": "call_1", "type": "function", "function": {"name": "read_file", "arguments": "{}"}}]},
              {"role": "tool", "tool_call_id": "call_1", "content": "file contents"}]


def _sent_turn(client, fake, messages):
    """What the upstream got as the human turn (the first user message) of ``messages``."""
    client.chat.completions.create(model="llama3", messages=messages)
    return next(m["content"] for m in fake.last.json["messages"] if m["role"] == "user")


def test_a_new_chat_asking_an_old_question_sees_a_document_added_since(rag_proxy, fake, data_dir):
    client = _openai(rag_proxy)
    chat = [{"role": "user", "content": "How fast does the zebrafish heart regrow?"}]
    assert ZEBRA not in _sent_turn(client, fake, chat)
    (data_dir / "documents" / "docs" / "zebrafish.md").write_text(f"# Zebrafish\n\nFact: {ZEBRA}.\n")
    rag_proxy.app.knowledge_bases.index_all()
    assert ZEBRA not in _sent_turn(client, fake, chat + TOOL_ROUND)  # the first chat's turn goes on as it began
    assert ZEBRA in _sent_turn(client, fake, chat)                   # a new chat, the same question


def test_a_no_match_while_the_kb_was_empty_is_not_kept_for_a_new_chat(make_proxy, fake, tmp_path):
    for name in ("docs", "code"):
        (tmp_path / "documents" / name).mkdir(parents=True)
    p = make_proxy(kb_config(fake.url), data_dir=tmp_path)
    p.app.knowledge_bases.index_all()
    client = _openai(p)
    chat = [{"role": "user", "content": "How fast does the zebrafish heart regrow?"}]
    assert _sent_turn(client, fake, chat) == chat[0]["content"]  # nothing to inject yet
    (tmp_path / "documents" / "docs" / "zebrafish.md").write_text(f"# Zebrafish\n\nFact: {ZEBRA}.\n")
    p.app.knowledge_bases.index_all()
    assert _sent_turn(client, fake, chat + TOOL_ROUND) == chat[0]["content"]  # its tool round: still nothing
    assert ZEBRA in _sent_turn(client, fake, chat)


# -- the retrieval time limit: an embedding server that never answers ----------------

@pytest.fixture
def silent_server():
    """The URL of a server socket on port 0 that takes connections and never answers.

    The kernel completes each handshake and buffers the request; nothing ever
    reads it.  Closing the socket at the end resets those connections.
    """
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    yield "http://127.0.0.1:%d" % listener.getsockname()[1]
    listener.close()


def _embedding_config(fake, policy, embed_url, embed_model="fake-embed", rag="", model_extra=""):
    """The vec (hybrid) KB on embedding provider emb at ``embed_url``, its timeouts the defaults."""
    extra_kb = "  vec:\n    retrieval: hybrid\n    embedding: emb\n"
    text = kb_config(fake.url, kbs="vec", extra_kb=extra_kb, rag=f"  on_failure: {policy}\n{rag}",
                     model_extra=model_extra)
    return text.replace("providers:\n", f'providers:\n  embedding:\n    emb: {{type: openai, base_url: "{embed_url}", '
                                        f'model: {embed_model}}}\n', 1)


def _indexed_then_moved(make_proxy, fake, data_dir, policy, embed_url, **kwargs):
    """A proxy whose vec KB was indexed through the fake's embeddings, reloaded with the
    provider moved to ``embed_url``.  Another model name there, so that no query vector
    cached for fake-embed stands in for asking it."""
    p = make_proxy(_embedding_config(fake, policy, fake.url + "/v1", **kwargs), data_dir=_vec_dir(data_dir))
    p.app.knowledge_bases.index_all()
    moved = _embedding_config(fake, policy, embed_url + "/v1", embed_model="moved-embed", **kwargs)
    return p, lambda: p.app.reload(ragproxy.Config.from_text(moved))


@pytest.mark.parametrize("policy", ["degrade", "fail_closed", "use_stale"])
def test_a_hung_embedding_server_costs_a_request_no_more_than_the_time_limit(make_proxy, fake, data_dir,
                                                                           silent_server, policy):
    """read_timeout is the default 600 s; rag.timeout_ms (or, for fail_closed, the model's
    timeout_ms under a long rag.timeout_ms) is 300.  The SDK gives up after 30 s, so a
    proxy that waits for the provider's own timeout fails the test."""
    fake.secrets = [SECRET]
    if policy == "fail_closed":
        limits = {"rag": "  timeout_ms: 120000\n", "model_extra": ", timeout_ms: 300"}
    else:
        limits = {"rag": "  timeout_ms: 300\n"}
    p, hang = _indexed_then_moved(make_proxy, fake, data_dir, policy, silent_server, **limits)
    client = openai.OpenAI(base_url=p.url + "/v1", api_key=API_KEY, max_retries=0, timeout=30)
    known = [{"role": "user", "content": "what does the purple elephant do"}]
    assert client.chat.completions.create(model="llama3", messages=known).choices[0].message.content \
        == "FOUND: " + SECRET
    hang()
    new = [{"role": "user", "content": "which purple animal sings"}]
    if policy == "degrade":
        reply = client.chat.completions.create(model="llama3", messages=new)
        assert reply.choices[0].message.content.startswith("ECHO") and fake.last.json["messages"] == new
    else:
        with pytest.raises(openai.APIStatusError) as info:
            client.chat.completions.create(model="llama3", messages=new)
        assert info.value.status_code == 502 and info.value.body["code"] == "rag_retrieval_failed"
        assert not any("purple animal" in r.body.decode() for r in fake.requests)
    if policy == "use_stale":  # a new chat asking the question answered before: its last good context
        reply = client.chat.completions.create(model="llama3", messages=known)
        assert reply.choices[0].message.content == "FOUND: " + SECRET
    outcomes = [row["outcome"] for row in logged_rows(p.app, 3 if policy == "use_stale" else 2)][::-1]  # oldest first
    assert outcomes == {"degrade": ["retrieved", "degraded"], "fail_closed": ["retrieved", "failed"],
                        "use_stale": ["retrieved", "failed", "stale"]}[policy]


def test_no_knowledge_base_is_searched_once_the_time_limit_has_passed(rag_proxy):
    ticks = iter([0.0, 0.1, 1.0])  # made; before code, 0.2 s left; before docs, none
    limit = embeddings.Deadline(0.3, lambda: next(ticks))
    with pytest.raises(Exception, match=r"time limit \(300 ms\) ran out before knowledge base 'docs'"):
        # code has nothing on elephants, so the priority merge goes on to docs
        rag_proxy.app.retriever.search(["code", "docs"], "purple elephant", rag_proxy.app.resolve_route("llama3"),
                                       deadline=limit)


# -- what a fail_closed error tells the client ---------------------------------------

def test_a_turns_human_message_sent_again_as_it_was_is_not_encoded_again(make_proxy, fake, data_dir):
    """From an agent loop's third round on, the turn's human message, which the client sends
    byte for byte as in the round before, goes upstream as the JSON text that round's got (its
    _Turn keeps it).  The cache marker Claude Code moves off it in the second round makes that
    round's message another text, which is encoded for itself."""
    fake.secrets = [SECRET]
    proxy = make_proxy(kb_config(fake.url), data_dir=data_dir)
    proxy.app.knowledge_bases.index_all()
    marker = {"type": "ephemeral"}

    def loop(rounds):   # the human turn, then tool rounds; the marker on the newest message
        words = {"type": "text", "text": "What does the purple elephant do?"}
        messages = [{"role": "user", "content": [
            {"type": "text", "text": "<system-reminder>\nBe brief.\n</system-reminder>"},
            dict(words, cache_control=marker) if not rounds else words]}]
        for r in range(rounds):
            result = {"type": "tool_result", "tool_use_id": f"t{r}", "content": "ok"}
            messages += [{"role": "assistant", "content": [{"type": "tool_use", "id": f"t{r}", "name": "Read",
                                                            "input": {}}]},
                         {"role": "user", "content": [dict(result, cache_control=marker) if r == rounds - 1
                                                      else result]}]
        return {"model": "llama3", "max_tokens": 64, "system": "Be exact.", "messages": messages}

    def send(rounds):
        status, _ = _raw_post(proxy.url, "/v1/messages", loop(rounds), {"anthropic-version": "2023-06-01"})
        assert status == 200 and fake.last.body.count(SECRET.encode()) == 1
        return fake.last.json["messages"][0]

    human = [send(rounds) for rounds in range(4)]
    assert [row["outcome"] for row in logged_rows(proxy.app, 4)][::-1] == ["retrieved"] + ["cached"] * 3
    assert "cache_control" in human[0]["content"][-1]
    assert human[1] == human[2] == human[3] == dict(human[0], content=[
        {k: v for k, v in part.items() if k != "cache_control"} for part in human[0]["content"]])
    (turn,) = proxy.app.retriever.turns._data.values()
    (path,) = turn.sent_texts
    sent, text, entry, encoded = turn.sent_texts[path]
    assert path == ("messages", 0) and b"cache_control" not in sent and json.loads(encoded) == entry == human[3]
    # What the next round sends upstream is that text, not the message encoded again:
    kept = encoded.replace("What does the purple", "What does the kept")
    assert kept != encoded
    turn.sent_texts[path] = turn.sent_texts[path]._replace(json=kept)
    assert send(3) == json.loads(kept) and send(0) == human[0]


def test_a_kept_entry_goes_back_in_without_inject_running_again():
    """inject_retrieved with a turn's ``sent_texts``: where the client sends the human message
    as the round before did, the entry that round made is put back, that very object, with its
    JSON text for the splice; a message sent otherwise is injected into again."""
    def a_round(reminder, kept):
        body = json.dumps({"model": "m", "max_tokens": 8, "messages": [
            {"role": "user", "content": [{"type": "text", "text": f"<system-reminder>{reminder}</system-reminder>"},
                                         {"type": "text", "text": "Why does it fail?"}]},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "Read", "input": {}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": "ok"}]}]}).encode()
        exchange = types.SimpleNamespace(
            endpoint=types.SimpleNamespace(name="messages"), payload=json.loads(body),
            route=types.SimpleNamespace(inject_mode="before_last_user"), members=jsonbody.Members(body, ("messages",)),
            request=types.SimpleNamespace(body=body), edits=(), changed=False, encoded=None)
        sent = exchange.payload["messages"]
        assert retrieval.inject_retrieved(exchange, found, sent_texts=kept) == (("messages", 0),)
        entry = exchange.payload["messages"][0]
        assert exchange.payload["messages"] is not sent and sent[0]["content"][0]["text"].endswith(
            "</system-reminder>")
        value, text = exchange.encoded[("messages", 0)]
        assert value is entry and json.loads(text) == entry
        assert entry["content"][1] == {"type": "text", "text": found.text}
        return entry

    found = retrieval.Retrieved(text="[1] notes.md\nIt fails when the cache is cold.", sources=("n",),
                                outcome="retrieved")
    kept = {}
    first = a_round("Be brief.", kept)
    assert list(kept) == [("messages", 0)] and kept[("messages", 0)].entry is first
    assert a_round("Be brief.", kept) is first
    other = a_round("Be exact.", kept)
    assert other is not first and other["content"][0]["text"] == "<system-reminder>Be exact.</system-reminder>"
    assert kept[("messages", 0)].entry is other and a_round("Be exact.", kept) is other
    found = dataclasses.replace(found, text=found.text + " Warm it first.")   # a budget cut, or another render
    assert a_round("Be exact.", kept) is not other


def _refused_url():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return "http://127.0.0.1:%d" % s.getsockname()[1]  # closed: connecting is refused


def _raw_post(url, path, body, headers=()):
    req = urllib.request.Request(url + path, method="POST", data=json.dumps(body).encode(),
                                 headers=dict({"Authorization": "Bearer " + API_KEY}, **dict(headers)))
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


def test_fail_closed_tells_every_dialect_the_same_and_the_log_the_cause(make_proxy, fake, data_dir, caplog):
    refused = _refused_url()
    p, refuse = _indexed_then_moved(make_proxy, fake, data_dir, "fail_closed", refused)
    refuse()
    question = "what does the purple elephant do"
    message = "retrieval context was unavailable"
    openai_shape = {"error": {"message": message, "type": "rag_retrieval_failed", "param": None,
                              "code": "rag_retrieval_failed"}}
    calls = [
        ("/v1/chat/completions", {"model": "llama3", "messages": [{"role": "user", "content": question}]}, (),
         openai_shape),
        ("/v1/responses", {"model": "llama3", "input": question}, (), openai_shape),
        ("/v1/messages", {"model": "llama3", "max_tokens": 16, "messages": [{"role": "user", "content": question}]},
         {"anthropic-version": "2023-06-01"}, {"type": "error", "error": {"type": "rag_retrieval_failed",
                                                                          "message": message}}),
        ("/api/chat", {"model": "llama3", "stream": False, "messages": [{"role": "user", "content": question}]}, (),
         {"error": message}),
    ]
    with caplog.at_level(logging.WARNING, logger="ragproxy"):
        for path, body, headers, expected in calls:
            status, data = _raw_post(p.url, path, body, headers)
            assert (status, json.loads(data)) == (502, expected), path
            assert refused.split("//")[1].encode() not in data and b"refused" not in data.lower()
    assert refused + "/v1/embeddings" in caplog.text and "refused" in caplog.text.lower()
    assert not any(r.path != "/v1/embeddings" and question in r.body.decode() for r in fake.requests)
    # The request log (the panel's) keeps the cause, not the stable message the client got.
    # Each call is logged just after its answer is sent: wait for the last one.
    logged = [row for row in logged_rows(p.app, len(calls)) if row["outcome"] == "failed"]
    assert len(logged) == len(calls) and all(refused in row["error"] for row in logged)
    # The SDKs read it as the API error it is.
    with pytest.raises(openai.APIStatusError) as info:
        _openai(p).chat.completions.create(model="llama3", messages=[{"role": "user", "content": question}])
    assert info.value.status_code == 502 and info.value.body["type"] == "rag_retrieval_failed"
    with pytest.raises(anthropic.APIStatusError) as info:
        anthropic.Anthropic(base_url=p.url, api_key=API_KEY, max_retries=0).messages.create(
            model="llama3", max_tokens=16, messages=[{"role": "user", "content": question}])
    assert info.value.status_code == 502 and info.value.body["error"]["type"] == "rag_retrieval_failed"


# -- {query} in inject_template: the question once -------------------------------------

QUERY_TEMPLATE = '  inject_template: "Use the context.\\n<context>\\n{context}\\n</context>\\nUser content: {query}"\n'


def test_a_query_placeholder_takes_the_place_of_the_question(make_proxy, fake, data_dir):
    fake.secrets = [SECRET]
    p = make_proxy(kb_config(fake.url, rag=QUERY_TEMPLATE), data_dir=data_dir)
    p.app.knowledge_bases.index_all()
    question = "What does the purple elephant do?"

    def once(text):
        assert SECRET in text and text.endswith("</context>\nUser content: " + question)
        assert fake.last.body.decode().count(question) == 1

    assert _openai(p).chat.completions.create(model="llama3", messages=[
        {"role": "system", "content": "be brief"}, {"role": "user", "content": question}]).choices[0] \
        .message.content == "FOUND: " + SECRET
    sent = fake.last.json["messages"]
    assert sent[0] == {"role": "system", "content": "be brief"}
    once(sent[1]["content"])

    reminder = "<system-reminder>ctx</system-reminder>"
    anthropic.Anthropic(base_url=p.url, api_key=API_KEY, max_retries=0).messages.create(
        model="llama3", max_tokens=16, messages=[{"role": "user", "content": [
            {"type": "text", "text": reminder}, {"type": "text", "text": question,
                                                  "cache_control": {"type": "ephemeral"}}]}])
    blocks = fake.last.json["messages"][0]["content"]
    assert blocks[0] == {"type": "text", "text": reminder} and len(blocks) == 2
    assert blocks[1]["cache_control"] == {"type": "ephemeral"}  # the question's marker stays with it
    once(blocks[1]["text"])

    _openai(p).responses.create(model="llama3", input=[{"role": "user", "content": [
        {"type": "input_text", "text": question}]}])
    [item] = fake.last.json["input"]
    assert [part["type"] for part in item["content"]] == ["input_text"]
    once(item["content"][0]["text"])
    _openai(p).responses.create(model="llama3", input=question)
    once(fake.last.json["input"])


# -- bodies the readers must not trip over -------------------------------------------

@pytest.mark.parametrize("part", [{"type": [], "text": "purple elephant"}, {"type": {}, "text": "purple elephant"},
                                  {"type": "text", "text": ["purple elephant"]}, ["purple elephant"], 7, None])
@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/responses", "/v1/messages"])
def test_content_parts_of_the_wrong_type_are_never_a_500(rag_proxy, fake, part, path):
    turn = {"role": "user", "content": [part, {"type": "input_text" if path == "/v1/responses" else "text",
                                               "text": "what does the purple elephant do"}]}
    body = {"model": "llama3", "max_tokens": 16, ("input" if path == "/v1/responses" else "messages"): [turn]}
    status, data = _raw_post(rag_proxy.url, path, body, {"anthropic-version": "2023-06-01"})
    assert status in (200, 400), data
    if status == 200:
        assert SECRET in fake.last.body.decode()  # the readable part was the question, and got its context


def test_a_lone_surrogate_escape_is_forwarded_with_context_as_sent(rag_proxy, fake):
    head = b'{"model": "llama3", "messages": [{"role": "user", "content": "first \\udfff"}, '
    body = head + b'{"role": "user", "content": "what does the purple elephant do \\ud800"}]}'
    req = urllib.request.Request(rag_proxy.url + "/v1/chat/completions", method="POST", data=body,
                                 headers={"Authorization": "Bearer " + API_KEY})
    with urllib.request.urlopen(req, timeout=10) as r:
        assert json.loads(r.read())["choices"][0]["message"]["content"] == "FOUND: " + SECRET
    sent = fake.last.body
    assert sent.startswith(head) and b"do \\ud800\"}]}" in sent
    assert fake.last.json["messages"][1]["content"].endswith("what does the purple elephant do \ud800")


def test_a_lone_surrogate_is_forwarded_with_context_when_the_whole_body_is_encoded_again(rag_proxy, fake):
    # A repeated member name leaves no single span to splice, so the whole body is encoded again.
    body = (b'{"model": "llama3", "stream": false, "stream": false, "messages": '
            b'[{"role": "user", "content": "what does the purple elephant do \\ud800"}]}')
    req = urllib.request.Request(rag_proxy.url + "/v1/chat/completions", method="POST", data=body,
                                 headers={"Authorization": "Bearer " + API_KEY})
    with urllib.request.urlopen(req, timeout=10) as r:
        assert json.loads(r.read())["choices"][0]["message"]["content"] == "FOUND: " + SECRET
    assert fake.last.json["messages"][0]["content"].endswith("what does the purple elephant do \ud800")


def test_bodies_nested_to_the_json_limit_are_never_a_500(rag_proxy, fake):
    """json parses a body nested nearly as deep as the stack allows; reading and encoding
    it again, a few frames deeper, must answer 400 then, not fail."""
    def status(depth):
        deep = "[" * depth + '"x"' + "]" * depth
        body = ('{"model": "llama3", "messages": [{"role": "user", "content": [{"type": "text", "text": '
                '"what does the purple elephant do"}, {"type": "image", "x": %s}]}]}' % deep).encode()
        req = urllib.request.Request(rag_proxy.url + "/v1/chat/completions", method="POST", data=body,
                                     headers={"Authorization": "Bearer " + API_KEY})
        try:
            with urllib.request.urlopen(req, timeout=10) as r:
                return r.status
        except urllib.error.HTTPError as err:
            return err.code

    lo, hi = 1, 100000  # the deepest body that is answered 200: below it all are, above it none
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if status(mid) == 200 else (lo, mid - 1)
    assert lo > 100
    assert {status(depth) for depth in range(lo - 3, lo + 40)} <= {200, 400}


def test_a_tool_round_reuses_its_turns_context_and_an_edited_prefix_retrieves_afresh(rag_proxy, fake):
    """The turn key is the hash of the client's bytes of the conversation up to the human turn:
    Claude Code's moving cache_control keeps it, an earlier message edited in place does not."""
    turn = [{"role": "user", "content": "hello"}, {"role": "assistant", "content": "hi"},
            {"role": "user", "content": [{"type": "text", "text": "what does the purple elephant do?",
                                          "cache_control": {"type": "ephemeral"}}]}]
    body = {"model": "llama3", "max_tokens": 64, "messages": turn}
    headers = {"anthropic-version": "2023-06-01"}
    assert _raw_post(rag_proxy.url, "/v1/messages", body, headers)[0] == 200
    first = fake.last.json["messages"][2]
    later = copy.deepcopy(turn)
    del later[2]["content"][0]["cache_control"]
    later += [{"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "Read", "input": {}}]},
              {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "ok",
                                            "cache_control": {"type": "ephemeral"}}]}]
    assert _raw_post(rag_proxy.url, "/v1/messages", dict(body, messages=later), headers)[0] == 200
    assert without_cache_control(fake.last.json["messages"][2]) == without_cache_control(first)
    edited = copy.deepcopy(later)
    edited[1]["content"] = "hi!"
    assert _raw_post(rag_proxy.url, "/v1/messages", dict(body, messages=edited), headers)[0] == 200
    outcomes = [row["outcome"] for row in logged_rows(rag_proxy.app, 3)][::-1]   # oldest first
    assert outcomes == ["retrieved", "cached", "retrieved"]


@pytest.mark.parametrize("source", ["last_user", "last_message"])
def test_a_tool_round_searched_with_the_turns_words_logs_them_and_one_from_its_newest_entry_its_own(
        make_proxy, fake, data_dir, source):
    """A later round takes the turn's query with its context when the query lies in the turn
    (last_user), and reads its own when it does not (last_message: the tool result)."""
    p = make_proxy(kb_config(fake.url, rag=f"  query_source: {source}") + "security:\n  log_query: true\n",
                   data_dir=data_dir)
    p.app.knowledge_bases.index_all()
    turn = [{"role": "user", "content": "what does the purple elephant do?"}]
    body = {"model": "llama3", "max_tokens": 64, "messages": turn}
    headers = {"anthropic-version": "2023-06-01"}
    later = turn + [{"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "Read", "input": {}}]},
                    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1",
                                                  "content": "the rotate_signing_key script"}]}]
    for messages in (turn, later, later):
        assert _raw_post(p.url, "/v1/messages", dict(body, messages=messages), headers)[0] == 200
    rows = logged_rows(p.app, 3)[::-1]   # oldest first
    assert [row["outcome"] for row in rows] == ["retrieved", "cached", "cached"]
    newest = "the rotate_signing_key script" if source == "last_message" else "what does the purple elephant do?"
    assert [row["query"] for row in rows] == ["what does the purple elephant do?", newest, newest]


def test_an_agent_loop_sends_upstream_what_it_would_with_nothing_remembered_of_its_bodies(rag_proxy, fake):
    """Each round of a Claude Code loop repeats the last one's body (App.parsed copies those
    values instead of parsing them); what goes upstream is, byte for byte, what it is when the
    same rounds come again to a proxy that remembers nothing of the bodies it read."""
    client = anthropic.Anthropic(base_url=rag_proxy.url, api_key=API_KEY, max_retries=0)
    reminder = {"type": "text", "text": "<system-reminder>\n" + "Follow the conventions. " * 30 + "</system-reminder>"}
    tools = [{"name": f"Tool{n}", "description": "Reads things. " * 60,
              "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}}} for n in range(3)]
    system = [{"type": "text", "text": "You are Claude Code. " * 60, "cache_control": {"type": "ephemeral"}}]
    messages = [{"role": "user", "content": [reminder, {"type": "text", "text": "what does the purple elephant do?",
                                                        "cache_control": {"type": "ephemeral"}}]}]
    rounds = []
    for n in range(5):
        rounds.append(copy.deepcopy(messages))
        for message in messages:   # Claude Code moves the mark on to the newest entry
            for part in message["content"]:
                part.pop("cache_control", None)
        messages += [{"role": "assistant", "content": [{"type": "text", "text": "Reading the file. " * 40},
                                                       {"type": "tool_use", "id": f"toolu_{n}", "name": "Tool0",
                                                        "input": {"path": f"src/{n}.py"}}]},
                     {"role": "user", "content": [{"type": "tool_result", "tool_use_id": f"toolu_{n}",
                                                   "content": f"line {n}\n" * 100,
                                                   "cache_control": {"type": "ephemeral"}}]}]
    edited = copy.deepcopy(rounds[-1])   # a client that rewinds: the question is not what it was
    edited[0]["content"][1]["text"] = "when does the purple elephant go?"   # as long: no bracket out of place
    rounds.append(edited)

    def send_all():
        sent = []
        for turn in rounds:
            client.messages.create(model="llama3", max_tokens=64, system=system, tools=tools, messages=turn)
            sent.append(fake.last.body)
        return sent

    remembered = send_all()
    assert rag_proxy.app.parsed.reused >= 4 * (2 + 1)   # tools, system and entries of every later round
    assert SECRET in remembered[-1].decode()
    rag_proxy.app.parsed = jsonbody.ParseMemo(max_bytes=0)   # keeps nothing
    assert send_all() == remembered and rag_proxy.app.parsed.reused == 0
    outcomes = [row["outcome"] for row in logged_rows(rag_proxy.app, 12)][::-1]
    # The rewound question is a turn of its own; the second time round, one already seen.
    assert outcomes == ["retrieved"] + ["cached"] * 4 + ["retrieved"] * 2 + ["cached"] * 5


def without_cache_control(value):
    if isinstance(value, dict):
        return {k: without_cache_control(v) for k, v in value.items() if k != "cache_control"}
    return [without_cache_control(v) for v in value] if isinstance(value, list) else value


def test_a_turns_context_is_counted_once_for_all_its_rounds():
    calls = []

    def count(text):
        calls.append(text)
        return len(text.split())

    found = retrieval.Retrieved("two words", ("a",), "retrieved")
    assert [found.tokens(count) for _ in range(3)] == [2, 2, 2] and calls == ["two words"]
    other = dataclasses.replace(found, text="now three words")   # a budget cut, stale reuse: another text
    assert other.tokens(count) == 3 and found.tokens(count) == 2 and len(calls) == 2
    assert retrieval.Retrieved("", (), "degraded").tokens(count) == 0 and len(calls) == 2


def test_hybrid_the_query_embedding_is_the_only_extra_call_and_a_repeated_query_makes_none(make_proxy, fake,
                                                                                          data_dir):
    """Two hybrid KBs on one embedding provider, under the retrieval time limit (a Deadline on
    every search): a question costs one embedding request, whichever model, KB list or round
    asks it again costs none, and nothing else is called."""
    fake.secrets = [SECRET]
    extra_kb = "  vec:\n    retrieval: hybrid\n    embedding: emb\n  vec2:\n    retrieval: hybrid\n    embedding: emb\n"
    config = kb_config(fake.url, kbs="vec, vec2", extra_kb=extra_kb, rag="  timeout_ms: 5000\n")
    config = config.replace("providers:\n", f'providers:\n  embedding:\n    emb: {{type: openai, base_url: '
                                            f'"{fake.url}/v1", model: fake-embed}}\n', 1)
    config = config.replace('  - {name: "*"', '  - {name: "solo", upstream: [oa], kb: [vec2], timeout_ms: 800}\n'
                                              '  - {name: "*"', 1)
    _vec_dir(data_dir)
    (data_dir / "documents" / "vec2").mkdir()
    (data_dir / "documents" / "vec2" / "keys.py").write_text(CODE)
    p = make_proxy(config, data_dir=data_dir)
    p.app.knowledge_bases.index_all()
    client = _openai(p)

    def calls(messages, model="llama3"):
        before = len(fake.requests)
        reply = client.chat.completions.create(model=model, messages=messages)
        paths = [r.path for r in fake.requests[before:]]
        return reply, paths.count("/v1/embeddings"), [path for path in paths if path != "/v1/embeddings"]

    asked = [{"role": "user", "content": "what does the purple elephant do"}]
    reply, embedded, others = calls(asked)
    assert reply.choices[0].message.content == "FOUND: " + SECRET
    assert (embedded, others) == (1, ["/v1/chat/completions"])   # one query vector for both KBs
    assert calls(asked)[1:] == (0, ["/v1/chat/completions"])     # a new chat asking it again
    assert calls(asked, "solo")[1:] == (0, ["/v1/chat/completions"])   # another model, KB list and time limit
    assert calls([{"role": "user", "content": "which kettle whistles"}])[1] == 1
    outcomes = [row["outcome"] for row in logged_rows(p.app, 4)][::-1]
    assert outcomes == ["retrieved"] * 4


def test_a_question_asked_again_is_not_searched_again_until_the_kb_changes(rag_proxy, fake, data_dir):
    """The search cache: a new chat asking an old question gets the same passage without a
    search (no lexical stage in the metrics), and a commit since is searched afresh."""
    client = _openai(rag_proxy)

    def searches():
        found = re.search(r'ragproxy_retrieval_seconds_count\{stage="lexical"\} (\d+)', rag_proxy.app.metrics.render())
        return int(found.group(1)) if found else 0

    chat = [{"role": "user", "content": "What does the purple elephant do?"}]
    counts = []
    for _ in range(2):
        assert SECRET in _sent_turn(client, fake, chat)
        logged_rows(rag_proxy.app, len(counts) + 1)
        counts.append(searches())
    (data_dir / "documents" / "docs" / "zebrafish.md").write_text(f"# Zebrafish\n\nFact: {ZEBRA}.\n")
    rag_proxy.app.knowledge_bases.index_all()
    assert SECRET in _sent_turn(client, fake, chat)
    logged_rows(rag_proxy.app, 3)
    counts.append(searches())
    assert counts == [1, 1, 2]
    assert [row["outcome"] for row in logged_rows(rag_proxy.app, 3)] == ["retrieved"] * 3


def test_another_process_commit_is_searched_once_the_last_look_at_it_is_current_max_age_old(
        make_proxy, rag_proxy, fake, data_dir):
    """Another process indexing the same data dir (here a second proxy on it): the retrieval
    path looks at the KB's CURRENT at most every CURRENT_MAX_AGE seconds (KBStore.current),
    so a question asked within that of its last look still gets the generation it saw."""
    now = [1000.0]
    rag_proxy.app.knowledge_bases.get("docs").store.monotonic = lambda: now[0]
    client = _openai(rag_proxy)
    chat = [{"role": "user", "content": "How fast does the zebrafish heart regrow?"}]
    assert ZEBRA not in _sent_turn(client, fake, chat)
    (data_dir / "documents" / "docs" / "zebrafish.md").write_text(f"# Zebrafish\n\nFact: {ZEBRA}.\n")
    other = make_proxy(kb_config(fake.url), data_dir=data_dir)
    assert [r.committed for r in other.app.knowledge_bases.index_all()] == [True, False]   # docs, code
    now[0] += retrieval.CURRENT_MAX_AGE / 2
    assert ZEBRA not in _sent_turn(client, fake, chat)
    now[0] += retrieval.CURRENT_MAX_AGE
    assert ZEBRA in _sent_turn(client, fake, chat)


class _Compression:
    """A levers.Profile's face to retrieval: its key and its choice of ragproxy's own chunks."""

    levers = ()   # the runner after retrieval has nothing to do

    def __init__(self, key, pick):
        self.key, self.pick, self.asked = key, pick, []

    def own_context(self, query, hits):
        self.asked.append((query, hits))
        return self.pick(hits)


def test_a_compression_profile_picks_and_orders_the_chunks_rendered(make_proxy, fake, data_dir):
    """exchange.compression.own_context gets the screened chunks with their scores before
    rendering; only the indices it returns are rendered, in its order; its key separates turns."""
    kettle = "# Kettle care\n\nThe copper kettle is descaled monthly.\n"
    (data_dir / "documents" / "docs" / "kettle.md").write_text(kettle)
    p = make_proxy(kb_config(fake.url), data_dir=data_dir)
    p.app.knowledge_bases.index_all()
    profile = {"now": None}

    def select(exchange):
        exchange.compression = profile["now"]

    p.app.rewriters.insert(p.app.rewriters.index(p.app.retriever), select)
    client = _openai(p)
    chat = [{"role": "user", "content": "the purple elephant and the copper kettle: what do they do?"}]
    code = "descaled monthly"

    def first_of(text):
        assert SECRET in text and code in text
        return "guide" if text.index(SECRET) < text.index(code) else "code"

    plain = _sent_turn(client, fake, chat)
    reverse = _Compression("compression:reverse", lambda hits: list(range(len(hits)))[::-1])
    profile["now"] = reverse
    reversed_turn = _sent_turn(client, fake, chat + TOOL_ROUND)   # a later round, but another profile
    (query, hits), = reverse.asked
    assert query == chat[0]["content"] and len(hits) == 2
    assert all(isinstance(h["text"], str) and isinstance(h["score"], float) for h in hits)
    assert hits[0]["score"] >= hits[1]["score"]
    assert {first_of(plain), first_of(reversed_turn)} == {"guide", "code"}
    assert _sent_turn(client, fake, chat + TOOL_ROUND) == reversed_turn and len(reverse.asked) == 1  # cached
    guide = next(i for i, h in enumerate(hits) if SECRET in h["text"])
    profile["now"] = _Compression("compression:one", lambda hits: [guide])
    only = _sent_turn(client, fake, chat)
    assert SECRET in only and code not in only
    profile["now"] = None
    assert _sent_turn(client, fake, chat + TOOL_ROUND) == plain   # the uncompressed turn's context, cached


@pytest.mark.parametrize("mode", ragproxy.INJECT_MODES)
@pytest.mark.parametrize("api", ["messages", "chat"])
def test_a_body_sent_again_gets_the_same_context_once_whatever_the_inject_mode(
        make_proxy, fake, data_dir, mode, api):
    """The parsed values a large body shares with the bodies that repeat it (App.parsed) are never
    edited: the same body, sent again, goes upstream as it went the first time, with one context."""
    fake.secrets = [SECRET]
    proxy = make_proxy(kb_config(fake.url, model_extra=f", inject_mode: {mode}"), data_dir=data_dir)
    proxy.app.knowledge_bases.index_all()
    assert proxy.app.parsed.check   # RAGPROXY_CHECK_SHARED, from conftest: an edit in place raises
    reminder = "<system-reminder>\n" + "Follow the conventions. " * 40 + "</system-reminder>"
    question = "What does the purple elephant do? " + "Say it plainly. " * 40
    if api == "messages":
        path = "/v1/messages"
        body = {"model": "llama3", "max_tokens": 64,
                "system": [{"type": "text", "text": "x-anthropic-billing-header: cc_version=1"},
                           {"type": "text", "text": "You are Claude Code. " * 80}],
                "tools": [{"name": f"Tool{n}", "description": "Reads things. " * 60,
                           "input_schema": {"type": "object"}} for n in range(8)],
                "messages": [{"role": "user", "content": [{"type": "text", "text": reminder},
                                                          {"type": "text", "text": question}]}]}
    else:
        path = "/v1/chat/completions"
        body = {"model": "llama3",
                "tools": [{"type": "function", "function": {"name": f"tool_{n}", "description": "Reads. " * 80,
                                                            "parameters": {"type": "object"}}} for n in range(8)],
                "messages": [{"role": "system", "content": "You are a coding agent. " * 100},
                             {"role": "user", "content": question}]}
    sent = []   # a model with knowledge bases: its bodies are read through App.parsed
    for _ in range(3):
        status, _ = _raw_post(proxy.url, path, body, {"anthropic-version": "2023-06-01"})
        assert status == 200
        sent.append(fake.last.body)
    assert sent[0] == sent[1] == sent[2] and sent[0].count(SECRET.encode()) == 1
    assert proxy.app.parsed.reused >= 2 * 3   # tools and system (or its message) of the later two
    proxy.app.parsed.verify()


@pytest.mark.parametrize("encode_once_min", [0, retrieval.ENCODE_ONCE_MIN])
@pytest.mark.parametrize("mode", ragproxy.INJECT_MODES)
@pytest.mark.parametrize("api", ["messages", "chat"])
def test_every_round_of_a_turn_sends_its_context_and_the_persons_words_as_sent(
        make_proxy, fake, data_dir, mode, api, encode_once_min):
    """A long context is encoded once for all the rounds of its turn (the splice puts it where a
    placeholder stood; this one is short, so it is with the limit at 0): the words around it,
    escapes and all, and a NUL of the client's own, go as written."""
    fake.secrets = [SECRET]
    proxy = make_proxy(kb_config(fake.url, model_extra=f", inject_mode: {mode}"), data_dir=data_dir)
    proxy.app.knowledge_bases.index_all()
    proxy.app.retriever.encode_once_min = encode_once_min
    words = 'What does the purple elephant do? "Quoted", C:\\path\\, caf\u00e9 \u6578\n\tand\\u0000 ' + \
        ("a NUL \x00 too\\" if api == "chat" else "\\")
    if api == "messages":
        path, turn = "/v1/messages", [{"role": "user", "content": [
            {"type": "text", "text": "<system-reminder>\nBe brief.\n</system-reminder>"},
            {"type": "text", "text": words, "cache_control": {"type": "ephemeral"}}]}]
        tool_round = [{"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "Read", "input": {}}]},
                      {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "ok"}]}]
        body = {"model": "llama3", "max_tokens": 64, "system": "Be exact.", "messages": turn}
    else:
        path, turn = "/v1/chat/completions", [{"role": "system", "content": "Be exact."},
                                              {"role": "user", "content": words}]
        tool_round = TOOL_ROUND
        body = {"model": "llama3", "messages": turn}
    sent = []
    for messages in (turn, turn + tool_round, turn + tool_round + tool_round):
        status, _ = _raw_post(proxy.url, path, dict(body, messages=messages), {"anthropic-version": "2023-06-01"})
        assert status == 200
        got = fake.last.json
        assert fake.last.body.count(SECRET.encode()) == 1
        # The words once, whole, whether beside the context or in the template's {query}.
        assert json.dumps(got, ensure_ascii=False).count(json.dumps(words, ensure_ascii=False)[1:-1]) == 1
        sent.append(got)
    assert [row["outcome"] for row in logged_rows(proxy.app, 3)][::-1] == ["retrieved", "cached", "cached"]
    for later in sent[1:]:
        assert later["messages"][:len(sent[0]["messages"])] == sent[0]["messages"]
        assert later.get("system") == sent[0].get("system")
