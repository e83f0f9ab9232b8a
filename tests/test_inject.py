"""Context injection: query extraction, turn keys, rendering and where the context goes.

Request bodies are shaped like what Claude Code, Codex CLI, Aider, the SDKs
and Ollama clients send (docs/clients.md in the shared notes).
"""
import copy
import itertools
import json
import os
import random
import re

import pytest

import ragproxy
from _ragproxy import inject, jsonbody
from _ragproxy.api import ClientError
from _ragproxy.inject import continues_turn, fill_template, question_text, render_chunks, uses_query
from conftest import ROOT

CONTEXT = "Reference material.\n<context>\n[1] docs/retry.md (abc123)\nUse Retry(total=3).\n</context>\n"
REMINDER = ("<system-reminder>\nAs you answer the user's questions, you can use the following context:\n"
            "# claudeMd\nCodebase and user instructions are shown below.\n"
            "Contents of /repo/CLAUDE.md:\nRun `make test` before committing.\n</system-reminder>\n")
CC_PROMPT = "Why does `parse_config()` raise KeyError: 'upstream' in src/ragproxy/config.py?"
CODEX_PROMPT = "Add retry with exponential backoff to fetch_index() in src/net/client.py"


def dumps(value):
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def without_cache_control(value):
    if isinstance(value, dict):
        return {k: without_cache_control(v) for k, v in value.items() if k != "cache_control"}
    if isinstance(value, list):
        return [without_cache_control(v) for v in value]
    return value


# -- realistic request bodies, one agent-loop round at a time ------------------

def claude_code_request(rounds, volatile=True):
    """Claude Code: billing block first, cached system blocks, user turn = [system-reminder block,
    prompt block], then tool rounds.  ``volatile``: like the real client, rehash the billing block
    per request and put cache_control on the newest block."""
    system = [
        {"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1.197.a1f; cc_entrypoint=cli; "
                                 "cch=%05d;" % (rounds * 7919 % 100000 if volatile else 0)},
        {"type": "text", "text": "You are Claude Code, Anthropic's official CLI for Claude.",
         "cache_control": {"type": "ephemeral"}},
        {"type": "text", "text": "You are an interactive CLI tool that helps users with software engineering tasks.",
         "cache_control": {"type": "ephemeral"}},
    ]
    messages = [{"role": "user", "content": [{"type": "text", "text": REMINDER},
                                             {"type": "text", "text": CC_PROMPT}]}]
    for r in range(rounds):
        messages.append({"role": "assistant", "content": [
            {"type": "thinking", "thinking": "I should read the config loader.", "signature": "EqQBCkYI%d" % r},
            {"type": "text", "text": "Let me look at the loader."},
            {"type": "tool_use", "id": "toolu_01A%d" % r, "name": "Read",
             "input": {"file_path": "/repo/src/ragproxy/config.py"}}]})
        result = [{"type": "tool_result", "tool_use_id": "toolu_01A%d" % r,
                   "content": "     1\tdef parse_config(raw):\n     2\t    return raw['upstream']\n"}]
        if r == 1:  # Claude Code attaches reminders to tool results too
            result.append({"type": "text", "text": "<system-reminder>\nThe TodoWrite tool hasn't been used "
                                                   "recently.\n</system-reminder>"})
        messages.append({"role": "user", "content": result})
    if volatile:
        messages[-1]["content"][-1]["cache_control"] = {"type": "ephemeral"}
    return {
        "model": "claude-sonnet-4-5-20250929", "max_tokens": 32000, "stream": True,
        "system": system, "messages": messages,
        "tools": [{"name": "Read", "description": "Reads a file.", "input_schema": {
            "type": "object", "properties": {"file_path": {"type": "string"}}, "required": ["file_path"]}}],
        "metadata": {"user_id": json.dumps({"device_id": "d1", "session_id": "s1"})},
        "thinking": {"type": "adaptive"}, "context_management": {"edits": []},
    }


def codex_request(rounds):
    """Codex CLI: developer message, AGENTS.md and <environment_context> user messages, the prompt,
    then reasoning / function_call / function_call_output items; no instructions field."""
    items = [
        {"type": "message", "role": "developer", "content": [
            {"type": "input_text", "text": "<permissions instructions>\nFilesystem sandboxing: workspace-write."
                                          "\n</permissions instructions>"}]},
        {"type": "message", "role": "user", "content": [
            {"type": "input_text", "text": "# AGENTS.md instructions for /repo\n\n<INSTRUCTIONS>\n"
                                          "Run pytest before finishing.\n</INSTRUCTIONS>"}]},
        {"type": "message", "role": "user", "content": [
            {"type": "input_text", "text": "<environment_context>\n  <cwd>/repo</cwd>\n  <shell>bash</shell>\n"
                                          "</environment_context>"}]},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": CODEX_PROMPT}]},
    ]
    for r in range(rounds):
        items += [
            {"type": "reasoning", "id": "rs_%d" % r, "summary": [], "encrypted_content": "gAAAAB%d==" % r},
            {"type": "function_call", "id": "fc_%d" % r, "call_id": "call_%d" % r, "name": "shell",
             "arguments": json.dumps({"command": ["bash", "-lc", "sed -n 1,80p src/net/client.py"]})},
            {"type": "function_call_output", "call_id": "call_%d" % r,
             "output": "def fetch_index(url):\n    return urlopen(url).read()\n"},
        ]
    return {"model": "gpt-5-codex", "input": items, "tools": [
        {"type": "function", "name": "shell", "parameters": {"type": "object", "properties": {}}},
        {"type": "web_search"}], "tool_choice": "auto", "parallel_tool_calls": False,
        "reasoning": {"effort": "medium", "summary": "auto"}, "store": False, "stream": True,
        "include": ["reasoning.encrypted_content"], "prompt_cache_key": "0199a1b2-c3d4"}


def chat_request(rounds):
    """An OpenAI-compatible agent (Cline, Continue, the SDK with tools)."""
    messages = [{"role": "system", "content": "You are a coding assistant."},
                {"role": "user", "content": "How do I configure the retry policy in urllib3.PoolManager?"}]
    for r in range(rounds):
        messages.append({"role": "assistant", "content": None, "tool_calls": [{
            "id": "call_%d" % r, "type": "function",
            "function": {"name": "read_file", "arguments": json.dumps({"path": "setup.cfg"})}}]})
        messages.append({"role": "tool", "tool_call_id": "call_%d" % r, "content": "[metadata]\nname = demo\n"})
    return {"model": "qwen2.5-coder:7b", "messages": messages, "stream": True,
            "tools": [{"type": "function", "function": {"name": "read_file", "parameters": {}}}]}


def aider_request():
    return {"model": "gpt-4o", "stream": True, "messages": [
        {"role": "system", "content": "Act as an expert software developer."},
        {"role": "user", "content": "Change get_factorial() to use math.factorial"},
        {"role": "assistant", "content": "To make this change we need to modify `mathweb/flask/app.py`."},
        {"role": "user", "content": "I switched to a new code base."},
        {"role": "assistant", "content": "Ok."},
        {"role": "user", "content": "Fix the off-by-one in paginate() in app/views.py\n\n"
                                    "# *SEARCH/REPLACE block* Rules:\nEvery block must use this format."},
    ]}


LOOPS = {
    "messages": (claude_code_request, "messages"),
    "responses": (codex_request, "input"),
    "chat": (chat_request, "messages"),
    "ollama_chat": (chat_request, "messages"),
}


# -- extract_query -------------------------------------------------------------

@pytest.mark.parametrize("rounds", [0, 1, 2])
def test_claude_code_query_is_the_prompt_without_reminders(rounds):
    assert ragproxy.extract_query("messages", claude_code_request(rounds)) == CC_PROMPT


@pytest.mark.parametrize("rounds", [0, 2])
def test_codex_query_skips_developer_agents_md_environment_and_tool_output(rounds):
    assert ragproxy.extract_query("responses", codex_request(rounds)) == CODEX_PROMPT


def test_chat_query_skips_tool_messages_and_keeps_code_intact():
    assert ragproxy.extract_query("chat", chat_request(2)) == \
        "How do I configure the retry policy in urllib3.PoolManager?"
    trace = ("Traceback (most recent call last):\n  File \"/srv/app/main.py\", line 42, in <module>\n"
             "    cfg = parse_config(raw)  # {raw!r}\nKeyError: 'upstream'")
    body = {"messages": [{"role": "user", "content": "  " + trace + "\n"}]}
    assert ragproxy.extract_query("chat", body) == trace


def test_reminder_span_inside_a_string_is_removed():
    body = {"messages": [{"role": "user", "content": "Explain <system-reminder>ignore\nthis</system-reminder>"
                                                     "the `--dry-run` flag"}]}
    assert ragproxy.extract_query("messages", body) == "Explain the `--dry-run` flag"


def test_images_and_none_content_are_skipped():
    body = {"messages": [
        {"role": "user", "content": [{"type": "text", "text": "What is in this diagram?"},
                                     {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBO"}}]},
        {"role": "assistant", "content": None},
        {"role": "user", "content": None},
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]},
    ]}
    assert ragproxy.extract_query("chat", body) == "What is in this diagram?"


def test_responses_role_only_items_and_string_input():
    body = {"input": [{"role": "user", "content": "first"}, {"role": "assistant", "content": "ok"},
                      {"role": "user", "content": [{"type": "input_text", "text": "second"},
                                                   {"type": "input_image", "image_url": "data:,"}]}]}
    assert ragproxy.extract_query("responses", body) == "second"
    assert ragproxy.extract_query("responses", {"input": "Summarise README.md"}) == "Summarise README.md"


def test_sources_last_message_and_all_user():
    body = chat_request(1)
    assert ragproxy.extract_query("chat", body, "last_message") == "[metadata]\nname = demo"
    assert ragproxy.extract_query("messages", claude_code_request(1), "last_message").startswith(
        "1\tdef parse_config(raw):")
    assert ragproxy.extract_query("responses", codex_request(1), "last_message").startswith("def fetch_index")
    assert ragproxy.extract_query("chat", aider_request(), "all_user").split("\n\n")[:3] == [
        "Change get_factorial() to use math.factorial", "I switched to a new code base.",
        "Fix the off-by-one in paginate() in app/views.py"]
    with pytest.raises(ValueError, match="query source"):
        ragproxy.extract_query("chat", body, "first_user")


def test_ollama_endpoints_and_unknown_endpoint():
    assert ragproxy.extract_query("ollama_generate", {"model": "m", "prompt": "why is the sky blue"}) == \
        "why is the sky blue"
    assert ragproxy.extract_query("ollama_chat", {"messages": [
        {"role": "user", "content": "hi", "images": ["iVBORw0KGgo="]}]}) == "hi"
    assert ragproxy.extract_query("embeddings", {"input": "hello"}) == ""
    assert ragproxy.extract_query("chat", {"messages": [{"role": "system", "content": "sys"}]}) == ""


def test_cap_keeps_start_and_end_of_one_turn_within_bytes():
    words = ["módulo_%d.función()" % i for i in range(600)]
    text = " ".join(words)
    query = ragproxy.extract_query("chat", {"messages": [{"role": "user", "content": text}]}, max_bytes=1000)
    assert len(query.encode("utf-8")) <= 1000
    head, tail = query.split("\n...\n")
    assert text.startswith(head) and text.endswith(tail)
    assert set(head.split() + tail.split()) <= set(words)  # no identifier cut in half


def test_cap_of_all_user_keeps_the_most_recent_text():
    body = {"messages": [{"role": "user", "content": "старый вопрос " * 200},
                         {"role": "assistant", "content": "ok"},
                         {"role": "user", "content": "newest question about 検索"}]}
    query = ragproxy.extract_query("chat", body, "all_user", max_bytes=301)
    assert query.endswith("newest question about 検索") and len(query.encode("utf-8")) <= 301
    assert query.split()[0] in ("старый", "вопрос")
    assert ragproxy.extract_query("chat", body, max_bytes=None) == "newest question about 検索"


# -- turn_key ------------------------------------------------------------------

@pytest.mark.parametrize("endpoint", sorted(LOOPS))
def test_turn_key_is_stable_through_an_agent_loop_and_changes_on_a_new_turn(endpoint):
    build, field = LOOPS[endpoint]
    keys = {ragproxy.turn_key(endpoint, build(r)) for r in range(3)}
    assert len(keys) == 1 and len(next(iter(keys))) == 64
    later = build(2)
    if endpoint == "responses":
        later[field] += [{"type": "message", "role": "assistant", "content": [
            {"type": "output_text", "text": "Done."}]},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "now add tests"}]}]
    else:
        later[field] += [{"role": "assistant", "content": "Done."}, {"role": "user", "content": "now add tests"}]
    assert ragproxy.turn_key(endpoint, later) not in keys


def raw_of(body):
    """turn_key's ``raw`` over the client's bytes, as the retriever gives it."""
    def raw(key, upto, marked):
        return jsonbody.raw_entries(jsonbody.Members(body, (key,)), key, upto, leave_out="cache_control",
                                    within=marked)
    return raw


CLIENT_ENCODINGS = [lambda v: json.dumps(v).encode(),   # Python SDKs
                    lambda v: json.dumps(v, ensure_ascii=False, separators=(",", ":")).encode()]   # JS


@pytest.mark.parametrize("encode", CLIENT_ENCODINGS)
@pytest.mark.parametrize("endpoint", sorted(LOOPS) + ["ollama_generate"])
def test_turn_key_of_the_raw_bytes_is_stable_through_an_agent_loop(endpoint, encode):
    """Claude Code moves cache_control to the newest block every round: the key holds."""
    if endpoint == "ollama_generate":
        bodies = [{"model": "m", "prompt": "why", "context": [r]} for r in range(3)]
    else:
        bodies = [LOOPS[endpoint][0](r) for r in range(3)]
    keys = {ragproxy.turn_key(endpoint, body, raw_of(encode(body))) for body in bodies}
    assert len(keys) == 1 and len(next(iter(keys))) == 64


@pytest.mark.parametrize("endpoint", sorted(LOOPS))
def test_turn_key_of_the_raw_bytes_changes_with_any_byte_of_the_prefix(endpoint):
    """A change anywhere in the entries up to the human turn, in any of them, is a new key;
    one after it is not."""
    build, field = LOOPS[endpoint]
    body = build(2)
    encode = CLIENT_ENCODINGS[1]
    key = ragproxy.turn_key(endpoint, body, raw_of(encode(body)))
    human = min(n for n in range(len(body[field])) if ragproxy.turn_key(endpoint, dict(body, **{
        field: body[field][:n + 1]})) == ragproxy.turn_key(endpoint, body))   # the last human turn
    assert human < len(body[field]) - 1   # there are entries after the turn
    for n, entry in enumerate(body[field]):
        changed = copy.deepcopy(body)
        changed[field][n] = dict(entry, extra_field=1)   # one more member: new bytes
        got = ragproxy.turn_key(endpoint, changed, raw_of(encode(changed)))
        assert (got != key) == (n <= human), n
    spaced_out = encode(body).replace(b'"role":', b'"role": ', 1)   # whitespace is bytes too
    assert ragproxy.turn_key(endpoint, body, raw_of(spaced_out)) != key


@pytest.mark.parametrize("encode", CLIENT_ENCODINGS)
def test_turn_key_of_the_raw_bytes_holds_when_the_marker_moves_inside_tool_results(encode):
    """A client may put cache_control on a tool result's own text part, two levels into the
    message: the raw key finds it there as well as on messages and their blocks."""
    marker = {"type": "ephemeral"}

    def body(marked):
        result = {"type": "tool_result", "tool_use_id": "t1", "content": [{"type": "text", "text": "ok"}]}
        messages = [{"role": "user", "content": "run the tests please"},
                    {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "ls", "input": {}}]},
                    {"role": "user", "content": [result]},
                    {"role": "user", "content": "and why did the build fail"}]
        if marked == "inner":
            result["content"][0]["cache_control"] = marker
        elif marked == "block":
            result["cache_control"] = marker
        elif marked == "message":
            messages[3]["cache_control"] = marker
        return {"model": "m", "messages": messages}

    keys = {ragproxy.turn_key("messages", b, raw_of(encode(b))) for b in map(body, ("inner", "block", "message", None))}
    assert len(keys) == 1


class _Seen(dict):
    """The retriever's cache of turn texts, as far as turn_key uses it."""

    def put(self, key, value):
        self[key] = value


@pytest.mark.parametrize("endpoint", sorted(LOOPS))
def test_turn_key_remembering_turn_texts_gives_the_keys_hashing_gives(endpoint):
    """A later round is matched by comparing its text with the one remembered: same keys as
    hashing, and a prefix of the same length and the same end that differs elsewhere is
    still another turn."""
    build, field = LOOPS[endpoint]
    encode, seen = CLIENT_ENCODINGS[1], _Seen()
    bodies = [build(r) for r in range(3)]
    for body in bodies:   # an earlier question, long enough to lie before the end the lookup uses
        body[field].insert(0, {"role": "user", "content": "an earlier question " * 40})
    keys = [ragproxy.turn_key(endpoint, body, raw_of(encode(body)), seen) for body in bodies]
    assert keys == [ragproxy.turn_key(endpoint, body, raw_of(encode(body))) for body in bodies]
    # One text per turn; two when the first round's prefix held a marker (as sent, and cut).
    marked_first = endpoint == "messages"
    assert len(set(keys)) == 1 and len(seen) == (2 if marked_first else 1)
    assert {key for _, key in seen.values()} == {keys[0]}
    first = encode(bodies[0])
    at = first.index(b"an earlier question")
    twin = first[:at] + b"A" + first[at + 1:]   # one byte, near the start
    key = ragproxy.turn_key(endpoint, json.loads(twin), raw_of(twin), seen)
    assert key != keys[0] and key == ragproxy.turn_key(endpoint, json.loads(twin), raw_of(twin))


@pytest.mark.parametrize("moved", [True, False], ids=["markers-move-on", "markers-stay"])
def test_turn_key_finds_a_later_round_from_its_prefix_as_sent(moved):
    """A later round whose prefix is the first round's, markers cut (Claude Code moves them
    to the newest block) or left where they were, is found from its text as sent: raw
    is asked once, with nothing cut, and the key is the one hashing gives."""
    def build(rounds):
        body = claude_code_request(rounds)   # the marker on the newest block
        if not moved:
            body["messages"][0]["content"][-1]["cache_control"] = {"type": "ephemeral"}
        return body

    encode, seen = CLIENT_ENCODINGS[1], _Seen()
    first = build(0)
    key = ragproxy.turn_key("messages", first, raw_of(encode(first)), seen)
    for rounds in (1, 2):
        body, asked = build(rounds), []
        raw = raw_of(encode(body))

        def recording(key, upto, marked, raw=raw):
            asked.append(marked)
            return raw(key, upto, marked)

        assert b'"cache_control"' in encode(body)
        assert ragproxy.turn_key("messages", body, recording, seen) == key
        assert len(asked) == 1 and not asked[0]
        assert ragproxy.turn_key("messages", body, raw_of(encode(body))) == key   # what hashing gives


def sent_at_of(body):
    """turn_key's ``sent_at`` over the client's bytes, as the retriever gives it."""
    return lambda key, upto: jsonbody.entries_span(jsonbody.Members(body, (key,)), key, upto)


@pytest.mark.parametrize("moved", [True, False], ids=["markers-move-on", "markers-stay"])
def test_turn_key_finds_a_later_round_where_its_prefix_lies(moved):
    """With ``sent_at``, a later round's prefix is compared where it lies in its body: raw is
    not asked at all, and the key is the one hashing gives.  A prefix of the same size and
    end that differs in one byte, or that is not ASCII (no span), goes the way raw does."""
    def build(rounds, prompt=CC_PROMPT):
        body = claude_code_request(rounds)
        body["messages"][0]["content"][1]["text"] = prompt
        if not moved:
            body["messages"][0]["content"][-1]["cache_control"] = {"type": "ephemeral"}
        return body

    def refusing(key, upto, marked):
        raise AssertionError("raw asked for a prefix seen where it lies")

    encode = CLIENT_ENCODINGS[1]
    for prompt in (CC_PROMPT, CC_PROMPT + " \u00e9t\u00e9"):
        seen = _Seen()
        first = encode(build(0, prompt))
        key = ragproxy.turn_key("messages", json.loads(first), raw_of(first), seen, sent_at=sent_at_of(first))
        assert key == ragproxy.turn_key("messages", json.loads(first), raw_of(first))   # what hashing gives
        for rounds in (1, 2):
            body = encode(build(rounds, prompt))
            if prompt.isascii():
                assert ragproxy.turn_key("messages", json.loads(body), refusing, seen,
                                         sent_at=sent_at_of(body)) == key
            else:
                assert sent_at_of(body)("messages", 0) is None
                assert ragproxy.turn_key("messages", json.loads(body), raw_of(body), seen,
                                         sent_at=sent_at_of(body)) == key
        later = encode(build(1, prompt))
        at = later.index(REMINDER[20:40].encode())
        twin = later[:at] + b"Z" + later[at + 1:]   # one byte of the prefix, far from its end
        got = ragproxy.turn_key("messages", json.loads(twin), raw_of(twin), seen, sent_at=sent_at_of(twin))
        assert got != key and got == ragproxy.turn_key("messages", json.loads(twin), raw_of(twin))


def test_turn_key_without_raw_text_encodes_the_entries():
    body = claude_code_request(1)
    assert ragproxy.turn_key("messages", body, lambda key, upto, marked: None) == ragproxy.turn_key("messages", body)


def test_turn_key_ignores_harness_only_messages_after_the_turn():
    body = codex_request(1)
    key = ragproxy.turn_key("responses", body)
    body["input"].append({"type": "message", "role": "user", "content": [  # view_image output
        {"type": "input_image", "image_url": "data:image/png;base64,iVBO"}]})
    body["input"].append({"type": "message", "role": "user", "content": [
        {"type": "input_text", "text": "<environment_context>\n  <cwd>/repo/sub</cwd>\n</environment_context>"}]})
    assert ragproxy.turn_key("responses", body) == key
    assert ragproxy.extract_query("responses", body) == CODEX_PROMPT


def test_turn_key_none_without_a_human_turn():
    assert ragproxy.turn_key("chat", {"messages": [{"role": "system", "content": "x"}]}) is None
    assert ragproxy.turn_key("responses", {"previous_response_id": "resp_1", "input": [
        {"type": "function_call_output", "call_id": "c", "output": "ok"}]}) is None
    assert ragproxy.turn_key("completions", {"prompt": "x"}) is None
    assert ragproxy.turn_key("ollama_generate", {"prompt": "x"}) != ragproxy.turn_key("ollama_generate",
                                                                                        {"prompt": "y"})



def test_a_part_or_turn_is_human_exactly_when_the_harness_pattern_leaves_words():
    # _part_kind and _is_human tell most texts from their first character; the pattern alone is the definition.
    pieces = ["", " ", "\n", "\t", "\u3000", "\x1c", "hi", "#", "# AGENTS.md instructions for /r\n", "<",
              "<system-reminder>", "</system-reminder>", "<skill x=1>", "</skill>", "<b>", "</b>", "a<b",
              "<INSTRUCTIONS>", "</INSTRUCTIONS>", "# ", "##", "x"]
    rng = random.Random(21)
    fmt = inject._INJECT_FORMATS["messages"]
    for _ in range(4000):
        texts = ["".join(rng.choice(pieces) for _ in range(rng.randint(0, 6))) for _ in range(rng.randint(0, 3))]
        parts = [{"type": "text", "text": t} for t in texts] + rng.choice([[], [{"type": "tool_result"}]])
        rng.shuffle(parts)
        words = [bool(inject._HARNESS_RE.sub("", t).strip()) for t in texts]
        assert [inject._part_kind({"type": "text", "text": t}) for t in texts] == \
            ["human" if w else "harness" for w in words], texts
        expected = any(words)
        assert inject._is_human(fmt, {"role": "user", "content": parts}) is expected, texts
        if len(texts) == 1:
            assert inject._is_human(fmt, {"role": "user", "content": texts[0]}) is expected, texts


# -- continues_turn ------------------------------------------------------------

@pytest.mark.parametrize("endpoint", sorted(LOOPS))
def test_only_the_rounds_after_the_first_continue_a_turn(endpoint):
    build, field = LOOPS[endpoint]
    if endpoint == "messages":
        build = lambda r: claude_code_request(r, volatile=False)  # noqa: E731
    assert [continues_turn(endpoint, build(r)) for r in range(3)] == [False, True, True]
    later = build(2)
    later[field].append({"role": "user", "content": "a new question"} if endpoint != "responses" else
                        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "new"}]})
    assert not continues_turn(endpoint, later)  # a new human turn starts


def test_harness_text_after_the_turn_and_prompts_do_not_continue_it():
    body = codex_request(0)
    body["input"] += [{"type": "message", "role": "user", "content": [
        {"type": "input_image", "image_url": "data:image/png;base64,iVBO"}]}, "junk", {"type": ["x"]}]
    assert not continues_turn("responses", body)
    assert not continues_turn("chat", aider_request())
    assert not continues_turn("responses", {"input": "Summarise README.md"})
    assert not continues_turn("ollama_generate", {"prompt": "why"})
    assert not continues_turn("chat", {"messages": [{"role": "assistant", "content": "only me"}]})
    assert continues_turn("chat", {"messages": [{"role": "user", "content": "q"}, {"role": "tool", "content": "x"}]})


# -- the walk back to the human turn, remembered across rounds ---------------------

def _located(body):
    """Conversation's ``located`` over the client's bytes, as the retriever gives it."""
    return lambda key: jsonbody.entry_spans(jsonbody.Members(body, (key,)), key)


class _Poisoned(dict):
    """An entry the walk must not classify: any read of it fails the test."""

    def get(self, *args):
        raise AssertionError("an entry an earlier walk classified was classified again")


def _next_entries(endpoint, rng, n):
    """What an agent's next request adds: the model's turns, now and then a person's new words,
    harness text or an image-only message (neither of which is a human turn)."""
    roll = rng.random()
    if endpoint == "responses":
        if roll < 0.15:
            return [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": f"now {n}"}]}]
        if roll < 0.25:
            return [{"type": "message", "role": "user", "content": [
                {"type": "input_text", "text": "<environment_context>\n<cwd>/r</cwd>\n</environment_context>"}]}]
        return [{"type": "function_call", "call_id": f"c{n}", "name": "shell", "arguments": "{}"},
                {"type": "function_call_output", "call_id": f"c{n}", "output": f"out {n}\n" * rng.randint(1, 9)}]
    if endpoint == "messages":
        if roll < 0.15:
            return [{"role": "user", "content": [{"type": "text", "text": REMINDER}, {"type": "text", "text": f"q{n}"}]}]
        if roll < 0.25:
            return [{"role": "user", "content": [{"type": "text", "text": REMINDER}]}]
        return [{"role": "assistant", "content": [{"type": "tool_use", "id": f"t{n}", "name": "Read", "input": {}}]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": f"t{n}",
                                              "content": f"line {n}\n" * rng.randint(1, 9)}]}]
    if roll < 0.15:
        return [{"role": "user", "content": f"and then {n}?"}]
    if roll < 0.25:
        return [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:image/png;base64,x"}}]}]
    return [{"role": "assistant", "content": None, "tool_calls": [{"id": f"c{n}", "type": "function",
                                                                   "function": {"name": "f", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": f"c{n}", "content": f"out {n}\n" * rng.randint(1, 9)}]


@pytest.mark.parametrize("endpoint", sorted(LOOPS))
def test_a_walk_that_stops_where_the_last_one_did_finds_the_human_turn_a_full_walk_finds(endpoint):
    """Agent loops of every format, several at once, through many rounds: new human words,
    harness text, Claude Code's cache mark moved onto the newest message, a conversation
    cut short (a client compacting it), a non-ASCII body (no spans: the full walk): the
    remembered walk answers what walking every entry answers, round after round."""
    build, field = LOOPS[endpoint]
    rng, tails = random.Random(20261207), _Seen()
    loops = [build(1) for _ in range(3)]
    for n in range(400):
        body = rng.choice(loops)
        entries = body[field]
        if rng.random() < 0.05 and len(entries) > 3:
            del entries[rng.randrange(2, len(entries)):]   # compacted, or edited back
        if endpoint == "messages":   # the mark moves on to the newest entry
            for entry in entries:
                if isinstance(entry.get("content"), list):
                    for part in entry["content"]:
                        part.pop("cache_control", None)
        entries += _next_entries(endpoint, rng, n)
        if endpoint == "messages" and isinstance(entries[-1]["content"], list):
            entries[-1]["content"][-1]["cache_control"] = {"type": "ephemeral"}
        encode = CLIENT_ENCODINGS[n % 2]
        sent = encode(body) if rng.random() > 0.05 else encode(dict(body, model="caf\u00e9")).replace(
            b"caf\\u00e9", "caf\u00e9".encode())
        walked = inject.Conversation(endpoint, json.loads(sent), tails, _located(sent)).last_human
        assert walked == inject.Conversation(endpoint, json.loads(sent)).last_human, n
    assert tails   # the loops were remembered


def test_a_later_round_classifies_only_the_entries_it_added():
    tails = _Seen()
    for rounds in range(1, 8):
        sent = CLIENT_ENCODINGS[0](claude_code_request(rounds))
        first = inject.Conversation("messages", json.loads(sent), tails, _located(sent)).last_human
    assert first == 0
    body = claude_code_request(8)
    sent = CLIENT_ENCODINGS[0](body)
    # Every entry the round before left behind its two newest: the walk must stop before them.
    body["messages"][:-4] = [_Poisoned(m) for m in body["messages"][:-4]]
    assert inject.Conversation("messages", body, tails, _located(sent)).last_human == 0
    with pytest.raises(AssertionError, match="classified again"):   # without the memory, the walk reads them
        inject.Conversation("messages", body).last_human
    # Cut back to the entries remembered, then a person's new words right after them.
    cut = claude_code_request(8)
    cut["messages"][-2:] = [{"role": "user", "content": [{"type": "text", "text": "now the other bug"}]}]
    sent = CLIENT_ENCODINGS[0](cut)
    assert inject.Conversation("messages", cut, tails, _located(sent)).last_human == len(cut["messages"]) - 1
    # The same entries elsewhere (a conversation that differs in them) are walked in full.
    other = claude_code_request(8)
    other["messages"][2]["content"][0]["text"] = "Let me look at the parser."
    sent = CLIENT_ENCODINGS[0](other)
    assert inject.Conversation("messages", other, tails, _located(sent)).last_human == 0


# -- render_context ------------------------------------------------------------

def chunk(i, content, **extra):
    return dict({"id": "c%02d" % i, "source": "docs/part%d.md" % i, "title": "Part %d" % i,
                 "score": 1.0 - i / 10, "content": content}, **extra)


def test_render_fills_placeholders_and_leaves_other_braces_alone():
    code = "def f(d):\n    return {k: v for k, v in d.items()}  # {context} {0} {{x}}\n"
    text, used = ragproxy.render_context(
        [chunk(1, code)], "Q={query} {unknown} {{literal}}\n{context}\nEND",
        "[{index}] {title} {source} ({id}) {score} {nope}\n{content}", 1000, query="dict {comp}")
    assert text == ("Q=dict {comp} {unknown} {literal}\n"
                    "[1] Part 1 docs/part1.md (c01) 0.900 {nope}\n" + code.rstrip("\n") + "\nEND")
    assert used == [chunk(1, code)]


def test_default_chunk_template_labels_chunks_with_index_source_lines_and_symbol():
    chunks = [chunk(1, "def solve(a, b):", source="numpy/linalg/_linalg.py", line_start=362, line_end=389,
                    symbol="solve", headings=[]),
              chunk(2, "beta", line_start=12, line_end=12, symbol="", headings=["Install", "Linux"]),
              chunk(3, "gamma", line_start=4, line_end=9, headings=["page 2"]),
              chunk(4, "delta")]  # a chunk from elsewhere, no line numbers: the path alone
    text, _ = ragproxy.render_context(chunks, "{context}", ragproxy.DEFAULT_CHUNK_TEMPLATE, 500)
    assert text == ("[1] numpy/linalg/_linalg.py:362-389 (solve)\ndef solve(a, b):\n\n"
                    "[2] docs/part2.md:12 (Install > Linux)\nbeta\n\n"
                    "[3] docs/part3.md:4-9 (page 2)\ngamma\n\n"
                    "[4] docs/part4.md\ndelta")


def test_chunk_template_lines_symbol_and_section_placeholders():
    template = "{index}|{lines}|{symbol}|{section}|{citation}"
    chunks = [chunk(1, "x", line_start=7, line_end=30, symbol="Config.load", headings=["A"]),
              chunk(2, "x", line_start=5, line_end=5),
              chunk(3, "x", line_start=0, line_end=0, symbol=None, headings=None),
              # client-shaped junk never reaches the label as anything but text or nothing
              chunk(4, "x", line_start="3", line_end=True, symbol=["s"], headings="Intro")]
    text, _ = ragproxy.render_context(chunks, "{context}", template, 500)
    assert text.split("\n\n") == [
        "1|7-30|Config.load|A|docs/part1.md:7-30 (Config.load)",
        "2|5|||docs/part2.md:5",
        "3||||docs/part3.md",
        "4||['s']||docs/part4.md (['s'])",
    ]


def test_default_preamble_names_exactly_what_the_labels_hold():
    """The instruction a model reads must describe the labels it sees: the number in
    brackets, then the path, the line range and the symbol or section."""
    hit = chunk(1, "def solve(a, b):", source="numpy/linalg/_linalg.py", line_start=362, line_end=389,
                symbol="solve")
    text, _ = ragproxy.render_context([hit], ragproxy.DEFAULT_INJECT_TEMPLATE,
                                      ragproxy.DEFAULT_CHUNK_TEMPLATE, 500)
    preamble, context = text.split("<context>\n")
    label = context.split("\n")[0]
    assert label == "[1] numpy/linalg/_linalg.py:362-389 (solve)"
    instruction = " ".join(preamble.split())
    assert "[id]" not in instruction
    assert "labelled [number] path:lines (symbol or section)" in instruction
    assert re.fullmatch(r"\[(\d+)\] (\S+):(\d+-\d+) \((.+)\)", label)
    assert "cite a passage by its [number] and path" in instruction


def test_render_takes_whole_chunks_best_first_within_the_budget():
    chunks = [chunk(i, "word " * 40) for i in range(1, 6)]
    text, used = ragproxy.render_context(chunks, "<context>\n{context}\n</context>", "{content}", 130,
                                         count_tokens=lambda s: len(s.split()))
    assert [c["id"] for c in used] == ["c01", "c02", "c03"]
    assert len(text.split()) <= 130 and text.count("word") == 120
    big_second = [chunks[0], chunk(2, "word " * 200), chunks[2]]
    _, used = ragproxy.render_context(big_second, "{context}", "{content}", 130,
                                      count_tokens=lambda s: len(s.split()))
    assert [c["id"] for c in used] == ["c01"]  # stops at the first that does not fit


def test_render_truncates_an_oversized_first_chunk_at_a_line():
    lines = ["line %03d of the module" % i for i in range(100)]
    text, used = ragproxy.render_context([chunk(1, "\n".join(lines)), chunk(2, "next")], "{context}",
                                         "{content}", 100, count_tokens=lambda s: len(s.split()))
    assert used[0]["truncated"] is True and len(used) == 1
    kept = used[0]["content"].split("\n")
    assert kept == lines[:len(kept)] and 15 <= len(kept) < 25
    assert text == "\n".join(kept) + "\n[... truncated]"
    one_line = "token " * 500
    text, used = ragproxy.render_context([chunk(1, one_line)], "{context}", "{content}", 50,
                                         count_tokens=lambda s: len(s.split()))
    assert used[0]["content"] == ("token " * 48).strip() and text.endswith("[... truncated]")


def test_default_templates_end_to_end_into_a_claude_code_request():
    chunks = [chunk(1, "Retry(total=3, backoff_factor=0.5)", line_start=10, line_end=12), chunk(2, "See {docs}.")]
    text, used = ragproxy.render_context(chunks, ragproxy.DEFAULT_INJECT_TEMPLATE,
                                         ragproxy.DEFAULT_CHUNK_TEMPLATE, 2000, query=CC_PROMPT)
    assert len(used) == 2 and "untrusted" in text
    assert "<context>\n[1] docs/part1.md:10-12\nRetry(total=3, backoff_factor=0.5)\n\n" \
           "[2] docs/part2.md\nSee {docs}.\n</context>" in text
    body = claude_code_request(0)
    assert ragproxy.inject("messages", body, text)
    assert body["messages"][0]["content"][1] == {"type": "text", "text": text}


def test_the_proxy_labels_injected_passages_by_path_lines_and_symbol(make_proxy, fake, tmp_path):
    """Through the proxy with the official SDK: what reaches the model names each
    passage as the preamble says, from the fields the indexed chunks carry."""
    import openai
    from conftest import API_KEY, proxy_config

    code = tmp_path / "documents" / "code"
    code.mkdir(parents=True)
    (code / "keys.py").write_text('"""Key rotation helpers."""\n\n\n'
                                  "def rotate_signing_key(store, days=90):\n"
                                  '    """Rotate the signing key after ``days``."""\n'
                                  "    return store.rotate(days)\n")
    (code / "ops.md").write_text("# Operations\n\n## Keys\n\nThe signing key is rotated every 90 days.\n")
    config = proxy_config(fake.url, extra="knowledge_bases:\n  code: {retrieval: lexical}\n").replace(
        '  - {name: "*", upstream: [ol, oa]}', '  - {name: "*", upstream: [ol, oa], kb: [code]}')
    p = make_proxy(config, data_dir=tmp_path)
    p.app.knowledge_bases.index_all()
    client = openai.OpenAI(base_url=p.url + "/v1", api_key=API_KEY, max_retries=0)
    client.chat.completions.create(model="llama3", messages=[
        {"role": "user", "content": "how often is the signing key rotated? rotate_signing_key"}])
    sent = fake.last.json["messages"][-1]["content"]
    labels = re.findall(r"^\[(\d+)\] (.*)$", sent, re.M)
    assert [n for n, _ in labels] == ["1", "2"]
    assert {label for _, label in labels} == {"code/keys.py:1-6 (rotate_signing_key)",
                                              "code/ops.md:1-5 (Operations > Keys)"}
    assert "cite a passage by its [number] and path" in " ".join(sent.split())


def test_render_nothing_when_nothing_fits():
    assert ragproxy.render_context([], "{context}", "{content}", 100) == ("", [])
    assert ragproxy.render_context([chunk(1, "x")], "{context}", "{content}", 0) == ("", [])
    assert ragproxy.render_context([chunk(1, "x y z")], "a b c d {context}", "{content}", 3,
                                   count_tokens=lambda s: len(s.split())) == ("", [])


def test_templates_fill_only_their_placeholders_and_keep_every_other_brace():
    assert fill_template("{{context}} {context} {other} {0} }{ {", "C}{", "Q") == "{context} C}{ {other} {0} }{ {"
    assert inject._fill_template("{0}{index}{0x}", {"0": "zero", "index": "1"}) == "zero1{0x}"
    # Fuzzed against the rule read literally: one left-to-right pass over {{, }} and {name}.
    placeholder = re.compile(r"\{\{|\}\}|\{(\w+)\}")

    def literally(template, values):
        return placeholder.sub(lambda m: m.group(0)[0] if m.group(1) is None else values.get(m.group(1), m.group(0)),
                               template)
    parts = ["{", "}", "{{", "}}", "a", " ", "é", "{content}", "{index}", "{0}", "{x}", "{é}", "{content!r}",
             "{content:>5}", "{ }", "{{content}}", "{{{content}}}", "{_}", "\n"]
    values = {"content": "C{x}}", "index": "1", "0": "zero", "_": "U"}
    rnd = random.Random(3)
    for _ in range(5000):
        template = "".join(rnd.choice(parts) for _ in range(rnd.randint(0, 9)))
        some = dict(rnd.sample(sorted(values.items()), rnd.randint(0, len(values))))
        assert inject._fill_template(template, some) == literally(template, some), template


# What render_chunks' shortcut rests on: no more tokens than UTF-8 bytes, for every kind of character.
TEXT_PIECES = ["a", "Zebra", "konfigurationsdatei", "é", "Änderung", "日本語", "\n", "\t", " ", "7", "2026", "{}",
               "()->", "€", "→", "😀", "\ud800", "__init__", "x=1;", "\u0301", "ß"]


def random_text(rnd, pieces=12):
    return "".join(rnd.choice(TEXT_PIECES) for _ in range(rnd.randint(0, pieces)))


def test_token_estimate_never_exceeds_utf8_bytes():
    rnd = random.Random(20)
    for _ in range(20000):
        text = random_text(rnd)
        assert ragproxy.estimate_tokens_text(text) <= len(text.encode("utf-8", "surrogatepass")), text


def _estimate_by_the_rule(text):
    """estimate_tokens_text's rule, character by character: its docstring as a loop over runs."""
    def kind(ch):
        code = ord(ch)
        if code < 128:
            return "a" if ch.isalpha() else "d" if ch.isdigit() else "n" if ch == "\n" else " " if ch.isspace() else "s"
        return "u" if code < 0x2000 else "c" if 0x3000 <= code <= 0xFFFF else "S"

    quarters = 0
    for run_kind, run in itertools.groupby(map(kind, text), key=lambda k: "L" if k in "au" else "P" if k in "sS" else k):
        run = list(run)
        if run_kind == "L":   # 3/4 for the run, one per six letters after its first, 1/4 per non-ASCII letter
            quarters += 3 + 4 * ((len(run) - 1) // 6) + run.count("u")
        elif run_kind == "d":   # digits in threes
            quarters += 4 * ((len(run) + 2) // 3)
        elif run_kind == "P":   # one for the run of symbols, and one more for each non-ASCII symbol
            quarters += 4 + 4 * run.count("S")
        elif run_kind in "cn":
            quarters += 4 * len(run)
    return max(1, (quarters + 3) // 4) if text else 0


def test_token_estimate_follows_its_rule_on_any_text():
    rnd = random.Random(21)
    runs = ["a" * 5, "b" * 6, "c" * 7, "d" * 12, "e" * 13, "1" * 2, "2" * 3, "3" * 4, "4" * 6, "5" * 7, "é" * 7,
            "ü" * 6, "--", "=>", "日本語", "😀😀", "→→"]
    for _ in range(20000):
        text = "".join(rnd.choice(TEXT_PIECES + runs) for _ in range(rnd.randint(0, 24)))
        assert ragproxy.estimate_tokens_text(text) == _estimate_by_the_rule(text), text
    with open(os.path.join(ROOT, "_ragproxy", "inject.py"), encoding="utf-8") as f:
        source = f.read()
    for at in range(0, len(source), 4999):   # code, with its long identifiers and runs of spaces and digits
        assert ragproxy.estimate_tokens_text(source[at:at + 3000]) == _estimate_by_the_rule(source[at:at + 3000])


@pytest.mark.parametrize("count_name", ["estimate", "words"])
def test_render_chunks_takes_the_longest_prefix_of_whole_chunks_that_fits_at_every_budget(count_name):
    # The same rule whether the whole fits by its bytes (nothing counted) or chunks are counted one by one.
    count = ragproxy.estimate_tokens_text if count_name == "estimate" else lambda s: len(s.split())
    rnd = random.Random(5)
    for _ in range(60):
        chunks = [chunk(k, random_text(rnd, 30) or "x") for k in range(1, rnd.randint(1, 5) + 1)]
        pieces = [fill_template("{context}", c["content"].rstrip("\r\n"), "") for c in chunks]
        total = sum(len(p.encode("utf-8", "surrogatepass")) for p in pieces) + 2 * (len(pieces) - 1)
        for budget in range(0, total + 3):
            context, used = render_chunks(chunks, "{content}", budget, count)
            if used and used[0].get("truncated"):
                assert len(used) == 1 and count(context) <= budget
                continue
            assert used == chunks[:len(used)] and context == "\n\n".join(pieces[:len(used)])
            costs = [count(p) + (count("\n\n") if i else 0) for i, p in enumerate(pieces)]
            assert sum(costs[:len(used)]) <= budget
            if len(used) < len(chunks):
                assert sum(costs[:len(used) + 1]) > budget


# Exact cl100k_base / o200k_base counts, measured with tiktoken.
TOKENIZED = [
    ("The proxy retrieves passages from local knowledge bases and injects them into the request "
     "before forwarding it to the model.", 22, 22),
    ('def load(path):\n    with open(path, encoding="utf-8") as f:\n        return json.load(f)["items"]\n',
     26, 26),
    ("Traceback (most recent call last):\n  File \"/srv/app/main.py\", line 42, in <module>\n"
     "    cfg = parse_config(raw)\nKeyError: 'upstream'\n", 38, 38),
    ('{"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}], "stream": true}', 32, 32),
    ("检索增强生成把本地知识库中的段落注入到请求中。", 25, 18),
    ("Die Konfigurationsdatei wird beim Start gelesen und bei Änderungen automatisch neu geladen.", 22, 17),
]


@pytest.mark.parametrize("text,cl100k,o200k", TOKENIZED)
def test_token_estimate_is_close_to_real_tokenizers(text, cl100k, o200k):
    estimate = ragproxy.estimate_tokens_text(text)
    assert 0.75 * min(cl100k, o200k) <= estimate <= 1.3 * max(cl100k, o200k)


def test_token_estimate_edges():
    assert ragproxy.estimate_tokens_text("") == 0
    assert ragproxy.estimate_tokens_text(" ") == 1
    assert ragproxy.estimate_tokens_text("a" * 4000) > 500  # long runs are not one token
    assert ragproxy.estimate_tokens_text("\ud800 lone surrogate") >= 2


# -- inject: where the context goes ---------------------------------------------

def test_before_last_user_claude_code_goes_between_reminder_and_prompt():
    body = claude_code_request(2)
    before = copy.deepcopy(body)
    assert ragproxy.inject("messages", body, CONTEXT)
    turn = body["messages"][0]["content"]
    assert turn == [{"type": "text", "text": REMINDER}, {"type": "text", "text": CONTEXT},
                    {"type": "text", "text": CC_PROMPT}]
    body["messages"][0]["content"].pop(1)
    assert body == before  # nothing else touched: system, tools, tool rounds


def test_before_last_user_anthropic_string_and_tool_result_mix():
    body = {"messages": [{"role": "system", "content": "be brief"},
                         {"role": "user", "content": "Where is retry configured?"}]}
    assert ragproxy.inject("messages", body, "CTX")
    assert body["messages"] == [{"role": "system", "content": "be brief"},
                                {"role": "user", "content": "CTX\n\nWhere is retry configured?"}]
    body = {"messages": [{"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "t1", "content": "ok"},
        {"type": "text", "text": "also check the tests"}]}]}
    assert ragproxy.inject("messages", body, "CTX")
    assert [p["type"] for p in body["messages"][0]["content"]] == ["tool_result", "text", "text"]
    assert body["messages"][0]["content"][1]["text"] == "CTX"
    body = {"messages": [{"role": "user", "content": REMINDER + "fix it"}]}
    assert ragproxy.inject("messages", body, "CTX")
    assert body["messages"][0]["content"] == REMINDER + "CTX\n\nfix it"


def test_before_last_user_chat_string_list_and_codex():
    body = aider_request()
    ragproxy.inject("chat", body, "CTX")
    assert body["messages"][-1]["content"].startswith("CTX\n\nFix the off-by-one")
    assert body["messages"][1]["content"] == "Change get_factorial() to use math.factorial"
    body = {"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "data:,"}}, {"type": "text", "text": "what is this"}]}]}
    ragproxy.inject("chat", body, "CTX")
    assert body["messages"][0]["content"][0] == {"type": "text", "text": "CTX"}
    body = codex_request(1)
    ragproxy.inject("responses", body, "CTX")
    assert body["input"][3]["content"] == [{"type": "input_text", "text": "CTX"},
                                           {"type": "input_text", "text": CODEX_PROMPT}]
    assert "instructions" not in body


def test_before_last_user_string_inputs_and_ollama():
    body = {"model": "m", "input": "Summarise README.md"}
    ragproxy.inject("responses", body, "CTX")
    assert body["input"] == "CTX\n\nSummarise README.md"
    body = {"model": "m", "prompt": "why", "system": "sys"}
    ragproxy.inject("ollama_generate", body, "CTX")
    assert body == {"model": "m", "prompt": "CTX\n\nwhy", "system": "sys"}
    body = {"model": "m", "messages": [{"role": "user", "content": "hi", "images": ["iVBO"]}]}
    ragproxy.inject("ollama_chat", body, "CTX")
    assert body["messages"] == [{"role": "user", "content": "CTX\n\nhi", "images": ["iVBO"]}]


@pytest.mark.parametrize("mode", inject.INJECT_MODES)
def test_injected_entry_is_the_one_entry_inject_changes_by_itself(mode):
    """Where injected_entry names a path, inject changes that entry and nothing else, and
    makes of it what it makes of the same entry alone in a conversation: what
    retrieval relies on to put back the entry a round before made."""
    requests = [(endpoint, make(rounds)) for endpoint, (make, _) in sorted(LOOPS.items()) for rounds in (0, 2)]
    requests += [("chat", aider_request()), ("responses", {"model": "m", "input": "Summarise README.md"}),
                 ("ollama_generate", {"model": "m", "prompt": "why"}),
                 ("chat", {"messages": [{"role": "assistant", "content": "hi"}]})]
    named = 0
    for (endpoint, body), replace in itertools.product(requests, (False, True)):
        payload = copy.deepcopy(body)
        path = inject.injected_entry(endpoint, payload, mode)
        edits = inject.inject(endpoint, payload, "CTX", mode, replace)
        if path is None:
            assert mode != "before_last_user" or all(len(edit) == 1 for edit in edits), endpoint
            continue
        named += 1
        key, i = path
        assert edits == (path,) and payload[key][:i] == body[key][:i] and payload[key][i + 1:] == body[key][i + 1:]
        alone = {key: [copy.deepcopy(body[key][i])]}
        assert inject.inject(endpoint, alone, "CTX", mode, replace) == ((key, 0),) and alone[key] == [payload[key][i]]
        again = copy.deepcopy(body)
        inject.put_entry(again, path, payload[key][i])
        assert again == payload and again[key] is not body[key]
    assert named == (2 * 2 * len(LOOPS) + 2 if mode == "before_last_user" else 0)


def test_system_modes_openai_chat():
    body = aider_request()
    ragproxy.inject("chat", body, "CTX", "system_prepend")
    assert body["messages"][0]["content"] == "CTX\n\nAct as an expert software developer."
    body = aider_request()
    ragproxy.inject("chat", body, "CTX", "system_append")
    assert body["messages"][0]["content"] == "Act as an expert software developer.\n\nCTX"
    body = {"messages": [{"role": "user", "content": "q"}, {"role": "developer",
                                                            "content": [{"type": "text", "text": "dev"}]}]}
    ragproxy.inject("chat", body, "CTX", "system_prepend")
    assert body["messages"][1]["content"] == [{"type": "text", "text": "CTX"}, {"type": "text", "text": "dev"}]
    body = {"messages": [{"role": "user", "content": "q"}]}
    ragproxy.inject("ollama_chat", body, "CTX", "system_append")
    assert body["messages"] == [{"role": "system", "content": "CTX"}, {"role": "user", "content": "q"}]


def test_system_modes_anthropic_keep_the_client_shape():
    body = claude_code_request(1)
    billing, cached = copy.deepcopy(body["system"][0]), copy.deepcopy(body["system"][1:])
    ragproxy.inject("messages", body, "CTX", "system_prepend")
    assert body["system"] == [billing, {"type": "text", "text": "CTX"}] + cached
    body = claude_code_request(1)
    ragproxy.inject("messages", body, "CTX", "system_append")
    assert body["system"] == [billing] + cached + [{"type": "text", "text": "CTX"}]
    body = {"system": "be brief", "messages": [{"role": "user", "content": "q"}]}
    ragproxy.inject("messages", body, "CTX", "system_prepend")
    assert body["system"] == "CTX\n\nbe brief"
    body = {"messages": [{"role": "user", "content": "q"}]}
    ragproxy.inject("messages", body, "CTX", "system_append")
    assert body["system"] == "CTX"


def test_system_modes_responses_and_generate():
    body = codex_request(0)
    ragproxy.inject("responses", body, "CTX", "system_append")
    assert body["instructions"] == "CTX" and body["input"] == codex_request(0)["input"]
    body = {"instructions": "You are terse.", "input": "q"}
    ragproxy.inject("responses", body, "CTX", "system_prepend")
    assert body["instructions"] == "CTX\n\nYou are terse."
    body = {"prompt": "q", "system": "sys"}
    ragproxy.inject("ollama_generate", body, "CTX", "system_append")
    assert body == {"prompt": "q", "system": "sys\n\nCTX"}


def test_new_message_goes_right_before_the_human_turn():
    body = claude_code_request(1)
    ragproxy.inject("messages", body, "CTX", "new_message")
    assert body["messages"][0] == {"role": "user", "content": "CTX"}
    assert body["messages"][1]["content"][1]["text"] == CC_PROMPT
    body = codex_request(1)
    ragproxy.inject("responses", body, "CTX", "new_message")
    assert body["input"][3] == {"type": "message", "role": "user",
                                "content": [{"type": "input_text", "text": "CTX"}]}
    assert body["input"][4]["content"][0]["text"] == CODEX_PROMPT
    body = aider_request()
    ragproxy.inject("chat", body, "CTX", "new_message")
    assert body["messages"][-2:] == [{"role": "user", "content": "CTX"}, aider_request()["messages"][-1]]
    body = {"prompt": "q"}
    ragproxy.inject("ollama_generate", body, "CTX", "new_message")
    assert body == {"prompt": "CTX\n\nq"}


@pytest.mark.parametrize("mode", ragproxy.INJECT_MODES)
@pytest.mark.parametrize("endpoint,body", [
    ("chat", {"messages": [{"role": "system", "content": "s"}, {"role": "assistant", "content": None}]}),
    ("messages", {"messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t"}]}]}),
    ("messages", {"messages": []}),
    ("responses", {"input": [{"type": "function_call_output", "call_id": "c", "output": "x"}]}),
    ("responses", {"input": [{"role": "user", "content": [{"type": "input_text", "text":
                                                            "<environment_context></environment_context>"}]}]}),
    ("ollama_generate", {"prompt": ""}),
    ("ollama_generate", {"prompt": "<|im_start|>user\nhi<|im_end|>\n", "raw": True}),
    ("completions", {"prompt": "q"}),
    ("chat", {"messages": "not a list"}),
])
def test_no_human_turn_means_no_injection(mode, endpoint, body):
    before = copy.deepcopy(body)
    assert ragproxy.inject(endpoint, body, "CTX", mode) == ()
    assert body == before


def test_unknown_roles_fields_and_bad_arguments():
    body = {"messages": [{"role": "system", "content": "inline system"}, {"role": "critic", "content": "meh"},
                         {"role": "user", "content": "q", "x_custom": {"keep": 1}}], "x_top": [1]}
    ragproxy.inject("messages", body, "CTX", "system_prepend")
    assert body["messages"][:2] == [{"role": "system", "content": "inline system"},
                                    {"role": "critic", "content": "meh"}]
    assert body["system"] == "CTX" and body["x_top"] == [1] and body["messages"][2]["x_custom"] == {"keep": 1}
    assert ragproxy.inject("chat", {"messages": [{"role": "user", "content": "q"}]}, "") == ()
    with pytest.raises(ValueError, match="inject mode"):
        ragproxy.inject("chat", {"messages": [{"role": "user", "content": "q"}]}, "CTX", "prepend")


# -- the paths inject reports ---------------------------------------------------

def spaced(payload):
    """The payload as a client might write it: spaced, with each top-level value and each
    entry of a top-level list on its own, so the test can find them in a spliced body."""
    def value(v):
        if isinstance(v, list):
            return "[ " + " , ".join(json.dumps(item, indent=1) for item in v) + " ]"
        return json.dumps(v, indent=1)
    return ("{\n " + ",\n ".join(f"{json.dumps(k)} : {value(v)}" for k, v in payload.items()) + "\n}").encode()


PATH_CASES = [(endpoint, build(rounds)) for endpoint, (build, _) in LOOPS.items() for rounds in (0, 2)] + [
    ("chat", aider_request()),
    ("chat", {"model": "m", "messages": [{"role": "user", "content": "q"}]}),  # no system message yet
    ("messages", {"model": "m", "messages": [{"role": "user", "content": "q"}]}),  # no system field yet
    ("messages", {"model": "m", "system": "be brief", "messages": [{"role": "user", "content": "q"}]}),
    ("responses", {"model": "m", "input": "Summarise README.md", "instructions": "terse"}),
    ("ollama_generate", {"model": "m", "prompt": "why", "system": "sys"}),
    ("ollama_generate", {"model": "m", "prompt": "why"}),
]


@pytest.mark.parametrize("replace", [False, True])
@pytest.mark.parametrize("mode", ragproxy.INJECT_MODES)
@pytest.mark.parametrize("endpoint,body", PATH_CASES + [("messages", claude_code_request(2))])
def test_inject_edits_nothing_below_the_top_level_in_place(endpoint, body, mode, replace):
    """Copy on write: the values a payload held before inject are as they were, so a body's
    values can be shared with the bodies that repeat it (jsonbody.ParseMemo)."""
    payload = copy.deepcopy(body)
    held = dict(payload)   # the objects themselves
    frozen = copy.deepcopy(held)
    paths = ragproxy.inject(endpoint, payload, CONTEXT, mode, replace)
    assert paths and payload != body
    assert held == frozen


@pytest.mark.parametrize("replace", [False, True])
@pytest.mark.parametrize("mode", ragproxy.INJECT_MODES)
@pytest.mark.parametrize("endpoint,body", PATH_CASES)
def test_inject_names_every_path_it_changed(endpoint, body, mode, replace):
    """Re-encoding only the reported paths gives the injected payload, and every other
    top-level value and list entry keeps the client's bytes."""
    raw = spaced(body)
    payload = jsonbody.json_object_of(raw)
    paths = ragproxy.inject(endpoint, payload, CONTEXT, mode, replace)
    assert paths
    sent = jsonbody.with_edits(raw, payload, paths)
    assert json.loads(sent) == payload
    for key, value in body.items():
        if (key,) in paths:
            continue
        if not isinstance(value, list):
            assert json.dumps(value, indent=1).encode() in sent, key
            continue
        edited = {path[1] for path in paths if path[0] == key}
        assert len(payload[key]) == len(value)
        kept = [json.dumps(item, indent=1).encode() in sent for item in value]
        assert kept == [i not in edited for i in range(len(value))], key


@pytest.mark.parametrize("mode", ragproxy.INJECT_MODES)
@pytest.mark.parametrize("endpoint,body", PATH_CASES + [("messages", claude_code_request(2)),
                                                       ("messages", claude_code_request(0))])
def test_one_conversation_shared_by_every_function_answers_as_each_alone(endpoint, body, mode):
    """What the retriever does: one Conversation for a request, its last human turn found once."""
    alone, shared = copy.deepcopy(body), copy.deepcopy(body)
    conversation = ragproxy.Conversation(endpoint, shared)
    for source in ragproxy.QUERY_SOURCES:
        assert ragproxy.extract_query(endpoint, shared, source, 4000, conversation) == \
            ragproxy.extract_query(endpoint, alone, source)
    assert question_text(endpoint, shared, conversation) == question_text(endpoint, alone)
    assert ragproxy.turn_key(endpoint, shared, conversation=conversation) == ragproxy.turn_key(endpoint, alone)
    assert continues_turn(endpoint, shared, conversation) == continues_turn(endpoint, alone)
    assert ragproxy.inject(endpoint, shared, CONTEXT, mode, True, conversation) == \
        ragproxy.inject(endpoint, alone, CONTEXT, mode, True)
    assert shared == alone


# -- the agent-loop invariant ---------------------------------------------------

def _loop(endpoint, build, mode):
    requests = [build(r) for r in range(3)]
    keys = {ragproxy.turn_key(endpoint, r) for r in requests}
    for request in requests:
        assert ragproxy.inject(endpoint, request, CONTEXT, mode)
    return requests, keys


@pytest.mark.parametrize("mode", ragproxy.INJECT_MODES)
@pytest.mark.parametrize("endpoint", sorted(LOOPS))
def test_agent_loop_requests_share_a_byte_identical_prefix(endpoint, mode):
    build, field = LOOPS[endpoint]
    if endpoint == "messages":
        build = lambda r: claude_code_request(r, volatile=False)  # noqa: E731
    requests, keys = _loop(endpoint, build, mode)
    assert len(keys) == 1
    added = 1 if mode == "new_message" else 0
    for rounds, (earlier, later) in enumerate(zip(requests, requests[1:]), 1):
        n = len(earlier[field])
        assert dumps(later[field][:n]) == dumps(earlier[field])
        assert dumps(later[field][n:]) == dumps(build(rounds)[field][n - added:])  # the client's, untouched
        for key in ("system", "instructions", "tools"):
            assert dumps(later.get(key)) == dumps(earlier.get(key))
        assert dumps(later).count(json.dumps(CONTEXT)[1:-1]) == 1


@pytest.mark.parametrize("mode", ragproxy.INJECT_MODES)
def test_claude_code_loop_with_moving_cache_control_and_billing_header(mode):
    """The client itself moves cache_control to the newest block and rehashes its billing
    block; everything we add sits at the same place with the same bytes."""
    requests, keys = _loop("messages", claude_code_request, mode)
    assert len(keys) == 1
    for earlier, later in zip(requests, requests[1:]):
        n = len(earlier["messages"])
        assert dumps(without_cache_control(later["messages"][:n])) == \
            dumps(without_cache_control(earlier["messages"]))
        assert dumps(later["system"][1:]) == dumps(earlier["system"][1:])
        assert later["system"][0]["text"].startswith("x-anthropic-billing-header:")
        assert [b.get("cache_control") for b in later["system"]] == \
               [b.get("cache_control") for b in earlier["system"]]


# -- {query}: the rendered template in place of the person's words ---------------------

def in_place(endpoint, body, mode="before_last_user"):
    """Inject a template holding the question; returns the rendered text."""
    text = "CTX\nUser content: " + question_text(endpoint, body)
    assert ragproxy.inject(endpoint, body, text, mode, replaces_question=True)
    return text


def test_uses_query_and_question_text():
    assert uses_query("a {context} b {query}") and not uses_query("{context} {{query}}")
    assert question_text("messages", claude_code_request(2)) == CC_PROMPT
    long = "word " * 2000  # never capped: it replaces the words, all of them
    assert question_text("chat", {"messages": [{"role": "user", "content": long}]}) == long.strip()
    chunks = [{"id": "a", "source": "s", "content": "alpha"}, {"id": "b", "source": "s", "content": "beta"}]
    context, used = render_chunks(chunks, "{content}", 100)
    assert ragproxy.render_context(chunks, "<c>{context}</c> {query}", "{content}", 100, "q") == \
        (fill_template("<c>{context}</c> {query}", context, "q"), used)


def test_query_in_place_before_last_user_in_every_shape():
    body = claude_code_request(0)
    body["messages"][0]["content"][1]["cache_control"] = {"type": "ephemeral"}
    text = in_place("messages", body)
    assert body["messages"][0]["content"] == [{"type": "text", "text": REMINDER},
                                              {"type": "text", "text": text, "cache_control": {"type": "ephemeral"}}]
    late = "<system-reminder>late</system-reminder>"
    body = {"messages": [{"role": "user", "content": REMINDER + "fix it " + late}]}
    text = in_place("messages", body)
    assert text.endswith("User content: fix it") and body["messages"][0]["content"] == REMINDER + text + "\n\n" + late
    body = {"messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": "ok"},
                                                      {"type": "text", "text": "and the tests " + late}]}]}
    text = in_place("messages", body)
    assert body["messages"][0]["content"] == [{"type": "tool_result", "tool_use_id": "t", "content": "ok"},
                                              {"type": "text", "text": text}, {"type": "text", "text": late}]
    body = {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:,"}},
                                                      {"type": "text", "text": "what is"}, "this"]}]}
    text = in_place("chat", body)
    assert text.endswith("what is\n\nthis")
    assert body["messages"][0]["content"] == [{"type": "text", "text": text},
                                              {"type": "image_url", "image_url": {"url": "data:,"}}]
    body = codex_request(1)
    text = in_place("responses", body)
    assert body["input"][3]["content"] == [{"type": "input_text", "text": text}]
    for endpoint, body, field in [("responses", {"input": "Summarise README.md"}, "input"),
                                  ("ollama_generate", {"prompt": "why", "system": "s"}, "prompt")]:
        text = in_place(endpoint, body)
        assert body[field] == text
    body = {"messages": [{"role": "user", "content": "hi", "images": ["iVBO"]}]}
    text = in_place("ollama_chat", body)
    assert body["messages"] == [{"role": "user", "content": text, "images": ["iVBO"]}]


def test_query_in_place_new_message():
    body = aider_request()
    text = in_place("chat", body, "new_message")
    assert body["messages"][:-1] == aider_request()["messages"][:-1]  # nothing was left: it took its place
    assert body["messages"][-1] == {"role": "user", "content": text}
    body = claude_code_request(1, volatile=False)
    text = in_place("messages", body, "new_message")
    assert body["messages"][0] == {"role": "user", "content": text}
    assert body["messages"][1]["content"] == [{"type": "text", "text": REMINDER}]  # the harness stays
    body = codex_request(0)
    text = in_place("responses", body, "new_message")
    assert body["input"][3] == {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}
    assert len(body["input"]) == 4


@pytest.mark.parametrize("mode", ["system_prepend", "system_append"])
def test_query_in_the_system_modes_is_only_text(mode):
    body = aider_request()
    ragproxy.inject("chat", body, "CTX " + question_text("chat", body), mode, replaces_question=True)
    assert body["messages"][-1] == aider_request()["messages"][-1]  # the question stays in its turn
    assert question_text("chat", body) in body["messages"][0]["content"]


@pytest.mark.parametrize("mode", ["before_last_user", "new_message"])
@pytest.mark.parametrize("endpoint", sorted(LOOPS))
def test_agent_loop_with_the_query_in_place_keeps_a_byte_identical_prefix(endpoint, mode):
    build, field = LOOPS[endpoint]
    if endpoint == "messages":
        build = lambda r: claude_code_request(r, volatile=False)  # noqa: E731
    question = question_text(endpoint, build(0))
    requests = [build(r) for r in range(3)]
    for request in requests:
        in_place(endpoint, request, mode)
    for earlier, later in zip(requests, requests[1:]):
        assert dumps(later[field][:len(earlier[field])]) == dumps(earlier[field])
        assert dumps(later).count(json.dumps(question)[1:-1]) == 1


# -- wrong types: skipped, never an exception ------------------------------------------

@pytest.mark.parametrize("endpoint,body", [
    ("chat", {"messages": [{"role": "user", "content": [{"type": [], "text": "hi"}, {"type": {}, "text": "q"},
                                                        {"type": "text", "text": ["q"]}, None, 5, [], "real"]}]}),
    ("messages", {"system": 5, "messages": [{"role": "user", "content": [{"type": ["text"], "text": "q"}, "real"]}]}),
    ("messages", {"system": {"text": "s"}, "messages": [{"role": [], "content": "x"}, {"role": "user",
                                                                                      "content": "real"}]}),
    ("responses", {"instructions": 7, "input": [{"type": [], "role": "user", "content": "x"},
                                                {"role": "user", "content": [{"type": None}, "real"]}]}),
    ("chat", {"messages": [{"role": "system", "content": 3}, {"role": "user", "content": {"text": "x"}},
                           {"role": "user", "content": "real"}]}),
])
def test_wrong_types_in_a_body_are_skipped(endpoint, body):
    assert ragproxy.extract_query(endpoint, body) == "real"
    for mode in ragproxy.INJECT_MODES:
        payload = copy.deepcopy(body)
        paths = ragproxy.inject(endpoint, payload, "CTX", mode)
        if mode.startswith("system") and paths == ():  # a system prompt no API accepts: left to the upstream
            assert payload == body
        else:
            assert "CTX" in json.dumps(payload)


def test_deep_nesting_that_json_accepts_is_read_without_recursion():
    deep = json.loads('{"type": "x", "cache_control": 1, "content": ' * 480 + '"deep text"' + "}" * 480)
    body = {"messages": [{"role": "user", "content": "q"}, {"role": "tool", "content": [deep]}]}
    assert ragproxy.extract_query("chat", body, "last_message") == "deep text"
    body = {"messages": [{"role": "user", "content": [{"type": "text", "text": "q"}, deep]}]}
    assert ragproxy.turn_key("chat", body)


# -- fuzz: mutated bodies of every format -------------------------------------------------

_ODD_VALUES = [None, True, 0, -1.5, "", "x", "\ud800", [], {}, [None], [[]], [{}], {"type": []}, {"type": {}},
               {"type": "text"}, {"type": "text", "text": []}, {"type": "text", "text": None},
               {"type": "text", "text": "<system-reminder>r</system-reminder>"}, {"type": "tool_result"},
               {"type": "input_text", "text": "words \ud800"}, {"role": "user"}, {"role": "user", "content": 5},
               {"role": "assistant", "content": [1]}, {"type": "function_call_output", "output": [{}]},
               {"type": "message", "role": "user", "content": [{"type": ["input_text"], "text": "t"}]},
               "<system-reminder>unclosed", {"cache_control": []}]


def _containers(value, path=()):
    yield path, value
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, child in list(items):
        yield from _containers(child, path + (key,))


def _mutate(body, rng):
    body = copy.deepcopy(body)
    for _ in range(rng.randint(1, 4)):
        spots = [(path, value) for path, value in _containers(body) if isinstance(value, (dict, list))]
        path, node = rng.choice(spots)
        odd = copy.deepcopy(rng.choice(_ODD_VALUES))
        keys = list(node) if isinstance(node, dict) else list(range(len(node)))
        action = rng.random()
        if keys and action < 0.6:
            node[rng.choice(keys)] = odd
        elif keys and action < 0.75:
            del node[rng.choice(keys)]
        elif isinstance(node, list):
            node.insert(rng.randint(0, len(node)), odd)
        else:
            node[rng.choice(["type", "text", "role", "content", "system", "instructions", "input", "messages",
                             "prompt", "raw", "output"])] = odd
    return body


_FUZZ_BODIES = [("messages", claude_code_request(2)), ("responses", codex_request(2)), ("chat", chat_request(2)),
                ("chat", aider_request()), ("ollama_chat", chat_request(1)),
                ("ollama_generate", {"model": "m", "prompt": REMINDER + "why", "system": "sys"}),
                ("responses", {"model": "m", "input": "Summarise README.md", "instructions": "terse"})]


def test_fuzz_readers_and_inject_never_raise_on_mutated_bodies():
    rng = random.Random(14)
    for case in range(4000):
        endpoint, seed = _FUZZ_BODIES[case % len(_FUZZ_BODIES)]
        body = _mutate(seed, rng)
        raw = json.dumps(body).encode()
        try:
            payload = jsonbody.json_object_of(raw)
            for source in ragproxy.QUERY_SOURCES:
                ragproxy.extract_query(endpoint, payload, source, rng.choice([None, 64, 4000]))
            ragproxy.turn_key(endpoint, payload)
            continues_turn(endpoint, payload)
            question = question_text(endpoint, payload)
            for mode in ragproxy.INJECT_MODES:
                for replace in (False, True):
                    edited = jsonbody.json_object_of(raw)
                    paths = ragproxy.inject(endpoint, edited, "CTX " + question, mode, replace)
                    sent = jsonbody.with_edits(raw, edited, paths) if paths else raw
                    assert sent is None or json.loads(sent) == edited
        except ClientError:
            pass
        except Exception as exc:
            raise AssertionError(f"case {case} ({endpoint}): {exc!r} for {raw[:300]!r}") from exc
