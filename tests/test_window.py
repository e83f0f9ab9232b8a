"""window_fit and the known-window table (_ragproxy.window), in-process.

Every API shape, golden cases worked out by hand (tests/data/window), the
budget arithmetic and each reason, and seeded property tests over generated
agent transcripts (bench/compression.py's generator and checker, which know
nothing of window.py's unit logic): a tool call never loses its results,
the prefix and the current turn stay, the rest is a newest suffix, the
result fits, the input is not mutated, and a round whose previous result
plus the new messages fits keeps that result as its prefix.  An agent loop
counts how many rounds changed the prefix.  Bad shapes never raise.
Tokens are words (whitespace split) unless a test needs the real estimator.
"""
import copy
import json
import os
import random
import sys

import pytest

from _ragproxy import compress, inject, window

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))

import compression as bench  # noqa: E402

GOLDEN = os.path.join(ROOT, "tests", "data", "window", "golden.json")
APIS = ("chat", "ollama_chat", "messages", "responses")


def words(text):
    return len(text.split())


def fit(messages, api, budget, estimate=words, **kw):
    return window.window_fit(messages, api, estimate, window=None, input_budget_tokens=budget, **kw)


def tokens(messages, estimate=words):
    return sum(window.message_tokens(m, estimate) for m in messages)


def indexes(original, result):
    return [next(i for i, m in enumerate(original) if m is r) for r in result]


def w(n, word="w"):
    return " ".join([word] * n)


# -- the table ---------------------------------------------------------------

@pytest.mark.parametrize("model, tokens_", [
    ("qwen2.5-coder:7b", 32768), ("qwen2.5-coder:32b-instruct-q4_K_M", 32768), ("qwen2.5:14b", 32768),
    ("qwen3:8b", 40960), ("qwen3-coder:30b", 262144), ("llama3.1:8b", 131072), ("llama3.2", 131072),
    ("Llama3.3:70B", 131072), ("llama3:latest", 8192), ("codellama:13b", 16384),
    ("deepseek-coder-v2:16b", 163840), ("deepseek-coder:6.7b", 16384), ("deepseek-r1:14b", 131072),
    ("mistral:7b", 32768), ("mistral-nemo", 131072), ("mixtral:8x22b", 65536), ("mixtral:8x7b", 32768),
    ("gemma2:9b", 8192), ("gemma3:27b", 131072), ("gemma3:1b", 32768), ("phi3:mini", 4096),
    ("phi3:medium-128k", 131072), ("phi4:14b", 16384), ("starcoder2:15b", 16384),
    ("gpt-4o-mini", 128000), ("gpt-4o-2024-08-06", 128000), ("gpt-4.1-mini", 1047576), ("gpt-4", 8192),
    ("o1-mini", 128000), ("o1", 200000), ("o3-mini", 200000), ("o4-mini", 200000), ("gpt-5-mini", 272000),
    ("claude-sonnet-4-5-20250929", 200000), ("claude-3-5-haiku-latest", 200000),
    ("gemini-2.5-pro", 1048576), ("gemini-1.5-pro-002", 2097152),
    ("openai/gpt-4o", 128000), ("ollama/qwen2.5-coder:7b", 32768),
])
def test_known_windows_match_names_as_clients_send_them(model, tokens_):
    assert window.model_window(model) == tokens_


def test_every_entry_is_reachable_first_match_wins():
    # Each glob, made into a name, resolves to its own entry: no earlier glob shadows a later one.
    for pattern, tokens_ in window.KNOWN_WINDOWS:
        assert window.model_window(pattern.replace("*", "")) == tokens_, pattern
    assert all(pattern == pattern.lower() for pattern, _ in window.KNOWN_WINDOWS)


def test_unknown_models_and_overrides():
    assert window.model_window("my-finetune") is None
    assert window.model_window("") is None
    assert window.model_window(None) is None
    assert window.model_window(["gpt-4o"]) is None
    assert window.model_window("my-finetune", 4096) == 4096
    assert window.model_window("gpt-4o", 8192) == 8192     # config's context_window beats the table


# -- the estimate --------------------------------------------------------------

def test_message_tokens_texts_structure_and_images():
    overhead = window.MESSAGE_OVERHEAD
    assert window.message_tokens({"role": "user", "content": "a b c"}, words) == 3 + overhead
    parts = {"role": "user", "content": [{"type": "text", "text": "a b"},
                                         {"type": "image_url", "image_url": {"url": "data:" + "x" * 10000}}]}
    assert window.message_tokens(parts, words) == 2 + window.IMAGE_TOKENS + overhead
    assert window.message_tokens({"role": "user", "content": "a", "images": ["AAAA", "BBBB"]}, words) == \
        1 + 2 * window.IMAGE_TOKENS + overhead
    call = {"role": "assistant", "content": None,
            "tool_calls": [{"id": "c1", "function": {"name": "f", "arguments": "{\"q\": \"one two three\"}"}}]}
    # Tool calls count by their JSON text: the arguments' words are in it.
    compact = json.dumps({"tool_calls": call["tool_calls"]}, separators=(",", ":"))
    assert window.message_tokens(call, words) == overhead + len(compact.split()) == overhead + 4
    assert window.message_tokens(call, inject.estimate_tokens_text) > overhead + 5
    result = {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": w(50)}]}
    assert window.message_tokens(result, words) == overhead + 50
    assert window.message_tokens("junk", words) == overhead + 1


# -- golden cases --------------------------------------------------------------

def golden_cases():
    with open(GOLDEN, encoding="utf-8") as f:
        return json.load(f)["cases"]


@pytest.mark.parametrize("case", golden_cases(), ids=lambda c: c["name"])
def test_golden(case):
    messages = case["messages"]
    out, outcome = fit(messages, case["api"], case["input_budget_tokens"])
    assert outcome.lever == "window_fit"
    expect = case["expect"]
    assert (outcome.reason, indexes(messages, out), outcome.tokens_before, outcome.tokens_after) == \
        (expect["reason"], expect["kept"], expect["tokens_before"], expect["tokens_after"])
    assert outcome.applied == (expect["reason"] == "applied")
    if not outcome.applied:
        assert out is messages
    else:
        assert bench.check_fit(messages, out, case["api"], case["input_budget_tokens"], outcome.tokens_after) == []


# -- budget and reasons --------------------------------------------------------

def conversation(turns=6, size=20):
    out = [{"role": "system", "content": w(5, "s")}]
    for t in range(turns):
        out += [{"role": "user", "content": w(size, "u%d" % t)}, {"role": "assistant", "content": w(size, "a")}]
    return out + [{"role": "user", "content": w(5, "now")}]


def test_budget_is_window_minus_reserve_minus_fixed():
    messages = conversation()            # 10 + 6 * 50 + 10 = 320 tokens
    assert tokens(messages) == 320
    args = dict(window=400, completion_reserve_tokens=80)
    out, o = window.window_fit(messages, "chat", words, **args)
    assert o.reason == "not_needed" and out is messages               # 400 - 80 = 320: fits exactly
    out, o = window.window_fit(messages, "chat", words, fixed_tokens=1, **args)
    assert o.applied and o.tokens_after <= 319 and tokens(out) == o.tokens_after
    out, o = window.window_fit(messages, "chat", words, fixed_tokens=200, **args)
    assert o.applied and tokens(out) <= 120
    # input_budget_tokens replaces window - reserve; fixed tokens still come off it.
    out, o = window.window_fit(messages, "chat", words, window=100000, input_budget_tokens=150, fixed_tokens=50)
    assert o.applied and tokens(out) <= 100
    assert out[0] is messages[0] and out[-1] is messages[-1]
    assert "budget 100 tokens" in o.detail


def test_reasons_unknown_window_string_input_and_nothing_fits():
    messages = conversation()
    out, o = window.window_fit(messages, "chat", words, window=None)
    assert (out, o.reason, o.applied) == (messages, "unknown_model_window", False)
    out, o = window.window_fit("just a string", "responses", words, window=1000)
    assert (out, o.reason) == ("just a string", "not_eligible")
    out, o = window.window_fit(messages, "chat", words, window=1000, fixed_tokens=5000)
    assert (out, o.reason) == (messages, "not_eligible")
    assert o.tokens_before == o.tokens_after == 320
    for reason in ("not_needed", "not_eligible", "unknown_model_window", "no_savings", "applied"):
        assert reason in compress.REASONS


@pytest.mark.parametrize("kw", [dict(window=0), dict(window=1.5), dict(window=100, fixed_tokens=-1),
                                dict(window=100, completion_reserve_tokens=True),
                                dict(window=None, input_budget_tokens=0), dict(window=100, low_water=0),
                                dict(window=100, low_water=1.5)])
def test_bad_arguments_are_value_errors(kw):
    with pytest.raises(ValueError):
        window.window_fit(conversation(), "chat", words, **kw)
    with pytest.raises(ValueError):
        window.window_fit(conversation(), "completions", words, window=100)


def test_leading_system_and_developer_messages_all_stay():
    messages = [{"role": "system", "content": w(30)}, {"role": "developer", "content": w(30)}] + conversation()[1:]
    out, o = fit(messages, "chat", 150)
    assert o.applied and out[:2] == messages[:2] and out[2]["role"] == "user"
    assert out[-1] is messages[-1]


def test_a_system_message_in_the_middle_is_history():
    messages = conversation()
    messages.insert(5, {"role": "system", "content": w(10, "mid")})
    out, o = fit(messages, "chat", 100)
    assert o.applied and messages[5] not in out[1:]


def test_the_current_turn_is_never_cut_even_mid_agent_loop():
    # One old turn, then a current turn of many tool rounds: the old turn goes, the loop stays whole.
    messages = conversation(turns=2)[:-1] + [{"role": "user", "content": "fix the bug"}]
    for n in range(8):
        messages += [{"role": "assistant", "content": None, "tool_calls": [
            {"id": "c%d" % n, "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "c%d" % n, "content": w(10)}]
    current = len(conversation(turns=2)) - 1
    need = tokens(messages[:1]) + tokens(messages[current:])
    out, o = fit(messages, "chat", need)
    assert o.applied and indexes(messages, out) == [0] + list(range(current, len(messages)))
    out, o = fit(messages, "chat", need - 1)
    assert o.reason == "not_eligible" and out is messages


def test_anthropic_never_starts_with_an_assistant_message():
    messages = [{"role": "user", "content": w(40)}, {"role": "assistant", "content": w(40)},
                {"role": "user", "content": w(40)}, {"role": "assistant", "content": w(40)},
                {"role": "user", "content": w(5)}]
    # 55 tokens would fit the last assistant + user, but that starts with an assistant message.
    out, o = fit(messages, "messages", 100)
    assert o.applied and indexes(messages, out) == [2, 3, 4]
    out, o = fit(messages, "messages", 99)
    assert o.applied and indexes(messages, out) == [4]
    out, o = fit([{"role": "assistant", "content": w(50)}] * 3, "messages", 60)
    assert o.reason == "not_eligible"


def test_ollama_and_chat_results_stay_with_an_unpaired_tool_message_too():
    messages = [{"role": "user", "content": w(30)}, {"role": "tool", "content": w(30)},
                {"role": "user", "content": w(30)}, {"role": "assistant", "content": "", "tool_calls": [{}]},
                {"role": "tool", "content": w(30)}, {"role": "user", "content": w(3)}]
    assert tokens(messages) == 154 and tokens(messages[2:]) == 84
    for api in ("chat", "ollama_chat"):
        # The stray tool message goes with the user message before it: a cut never lands on a tool result.
        out, o = fit(messages, api, 90)
        assert o.applied and indexes(messages, out) == [2, 3, 4, 5]
        out, o = fit(messages, api, 80)
        assert o.applied and indexes(messages, out) == [5]


def test_result_shares_kept_messages_and_does_not_mutate():
    messages = conversation()
    before = copy.deepcopy(messages)
    out, o = fit(messages, "chat", 120)
    assert o.applied and out is not messages and messages == before
    assert all(any(m is k for k in messages) for m in out)


# -- property tests over generated transcripts ---------------------------------

@pytest.mark.parametrize("api", APIS)
def test_property_generated_transcripts(api):
    for seed in range(60):
        rng = random.Random("%s-%d" % (api, seed))
        messages, ends = bench.transcript(rng, api, rng.randint(3, 40), system=rng.random() < 0.7,
                                          result_words=(5, 120))
        for end in rng.sample(ends, min(len(ends), 6)):
            request = messages[:end]
            frozen = json.dumps(request)
            total = tokens(request)
            budget = rng.randint(20, total + 50)
            out, o = fit(request, api, budget)
            assert json.dumps(request) == frozen
            assert o.tokens_before == total
            if total <= budget:
                assert (o.reason, out) == ("not_needed", request)
                continue
            prefix = bench.prefix_length(request)
            turn = bench.human_turn_start(request, api)
            current = tokens(request[:prefix]) + tokens(request[turn:])
            if current > budget:
                assert o.reason == "not_eligible" and out is request, (api, seed, end)
                continue
            assert o.reason == "applied", (api, seed, end, o)
            assert bench.check_fit(request, out, api, budget, o.tokens_after) == [], (api, seed, end)
            assert tokens(out) == o.tokens_after < total
            again, o2 = fit(request, api, budget)
            assert o2 == o and len(again) == len(out) and all(a is b for a, b in zip(again, out))


@pytest.mark.parametrize("api", APIS)
def test_property_a_round_that_fits_on_the_previous_result_keeps_it(api):
    """Prefix stability: when last round's result plus this round's new messages fits, that is the result."""
    checked = changed = 0
    for seed in range(25):
        rng = random.Random("stable-%s-%d" % (api, seed))
        messages, ends = bench.transcript(rng, api, rng.randint(20, 60), result_words=(5, 150))
        budget = rng.randint(300, 1500)
        previous = None
        for start, end in zip([None] + ends, ends):
            request = messages[:end]
            out, o = fit(request, api, budget)
            if previous is not None and o.reason != "not_eligible":
                grown = previous + messages[start:end]
                if tokens(grown) <= budget:
                    checked += 1
                    assert len(out) == len(grown) and all(a is b for a, b in zip(out, grown)), (api, seed, end)
                else:
                    changed += 1
            previous = out if o.reason in ("applied", "not_needed") else None
    assert checked > 100 and changed > 10      # both branches were exercised


def agent_loop_prefix_changes(low_water, seed, rounds=30):
    """Prefix changes and applied rounds of one agent loop on a budget of half its final history."""
    rng = random.Random("loop-%d" % seed)
    messages, ends = bench.transcript(rng, "chat", rounds, result_words=(40, 300))
    # Half the final history, or the largest current turn when that is more: every round must fit.
    turns = [tokens(messages[:1]) + tokens(messages[bench.human_turn_start(messages[:e], "chat"):e]) for e in ends]
    budget = max(tokens(messages) // 2, max(turns))
    changes, previous, applied = 0, None, 0
    for end in ends:
        request = messages[:end]
        out, o = window.window_fit(request, "chat", words, window=budget + 1024, low_water=low_water)
        assert o.reason in ("applied", "not_needed"), o
        assert tokens(out) <= budget
        applied += o.applied
        if previous is not None and (len(out) < len(previous) or any(a is not b for a, b in zip(previous, out))):
            changes += 1
        previous = out
    return changes, applied


def test_agent_loops_change_the_prefix_rarely():
    low = [agent_loop_prefix_changes(window.LOW_WATER, seed) for seed in range(20)]
    one_by_one = [agent_loop_prefix_changes(1.0, seed) for seed in range(20)]
    applied = sum(a for _, a in low)
    assert applied == sum(a for _, a in one_by_one) == 312     # the budget binds on half of the 600 rounds
    # The figures the module docstring quotes: rounds (of 600) whose prefix changed.
    assert (sum(c for c, _ in low), sum(c for c, _ in one_by_one)) == (56, 103)


# -- bad shapes ----------------------------------------------------------------

_JUNK = (None, 0, 1.5, True, "text", [], {}, [None, 1, "x"], {"a": [1, {"b": None}]},
         {"role": ["user"]}, {"role": "user", "content": {"a": 1}}, {"role": "user", "content": 7},
         {"role": "assistant", "tool_calls": "x"}, {"role": "assistant", "tool_calls": [None, 3]},
         {"role": "tool"}, {"role": "tool", "content": None}, {"content": [None, 1, {"type": []}, "s"]},
         {"type": 5}, {"type": "function_call"}, {"type": "function_call_output", "output": [1]},
         {"type": "reasoning"}, {"role": "user", "images": "zz"}, {"role": "user", "images": [None]},
         {"role": "user", "content": [{"type": "tool_result"}]},
         {"role": "assistant", "content": [{"type": "tool_use"}]},
         {"role": "system", "content": ["x"]}, {"role": "developer"}, {"role": "user", "content": "a b c d e f"},
         {"role": "assistant", "content": "g h i"}, {"role": {"x": 1}, "type": {"y": 2}})


@pytest.mark.parametrize("api", APIS)
def test_bad_shapes_never_raise(api):
    for value in (None, {}, "x", 5, [], [None]):
        out, o = fit(value, api, 10)
        assert out is value and o.reason in compress.REASONS and not (o.applied and out is value)
    for seed in range(300):
        rng = random.Random(seed)
        messages = [rng.choice(_JUNK) for _ in range(rng.randint(1, 25))]
        out, o = fit(messages, api, rng.randint(1, 80))
        assert o.reason in compress.REASONS
        assert isinstance(out, list) and (out is messages or o.applied)
        if o.applied:
            assert out[-1] is messages[-1] and tokens(out) <= o.tokens_after + 0 and o.tokens_after < o.tokens_before


@pytest.mark.parametrize("api", APIS)
def test_the_checker_catches_what_it_must(api):
    """The property tests are only as good as bench.check_fit: it finds a split unit, a lost turn, a gap."""
    rng = random.Random("checker-" + api)
    messages, _ = bench.transcript(rng, api, 30, result_words=(5, 20))
    p = bench.prefix_length(messages)
    users = [i for i in range(p + 1, len(messages)) if bench.human_turn_start(messages[:i + 1], api) == i]
    cut = users[1]
    assert bench.check_fit(messages, messages[:p] + messages[cut:], api) == []
    # Start one message later: a cut inside a unit, or on a non-user message.
    assert bench.check_fit(messages, messages[:p] + messages[cut + 1:], api) != []
    # A gap: not a newest suffix.
    assert bench.check_fit(messages, messages[:p] + messages[cut:-3] + messages[-2:], api) != []
    # The current turn lost.
    assert bench.check_fit(messages, messages[:p] + messages[users[-1] + 1:], api) != []
    calls = [i for i, m in enumerate(messages) if m.get("tool_calls") or m.get("type") == "function_call"
             or any(isinstance(b, dict) and b.get("type") == "tool_use" for b in (m.get("content") or [])
                    if isinstance(m.get("content"), list))]
    assert calls
    # A call whose results are gone (the list rebuilt without the message after it).
    i = calls[-1]
    broken = messages[:i + 1] + messages[i + 2:]
    assert bench.check_fit(broken, broken, api) != []
    assert bench.check_fit(messages, messages[:p], api) != []
    assert bench.check_fit(messages, messages, api, budget=10, tokens=11) != []


def test_responses_custom_tool_calls_keep_their_outputs():
    messages = [{"role": "user", "content": w(40)},
                {"type": "custom_tool_call", "call_id": "x1", "name": "apply_patch", "input": w(30)},
                {"type": "custom_tool_call_output", "call_id": "x1", "output": w(30)},
                {"role": "user", "content": w(40)},
                {"type": "custom_tool_call", "call_id": "x2", "name": "apply_patch", "input": w(30)},
                {"type": "custom_tool_call_output", "call_id": "x2", "output": w(30)}]
    assert [a for a, _ in window.units(messages, "responses")] == [0, 1, 3, 4]
    out, o = fit(messages, "responses", 120)
    assert o.applied and indexes(messages, out) == [3, 4, 5]


def test_an_image_only_user_message_mid_loop_is_not_the_current_turn():
    # Codex returns view_image output as a user message holding only an image, in the middle of the loop.
    image = {"type": "message", "role": "user",
             "content": [{"type": "input_image", "image_url": "data:image/png;base64," + "A" * 400}]}
    messages = [{"role": "developer", "content": w(10)}, {"role": "user", "content": w(200, "old")},
                {"role": "assistant", "content": w(50)}, {"role": "user", "content": "look at the screenshot"},
                {"type": "function_call", "call_id": "v1", "name": "view_image", "arguments": "{}"},
                {"type": "function_call_output", "call_id": "v1", "output": "attached"}, image,
                {"type": "function_call", "call_id": "v2", "name": "shell", "arguments": "{}"},
                {"type": "function_call_output", "call_id": "v2", "output": w(10)}]
    assert bench.human_turn_start(messages, "responses") == 3
    out, o = fit(messages, "responses", window.IMAGE_TOKENS + 100)
    assert o.applied and indexes(messages, out) == [0] + list(range(3, 9))
    out, o = fit(messages, "responses", window.IMAGE_TOKENS + 10)
    assert o.reason == "not_eligible"
