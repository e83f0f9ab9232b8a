#!/usr/bin/env python3
"""What ragproxy spends on a request body of the size real coding tools send, in one run.

    python bench/request_body.py                          # 10 KB, 100 KB, 500 KB bodies (~10 s)
    python bench/request_body.py --sizes 100000 --repeat 50
    python bench/request_body.py --ragproxy /tmp/try/ragproxy.py --json

The bodies are shaped like Claude Code's /v1/messages calls
(shared/docs/clients.md): the model first, then a conversation, a system prompt
and tool definitions, made of pseudo-words (fixed seed) up to the size asked.
Every side runs on the same bytes, in this process, back to back; the figure is
the median of --repeat runs in microseconds.

Sides:
  json.loads                 the stdlib parser, as a yardstick
  parse (every call)         ragproxy's _json_object_of: every proxied call pays it,
                             to read the model and check the body
  serialize again            _json_bytes of the payload: what a rewrite of the
                             body costs (retrieval injection; a model rename before
                             commit cbe4a73)
  replace model in place     _with_model: a model rename now
  splice injected turn       _with_edits: retrieval injection since it names what it
                             changed (2 KB of context before the last user turn;
                             before that commit, injection cost "serialize again")
  inject + splice, N KB      inject and with_edits, as a request that injects N KB
                             of context pays them (--contexts)
  ... encoded once, N KB     the same in a later round of the turn, whose context
                             was encoded once (what inject_retrieved does from 2 KB)
  ... kept by the turn, N KB the same from the turn's third round on, whose human
                             message is sent as in the round before: its JSON text
                             with the context in is the one that round's got
  parse, loop round (N)      _json_object_with_members through a ParseMemo, as a
                             large body is parsed, over N rounds of an agent loop
                             that starts from the body and adds a tool call and
                             its result each round (--loop-rounds): per round
"""

from __future__ import annotations

import argparse
import functools
import importlib
import inspect
import json
import random
import statistics
import string
import sys
import time
import types

from perf import RAGPROXY, load_ragproxy


def claude_code_body(size, seed=5):
    """JSON bytes of about ``size`` bytes, in the order and shape Claude Code sends."""
    rng = random.Random(seed)
    vocabulary = ["".join(rng.choice(string.ascii_lowercase) for _ in range(rng.randint(2, 9)))
                  for _ in range(3000)]

    def text(n):
        return " ".join(rng.choice(vocabulary) for _ in range(max(1, n // 6)))

    body = {"model": "claude-sonnet-4-5", "messages": [], "system": [
        {"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1"},
        {"type": "text", "text": text(size // 8), "cache_control": {"type": "ephemeral"}}],
        "tools": [{"name": f"tool_{i}", "description": text(size // 80),
                   "input_schema": {"type": "object", "properties": {"arg": {"type": "string",
                                                                             "description": text(60)}},
                                    "required": ["arg"]}} for i in range(20)],
        "metadata": {"user_id": json.dumps({"session": "bench"})}, "max_tokens": 32000, "stream": True}
    turn = 0
    while len(json.dumps(body)) < size:
        body["messages"].append({"role": "user" if turn % 2 == 0 else "assistant",
                                 "content": [{"type": "text", "text": text(min(3000, size // 20))}]})
        turn += 1
    return json.dumps(body, ensure_ascii=False).encode("utf-8")


# The new human turn of the agent-loop body: words a coding question shares with
# both shared eval corpora (SciFact abstracts, CoSQA code), so a lexical KB over
# either finds and injects something, as a real KB over a user's docs would.
AGENT_PROMPT = ("The test for the gene expression parser fails: python reads the csv file of protein levels, "
                "but the function returns an empty list when the cell type column is missing. Find out why, "
                "fix it, and add a test that covers a file without that column.")
_REMINDER = ("<system-reminder>\nAs you answer the user's questions, you can use the following context:\n"
             "# important-instruction-reminders\nDo what has been asked; nothing more, nothing less.\n"
             "</system-reminder>\n")


def agent_loop_body(size=120_000, tools=24, turns=40, tool_round=False, model="claude-sonnet-4-5",
                    prompt=AGENT_PROMPT, seed=5, stream=True):
    """A Claude Code /v1/messages body of about ``size`` bytes: ``tools`` tools and ``turns`` messages.

    The messages are an agent loop's history: the first human turn, then
    assistant tool calls and their results in pairs, and last a new human turn
    (a ``<system-reminder>`` block, then ``prompt``): the first request of a
    turn, which retrieves.  ``tool_round`` appends one more tool call and its
    result: the next round of that same turn, which may reuse what the first
    got.  Fixed seed: the same arguments give the same bytes.
    """
    pairs = max(0, (turns - 2) // 2)

    def build(share, tool_round=False):
        rng = random.Random(seed)
        vocabulary = ["".join(rng.choice(string.ascii_lowercase) for _ in range(rng.randint(2, 9)))
                      for _ in range(3000)]

        def text(n):
            return " ".join(rng.choice(vocabulary) for _ in range(max(1, n // 6)))

        def human(words):
            return {"role": "user", "content": [
                {"type": "text", "text": _REMINDER},
                {"type": "text", "text": words, "cache_control": {"type": "ephemeral"}}]}

        def call(i, n):
            return {"role": "assistant", "content": [
                {"type": "text", "text": text(n // 3)},
                {"type": "tool_use", "id": f"toolu_{i:024d}", "name": f"tool_{i % tools}",
                 "input": {"arg": text(n // 3)}}]}

        def result(i, n):
            return {"role": "user", "content": [{"type": "tool_result", "tool_use_id": f"toolu_{i:024d}",
                                                 "content": text(n)}]}

        body = {"model": model, "messages": [], "system": [
            {"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1.197"},
            {"type": "text", "text": text(size // 8), "cache_control": {"type": "ephemeral"}}],
            "tools": [{"name": f"tool_{i}", "description": text(size // 100),
                       "input_schema": {"type": "object", "properties": {"arg": {"type": "string",
                                                                                 "description": text(60)}},
                                        "required": ["arg"]}} for i in range(tools)],
            "metadata": {"user_id": json.dumps({"session": "bench"})}, "max_tokens": 32000,
            "thinking": {"type": "adaptive"}, "stream": stream}
        body["messages"].append(human(text(share)))
        for i in range(pairs):
            body["messages"] += [call(i, share), result(i, share)]
        body["messages"].append(human(prompt))
        if tool_round:
            body["messages"] += [call(pairs, 600), result(pairs, 600)]
        return json.dumps(body, ensure_ascii=False).encode("utf-8")

    # The history takes what the system prompt and the tools leave: the body's
    # size grows about linearly with each message's share, so two probes say
    # what share fills it (the tool round's two messages come on top).
    base, probe = len(build(0)), len(build(6000))
    return build(max(0, int(6000 * (size - base) / max(1, probe - base))), tool_round)


def median_us(fn, repeat):
    fn()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e6


def body_helpers(rp):
    """The request-body helpers of ``rp``: in _ragproxy since the package split, module privates before."""
    if hasattr(rp, "_json_object_of"):   # a single-file ragproxy.py (--ragproxy from an older commit)
        return types.SimpleNamespace(json_object_of=rp._json_object_of, json_bytes=rp._json_bytes,
                                     with_model=getattr(rp, "_with_model", None),  # absent before cbe4a73
                                     with_edits=getattr(rp, "_with_edits", None),  # absent before 7d10aaa
                                     parse_memo=None)
    api = importlib.import_module("_ragproxy.api")
    jsonbody = importlib.import_module("_ragproxy.jsonbody")
    retrieval = importlib.import_module("_ragproxy.retrieval")
    return types.SimpleNamespace(json_object_of=jsonbody.json_object_of, json_bytes=api.json_bytes,
                                 with_model=jsonbody.with_model, with_edits=jsonbody.with_edits,
                                 members=jsonbody.Members, retrieved=retrieval.Retrieved,
                                 json_object_with_members=getattr(jsonbody, "json_object_with_members", None),
                                 parse_memo=getattr(jsonbody, "ParseMemo", None),
                                 inject_retrieved=getattr(retrieval, "inject_retrieved", None))


def context_sides(rp, helpers, body, contexts):
    """Injecting ``contexts`` (sizes in bytes) and splicing, as every round of a turn pays it
    (the body's Members found as it was parsed), without and (where this version has them)
    with the context encoded once for the turn, and with the turn's message kept encoded."""
    sides = {}
    members = helpers.members(body, ("messages",))   # as the parse found them: what the proxy splices with
    words = random.Random(11).choices(["def", "return", "self.value", "numpy", "array(", "x", "=", "1", "+",
                                       '"text"', "C:\\path", "caf\u00e9", "\n"], k=20000)
    for size in contexts:
        plain, *later = _context_rounds(rp, helpers, body, members, " ".join(words)[:size])
        sides[f"inject + splice, {size // 1000} KB"] = plain
        for label, fn in zip(("encoded once", "kept by the turn"), later):
            if fn is not None:
                if fn() != plain():
                    raise SystemExit(f"the context {label} gave other bytes")
                sides[f"... {label}, {size // 1000} KB"] = fn
    return sides


def _context_rounds(rp, helpers, body, members, context):
    payload = helpers.json_object_of(body)

    def plain():
        sent = dict(payload)
        return helpers.with_edits(body, sent, rp.inject("messages", sent, context, "before_last_user"), members)
    if helpers.inject_retrieved is None:
        return plain, None, None
    found = helpers.retrieved(context, (), "retrieved")
    found.json_escaped()   # the turn's first round encoded it

    def a_round(**turn):
        exchange = types.SimpleNamespace(endpoint=types.SimpleNamespace(name="messages"), payload=dict(payload),
                                         route=types.SimpleNamespace(inject_mode="before_last_user"), encoded=None,
                                         members=members, request=types.SimpleNamespace(body=body), edits=(),
                                         changed=False)
        paths = helpers.inject_retrieved(exchange, found, encode_once_min=0, **turn)
        return helpers.with_edits(body, exchange.payload, paths, members, exchange.encoded)
    if "sent_texts" not in inspect.signature(helpers.inject_retrieved).parameters:
        return plain, a_round, None
    sent_texts = {}
    a_round(sent_texts=sent_texts)   # the round before, which sent the human message as this one does
    return plain, a_round, lambda: a_round(sent_texts=sent_texts)


def agent_loop_rounds(scenario, body, rounds, model=None):
    """The bodies of ``rounds`` rounds of an agent loop on ``body`` (its first request, the human turn
    last; the first of the bodies) in the scenario's wire format ("claude" or chat), for ``model``
    (None: the body's): each round the one before with a tool call and its result more, encoded
    as the body was, so that what a round repeats is byte for byte the same."""
    payload = json.loads(body)
    if model is not None:
        payload["model"] = model
    claude = scenario == "claude"
    dumps = functools.partial(json.dumps, ensure_ascii=False) if claude else \
        functools.partial(json.dumps, separators=(",", ":"))
    messages, bodies = payload["messages"], []
    for n in range(rounds):
        if n:
            call_id, output = f"toolu_{n:020d}", f"{n}: def handler(request):\n    return respond(request)\n" * 12
            if claude:   # Claude Code marks only the newest message for prompt caching
                messages = [_unmarked(m) for m in messages] + [
                    {"role": "assistant", "content": [{"type": "tool_use", "id": call_id, "name": "Read",
                                                       "input": {"file_path": f"src/handler_{n}.py"}}]},
                    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call_id, "content": output,
                                                  "cache_control": {"type": "ephemeral"}}]}]
            else:
                messages = messages + [
                    {"role": "assistant", "content": None, "tool_calls": [
                        {"id": call_id, "type": "function",
                         "function": {"name": "read_file", "arguments": json.dumps({"path": f"src/h{n}.py"})}}]},
                    {"role": "tool", "tool_call_id": call_id, "content": output}]
        bodies.append(dumps(dict(payload, messages=messages)).encode("utf-8"))
    return bodies


def _unmarked(message):
    content = message.get("content")
    if not isinstance(content, list) or not any(isinstance(p, dict) and "cache_control" in p for p in content):
        return message
    return dict(message, content=[{k: v for k, v in p.items() if k != "cache_control"} if isinstance(p, dict) else p
                                  for p in content])


def measure(rp, size, repeat, contexts=(), rounds=0):
    helpers = body_helpers(rp)
    body = claude_code_body(size)
    payload = helpers.json_object_of(body)
    model = payload["model"]
    sides = {"json.loads": lambda: json.loads(body),
             "parse (every call)": lambda: helpers.json_object_of(body),
             "serialize again": lambda: helpers.json_bytes(payload)}
    with_model = helpers.with_model
    if with_model is not None:
        renamed = with_model(body, model, "qwen2.5-coder:32b")
        if renamed is None or json.loads(renamed) != dict(payload, model="qwen2.5-coder:32b"):
            raise SystemExit("replace model in place gave a different payload")
        sides["replace model in place"] = lambda: with_model(body, model, "qwen2.5-coder:32b")
    with_edits = helpers.with_edits
    if with_edits is not None:
        injected = helpers.json_object_of(body)
        paths = rp.inject("messages", injected, "Reference material.\n" + "x " * 1000, "before_last_user")
        if json.loads(with_edits(body, injected, paths)) != injected:
            raise SystemExit("splice injected turn gave a different payload")
        sides["splice injected turn"] = lambda: with_edits(body, injected, paths)
        sides.update(context_sides(rp, helpers, body, contexts))
    per_call = dict.fromkeys(sides, 1)
    if rounds and helpers.parse_memo is not None:
        bodies = agent_loop_rounds("claude", body, rounds + 1)[1:]   # the rounds after the body
        memo = helpers.parse_memo()
        for sent in bodies:
            if helpers.json_object_with_members(sent, ("messages", "input"), memo)[0] != json.loads(sent):
                raise SystemExit("a loop round parsed through the memo gave a different payload")

        def loop():
            memo = helpers.parse_memo()   # a new one each time: every round meets what the one before kept
            for sent in bodies:
                helpers.json_object_with_members(sent, ("messages", "input"), memo)
        name = f"parse, loop round ({rounds})"
        sides[name], per_call[name] = loop, rounds
    return len(body), {name: round(median_us(fn, repeat) / per_call[name], 1) for name, fn in sides.items()}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", default="10000,100000,500000", help="comma-separated body sizes in bytes")
    p.add_argument("--repeat", type=int, default=30, help="timed runs per side and size (median)")
    p.add_argument("--contexts", default="1000,2000,4000,8000,16000",
                   help="comma-separated sizes of injected context, in bytes")
    p.add_argument("--loop-rounds", type=int, default=100,
                   help="rounds of the agent loop the loop-round side parses (default 100; 0: no such side)")
    p.add_argument("--ragproxy", default=RAGPROXY, help="the ragproxy.py to measure")
    p.add_argument("--json", action="store_true", help="also print one JSON line with every figure")
    args = p.parse_args(argv)
    rp = load_ragproxy(args.ragproxy)
    print(f"{rp.version_text()}; Claude Code-shaped bodies; median of {args.repeat} runs, microseconds")
    report = {}
    for size in (int(s) for s in args.sizes.split(",")):
        actual, figures = measure(rp, size, args.repeat, [int(c) for c in args.contexts.split(",") if c],
                                  args.loop_rounds)
        report[actual] = figures
        print(f"\n{actual:,} bytes")
        for name, us in figures.items():
            print(f"  {name:28s} {us:10.1f} us")
    if args.json:
        print(json.dumps({"sizes": report}, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
