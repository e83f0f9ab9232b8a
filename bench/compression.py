#!/usr/bin/env python3
"""What the compression levers save and what they cost: rag_select on SciFact, window_fit on agent transcripts.

    python bench/compression.py                          # both parts, ../shared/eval/scifact
    python bench/compression.py --queries 50 --transcripts 5
    python bench/compression.py --part window --budgets 8000,16000,32000

(a) rag_select.  Every judged SciFact test query is searched in a
knowledge base built the way bench/eval_retrieval.py builds one (ragproxy's
own import, chunking and BM25, ``KnowledgeBase.search``); its top 20 chunks
go into one chat request as one <sbproxy-retrieval> block, each chunk with
its BM25 score divided by the query's best (the grammar wants [0, 1]).
``compress.rag_select`` with ``max_chunks: 5`` runs on it with ranking
``supplied`` (those scores) and ``lexical`` (TF-IDF cosine to the query).
Reported per ranking: the marked context's estimated tokens before and after
(``inject.estimate_tokens_text``), nDCG@10 and Recall@5 of the kept chunks in
the order they stay in (each document at its best chunk, as eval_retrieval
scores), against the same figures for all 20 (Recall@5 there is BM25's
first 5, Recall@20 all of them).

(b) window_fit.  Seeded generated agent transcripts, chat and Anthropic
messages shapes, 20 to 200 rounds each (a round is one request: after a
person's message or after a tool result), human turns of 0 to 5 tool rounds
with 1 to 3 parallel calls.  Each round's request is the history so far, as
a client sends it; window_fit runs on it with ``input_budget_tokens`` set to
each budget (no fixed tokens).  Reported per shape and budget: outcomes by
reason, every result checked (each tool call with its results, the prefix,
the current turn, a contiguous newest suffix, Anthropic alternation: valid
yes / no), tokens kept against the budget for the rounds it applied (mean,
min, max), and how often a round's request did not start with the previous
round's (prefix changes per 100 rounds), with the default low-water mark and
with ``low_water=1.0`` (cut as little as fits) for comparison.

The transcript generator and the checker are public: tests/test_window.py
uses them for its property tests.

Output: readable tables, then one JSON line per result row (the last lines).
Standard library only (plus what ragproxy itself uses); Python 3.9+.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shutil
import sys
import tempfile

import eval_retrieval as ev
from perf import load_ragproxy

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
RAGPROXY = os.path.join(ROOT, "ragproxy.py")
COLLECTION = os.path.join(os.path.dirname(ROOT), "shared", "eval", "scifact")
TOP_CHUNKS = 20
MAX_CHUNKS = 5
SHAPES = ("chat", "messages")

# Public names: transcript, check_fit, human_turn_start, prefix_length, rag_select_bench, window_bench, main

# --------------------------------------------------------------------------
# Generated agent transcripts

_WORDS = ("the", "function", "returns", "a", "list", "of", "files", "in", "config", "when", "error", "is", "raised",
          "test", "fails", "because", "value", "None", "self.path", "os.path.join", "import", "json", "def",
          "class", "Handler", "request", "response", "status", "200", "404", "timeout", "retry", "cache", "key",
          "index", "build", "deploy", "log", "line", "42", "module", "parse", "token", "buffer", "window",
          "context", "model", "query", "chunk", "score", "{", "}", "(", ")", "=", "->", "return", "if", "else")
_TOOLS = ("read_file", "grep", "run_tests", "list_dir", "edit_file")


def _text(rng, low, high):
    return " ".join(rng.choice(_WORDS) for _ in range(rng.randint(low, high)))


def _lines(rng, low, high):
    """Tool output: lines of code-like words."""
    words = rng.randint(low, high)
    out, line = [], []
    for _ in range(words):
        line.append(rng.choice(_WORDS))
        if len(line) >= rng.randint(4, 14):
            out.append(" ".join(line))
            line = []
    out.append(" ".join(line))
    return "\n".join(out)


def transcript(rng, api, rounds, system=True, result_words=(30, 600)):
    """``(messages, ends)``: a generated agent conversation in ``api``'s shape, and its rounds.

    ``ends[r]`` is the length of round r's request (``messages[:ends[r]]``):
    each ends with a person's message or with a tool round's results.  Turns
    before the last end with an assistant answer.  ``api``: chat,
    ollama_chat, messages or responses.  Ids are unique within the list.
    """
    messages, ends, serial = [], [], [0]
    if system and api in ("chat", "ollama_chat"):
        messages.append({"role": "system", "content": _text(rng, 50, 300)})
    elif system and api == "responses":
        messages.append({"role": "developer", "content": _text(rng, 50, 300)})

    def new_id(prefix):
        serial[0] += 1
        return "%s_%04d" % (prefix, serial[0])

    while True:
        human = _text(rng, 5, 120)
        if api == "messages":
            messages.append({"role": "user", "content": human if rng.random() < 0.5 else
                             [{"type": "text", "text": human}]})
        elif api == "responses":
            messages.append({"role": "user", "content": human} if rng.random() < 0.5 else
                            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": human}]})
        else:
            messages.append({"role": "user", "content": human})
        ends.append(len(messages))
        if len(ends) >= rounds:
            return messages, ends
        for _ in range(rng.choice((0, 1, 1, 2, 3, 4, 5))):
            calls = [(new_id("call"), rng.choice(_TOOLS), {"path": "src/%s.py" % rng.choice(_WORDS),
                                                           "query": _text(rng, 1, 8)})
                     for _ in range(rng.choice((1, 1, 1, 2, 3)))]
            results = [_lines(rng, *result_words) for _ in calls]
            _tool_round(rng, api, messages, calls, results, new_id)
            ends.append(len(messages))
            if len(ends) >= rounds:
                return messages, ends
        answer = _text(rng, 10, 250)
        if api == "messages":
            messages.append({"role": "assistant", "content": [{"type": "text", "text": answer}]})
        elif api == "responses":
            if rng.random() < 0.5:
                messages.append({"type": "reasoning", "id": new_id("rs"), "summary": []})
            messages.append({"type": "message", "role": "assistant",
                             "content": [{"type": "output_text", "text": answer}]})
        else:
            messages.append({"role": "assistant", "content": answer})


def _tool_round(rng, api, messages, calls, results, new_id):
    if api == "chat":
        messages.append({"role": "assistant", "content": None, "tool_calls": [
            {"id": cid, "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}
            for cid, name, args in calls]})
        messages.extend({"role": "tool", "tool_call_id": cid, "content": res}
                        for (cid, _, _), res in zip(calls, results))
    elif api == "ollama_chat":
        messages.append({"role": "assistant", "content": "", "tool_calls": [
            {"function": {"name": name, "arguments": args}} for _, name, args in calls]})
        messages.extend({"role": "tool", "tool_name": name, "content": res}
                        for (_, name, _), res in zip(calls, results))
    elif api == "messages":
        blocks = [{"type": "text", "text": _text(rng, 3, 30)}] if rng.random() < 0.6 else []
        blocks += [{"type": "tool_use", "id": cid, "name": name, "input": args} for cid, name, args in calls]
        messages.append({"role": "assistant", "content": blocks})
        messages.append({"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": cid, "content": res} for (cid, _, _), res in zip(calls, results)]})
    else:
        if rng.random() < 0.5:
            messages.append({"type": "reasoning", "id": new_id("rs"), "summary": []})
        messages.extend({"type": "function_call", "call_id": cid, "name": name, "arguments": json.dumps(args)}
                        for cid, name, args in calls)
        messages.extend({"type": "function_call_output", "call_id": cid, "output": res}
                        for (cid, _, _), res in zip(calls, results))


# --------------------------------------------------------------------------
# Checking a window_fit result against its input (independently of window.py's own unit logic)


def _get(m, key):
    return m.get(key) if isinstance(m, dict) else None


def prefix_length(messages):
    n = 0
    while n < len(messages) and _get(messages[n], "role") in ("system", "developer"):
        n += 1
    return n


def _blocks(m, kind):
    content = _get(m, "content")
    return [b for b in content if isinstance(b, dict) and b.get("type") == kind] if isinstance(content, list) else []


def human_turn_start(messages, api):
    """Index of the newest user message with text in it (None when there is none)."""
    for i in range(len(messages) - 1, -1, -1):
        m = messages[i]
        if _get(m, "role") != "user":
            continue
        if api == "messages" and _blocks(m, "tool_result"):
            continue
        content = _get(m, "content")
        if not (isinstance(content, str) and content.strip()) and not any(
                isinstance(b, dict) and isinstance(b.get("text"), str) and b["text"].strip()
                for b in (content if isinstance(content, list) else [])):
            continue        # images only: not a person's message
        if api == "responses" and _get(m, "type") not in (None, "message"):
            continue
        return i
    return None


def _pairing(result, api):
    problems = []
    if api in ("chat", "ollama_chat"):
        i = 0
        while i < len(result):
            m = result[i]
            if _get(m, "role") == "tool":
                problems.append("tool result %d without its call" % i)
            calls = _get(m, "tool_calls") if _get(m, "role") == "assistant" else None
            i += 1
            if not calls:
                continue
            results = []
            while i < len(result) and _get(result[i], "role") == "tool":
                results.append(result[i])
                i += 1
            if api == "chat":
                if sorted(c["id"] for c in calls) != sorted(r.get("tool_call_id") for r in results):
                    problems.append("tool calls before %d do not match their results" % i)
            elif len(calls) != len(results):
                problems.append("%d calls, %d results before %d" % (len(calls), len(results), i))
    elif api == "messages":
        for i, m in enumerate(result):
            uses = sorted(b.get("id") for b in _blocks(m, "tool_use"))
            answered = sorted(b.get("tool_use_id") for b in _blocks(result[i + 1], "tool_result")) \
                if i + 1 < len(result) else []
            if uses and uses != answered:
                problems.append("tool_use in %d without its tool_result" % i)
            got = sorted(b.get("tool_use_id") for b in _blocks(m, "tool_result"))
            if got and (i == 0 or sorted(b.get("id") for b in _blocks(result[i - 1], "tool_use")) != got):
                problems.append("tool_result in %d without its tool_use" % i)
        roles = [_get(m, "role") for m in result]
        if roles and roles[0] != "user":
            problems.append("starts with %r" % (roles[0],))
        if any(a == b for a, b in zip(roles, roles[1:])):
            problems.append("roles do not alternate")
    else:
        seen, answered = set(), set()
        for i, m in enumerate(result):
            kind = _get(m, "type")
            if kind == "function_call":
                seen.add(m.get("call_id"))
            elif kind == "function_call_output":
                if m.get("call_id") not in seen:
                    problems.append("output %d before or without its call" % i)
                answered.add(m.get("call_id"))
        if seen - answered:
            problems.append("%d calls without output" % len(seen - answered))
    return problems


def check_fit(original, result, api, budget=None, tokens=None):
    """Problems with ``result`` as a window_fit of ``original`` (an empty list: valid).

    The prefix is kept, the rest is a contiguous newest suffix of the
    original (the same objects), a cut lands on a user message, the newest
    person's message is kept, every tool call keeps its results (and a
    Responses call its reasoning item), Anthropic roles alternate; with
    ``budget`` and ``tokens`` (the kept list's tokens), those fit.
    """
    problems = []
    p = prefix_length(original)
    start = len(original) - (len(result) - p)
    if len(result) < p or start < p or any(a is not b for a, b in zip(result[:p], original[:p])) or \
            any(a is not b for a, b in zip(result[p:], original[start:])):
        return ["not the prefix plus a newest suffix"]
    if start == len(original) > p:
        return ["nothing after the prefix is kept"]
    if start > p and _get(original[start], "role") != "user":
        problems.append("the cut lands on %r, not a user message" % (_get(original[start], "role"),))
    turn = human_turn_start(original, api)
    if turn is not None and start > turn:
        problems.append("the current turn is cut")
    if api == "responses":
        kept = set(map(id, result))
        for i, m in enumerate(original):
            if _get(m, "type") == "function_call" and id(m) in kept:
                j = i - 1
                while j >= 0 and _get(original[j], "type") == "function_call":
                    j -= 1
                if j >= 0 and _get(original[j], "type") == "reasoning" and id(original[j]) not in kept:
                    problems.append("call %d kept without its reasoning item" % i)
    problems += _pairing(result, api)
    if budget is not None and tokens is not None and tokens > budget:
        problems.append("%d tokens over the budget of %d" % (tokens, budget))
    return problems


# --------------------------------------------------------------------------
# (a) rag_select on SciFact


def _kb_args():
    """The knowledge-base settings eval_retrieval uses by default."""
    return argparse.Namespace(strategy="auto", chunk_size=256, chunk_overlap=32, k1=1.2, b=0.75,
                              lexical_weight=1.0, dense_weight=1.0, compact="", fusion="",
                              embed_model="", embed_batch_size=64)


def _marked_request(query, hits):
    lines = ["<sbproxy-retrieval>", "<sbproxy-query>", query, "</sbproxy-query>"]
    best = max(h.score for h in hits) or 1.0
    for n, h in enumerate(hits):
        body = h.chunk["text"].replace("\r\n", "\n").replace("\r", "\n").rstrip("\n")
        score = max(0.0, min(1.0, h.score / best))
        lines += ['<sbproxy-chunk id="c%02d" score="%.4f" format="text">' % (n, score), body, "</sbproxy-chunk>"]
    lines.append("</sbproxy-retrieval>")
    return [{"role": "system", "content": "Answer from the retrieved context."},
            {"role": "user", "content": "\n".join(lines) + "\n\nIs this claim supported? " + query}]


def _kept_ids(messages):
    text = messages[1]["content"]
    return [line.split('"')[1] for line in text.split("\n") if line.startswith("<sbproxy-chunk ")]


def rag_select_bench(ragproxy, collection, limit_queries=0):
    """Per ranking (all 20, supplied, lexical): mean tokens before/after and the quality of what is kept."""
    from _ragproxy import compress, inject
    corpus_path, queries, qrels = ev.read_beir(collection, "test")
    judged = [q for q in queries if any(g > 0 for g in qrels.get(q, {}).values())]
    if limit_queries:
        judged = judged[:limit_queries]
    data_dir = tempfile.mkdtemp(prefix="ragproxy-compression-")
    try:
        os.makedirs(os.path.join(data_dir, "config"))
        if limit_queries:
            corpus_path = ev.slice_corpus(corpus_path, {d for q in judged for d in qrels[q]}, 500,
                                           os.path.join(data_dir, "corpus.jsonl"))
        config_path = os.path.join(data_dir, "config", "config.yaml")
        ev.write_config(config_path, _kb_args(), None)
        with contextlib.redirect_stdout(sys.stderr):
            status = ragproxy.main(["import", ev.KB_NAME, corpus_path, "--data-dir", data_dir, "--config",
                                    config_path, "--log-level", "WARNING"])
        if status != 0:
            raise SystemExit("compression: ragproxy import failed (exit %s)" % status)
        kbs = ragproxy.KnowledgeBases(ragproxy.Config.load(config_path), data_dir, ragproxy.make_http_pool())
        kb = kbs.get(ev.KB_NAME)
        prefix = "%s/%s" % (ev.KB_NAME, os.path.basename(corpus_path))
        rows = {name: {"tokens_before": 0, "tokens_after": 0, "ndcg@10": 0.0, "recall@5": 0.0, "recall@20": 0.0,
                       "kept": 0, "applied": 0} for name in ("all 20", "supplied", "lexical")}
        estimate = inject.estimate_tokens_text
        for qid in judged:
            hits = kb.search(queries[qid], TOP_CHUNKS, mode="lexical")
            doc_of = {"c%02d" % n: ev.doc_id_of(h.chunk["source"], prefix) for n, h in enumerate(hits)}
            messages = _marked_request(queries[qid], hits)
            judgments = qrels[qid]
            for name in rows:
                if name == "all 20":
                    kept, outcome = messages, None
                else:
                    kept, outcome = compress.rag_select(messages, "chat", estimate, ranking=name,
                                                        max_chunks=MAX_CHUNKS)
                docs = ev.best_rank_per_document([doc_of[c] for c in _kept_ids(kept)])
                row = rows[name]
                tokens = estimate(messages[1]["content"])
                row["tokens_before"] += tokens
                row["tokens_after"] += outcome.tokens_after if outcome and outcome.applied else tokens
                row["applied"] += bool(outcome and outcome.applied)
                row["kept"] += len(_kept_ids(kept))
                row["ndcg@10"] += ev.ndcg_at_k(docs, judgments, 10)
                row["recall@5"] += ev.recall_at_k(docs, judgments, 5)
                row["recall@20"] += ev.recall_at_k(docs, judgments, 20)
        kbs.stop()
    finally:
        shutil.rmtree(data_dir, ignore_errors=True)
    n = max(1, len(judged))
    out = []
    for name, row in rows.items():
        out.append({"part": "rag_select", "ranking": name, "queries": len(judged), "max_chunks": MAX_CHUNKS,
                    "top_chunks": TOP_CHUNKS,
                    "tokens_before": round(row["tokens_before"] / n, 1),
                    "tokens_after": round(row["tokens_after"] / n, 1),
                    "saved_percent": round(100.0 * (1 - row["tokens_after"] / max(1, row["tokens_before"])), 1),
                    "chunks_kept": round(row["kept"] / n, 2), "applied": row["applied"],
                    **{m: round(row[m] / n, 4) for m in ("ndcg@10", "recall@5", "recall@20")}})
    return out


# --------------------------------------------------------------------------
# (b) window_fit on generated transcripts


def _memo(estimate):
    """The estimator with its answers remembered: every round re-counts the same texts."""
    cache = {}

    def cached(text):
        value = cache.get(text)
        if value is None:
            value = cache[text] = estimate(text)
        return value
    return cached


def window_bench(ragproxy, transcripts, seed, budgets, shapes=SHAPES, low_waters=(None, 1.0)):
    from _ragproxy import inject, window
    estimate = _memo(inject.estimate_tokens_text)
    out = []
    for api in shapes:
        convs = []
        for t in range(transcripts):
            rng = random.Random("%s-%d-%d" % (api, seed, t))
            convs.append(transcript(rng, api, rng.randint(20, 200)))
        for budget in budgets:
            for low in low_waters:
                kw = {} if low is None else {"low_water": low}
                reasons, valid, invalid, shares, changes, rounds = {}, 0, 0, [], 0, 0
                for messages, ends in convs:
                    previous = None
                    for end in ends:
                        request = messages[:end]
                        kept, outcome = window.window_fit(request, api, estimate, window=None,
                                                          input_budget_tokens=budget, **kw)
                        reasons[outcome.reason] = reasons.get(outcome.reason, 0) + 1
                        rounds += 1
                        problems = check_fit(request, kept, api, budget, outcome.tokens_after) \
                            if outcome.applied else []
                        valid += not problems
                        invalid += bool(problems)
                        if outcome.applied:
                            shares.append(outcome.tokens_after / budget)
                        if previous is not None and (len(kept) < len(previous) or
                                                     any(a is not b for a, b in zip(previous, kept))):
                            changes += 1
                        previous = kept
                out.append({"part": "window_fit", "api": api, "budget": budget,
                            "low_water": window.LOW_WATER if low is None else low,
                            "transcripts": transcripts, "rounds": rounds, "reasons": reasons,
                            "valid": valid, "invalid": invalid,
                            "kept_share_mean": round(sum(shares) / len(shares), 3) if shares else None,
                            "kept_share_min": round(min(shares), 3) if shares else None,
                            "kept_share_max": round(max(shares), 3) if shares else None,
                            "prefix_changes_per_100_rounds": round(100.0 * changes / max(1, rounds), 1)})
    return out


# --------------------------------------------------------------------------


def print_tables(rows, out=sys.stdout):
    rag = [r for r in rows if r["part"] == "rag_select"]
    if rag:
        print("rag_select on SciFact test: %d queries, top %d BM25 chunks marked, max_chunks %d"
              % (rag[0]["queries"], TOP_CHUNKS, MAX_CHUNKS), file=out)
        _table([("ranking", "tokens before", "after", "saved %", "chunks", "nDCG@10", "R@5", "R@20")] +
               [(r["ranking"], "%.0f" % r["tokens_before"], "%.0f" % r["tokens_after"], "%.1f" % r["saved_percent"],
                 "%.1f" % r["chunks_kept"], "%.4f" % r["ndcg@10"], "%.4f" % r["recall@5"], "%.4f" % r["recall@20"])
                for r in rag], out)
    win = [r for r in rows if r["part"] == "window_fit"]
    if win:
        print("window_fit on generated agent transcripts (%d per shape, 20-200 rounds): every round's request"
              % win[0]["transcripts"], file=out)

        def share(r, k):
            return "-" if r[k] is None else "%.2f" % r[k]
        _table([("api", "budget", "low water", "rounds", "applied", "not needed", "not eligible", "valid/invalid",
                 "kept/budget mean", "min", "max", "prefix changes /100")] +
               [(r["api"], str(r["budget"]), "%.2f" % r["low_water"], str(r["rounds"]),
                 str(r["reasons"].get("applied", 0)), str(r["reasons"].get("not_needed", 0)),
                 str(r["reasons"].get("not_eligible", 0)), "%d/%d" % (r["valid"], r["invalid"]),
                 share(r, "kept_share_mean"), share(r, "kept_share_min"), share(r, "kept_share_max"),
                 "%.1f" % r["prefix_changes_per_100_rounds"]) for r in win], out)


def _table(rows, out):
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths))), file=out)
    print(file=out)


def _parse_args(argv):
    p = argparse.ArgumentParser(description="rag_select on SciFact and window_fit on agent transcripts.")
    p.add_argument("--collection", default=COLLECTION, help="BEIR-layout SciFact (default ../shared/eval/scifact)")
    p.add_argument("--part", choices=("both", "rag", "window"), default="both")
    p.add_argument("--queries", type=int, default=0, help="only the first N judged queries (and a 500-document "
                   "slice of the corpus; default all)")
    p.add_argument("--transcripts", type=int, default=20, help="transcripts per shape (default 20)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--budgets", default="8000,16000,32000", help="input budgets in tokens, comma-separated")
    p.add_argument("--ragproxy", default=RAGPROXY, metavar="PATH", help="ragproxy.py to measure")
    args = p.parse_args(argv)
    try:
        args.budgets = [int(b) for b in args.budgets.split(",") if b.strip()]
    except ValueError:
        p.error("--budgets takes integers")
    if not args.budgets or min(args.budgets) < 1:
        p.error("--budgets takes positive integers")
    return args


def main(argv=None):
    args = _parse_args(sys.argv[1:] if argv is None else argv)
    ragproxy = load_ragproxy(args.ragproxy)
    rows = []
    if args.part in ("both", "rag"):
        rows += rag_select_bench(ragproxy, args.collection, args.queries)
    if args.part in ("both", "window"):
        rows += window_bench(ragproxy, args.transcripts, args.seed, args.budgets)
    print_tables(rows)
    for r in rows:
        print(json.dumps(r, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
