"""Compression end to end: the official SDKs through the real server (port 0) to the fake upstream.

Each test checks what the upstream received: the marked blocks as the levers
left them, every byte outside them as the client sent it, X-Compression gone.
"""
from __future__ import annotations

import json

import pytest
from conftest import API_KEY, logged_rows, proxy_config

import ragproxy
from _ragproxy import marked, summary

COMPRESSION = """
  - {name: squeeze, upstream: oa, compression: on}
  - {name: claude-squeeze, upstream: an, compression: top2}
  - {name: llama-squeeze, upstream: ol, compression: top2}
compression:
  levers:
    - {name: rag_select, max_chunks: 2}
    - position_reorder
  profiles:
    top2:
      levers: [{name: rag_select, max_chunks: 2}]
    nothing:
      levers: []
    fit:
      levers: [{name: window_fit, completion_reserve_tokens: 100}]
"""

BEFORE = "Please answer from the notes below.\n\n"
AFTER = "\n\nThanks! Keep it short."


def block(scores=(0.2, 0.9, 0.5, 0.1), newline="\n"):
    lines = ["<sbproxy-retrieval>", "<sbproxy-query>", "Why did the deployment fail?", "</sbproxy-query>"]
    for i, score in enumerate(scores):
        lines += [f'<sbproxy-chunk id="c{i}" score="{score}" format="text">', f"chunk {i} text, score {score}",
                  "</sbproxy-chunk>"]
    lines.append("</sbproxy-retrieval>")
    return newline.join(lines) + newline


def chunk_ids(text):
    return [c.id for s in marked.parse(text) if isinstance(s, marked.Block) for c in s.chunks]


def outside(text):
    return [s for s in marked.parse(text) if isinstance(s, str)]


@pytest.fixture
def proxy(make_proxy, tmp_path):
    return make_proxy(data_dir=tmp_path, extra=COMPRESSION)


def test_openai_chat_with_the_header_keeps_the_two_best_chunks_best_at_the_edges(proxy, fake):
    import openai
    client = openai.OpenAI(base_url=proxy.url + "/v1", api_key=API_KEY, max_retries=0, timeout=10)
    content = BEFORE + block() + AFTER
    client.chat.completions.create(model="gpt-4o", messages=[
        {"role": "system", "content": "You are terse."}, {"role": "user", "content": content}],
        extra_headers={"X-Compression": "on"})
    sent = fake.last.json["messages"]
    assert sent[0] == {"role": "system", "content": "You are terse."}
    assert chunk_ids(sent[1]["content"]) == ["c1", "c2"]   # 0.9 first, 0.5 last: two chunks are already at the edges
    assert outside(sent[1]["content"]) == outside(content)
    assert "x-compression" not in fake.last.headers
    rows = logged_rows(proxy.app, 1)
    assert [(lv["lever"], lv["outcome"], lv["reason"]) for lv in rows[0]["levers"]] == [
        ("rag_select", "applied", "applied"), ("position_reorder", "skipped", "already_ordered")]
    assert rows[0]["levers"][0]["tokens_after"] < rows[0]["levers"][0]["tokens_before"]
    metrics = proxy.app.metrics.render()
    assert 'ragproxy_compression_lever_total{lever="rag_select",outcome="applied",reason="applied"} 1' in metrics


def test_the_models_own_setting_applies_without_a_header_and_off_turns_it_off(proxy, fake):
    import openai
    client = openai.OpenAI(base_url=proxy.url + "/v1", api_key=API_KEY, max_retries=0, timeout=10)
    content = block()
    client.chat.completions.create(model="squeeze", messages=[{"role": "user", "content": content}])
    assert chunk_ids(fake.last.json["messages"][0]["content"]) == ["c1", "c2"]
    client.chat.completions.create(model="squeeze", messages=[{"role": "user", "content": content}],
                                   extra_headers={"X-Compression": "off"})
    assert fake.last.json["messages"][0]["content"] == content
    client.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": content}])
    assert fake.last.json["messages"][0]["content"] == content   # gpt-* is off by default


def test_anthropic_messages_through_a_profile_and_the_sdk_count_tokens(proxy, fake):
    import anthropic
    client = anthropic.Anthropic(base_url=proxy.url, api_key=API_KEY, max_retries=0, timeout=10)
    content = BEFORE + block(newline="\r\n") + AFTER
    client.messages.create(model="claude-squeeze", max_tokens=50, system="terse",
                           messages=[{"role": "user", "content": content}])
    sent = fake.last.json
    assert sent["system"] == "terse"
    assert chunk_ids(sent["messages"][0]["content"]) == ["c1", "c2"]   # top2 keeps retrieval order
    assert outside(sent["messages"][0]["content"]) == outside(content)
    assert "\r\n" in sent["messages"][0]["content"]
    client.messages.count_tokens(model="claude-squeeze", messages=[{"role": "user", "content": content}])
    assert fake.last.path.endswith("/count_tokens")
    assert chunk_ids(fake.last.json["messages"][0]["content"]) == ["c1", "c2"]   # counts what would be sent


def test_ollama_chat_native_and_a_responses_input_list(proxy, fake):
    import ollama
    import openai
    client = ollama.Client(host=proxy.url, headers={"Authorization": "Bearer " + API_KEY, "X-Compression": "top2"})
    content = block()
    client.chat(model="llama3.1", messages=[{"role": "user", "content": content}])
    assert fake.last.path == "/api/chat"
    assert chunk_ids(fake.last.json["messages"][0]["content"]) == ["c1", "c2"]
    client.chat(model="squeeze", messages=[{"role": "user", "content": content}])   # translated for an OpenAI upstream
    assert fake.last.path == "/v1/chat/completions" and "x-compression" not in fake.last.headers
    assert chunk_ids(fake.last.json["messages"][0]["content"]) == ["c1", "c2"]
    oa = openai.OpenAI(base_url=proxy.url + "/v1", api_key=API_KEY, max_retries=0, timeout=10)
    oa.responses.create(model="gpt-4o", input=[{"role": "user", "content": content}],
                        extra_headers={"X-Compression": "top2"})
    assert chunk_ids(fake.last.json["input"][0]["content"]) == ["c1", "c2"]
    oa.responses.create(model="gpt-4o", input=content, extra_headers={"X-Compression": "top2"})
    assert fake.last.json["input"] == content   # a string input is not eligible
    row = logged_rows(proxy.app, 4)[0]
    assert [(lv["lever"], lv["reason"]) for lv in row["levers"]] == [("rag_select", "not_eligible")]


@pytest.mark.parametrize("value", ["on, off", "On", "tight", "", "top2 x"])
def test_a_malformed_or_undeclared_header_is_a_400_in_each_apis_shape(proxy, fake, value):
    import anthropic
    import openai
    oa = openai.OpenAI(base_url=proxy.url + "/v1", api_key=API_KEY, max_retries=0, timeout=10)
    with pytest.raises(openai.BadRequestError) as raised:
        oa.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "hi"}],
                                   extra_headers={"X-Compression": value})
    assert raised.value.body["code"] == "invalid_compression_header"
    an = anthropic.Anthropic(base_url=proxy.url, api_key=API_KEY, max_retries=0, timeout=10)
    with pytest.raises(anthropic.BadRequestError) as raised:
        an.messages.create(model="claude-x", max_tokens=5, messages=[{"role": "user", "content": "hi"}],
                           extra_headers={"X-Compression": value})
    assert raised.value.body["type"] == "error"
    assert fake.requests == []   # nothing went upstream


def test_a_repeated_header_is_malformed(proxy, fake):
    import http.client
    conn = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=10)
    body = json.dumps({"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]})
    conn.putrequest("POST", "/v1/chat/completions")
    for name, value in (("Authorization", "Bearer " + API_KEY), ("Content-Type", "application/json"),
                        ("Content-Length", str(len(body))), ("X-Compression", "on"), ("X-Compression", "on")):
        conn.putheader(name, value)
    conn.endheaders(body.encode())
    response = conn.getresponse()
    assert response.status == 400
    assert json.loads(response.read())["error"]["code"] == "invalid_compression_header"


def test_a_malformed_block_leaves_the_list_untouched_and_the_log_says_why(proxy, fake):
    import openai
    client = openai.OpenAI(base_url=proxy.url + "/v1", api_key=API_KEY, max_retries=0, timeout=10)
    good, broken = block(), block().replace("</sbproxy-query>\n", "", 1)
    messages = [{"role": "user", "content": good}, {"role": "assistant", "content": "ok"},
                {"role": "user", "content": broken}]
    client.chat.completions.create(model="squeeze", messages=messages)
    assert fake.last.json["messages"] == messages   # not even the well-formed first block is trimmed
    levers = logged_rows(proxy.app, 1)[0]["levers"]
    assert [(lv["lever"], lv["reason"]) for lv in levers] == [
        ("rag_select", "malformed_marked_context"), ("position_reorder", "malformed_marked_context")]


def test_an_empty_profile_changes_nothing_and_tools_pass_byte_for_byte(proxy, fake):
    import urllib.request
    body = (b'{"model": "gpt-4o", "tools": [{"type": "function", "function": {"name": "f",  "parameters": {}}}],'
            b' "messages": [{"role": "user", "content": ' + json.dumps(block()).encode() + b'}]}')
    for profile in ("nothing", "top2"):
        request = urllib.request.Request(proxy.url + "/v1/chat/completions", body, method="POST", headers={
            "Authorization": "Bearer " + API_KEY, "Content-Type": "application/json", "X-Compression": profile})
        urllib.request.urlopen(request, timeout=10).read()
        received = fake.last.body
        if profile == "nothing":
            assert received == body
        else:   # only the messages member is encoded again: the tools keep their odd spacing
            assert b'"tools": [{"type": "function", "function": {"name": "f",  "parameters": {}}}]' in received
            assert chunk_ids(fake.last.json["messages"][0]["content"]) == ["c1", "c2"]


AGENT = """
  - {name: agent, upstream: oa, compression: agent, context_window: 3000}
compression:
  profiles:
    agent:
      levers:
        - {name: summary_buffer, min_tokens: 300, retain_recent_messages: 4, target_summary_tokens: 60,
           summarizer: {provider: oa, model: summarizer-model, timeout: 5}}
        - {name: window_fit, completion_reserve_tokens: 500}
"""


def test_an_agent_loop_with_summary_buffer_and_window_fit_keeps_its_prefix_between_tool_rounds(make_proxy, fake,
                                                                                              tmp_path):
    """Tool rounds of one turn re-send the same prefix; it changes only when a lever has to act again."""
    import openai
    proxy = make_proxy(data_dir=tmp_path, extra=AGENT)
    client = openai.OpenAI(base_url=proxy.url + "/v1", api_key=API_KEY, max_retries=0, timeout=10,
                           default_headers={"X-Ragproxy-Session-Id": "agent-session-1"})
    words = "the build log shows a failing step in the deploy stage again "
    messages = [{"role": "system", "content": "You are a coding agent."}]
    for i in range(6):   # earlier plain turns: what summary_buffer may summarise
        messages += [{"role": "user", "content": f"question {i}: " + words * 6},
                     {"role": "assistant", "content": f"answer {i}: " + words * 6}]
    for i in range(12):   # earlier agent turns with tools: structured, only window_fit may drop them
        messages += [{"role": "user", "content": f"task {i}: " + words * 2},
                     {"role": "assistant", "content": None, "tool_calls": [{"id": f"old_{i}", "type": "function",
                                                                            "function": {"name": "grep",
                                                                                         "arguments": "{}"}}]},
                     {"role": "tool", "tool_call_id": f"old_{i}", "content": f"match {i}: " + words * 6},
                     {"role": "assistant", "content": f"done {i}."}]
    messages.append({"role": "user", "content": "now fix the deploy"})
    sent = []
    for round_ in range(25):   # one turn of tool rounds: each adds a call and its result
        client.chat.completions.create(model="agent", messages=messages)
        newest = messages[-1]
        upstream = [r for r in fake.requests if r.path.endswith("/chat/completions")]
        sent.append(next(r for r in reversed(upstream) if r.json["model"] == "agent"))
        call_id = f"call_{round_}"
        messages += [{"role": "assistant", "content": None, "tool_calls": [
            {"id": call_id, "type": "function", "function": {"name": "read_file", "arguments": '{"n": %d}' % round_}}]},
            {"role": "tool", "tool_call_id": call_id, "content": f"file {round_}: " + words * 2}]
    lists = [r.json["messages"] for r in sent]
    breaks = [k for k in range(1, len(lists)) if lists[k][:len(lists[k - 1])] != lists[k - 1]]
    levers = [row["levers"] for row in reversed(logged_rows(proxy.app, 25))]
    fitted = [k for k, lv in enumerate(levers) if lv[1]["outcome"] == "applied"]
    summarised = [k for k, lv in enumerate(levers) if lv[0]["outcome"] == "applied"]
    assert summarised, [lv[0]["reason"] for lv in levers]
    assert fitted, [lv[1]["reason"] for lv in levers]   # the transcript outgrew the window: window_fit cut
    # Every tool pairing the model sees is whole, and the current turn is there.
    for listed in lists:
        ids = {c["id"] for m in listed if m.get("tool_calls") for c in m["tool_calls"]}
        assert all(m["tool_call_id"] in ids for m in listed if m["role"] == "tool")
        assert listed[0]["role"] == "system"
    assert lists[-1][-1] == newest
    # The summary is made once and re-sent byte for byte; the prefix changes only where window_fit
    # had to cut again (it cuts down to a low-water mark, so not on every round past the budget).
    assert len([r for r in fake.requests if r.json and r.json.get("model") == "summarizer-model"]) == 1
    made = [m for listed in lists for m in listed if str(m.get("content")).startswith(summary.SUMMARY_HEADER)]
    assert made and all(m == made[0] for m in made)   # (window_fit drops it with the oldest history once it cuts)
    assert set(breaks) <= set(fitted) and 1 <= len(breaks) <= 3, (breaks, fitted)


def test_the_admin_api_serves_the_compression_view_with_the_redis_password_masked(make_admin_proxy, fake):
    extra = COMPRESSION + '  state: {backend: redis, redis_url: "redis://:hunter2-secret@cache.internal:6379/0"}\n'
    compressed = make_admin_proxy(proxy_config(fake.url, extra=extra))
    status, _, view = compressed.admin().get("/admin/api/compression")
    assert status == 200
    assert [p["name"] for p in view["profiles"]] == ["on", "top2", "nothing", "fit"]
    assert {m["name"]: m["compression"] for m in view["models"]}["claude-squeeze"] == "top2"
    assert view["state"]["backend"] == "redis" and "hunter2" not in json.dumps(view)
    assert "cache.internal:6379" in view["state"]["redis_url"]
    assert view["levers"] == [] and view["tokens_saved"] == {}
    import openai
    client = openai.OpenAI(base_url=compressed.url + "/v1", api_key=API_KEY, max_retries=0, timeout=10)
    client.chat.completions.create(model="squeeze", messages=[{"role": "user", "content": block()}])
    logged_rows(compressed.app, 1)
    _, _, view = compressed.admin().get("/admin/api/compression")
    assert {(r["lever"], r["reason"]): r["count"] for r in view["levers"]} == {
        ("rag_select", "applied"): 1, ("position_reorder", "already_ordered"): 1}
    assert view["tokens_saved"]["rag_select"] > 0


def test_ragproxys_own_chunks_go_through_the_profile_rag_select_keeping_the_best(make_proxy, fake, tmp_path):
    docs = tmp_path / "documents" / "notes"
    docs.mkdir(parents=True)
    (docs / "deploy.md").write_text("# Deploys\n\nThe deploy key rotates weekly; the deploy pipeline checks it.\n")
    (docs / "kettle.md").write_text("# Kettle\n\nThe copper kettle is descaled monthly; the deploy team owns it.\n")
    extra = ("  - {name: kb-squeeze, upstream: oa, kb: notes, compression: top1}\n"
             "  - {name: kb-plain, upstream: oa, kb: notes}\n"
             "compression:\n  profiles:\n    top1:\n      levers: [{name: rag_select, max_chunks: 1}]\n")
    proxy = make_proxy(data_dir=tmp_path, extra=extra)
    proxy.app.knowledge_bases.index_all()
    import openai
    client = openai.OpenAI(base_url=proxy.url + "/v1", api_key=API_KEY, max_retries=0, timeout=10)
    question = [{"role": "user", "content": "how often does the deploy key rotate in the deploy pipeline?"}]
    client.chat.completions.create(model="kb-plain", messages=question)
    plain = fake.last.body.decode()
    assert "rotates weekly" in plain and "descaled monthly" in plain
    client.chat.completions.create(model="kb-squeeze", messages=question)
    squeezed = fake.last.body.decode()
    assert "rotates weekly" in squeezed and "descaled monthly" not in squeezed


def test_an_ollama_chats_own_num_ctx_is_the_window_window_fit_keeps_to(proxy, fake):
    import ollama
    client = ollama.Client(host=proxy.url, headers={"Authorization": "Bearer " + API_KEY, "X-Compression": "fit"})
    history = []
    for i in range(20):
        history += [{"role": "user", "content": f"question {i} " + "about the deploy pipeline " * 10},
                    {"role": "assistant", "content": f"answer {i} " + "the deploy pipeline is fine " * 10}]
    history.append({"role": "user", "content": "and now?"})
    client.chat(model="llama3.1", messages=history)   # the table's 128K window: all of it fits
    assert len(fake.last.json["messages"]) == len(history)
    client.chat(model="llama3.1", messages=history, options={"num_ctx": 1024})
    sent = fake.last.json["messages"]
    assert len(sent) < len(history) and sent[-1] == history[-1] and sent == history[-len(sent):]
    assert sent[0]["role"] == "user"   # the cut lands on a user message


def test_count_tokens_answered_by_ragproxy_counts_the_compressed_body(proxy, fake):
    import anthropic
    client = anthropic.Anthropic(base_url=proxy.url, api_key=API_KEY, max_retries=0, timeout=10)
    messages = [{"role": "user", "content": block(scores=(0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8))}]
    full = client.messages.count_tokens(model="squeeze", messages=messages,
                                        extra_headers={"X-Compression": "off"}).input_tokens
    kept = client.messages.count_tokens(model="squeeze", messages=messages).input_tokens
    assert fake.requests == []   # an OpenAI upstream has no count_tokens: ragproxy estimates
    assert kept < full


def test_a_failing_summarizer_is_not_asked_again_until_its_back_off_ends(fake, _running, tmp_path):
    """One request pays for a dead summarizer; the next ones skip it at once until the back-off is over."""
    import openai

    from _ragproxy import levers
    now = [1000.0]
    config = ragproxy.Config.from_text(proxy_config(fake.url, extra=AGENT))
    proxy = _running(ragproxy.App(config, data_dir=str(tmp_path), clock=lambda: now[0]))
    client = openai.OpenAI(base_url=proxy.url + "/v1", api_key=API_KEY, max_retries=0, timeout=10,
                           default_headers={"X-Ragproxy-Session-Id": "backoff-session"})
    words = "the build log shows a failing step in the deploy stage again "
    messages = [{"role": "system", "content": "You are a coding agent."}]
    for i in range(6):
        messages += [{"role": "user", "content": f"question {i}: " + words * 6},
                     {"role": "assistant", "content": f"answer {i}: " + words * 6}]
    messages.append({"role": "user", "content": "and now?"})

    def summarizer_calls():
        return len([r for r in fake.requests if r.json and r.json.get("model") == "summarizer-model"])

    def first_lever(requests):   # the latest request's row, once all ``requests`` are logged
        return logged_rows(proxy.app, requests)[0]["levers"][0]

    fake.fail_next(500, path="/v1/chat/completions")   # the summarizer's call comes first
    assert client.chat.completions.create(model="agent", messages=messages).choices[0].message.content
    assert summarizer_calls() == 1 and first_lever(1)["reason"] == "summarizer_failed"
    now[0] += levers.SUMMARIZER_BACKOFF - 1
    client.chat.completions.create(model="agent", messages=messages)
    assert summarizer_calls() == 1 and first_lever(2)["reason"] == "summarizer_failed"   # not asked
    now[0] += 2
    client.chat.completions.create(model="agent", messages=messages)
    assert summarizer_calls() == 2 and first_lever(3)["outcome"] == "applied"
