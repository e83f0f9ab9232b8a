"""Editing a request's JSON body in place (_ragproxy.jsonbody): with_model, with_edits, json_object_of, in-process.

Each test compares bytes: what is not edited must come out exactly as it
went in, and where an edit cannot be placed safely the answer is None (the
proxy then encodes the payload again).  That the proxy forwards these bytes
is test_proxy's.
"""
import json
import random

import pytest

from _ragproxy import jsonbody
from _ragproxy.api import ClientError, json_text
from _ragproxy.http1 import BodyParts


def test_with_model_replaces_only_a_leading_model_of_the_parsed_value():
    assert jsonbody.with_model(b'{"model":"a\\u0062","x":1}', "ab", 'n"\u00e9') == \
        b'{"model":"n\\"\xc3\xa9","x":1}'
    assert jsonbody.with_model(b'{"model":"a","model":"b"}', "b", "c") is None
    assert jsonbody.with_model(b'{"x":{"model":"a"},"model":"a"}', "a", "c") is None
    assert jsonbody.with_model(b'{"model" "a"}', "a", "c") is None


def test_with_edits_re_encodes_only_the_paths_named():
    body = b' { "model" : "a", "messages" : [ {"n": 1.50} , {"n": 2} ], "x": 1e400 } '
    payload = jsonbody.json_object_of(body)
    payload["messages"][1]["n"] = 3
    assert jsonbody.with_edits(body, payload, [("messages", 1)]) == \
        b' { "model" : "a", "messages" : [ {"n": 1.50} , {"n":3} ], "x": 1e400 } '
    payload["model"], payload["system"], payload["tools"] = "b", "s\u00e9", []
    assert jsonbody.with_edits(body, payload, [("system",), ("model",), ("messages", 1), ("tools",)]) == \
        ' { "model" : "b", "messages" : [ {"n": 1.50} , {"n":3} ], "x": 1e400,"system":"s\u00e9","tools":[] } '.encode()
    assert jsonbody.with_edits(b'{}', {"system": "s"}, [("system",)]) == b'{"system":"s"}'


@pytest.mark.parametrize("body,payload,paths", [
    (b'{"system":"a","system":"b"}', {"system": "c"}, [("system",)]),  # which "system" the parser kept is a guess
    (b'{"messages":[1,2]}', {"messages": [0, 1, 2]}, [("messages", 0)]),  # the list changed length
    (b'{"messages":[1,2]}', {"messages": [1, 3]}, [("messages", 2)]),  # no such entry
    (b'{"messages":{"a":1}}', {"messages": {"a": 2}}, [("messages", 0)]),  # not a list
    (b'{"messages":[1,2]}', {"messages": [1, 3]}, [("messages",), ("messages", 1)]),  # overlapping paths
    (b'{"messages":[1]}', {"messages": [1], "new": [1]}, [("new", 0)]),  # an entry of a new member
    (b'{"messages":[1]}', {}, [("messages",)]),  # a member the rewriter removed
])
def test_with_edits_declines_what_it_cannot_place(body, payload, paths):
    assert jsonbody.with_edits(body, payload, paths) is None


def test_with_edits_writes_a_lone_surrogate_as_the_escape_it_came_as():
    body = b'{"a": "\\udfff kept as sent", "messages": [{"t": "caf\\u00e9 \\ud800"}, 1]}'
    payload = jsonbody.json_object_of(body)
    payload["messages"][0]["t"] += " \u00e9"
    sent = jsonbody.with_edits(body, payload, [("messages", 0)])
    assert sent == '{"a": "\\udfff kept as sent", "messages": [{"t":"caf\u00e9 \\ud800 \u00e9"}, 1]}'.encode()
    assert jsonbody.json_object_of(sent) == payload
    payload["system"] = "\udc80"  # a new member too
    assert jsonbody.json_object_of(jsonbody.with_edits(body, payload, [("messages", 0), ("system",)])) == payload


def test_with_edits_of_a_body_too_deep_to_encode_again_is_a_400():
    # The parser ran at a shallower stack than the encoder will, and accepted it.
    depth = 10 ** 5
    payload = {"messages": [{"x": None}]}
    node = payload["messages"][0]
    for _ in range(depth):
        node["x"] = {"x": None}
        node = node["x"]
    with pytest.raises(ClientError) as caught:
        jsonbody.with_edits(b'{"messages": [{"x": null}]}', payload, [("messages", 0)])
    assert caught.value.status == 400 and "nested too deeply" in caught.value.message


# -- Members and raw_entries: the client's own text, for the turn key -----------

def _members(body, key="messages"):
    return jsonbody.Members(body, (key,))


def test_raw_entries_is_the_clients_text_of_the_first_entries():
    body = b'{"model":"m", "messages" : [ {"a": 1.50} ,{"b":"\\u00e9"},\n {"c": 3} ], "tools": []}'
    members = _members(body)
    assert jsonbody.raw_entries(members, "messages", 0) == '{"a": 1.50}'
    assert jsonbody.raw_entries(members, "messages", 1) == '{"a": 1.50} ,{"b":"\\u00e9"}'
    assert jsonbody.raw_entries(members, "messages", 2) == '{"a": 1.50} ,{"b":"\\u00e9"},\n {"c": 3}'
    assert jsonbody.raw_entries(members, "messages") == '[ {"a": 1.50} ,{"b":"\\u00e9"},\n {"c": 3} ]'
    assert jsonbody.raw_entries(_members(b'{"prompt": "why \\"so\\""}', "prompt"), "prompt") == '"why \\"so\\""'


@pytest.mark.parametrize("body,key,upto", [
    (b'{"messages":[1],"messages":[1]}', "messages", 0),   # which one the parser kept is a guess
    (b'{"messages":[1,2]}', "messages", 2),               # past the end
    (b'{"messages":[1,2]}', "input", 0),                  # no such member
    (b'{"messages":{"a":1}}', "messages", 0),              # not an array
])
def test_raw_entries_declines_what_it_cannot_tell(body, key, upto):
    assert jsonbody.raw_entries(_members(body), key, upto) is None


def test_raw_value_is_the_clients_text_of_one_member_or_entry():
    body = rb'{"system": "caf\u00e9" , "messages": [ {"a": 1.50} ,{"b":"\u00e9"} ]}'
    members = _members(body)   # an ASCII body: its own bytes
    assert jsonbody.raw_value(members, ("messages", 1)) == rb'{"b":"\u00e9"}'
    assert jsonbody.raw_value(members, ("system",)) == rb'"caf\u00e9"'
    assert jsonbody.raw_value(members, ("messages",)) == rb'[ {"a": 1.50} ,{"b":"\u00e9"} ]'
    utf8 = _members(body.replace(rb"\u00e9", "\u00e9".encode()))   # text, where bytes are not characters
    assert jsonbody.raw_value(utf8, ("messages", 1)) == '{"b":"\u00e9"}'
    for declined, path in [(b'{"messages":[1],"messages":[1]}', ("messages", 0)), (b'{"messages":[1]}', ("messages", 1)),
                           (b'{"messages":[1]}', ("input",)), (b'{"messages":{"a":1}}', ("messages", 0))]:
        assert jsonbody.raw_value(_members(declined), path) is None


CACHE_CONTROL_CASES = [
    {"type": "text", "text": "q", "cache_control": {"type": "ephemeral"}},          # last member
    {"cache_control": {"type": "ephemeral", "ttl": "1h"}, "type": "text", "text": "q"},  # first
    {"type": "text", "cache_control": {"type": "ephemeral"}, "text": "q"},          # between
    {"cache_control": {"type": "ephemeral"}},                                       # the only one
    {"content": [{"type": "text", "text": "q", "cache_control": {"type": "ephemeral"}}],
     "cache_control": {"cache_control": {"type": "ephemeral"}}},                     # nested, and inside one cut
]


def _strip(value):
    if isinstance(value, dict):
        return {k: _strip(v) for k, v in value.items() if k != "cache_control"}
    return [_strip(v) for v in value] if isinstance(value, list) else value


@pytest.mark.parametrize("dumps", [
    lambda v: json.dumps(v),
    lambda v: json.dumps(v, separators=(",", ":")),
    lambda v: json.dumps(v, indent=2),
    lambda v: json.dumps(v, indent="\t", ensure_ascii=False),
])
@pytest.mark.parametrize("entry", CACHE_CONTROL_CASES)
def test_raw_entries_leaves_out_cache_control_as_the_encoder_would_have(entry, dumps):
    """The text without cache_control is byte for byte what the client's encoder writes for
    the entry without it: one turn's key must not change when a client moves the marker."""
    body = dumps({"messages": [{"role": "user", "content": "first"}, entry]}).encode()
    without = dumps({"messages": [{"role": "user", "content": "first"}, _strip(entry)]}).encode()
    got = jsonbody.raw_entries(_members(body), "messages", 1, leave_out="cache_control")
    assert got == jsonbody.raw_entries(_members(without), "messages", 1)
    assert "cache_control" not in got
    assert jsonbody.raw_entries(_members(body), "messages", 1) != got   # without leave_out: as sent


def test_raw_entries_cuts_only_within_the_entries_named():
    marker = {"type": "text", "text": "q", "cache_control": {"type": "ephemeral"}}
    entries = [{"role": "user", "content": [marker]}, {"role": "assistant", "content": "a"},
               {"role": "user", "content": [marker, marker]}]
    body = json.dumps({"messages": entries}).encode()
    members = _members(body)
    everywhere = jsonbody.raw_entries(members, "messages", 2, leave_out="cache_control")
    assert jsonbody.raw_entries(members, "messages", 2, leave_out="cache_control", within=[2, 0]) == everywhere
    assert "cache_control" not in everywhere
    only_last = jsonbody.raw_entries(members, "messages", 2, leave_out="cache_control", within=[2, 5])
    assert only_last.count("cache_control") == 1 and only_last.index("cache_control") < only_last.index("assistant")
    assert jsonbody.raw_entries(members, "messages", 1, leave_out="cache_control", within=[2]) == \
        jsonbody.raw_entries(members, "messages", 1)   # the entry named lies past upto
    assert jsonbody.raw_entries(members, "messages", 2, leave_out="cache_control", within=[1]) == \
        jsonbody.raw_entries(members, "messages", 2)


def test_raw_entries_keeps_cache_control_written_inside_a_string():
    entry = {"text": 'say "cache_control": {} \\', "note": "\\\"cache_control\": 1"}
    body = json.dumps({"messages": [entry]}).encode()
    members = _members(body)
    assert jsonbody.raw_entries(members, "messages", 0, leave_out="cache_control") == json.dumps(entry)


def test_with_edits_reuses_the_members_found_for_the_same_body_only():
    body = b'{"model":"a","messages":[{"n":1},{"n":2}]}'
    payload = jsonbody.json_object_of(body)
    payload["messages"][1]["n"] = 3
    expected = b'{"model":"a","messages":[{"n":1},{"n":3}]}'
    assert jsonbody.with_edits(body, payload, [("messages", 1)], _members(body)) == expected
    # Members of another body, or without the entries the path names, are not used.
    other = b'{"model":"a","messages":[{"n":1},  {"n":2}]}'
    assert jsonbody.with_edits(body, payload, [("messages", 1)], _members(other)) == expected
    assert jsonbody.with_edits(body, payload, [("messages", 1)], _members(body, "tools")) == expected


@pytest.mark.parametrize("body", [
    b'{"model":"m","messages":[{"role":"user","content":"hi"},{"n":1.50e3}],"tools":[],"x":null}',
    b' \n{ "messages" : [ ] , "y" : {"messages": [1]} }\t',
    b'{"messages":{"a":[1]},"n":-0.0,"s":"\\u00e9\\ud800","big":1e400,"nan":NaN}',
    b'{}',
])
def test_json_object_with_members_parses_as_json_object_of_and_finds_the_members(body):
    payload, members = jsonbody.json_object_with_members(body, ("messages",))
    assert repr(payload) == repr(jsonbody.json_object_of(body))   # repr: NaN and -0.0 as well
    found = jsonbody.Members(body, ("messages",))
    assert (members.spans, members.close, members.text) == (found.spans, found.close, found.text)


@pytest.mark.parametrize("body", [
    b'{"a":1,"a":2}',                      # a repeated key: the full parser keeps the last
    b'{"messages":[1,2]}{}', b'[1]', b'"x"',
])
def test_json_object_with_members_leaves_what_it_cannot_vouch_for_to_the_full_parser(body):
    try:
        want = jsonbody.json_object_of(body)
    except ClientError as exc:
        want = exc
    try:
        got, members = jsonbody.json_object_with_members(body, ("messages",))
    except ClientError as exc:
        assert isinstance(want, ClientError) and exc.message == want.message
        return
    assert got == want and members is None


@pytest.mark.parametrize("body", [
    b'{"a" 1}', b'{"a":1 "b":2}', b'{"a":1,}', b'{"messages":[1,]}', b'{"messages":[1 2]}', b'{1:2}',
    b'{"messages":[1}', b'{"a":[1]]}', b'{"a":1', b'{"messages":[', b'\xff{}', b'{"a":1}x',
])
def test_json_object_with_members_refuses_malformed_bodies_as_json_object_of_does(body):
    with pytest.raises(ClientError) as want:
        jsonbody.json_object_of(body)
    with pytest.raises(ClientError) as got:
        jsonbody.json_object_with_members(body, ("messages",))
    assert (got.value.status, got.value.message) == (want.value.status, want.value.message)


def test_leading_model_reads_a_first_model_key_only():
    assert jsonbody.leading_model(b' {\n "model" : "claude-\\u0073onnet", "messages": []}') == "claude-sonnet"
    assert jsonbody.leading_model(b'{"messages": [], "model": "m"}') is None
    assert jsonbody.leading_model(b'{"model": 5}') is None
    assert jsonbody.leading_model(b'{"model": "bad \\x escape"}') is None
    assert jsonbody.leading_model(b'') is None


@pytest.mark.parametrize("word", ["plain", "caf\u00e9 \u6f22", "\\ud800 lone"])
def test_raw_entries_as_utf8_are_the_texts_bytes_and_a_splice_is_the_same_either_way(word):
    """An ASCII body's entries are cut from its bytes; any other's text is encoded: the same bytes."""
    body = ('{"model": "m", "messages": [{"role": "user", "content": [{"type": "text", "text": "%s", '
            '"cache_control": {"type": "ephemeral"}}]}, {"role": "assistant", "content": "ok"}, '
            '{"role": "user", "content": "next"}]}' % word).encode("utf-8")
    payload, members = jsonbody.json_object_with_members(body, ("messages",))
    for upto in (0, 1, None):
        text = jsonbody.raw_entries(members, "messages", upto, leave_out="cache_control")
        assert "cache_control" not in text
        assert jsonbody.raw_entries(members, "messages", upto, leave_out="cache_control", utf8=True) == \
            text.encode("utf-8", "surrogatepass")
    payload["messages"][2]["content"] = "context \u00e9\n\nnext"
    spliced = jsonbody.with_edits(body, payload, (("messages", 2),), members)
    assert json.loads(spliced) == payload
    assert spliced.startswith(body[:body.index(b'{"role": "user", "content": "next"}')])
    # As parts, the same bytes: an ASCII body's own bytes as views of it, around the new text.
    parts = jsonbody.with_edits(body, payload, (("messages", 2),), members, parts=True)
    assert bytes(parts) == spliced and len(parts) == len(spliced)
    if body.isascii():
        assert isinstance(parts, BodyParts) and len(parts.parts) == 3
        assert all(part.obj is body for part in (parts.parts[0], parts.parts[2]))   # not copied
    else:   # the spliced text is encoded once: one bytes object, as without ``parts``
        assert isinstance(parts, bytes)


@pytest.mark.parametrize("word", ["plain", "caf\u00e9"])
def test_entries_span_is_where_raw_entries_cut_the_text_as_sent(word):
    body = ('{"model": "m", "messages" : [ {"role": "user", "content": "%s", "cache_control": {}} ,'
            '{"role": "assistant", "content": "ok"}]}' % word).encode("utf-8")
    members = _members(body)
    for upto in (0, 1):
        span = jsonbody.entries_span(members, "messages", upto)
        if word != "plain":   # not ASCII: text and bytes offsets differ, so there is no span
            assert span is None
            continue
        source, start, end = span
        assert source is body
        assert source[start:end] == jsonbody.raw_entries(members, "messages", upto, leave_out="cache_control",
                                                          utf8=True, within=())
    for bad, key, upto in [(b'{"messages":[1],"messages":[1]}', "messages", 0), (b'{"messages":[1,2]}', "messages", 2),
                           (b'{"messages":[1,2]}', "input", 0), (b'{"messages":{"a":1}}', "messages", 0),
                           (b'{"messages":[1,2]}', "messages", -1)]:
        assert jsonbody.entries_span(_members(bad, key if key != "input" else "messages"), key, upto) is None


# -- ParseMemo: what a body repeats of an earlier one is copied, not parsed ------------------------

REMINDER = "<system-reminder>\nThe context below is yours to use.\n</system-reminder>\n" * 3   # > the head


def _agent_round(rounds, marker=True, tools="tools"):
    """The body of round ``rounds`` of a Claude-Code-like loop: every human turn opens with the
    same reminder, the newest entry carries the cache_control mark the next round moves on."""
    messages = []
    for n in range(rounds):
        if n % 3 == 0:
            messages.append({"role": "user", "content": [{"type": "text", "text": REMINDER},
                                                         {"type": "text", "text": f"question {n} " * 40}]})
        else:
            messages.append({"role": "user", "content": [{"type": "tool_result", "tool_use_id": f"t{n}",
                                                          "content": f"result {n}\n" * 60}]})
        messages.append({"role": "assistant", "content": [{"type": "text", "text": f"answer {n} " * 50}]})
    if marker:
        messages[-1]["content"][-1]["cache_control"] = {"type": "ephemeral"}
    return json.dumps({"model": "m", "messages": messages, "system": [{"type": "text", "text": "sys " * 300}],
                       tools: [{"name": f"tool_{i}", "input_schema": {"type": "object"}, "d": "x" * 300}
                               for i in range(4)], "stream": False}).encode()


def _parse_as_without_memo(body, memo):
    payload, members = jsonbody.json_object_with_members(body, ("messages",), memo)
    want, want_members = jsonbody.json_object_with_members(body, ("messages",))
    assert repr(payload) == repr(want)
    assert (members.spans, members.close) == (want_members.spans, want_members.close)
    return payload


def test_parse_memo_copies_what_each_round_of_an_agent_loop_repeats():
    memo = jsonbody.ParseMemo()
    _parse_as_without_memo(_agent_round(3), memo)
    assert memo.reused == 0
    for rounds in range(4, 12):   # the mark moves on; the entries before it, the system and tools repeat
        before = memo.reused
        _parse_as_without_memo(_agent_round(rounds), memo)
        assert memo.reused - before >= 2 * rounds - 2   # a run of the entries, the tools and the system
        assert memo.size == memo.held_bytes()   # a run one round longer counts only what it adds
    before = memo.reused
    _parse_as_without_memo(_agent_round(11), memo)   # the same body again: everything but the small members
    assert memo.reused - before >= 2 + 22 - 2


def test_parse_memo_shares_what_a_body_repeats_and_gives_each_body_its_own_top_level():
    memo = jsonbody.ParseMemo()
    body = _agent_round(6)
    first = _parse_as_without_memo(body, memo)
    second = _parse_as_without_memo(body, memo)
    assert second == first == json.loads(body)
    # What the request owns: the object and the expanded array's list, to replace entries in.
    assert second is not first and second["messages"] is not first["messages"]
    # What it shares with every body that repeats it: read-only (copy on write, as inject does).
    assert second["tools"] is first["tools"] and second["system"] is first["system"]
    assert all(a is b for a, b in zip(second["messages"][:-2], first["messages"]))


@pytest.mark.parametrize("edit", [
    lambda payload: payload["messages"][0]["content"].insert(0, {"type": "text", "text": "injected context"}),
    lambda payload: payload["tools"].pop(),
    lambda payload: payload["system"][0].update(text="edited"),
])
def test_parse_memo_check_catches_a_shared_value_edited_in_place(edit):
    body = _agent_round(6)
    memo = jsonbody.ParseMemo(check=True)
    first, _ = jsonbody.json_object_with_members(body, ("messages",), memo)
    memo.verify()
    edit(first)
    with pytest.raises(jsonbody.SharedValueEdited) as caught:
        memo.verify()
    assert "edited in place" in str(caught.value)
    with pytest.raises(jsonbody.SharedValueEdited):   # and where the next body would have read it
        jsonbody.json_object_with_members(body, ("messages",), memo)
    unchecked = jsonbody.ParseMemo()
    edit(jsonbody.json_object_with_members(body, ("messages",), unchecked)[0])
    unchecked.verify()   # nothing kept to compare with: the hazard check=True is for


def test_parse_memo_check_passes_what_replaces_instead_of_editing():
    body = _agent_round(6)
    memo = jsonbody.ParseMemo(check=True)
    for _ in range(3):
        payload, _ = jsonbody.json_object_with_members(body, ("messages",), memo)
        message = payload["messages"][0]
        payload["messages"][0] = {**message, "content": [{"type": "text", "text": "context"}] + message["content"]}
        payload["tools"] = payload["tools"][:-1]
        payload["model"] = "renamed"
    memo.verify()
    assert memo.reused >= 4


@pytest.mark.parametrize("change", [
    lambda body: body.replace(b'"d": "xxx', b'"d": "Xxx', 1),                       # a tool differs inside
    lambda body: body.replace(b'x"}], "stream"', b'x", "more": 1}], "stream"'),    # a tool has one key more
    lambda body: body.replace(b'answer 1 "}', b'answer 1 ", "n": [1, 2]}', 1),      # an old entry differs at its end
    lambda body: body.replace(b'"messages": [', b'"messages": [{"role": "user", "content": "first"}, ', 1),
])
def test_parse_memo_parses_a_value_that_only_begins_like_one_it_holds(change):
    memo = jsonbody.ParseMemo()
    body = _agent_round(7)
    _parse_as_without_memo(body, memo)
    changed = change(body)
    assert changed != body
    assert _parse_as_without_memo(changed, memo) == json.loads(changed)


def test_parse_memo_places_a_run_where_this_body_has_its_entries():
    memo = jsonbody.ParseMemo()
    body = _agent_round(7)
    _parse_as_without_memo(body, memo)
    # A longer model name moves every entry on; the spans must move with them, and back again.
    for model in (b'"a longer model name"', b'"m"', b'"mm"'):
        moved = body.replace(b'"m"', model, 1)
        before = memo.reused
        payload = _parse_as_without_memo(moved, memo)   # spans and values as the plain walk finds them
        assert memo.reused - before >= 2 * 7 - 2 and payload == json.loads(moved)


def test_parse_memo_refuses_a_body_that_breaks_after_what_it_repeats():
    memo = jsonbody.ParseMemo()
    body = _agent_round(7)
    _parse_as_without_memo(body, memo)
    for broken in (body.replace(b'], "system"', b' "system"'), body[:-1], body.replace(b'}]}, {"role"', b'}]} {"role"', 3)):
        with pytest.raises(ClientError) as want:
            jsonbody.json_object_of(broken)
        with pytest.raises(ClientError) as got:
            jsonbody.json_object_with_members(broken, ("messages",), memo)
        assert (got.value.status, got.value.message) == (want.value.status, want.value.message)


def test_parse_memo_stays_within_its_bytes_and_keeps_the_newest():
    memo = jsonbody.ParseMemo(max_bytes=200_000)
    for n in range(30):   # thirty conversations, each its own tools
        _parse_as_without_memo(_agent_round(6, tools=f"tools{n}"), memo)
        assert 0 < memo.size <= 200_000
    assert memo.size == memo.held_bytes()
    before = memo.reused
    _parse_as_without_memo(_agent_round(6, tools="tools29"), memo)
    assert memo.reused - before >= 10


def test_parse_memo_gives_what_json_gives_for_random_conversations():
    import random
    rng = random.Random(20261203)
    memo = jsonbody.ParseMemo(max_bytes=1 << 20, min_chars=16)   # small values too, to exercise more records
    words = ["a", "\u00e9t\u00e9", "\\", '"', "\U0001f600", "\ud800", "\n", "x" * 40, "1e400", "-0.0"]
    conversations = [[] for _ in range(3)]
    for _ in range(300):
        messages = rng.choice(conversations)
        if messages and rng.random() < 0.2:
            del messages[rng.randrange(len(messages)):]   # a client that edits an earlier turn
        messages.append({"role": rng.choice(["user", "assistant"]),
                         "content": [{"type": "text", "text": " ".join(rng.choice(words) for _ in range(20))}
                                     for _ in range(rng.randint(1, 3))]})
        if rng.random() < 0.5:
            messages[-1]["cache_control"] = {"type": "ephemeral"}
        value = {"model": "m", "messages": messages, "n": rng.choice([1.5, -0.0, 10 ** 30, None, True])}
        separators = rng.choice([(",", ":"), (", ", ": ")])
        try:   # a lone surrogate can only come as an escape
            body = json.dumps(value, ensure_ascii=rng.random() < 0.5, separators=separators).encode()
        except UnicodeEncodeError:
            body = json.dumps(value, separators=separators).encode()
        _parse_as_without_memo(body, memo)
        for entry in messages:
            entry.pop("cache_control", None)
    assert memo.reused > 300


_PIECES = ["", "plain words", 'a "quote"', "back\\slash", "\\", "\\u0000", "line\nbreak\ttab\r", "\x01\x1f\x7f",
           "caf\u00e9 \u6578\u64da", "\u2028", "\ud800", "\U0001f600"]


def test_json_text_with_is_the_json_text_of_the_value_with_the_string_in_the_placeholders_place():
    rng, declined = random.Random(7), 0
    for _ in range(3000):
        before, after, inner = ("".join(rng.choice(_PIECES) for _ in range(rng.randint(0, 4))) for _ in range(3))
        inner += rng.choice(["", "\x00"])   # the string stood for may hold anything
        def value(s):
            return {"role": "user", "content": [{"type": "text", "text": "\\"},
                                                {"type": "text", "text": before + s + after, "n": [1.5, None]}]}
        escaped = json_text(inner)[1:-1]
        for stand_in, whole in ((value(jsonbody.PLACEHOLDER), value(inner)),
                                (before + jsonbody.PLACEHOLDER + after, before + inner + after)):
            got = jsonbody.json_text_with(stand_in, escaped)
            if got is None:   # declined only where the placeholder's escape is there more than once
                assert json_text(stand_in).count("\\u0000") > 1
                declined += 1
            else:
                assert got == json_text(whole)
    assert declined < 2000   # of 6,000: only where the client sent a NUL or a "\\u0000" of its own


@pytest.mark.parametrize("value", [
    {"a": "\x00", "b": jsonbody.PLACEHOLDER},              # a NUL of the client's own as well
    {"a": "x" + jsonbody.PLACEHOLDER * 2},
    {"a": "no placeholder"},
])
def test_json_text_with_declines_unless_the_placeholder_is_there_once(value):
    assert jsonbody.json_text_with(value, "context") is None


def test_with_edits_takes_a_values_known_text_while_the_payload_holds_that_very_value():
    body = b'{"model":"a","messages":[{"n":1},{"n":2}]}'
    payload = jsonbody.json_object_of(body)
    entry = payload["messages"][1] = {"n": 3}
    known = {("messages", 1): (entry, '{"n":"as known"}')}
    assert jsonbody.with_edits(body, payload, [("messages", 1)], encoded=known) == \
        b'{"model":"a","messages":[{"n":1},{"n":"as known"}]}'
    payload["messages"][1] = {"n": 3}   # equal, not the same: a later edit replaced it
    assert jsonbody.with_edits(body, payload, [("messages", 1)], encoded=known) == \
        b'{"model":"a","messages":[{"n":1},{"n":3}]}'
