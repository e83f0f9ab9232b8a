"""summary_buffer: which history it summarises, incremental and prefix-stable rewrites, its state, its summarizer.

In-process with a recording fake summarizer, and with make_summarizer's
real request to the fake OpenAI upstream on a real socket.  State on SQLite
(injected clock) and on a real redis-server (the redis_server fixture).
"""
import copy
import http.client
import json
import random
import threading
import urllib.parse
import uuid

import pytest
from conftest import ManualClock

from _ragproxy import compress, inject, sessionstate, summary
from _ragproxy.sessionstate import RedisState, SqliteState
from _ragproxy.summary import SUMMARY_HEADER, SummarizerFailed, make_summarizer, summary_buffer


def words(text):
    return len(text.split())


def Clock(now=2_000_000.0):
    return ManualClock(now)


class FakeSummarizer:
    """Records each call; answers a short summary naming the call and how many messages it saw."""

    def __init__(self, fail=None):
        self.calls = []
        self.fail = fail
        self.timeout = 10.0

    def __call__(self, messages, previous, target_tokens):
        self.calls.append((copy.deepcopy(messages), previous, target_tokens))
        if self.fail is not None:
            raise self.fail
        return "summary %d of %d messages (before: %s)" % (len(self.calls), len(messages), previous is not None)


def filler(i, n=40):
    return " ".join("w%d_%d" % (i, j) for j in range(n))


def chat_history(rounds, n=40, system=True, first=0):
    """system, then ``rounds`` user/assistant exchanges of n words each, then the current user turn."""
    out = [{"role": "system", "content": "You are helpful."}] if system else []
    for i in range(first, first + rounds):
        out.append({"role": "user", "content": "question %d: %s" % (i, filler(i, n))})
        out.append({"role": "assistant", "content": "answer %d: %s" % (i, filler(i + 1000, n))})
    out.append({"role": "user", "content": "the current question"})
    return out


@pytest.fixture
def state(tmp_path):
    s = SqliteState(str(tmp_path / "state.sqlite3"), ttl=3600)
    yield s
    s.close()


def run(messages, state, summarize, api="chat", session="sess-1", **kw):
    kw.setdefault("min_tokens", 200)
    kw.setdefault("retain_recent_messages", 4)
    kw.setdefault("target_summary_tokens", 50)
    return summary_buffer(messages, api, words, session_id=session, state=state, summarize=summarize, **kw)


# -- what is eligible ----------------------------------------------------------

def test_session_ids():
    for ok in ("a", "A-z_0.9:x", "x" * 128, str(uuid.uuid4()), "agent:run-42"):
        assert summary.valid_session_id(ok), ok
    for bad in (None, "", "x" * 129, "a b", "a/b", "é", "a\n", 42, "a\x00", "{x}"):
        assert not summary.valid_session_id(bad), bad


def test_missing_or_invalid_session_skips(state):
    msgs = chat_history(10)
    fake = FakeSummarizer()
    for session in (None, "", "no spaces allowed", "x" * 129):
        out, outcome = run(msgs, state, fake, session=session)
        assert out is msgs and outcome.reason == "missing_session" and not outcome.applied
    assert fake.calls == []


def test_no_state_is_state_unavailable():
    msgs = chat_history(10)
    out, outcome = run(msgs, None, FakeSummarizer())
    assert out is msgs and outcome.reason == "state_unavailable"


def test_short_history_is_not_needed(state):
    msgs = chat_history(2)
    fake = FakeSummarizer()
    out, outcome = run(msgs, state, fake)
    assert out is msgs and outcome.reason == "not_needed" and fake.calls == []
    out, outcome = run(chat_history(1), state, fake)         # nothing older than the retained messages
    assert outcome.reason == "not_needed"
    out, outcome = run(chat_history(10), state, fake, min_tokens=100_000)
    assert outcome.reason == "not_needed" and outcome.tokens_before > 0 and fake.calls == []


def test_responses_string_input_is_not_eligible(state):
    out, outcome = summary_buffer("just text", "responses", words, session_id="s", state=state,
                                  summarize=FakeSummarizer())
    assert out == "just text" and outcome.reason == "not_eligible"


def test_applied_chat_shape_and_no_mutation(state):
    msgs = chat_history(10)
    before = copy.deepcopy(msgs)
    fake = FakeSummarizer()
    out, outcome = run(msgs, state, fake)
    assert msgs == before
    assert outcome.applied and outcome.reason == "applied" and outcome.lever == "summary_buffer"
    assert outcome.tokens_after < outcome.tokens_before
    # system prefix, ONE summary message, then an assistant turn and the rest unchanged (same objects)
    assert out[0] is msgs[0]
    assert out[1] == {"role": "user", "content": SUMMARY_HEADER + "summary 1 of 17 messages (before: False)"}
    assert out[2]["role"] == "assistant"
    assert out[2:] == msgs[18:] and all(a is b for a, b in zip(out[2:], msgs[18:]))
    assert len(msgs) - 18 >= 4  # the retained recent messages are all still there
    sent, previous, target = fake.calls[0]
    assert previous is None and target == 50
    assert sent == [{"role": m["role"], "content": m["content"]} for m in msgs[1:18]]


def test_the_current_turn_is_never_summarised(state):
    msgs = chat_history(10) + [{"role": "assistant", "content": "Prefilled start of the reply:"}]
    fake = FakeSummarizer()
    out, outcome = run(msgs, state, fake, retain_recent_messages=0)
    assert outcome.applied
    assert out[-2:] == msgs[-2:] and out[-2]["content"] == "the current question"
    assert all(m["content"] != "the current question" for m in fake.calls[0][0])


def test_text_only_parts_are_plain_text(state):
    msgs = chat_history(10)
    msgs[3] = {"role": "user", "content": [{"type": "text", "text": "part one"}, {"type": "text", "text": "two"}]}
    msgs[4] = dict(msgs[4], tool_calls=[], refusal=None)  # empty fields an SDK sends
    fake = FakeSummarizer()
    out, outcome = run(msgs, state, fake)
    assert outcome.applied
    assert fake.calls[0][0][2] == {"role": "user", "content": "part one\ntwo"}


@pytest.mark.parametrize("structured", [
    {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function",
                                                          "function": {"name": "f", "arguments": "{}"}}]},
    {"role": "user", "content": [{"type": "text", "text": "look"},
                                 {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]},
    {"role": "tool", "tool_call_id": "c1", "content": "result"},
    {"role": "system", "content": "a mid-history instruction"},
    {"role": "user", "content": "x", "metadata": {"k": "v"}},
])
def test_history_stops_at_the_first_structured_message(state, structured):
    msgs = chat_history(10)
    msgs.insert(7, structured)
    fake = FakeSummarizer()
    out, outcome = run(msgs, state, fake, min_tokens=50)
    assert outcome.applied
    sent = fake.calls[0][0]
    # only what came before the structured message went to the summarizer ...
    assert len(sent) <= 6 and all(isinstance(m["content"], str) for m in sent)
    assert all("mid-history" not in m["content"] and m["content"] != "result" for m in sent)
    # ... and it and everything after it is still in the list, byte for byte
    i = out.index(structured)
    assert out[i:] == msgs[msgs.index(structured):]


def test_structured_history_is_structured_request(state):
    msgs = [{"role": "system", "content": "s"},
            {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:image/png;base64,AA"}}]}]
    msgs += chat_history(10, system=False)
    fake = FakeSummarizer()
    out, outcome = run(msgs, state, fake)
    assert out is msgs and outcome.reason == "structured_request" and fake.calls == []


def test_anthropic_messages_keep_alternation(state):
    msgs = [{"role": "user", "content": "task: " + filler(1)}]
    for i in range(8):
        msgs.append({"role": "assistant", "content": [{"type": "text", "text": "a%d " % i + filler(i)}]})
        msgs.append({"role": "user", "content": [{"type": "text", "text": "u%d " % i + filler(i + 50),
                                                  "cache_control": {"type": "ephemeral"}}]})
    fake = FakeSummarizer()
    for retain in (3, 4, 5):
        out, outcome = summary_buffer(msgs, "messages", words, session_id="anth-%d" % retain, state=state,
                                      summarize=fake, min_tokens=100, retain_recent_messages=retain)
        assert outcome.applied
        roles = [m["role"] for m in out]
        assert roles[0] == "user" and out[0]["content"].startswith(SUMMARY_HEADER)
        assert all(a != b for a, b in zip(roles, roles[1:])), roles
        assert len(out) - 1 >= retain


def test_anthropic_tool_use_is_never_summarised(state):
    msgs = [{"role": "user", "content": "task " + filler(1)},
            {"role": "assistant", "content": "ok " + filler(2)},
            {"role": "user", "content": "go on " + filler(3)},
            {"role": "assistant", "content": [{"type": "text", "text": "calling"},
                                              {"type": "tool_use", "id": "t1", "name": "f", "input": {}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": filler(4)}]}]
    msgs += chat_history(6, system=False)[1:]  # assistant first: alternation after the tool_result
    fake = FakeSummarizer()
    out, outcome = summary_buffer(msgs, "messages", words, session_id="tools", state=state, summarize=fake,
                                  min_tokens=50, retain_recent_messages=2)
    assert outcome.applied
    # up to the tool_use message, which the summary (a user message) is followed by
    assert [m["content"] for m in fake.calls[0][0]] == [m["content"] for m in msgs[:3]]
    assert out[1:] == msgs[3:] and out[1]["role"] == "assistant"


def test_responses_input(state):
    items = [{"role": "developer", "content": "be brief"}]
    for i in range(6):
        items.append({"role": "user", "content": [{"type": "input_text", "text": "q%d " % i + filler(i)}]})
        items.append({"id": "msg_%d" % i, "type": "message", "role": "assistant", "status": "completed",
                      "content": [{"type": "output_text", "text": "a%d " % i + filler(i + 9), "annotations": []}]})
    items.append({"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"})
    items.append({"type": "function_call_output", "call_id": "c", "output": "done"})
    fake = FakeSummarizer()
    out, outcome = summary_buffer(items, "responses", words, session_id="resp", state=state, summarize=fake,
                                  min_tokens=50, retain_recent_messages=2)
    assert outcome.applied
    assert out[0] is items[0] and out[1]["role"] == "user" and out[1]["content"].startswith(SUMMARY_HEADER)
    assert out[-2:] == items[-2:]
    assert all(m["content"].startswith(("q", "a")) for m in fake.calls[0][0])


def test_ollama_images_are_structured(state):
    msgs = chat_history(8)
    msgs[5] = dict(msgs[5], images=["iVBORw0KGgo="])
    fake = FakeSummarizer()
    out, outcome = summary_buffer(msgs, "ollama_chat", words, session_id="oll", state=state, summarize=fake,
                                  min_tokens=50, retain_recent_messages=2)
    # up to the user message with the image, less the user message before it (the summary is followed by
    # an assistant turn)
    assert outcome.applied and len(fake.calls[0][0]) == 3 and out[2:] == msgs[4:]


# -- incremental, commit rule, failures -----------------------------------------

def test_reuse_then_incremental_update(state):
    fake = FakeSummarizer()
    msgs = chat_history(10)
    first, o1 = run(msgs, state, fake)
    assert o1.applied and len(fake.calls) == 1
    # a round later: same summary, no call (the new history is under min_tokens)
    msgs2 = msgs + [{"role": "assistant", "content": "short"}, {"role": "user", "content": "next"}]
    second, o2 = run(msgs2, state, fake)
    assert o2.applied and len(fake.calls) == 1
    assert second[:len(first)] == first
    # enough new history: only the new messages and the previous summary go out
    msgs3 = msgs2[:-1] + chat_history(6, system=False)
    third, o3 = run(msgs3, state, fake)
    assert o3.applied and len(fake.calls) == 2
    sent, previous, _ = fake.calls[1]
    assert previous == "summary 1 of 17 messages (before: False)"
    assert sent[0]["content"] == msgs[18]["content"]          # starts right after what summary 1 covered
    assert third[1]["content"] == SUMMARY_HEADER + "summary 2 of %d messages (before: True)" % len(sent)


def test_edited_history_starts_a_fresh_summary(state):
    fake = FakeSummarizer()
    msgs = chat_history(10)
    run(msgs, state, fake)
    edited = copy.deepcopy(msgs)
    edited[3]["content"] = "I changed my mind about this message"
    out, outcome = run(edited, state, fake)
    assert outcome.applied and len(fake.calls) == 2 and fake.calls[1][1] is None


def test_a_moved_cache_breakpoint_is_the_same_history(state):
    """Claude Code moves its cache_control breakpoints every round; the summary still fits."""
    fake = FakeSummarizer()
    msgs = [{"role": "user", "content": [{"type": "text", "text": "u%d " % i + filler(i)}]} if i % 2 == 0
            else {"role": "assistant", "content": "a%d " % i + filler(i)} for i in range(17)]
    msgs[2]["content"][0]["cache_control"] = {"type": "ephemeral"}
    first, o1 = summary_buffer(msgs, "messages", words, session_id="cc", state=state, summarize=fake,
                               min_tokens=100, retain_recent_messages=2)
    moved = copy.deepcopy(msgs)
    del moved[2]["content"][0]["cache_control"]
    moved[4]["content"] = moved[4]["content"][0]["text"]  # and a part list sent as a string
    second, o2 = summary_buffer(moved, "messages", words, session_id="cc", state=state, summarize=fake,
                                min_tokens=100, retain_recent_messages=2)
    assert o1.applied and o2.applied and len(fake.calls) == 1 and second == first


def test_sessions_and_scopes_are_separate(state):
    fake = FakeSummarizer()
    msgs = chat_history(10)
    run(msgs, state, fake, session="s1", scope="key-a/model")
    run(msgs, state, fake, session="s1", scope="key-a/model")
    assert len(fake.calls) == 1
    run(msgs, state, fake, session="s1", scope="key-b/model")
    run(msgs, state, fake, session="s2", scope="key-a/model")
    assert len(fake.calls) == 3


def test_no_savings_is_stored_and_not_asked_again(state):
    calls = []

    def verbose(messages, previous, target):
        calls.append(1)
        return "long " * 5000

    msgs = chat_history(10)
    out, outcome = run(msgs, state, verbose)
    assert out is msgs and outcome.reason == "no_savings" and not outcome.applied
    out, outcome = run(msgs + [{"role": "assistant", "content": "x"}, {"role": "user", "content": "y"}],
                       state, verbose)
    assert outcome.reason == "no_savings" and len(calls) == 1


@pytest.mark.parametrize("failure", [SummarizerFailed("timeout"), RuntimeError("bug"), "", None, 42])
def test_summarizer_failure_leaves_the_list(state, failure):
    def bad(messages, previous, target):
        if isinstance(failure, Exception):
            raise failure
        return failure

    msgs = chat_history(10)
    out, outcome = run(msgs, state, bad)
    assert out is msgs and outcome.reason == "summarizer_failed" and not outcome.applied
    assert state.get(summary.state_key("sess-1")) == sessionstate.Stored()


def test_state_failing_is_state_unavailable(tmp_path):
    s = SqliteState(str(tmp_path / "s.sqlite3"))
    s.close()  # every call now raises StateUnavailable
    msgs = chat_history(10)
    out, outcome = run(msgs, s, FakeSummarizer())
    assert out is msgs and outcome.reason == "state_unavailable"


def test_bad_parameters_are_value_errors(state):
    msgs = chat_history(3)
    with pytest.raises(ValueError):
        run(msgs, state, FakeSummarizer(), api="completions")
    for kw in ({"min_tokens": -1}, {"retain_recent_messages": 1.5}, {"target_summary_tokens": 0},
               {"min_tokens": True}):
        with pytest.raises(ValueError):
            run(msgs, state, FakeSummarizer(), **kw)


def test_real_estimator(state):
    fake = FakeSummarizer()
    out, outcome = summary_buffer(chat_history(12), "chat", inject.estimate_tokens_text, session_id="est",
                                  state=state, summarize=fake, min_tokens=300)
    assert outcome.applied and outcome.tokens_after < outcome.tokens_before


# -- prefix stability over agent loops --------------------------------------------

def is_prefix(a, b):
    return len(a) <= len(b) and all(json.dumps(x, sort_keys=True) == json.dumps(y, sort_keys=True)
                                    for x, y in zip(a, b))


def test_agent_loop_of_plain_rounds_changes_the_prefix_only_when_it_resummarises(state):
    """30 rounds of a chat loop, each appending the model's answer and the next user message: the request
    sent upstream keeps the previous one as its prefix except in the rounds that re-summarise, and those
    come only once per min_tokens of new history."""
    fake = FakeSummarizer()
    msgs = chat_history(3)
    previous_out, changes, calls_at, applied = None, [], [], 0
    for r in range(30):
        calls = len(fake.calls)
        out, outcome = run(msgs, state, fake, min_tokens=300, retain_recent_messages=4)
        applied += outcome.applied
        if len(fake.calls) > calls:
            calls_at.append(r)
        if previous_out is not None and not is_prefix(previous_out, out):
            changes.append(r)
        previous_out = out
        msgs = msgs + [{"role": "assistant", "content": "answer r%d %s" % (r, filler(r, 30))},
                       {"role": "user", "content": "user r%d %s" % (r, filler(r + 500, 30))}]
    assert applied >= 25
    assert changes == calls_at and calls_at[0] > 0  # the prefix changes exactly in the summarising rounds
    new_history_words = 30 * 2 * 33
    assert 1 <= len(fake.calls) <= new_history_words // 300 + 2
    # every summarizer call after the first got only the new history and the previous summary
    assert all(previous is not None for _, previous, _ in fake.calls[1:])


def test_agent_loop_of_tool_rounds_never_changes_the_prefix(state):
    """A coding agent: a plain start, then 25 tool rounds (assistant tool_calls + tool results).  The
    summary covers the plain start once; no tool round changes a byte of the prefix."""
    fake = FakeSummarizer()
    msgs = chat_history(6)[:-1] + [{"role": "user", "content": "now fix the bug " + filler(7)}]
    outs = []
    for r in range(25):
        out, outcome = run(msgs, state, fake, min_tokens=100, retain_recent_messages=2)
        assert outcome.applied, outcome
        outs.append(out)
        msgs = msgs + [
            {"role": "assistant", "content": None,
             "tool_calls": [{"id": "call_%d" % r, "type": "function",
                             "function": {"name": "read_file", "arguments": json.dumps({"path": "f%d.py" % r})}}]},
            {"role": "tool", "tool_call_id": "call_%d" % r, "content": "file %d: %s" % (r, filler(r, 80))}]
    assert len(fake.calls) == 1
    assert all(is_prefix(a, b) for a, b in zip(outs, outs[1:]))


# -- restart, ttl, replicas ---------------------------------------------------------

def test_sqlite_state_survives_a_restart(tmp_path):
    spec = {"backend": "sqlite", "ttl": 3600}
    fake = FakeSummarizer()
    msgs = chat_history(10)
    s1 = sessionstate.open_state(spec, str(tmp_path))
    out1, _ = run(msgs, s1, fake)
    s1.close()
    s2 = sessionstate.open_state(spec, str(tmp_path))
    out2, outcome = run(msgs, s2, fake)
    s2.close()
    assert outcome.applied and out2 == out1 and len(fake.calls) == 1


def test_ttl_expiry_with_an_injected_clock(tmp_path):
    clock = Clock()
    s = sessionstate.open_state({"backend": "sqlite", "ttl": 600}, str(tmp_path), clock=clock)
    fake = FakeSummarizer()
    msgs = chat_history(10)
    run(msgs, s, fake)
    clock.advance(599)
    run(msgs, s, fake)       # used: kept another 600 s
    clock.advance(599)
    run(msgs, s, fake)
    assert len(fake.calls) == 1
    clock.advance(601)       # unused for longer than the ttl
    out, outcome = run(msgs, s, fake)
    assert outcome.applied and len(fake.calls) == 2 and fake.calls[1][1] is None
    s.close()


def test_a_replica_whose_lease_ran_out_uses_the_winners_summary(tmp_path):
    """Replica A's summarizer is slow: its lease runs out, replica B summarises and writes.  A's write is
    refused (the fence), it re-reads, and sends B's summary: both replicas send the same bytes."""
    clock = Clock()
    path = str(tmp_path / "shared.sqlite3")
    a, b = SqliteState(path, clock=clock), SqliteState(path, clock=clock)
    msgs = chat_history(10)
    fake_b = FakeSummarizer()
    result_b = {}

    def slow(messages, previous, target):
        clock.advance(1000)  # longer than A's lease
        result_b["out"] = run(msgs, b, fake_b)
        return "A's summary"

    out_a, outcome_a = run(msgs, a, slow, lease_seconds=30)
    out_b, outcome_b = result_b["out"]
    assert outcome_a.applied and outcome_b.applied
    assert out_a == out_b and "summary 1 of" in out_a[1]["content"]
    assert a.get(summary.state_key("sess-1")).summary.startswith("summary 1 of")
    a.close()
    b.close()


def test_a_replica_finding_the_lease_taken_falls_back(tmp_path):
    path = str(tmp_path / "shared.sqlite3")
    a, b = SqliteState(path), SqliteState(path)
    msgs = chat_history(10)
    inside, release = threading.Event(), threading.Event()
    seen = {}

    def blocking(messages, previous, target):
        inside.set()
        assert release.wait(30)
        return "A's summary"

    thread = threading.Thread(target=lambda: seen.setdefault("a", run(msgs, a, blocking)))
    thread.start()
    assert inside.wait(30)
    fake_b = FakeSummarizer()
    out_b, outcome_b = run(msgs, b, fake_b)
    assert out_b is msgs and outcome_b.reason == "summary_busy" and "lease" in outcome_b.detail
    assert fake_b.calls == []
    release.set()
    thread.join(30)
    out_a, outcome_a = seen["a"]
    assert outcome_a.applied
    again, outcome = run(msgs, b, fake_b)
    assert outcome.applied and again == out_a and fake_b.calls == []
    a.close()
    b.close()


def test_lease_taken_elsewhere_sends_the_stored_summary(state):
    fake = FakeSummarizer()
    msgs = chat_history(10)
    first, _ = run(msgs, state, fake)
    grown = msgs[:-1] + chat_history(8, system=False, first=10)
    token = state.acquire(summary.state_key("sess-1"), 60)  # another replica is re-summarising
    out, outcome = run(grown, state, fake)
    assert outcome.applied and len(fake.calls) == 1
    assert out[1] == first[1] and out[2:] == grown[18:]    # last round's summary, the same bytes
    state.release(summary.state_key("sess-1"), token)
    out, outcome = run(grown, state, fake)
    assert outcome.applied and len(fake.calls) == 2 and out[1] != first[1]


def test_two_redis_replicas_share_one_summary(redis_server):
    a, b = RedisState(redis_server.url), RedisState(redis_server.url)
    session = "redis-" + uuid.uuid4().hex
    fake = FakeSummarizer()
    msgs = chat_history(10)
    out_a, oa = run(msgs, a, fake, session=session)
    out_b, ob = run(msgs + [{"role": "assistant", "content": "x"}, {"role": "user", "content": "y"}], b, fake,
                    session=session)
    assert oa.applied and ob.applied and len(fake.calls) == 1
    assert out_b[:len(out_a) - 1] == out_a[:-1]
    a.close()
    b.close()


def test_redis_killed_mid_session_fails_open_then_recovers(redis_server):
    clock = Clock()
    state = RedisState(redis_server.url, clock=clock, retry_interval=2.0)
    session = "kill-" + uuid.uuid4().hex
    fake = FakeSummarizer()
    msgs = chat_history(10)
    try:
        out, outcome = run(msgs, state, fake, session=session)
        assert outcome.applied
        redis_server.kill()
        out, outcome = run(msgs, state, fake, session=session)
        assert out is msgs and outcome.reason == "state_unavailable" and not outcome.applied
        redis_server.start()  # empty: no persistence
        out, outcome = run(msgs, state, fake, session=session)
        assert outcome.reason == "state_unavailable"  # still inside the retry interval
        clock.advance(2.0)
        out, outcome = run(msgs, state, fake, session=session)
        assert outcome.applied and len(fake.calls) == 2
    finally:
        if redis_server.proc is None:
            redis_server.start()
        state.close()


# -- make_summarizer against a fake OpenAI upstream -----------------------------------

def http_call_json(base_url):
    """call_json as the wiring gives it: POST JSON to the provider, the parsed answer back."""
    parts = urllib.parse.urlsplit(base_url)

    def call_json(path, payload, timeout):
        conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=timeout)
        try:
            conn.request("POST", path, body=json.dumps(payload).encode(),
                         headers={"Content-Type": "application/json", "Authorization": "Bearer k"})
            resp = conn.getresponse()
            data = resp.read()
        except OSError as exc:
            raise SummarizerFailed("transport: %s" % type(exc).__name__) from None
        finally:
            conn.close()
        if resp.status != 200:
            raise SummarizerFailed("status %d" % resp.status)
        return json.loads(data)

    return call_json


def test_make_summarizer_over_http(fake, state):
    fake.reply_fn = lambda rec: "The user asked ten questions about w-words."
    summarize = make_summarizer(http_call_json(fake.url), "summary-model", timeout=10)
    assert summarize.timeout == 10.0
    msgs = chat_history(10)
    out, outcome = run(msgs, state, summarize, target_summary_tokens=80)
    assert outcome.applied
    assert out[1]["content"] == SUMMARY_HEADER + "The user asked ten questions about w-words."
    body = fake.last.json
    assert fake.last.path == "/v1/chat/completions"
    assert body["model"] == "summary-model" and body["stream"] is False and body["temperature"] == 0
    assert body["max_tokens"] >= 80
    system, user = body["messages"]
    assert system["role"] == "system" and "80 tokens" in system["content"]
    assert user["role"] == "user" and "[user]\nquestion 0:" in user["content"]
    assert "PREVIOUS SUMMARY" not in user["content"]
    # the next summary sends the previous one along with only the new messages
    more = msgs[:-1] + chat_history(6, system=False, first=10)
    run(more, state, summarize, target_summary_tokens=80)
    user = fake.last.json["messages"][1]["content"]
    assert user.startswith("PREVIOUS SUMMARY:\nThe user asked ten questions about w-words.")
    assert "question 8:" not in user and "answer 8:" in user and "question 10:" in user  # after the 17 covered


def test_make_summarizer_failures(fake, state):
    summarize = make_summarizer(http_call_json(fake.url), "m", timeout=0.5)
    msgs = chat_history(10)
    fake.fail_next(500)
    out, outcome = run(msgs, state, summarize, session="f1")
    assert out is msgs and outcome.reason == "summarizer_failed"
    fake.delay = 3.0  # past the 0.5 s timeout
    out, outcome = run(msgs, state, summarize, session="f2")
    assert out is msgs and outcome.reason == "summarizer_failed"
    fake.delay = 0.0
    fake.reply_fn = lambda rec: "   "
    out, outcome = run(msgs, state, summarize, session="f3")
    assert outcome.reason == "summarizer_failed"
    for answer in ({}, {"choices": []}, {"choices": [{"message": {"content": None}}]}, []):
        s = make_summarizer(lambda path, payload, timeout, a=answer: a, "m", 1)
        with pytest.raises(SummarizerFailed):
            s([{"role": "user", "content": "x"}], None, 10)

    def broken(path, payload, timeout):
        raise ConnectionResetError("peer")
    with pytest.raises(SummarizerFailed, match="ConnectionResetError"):
        make_summarizer(broken, "m", 1)([{"role": "user", "content": "x"}], None, 10)
    for model, timeout in (("", 1), ("m", 0), ("m", True)):
        with pytest.raises(ValueError):
            make_summarizer(broken, model, timeout)


def test_replicas_racing_on_redis_call_the_summarizer_once(redis_server):
    """Four threads on two replicas send the same session's request at once: one takes the lease and
    summarises, the others skip this request or send that same summary; nobody asks a second time."""
    replicas = [RedisState(redis_server.url), RedisState(redis_server.url)]
    session = "race-" + uuid.uuid4().hex
    msgs = chat_history(10)
    barrier = threading.Barrier(4, timeout=30)
    calls, results = [], []
    lock = threading.Lock()

    def summarize(messages, previous, target):
        with lock:
            calls.append(1)
        return "the one summary"

    def send(state):
        barrier.wait()
        out = run(msgs, state, summarize, session=session)
        with lock:
            results.append(out)

    threads = [threading.Thread(target=send, args=(replicas[i % 2],), daemon=True) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert len(results) == 4 and len(calls) == 1
    applied = [out for out, outcome in results if outcome.applied]
    assert applied and all(out == applied[0] for out in applied)
    assert all(outcome.reason == "summary_busy" for _, outcome in results if not outcome.applied)
    assert all(out is msgs for out, outcome in results if not outcome.applied)
    for r in replicas:
        r.close()


@pytest.mark.parametrize("api", ["chat", "ollama_chat", "messages", "responses"])
def test_random_histories_keep_the_invariants(state, api):
    """Mixed histories (plain, structured, parts, prefixes) never raise, are never mutated, and when
    rewritten keep every structured message, the current turn and an assistant turn after the summary."""
    rng = random.Random(sum(map(ord, api)))
    applied = 0

    def plain(role, i):
        text = "%s %d %s" % (role, i, filler(i, rng.randint(1, 60)))
        if rng.random() < 0.2 and api != "ollama_chat":
            kind = {"responses": "input_text" if role == "user" else "output_text"}.get(api, "text")
            return {"role": role, "content": [{"type": kind, "text": text}]}
        return {"role": role, "content": text}

    def structured(i):
        return rng.choice([
            {"role": "assistant", "content": "x", "tool_calls": [{"id": "c%d" % i}]},
            {"role": "user", "content": [{"type": "image", "source": {}}]},
            {"role": "system", "content": "mid %d" % i},
            {"type": "function_call", "call_id": "c%d" % i, "name": "f", "arguments": "{}"},
            {"role": "user", "content": "y", "extra": 1},
        ])

    for case in range(150):
        msgs = []
        if api != "messages" and rng.random() < 0.7:
            msgs.append({"role": "system", "content": "sys"})
        for i in range(rng.randint(0, 30)):
            if rng.random() < 0.05:
                msgs.append(structured(i))
            else:
                msgs.append(plain("user" if i % 2 == 0 else "assistant", i))
        if rng.random() < 0.2:
            msgs.append({"role": "assistant", "content": "prefill"})
        before = copy.deepcopy(msgs)
        fake = FakeSummarizer()
        out, outcome = summary_buffer(msgs, api, words, session_id="fuzz-%d" % case, state=state, summarize=fake,
                                      min_tokens=rng.choice([0, 20, 200]),
                                      retain_recent_messages=rng.randint(0, 6), target_summary_tokens=20)
        assert msgs == before
        assert outcome.reason in compress.REASONS
        if not outcome.applied:
            assert out is msgs
            continue
        applied += 1
        k = next(i for i, m in enumerate(out) if isinstance(m.get("content"), str)
                 and m["content"].startswith(SUMMARY_HEADER))
        tail = out[k + 1:]
        assert out[:k] == msgs[:k] and msgs[len(msgs) - len(tail):] == tail
        assert tail and (tail[0].get("role") == "assistant" or tail[0].get("type") == "function_call")
        replaced = msgs[k:len(msgs) - len(tail)]
        assert replaced and all(summary.message_text(m, api) is not None for m in replaced)
        users = [i for i, m in enumerate(msgs) if m.get("role") == "user"]
        assert not users or users[-1] >= len(msgs) - len(tail)   # the current turn is kept
        assert outcome.tokens_after < outcome.tokens_before
    assert applied >= 20  # the invariants were checked on real rewrites
