"""Compression levers (_ragproxy.compress): rag_select, compact_serialization, position_reorder, in-process.

Every lever reason, the commit rule (strict drop; non-expanding for the
reorder), no partial rewrite, the table format's exact decoder (property
test over seeded random tables) and a seeded fuzz over mutated requests.
Token estimates are plain functions of the text (characters unless a test
needs another), so expected counts are worked out from the strings.
"""
import json
import math
import random

import pytest

from _ragproxy import compress, marked


def chars(text):
    return len(text)


def block(chunks, query="alpha beta", nl="\n"):
    """A block from ``[(id, score or None, format, text)]``."""
    lines = ["<sbproxy-retrieval>", "<sbproxy-query>", query, "</sbproxy-query>"]
    for cid, score, fmt, text in chunks:
        score = "" if score is None else ' score="%s"' % score
        lines += ['<sbproxy-chunk id="%s"%s format="%s">' % (cid, score, fmt)] + ([text] if text is not None else [])
        lines.append("</sbproxy-chunk>")
    return nl.join(lines + ["</sbproxy-retrieval>"]) + nl


def request(*texts, role="user"):
    return [{"role": "system", "content": "be brief"}] + [{"role": role, "content": t} for t in texts]


def ids(messages, index=1):
    segments = marked.parse(messages[index]["content"])
    return [[c.id for c in s.chunks] for s in segments if isinstance(s, marked.Block)]


SCORED = [("a", "0.9", "text", "first"), ("b", "0.2", "text", "second"), ("c", "0.6", "text", "third"),
          ("d", "0.4", "text", "fourth")]


# -- the skips every retrieval lever shares --------------------------------

LEVERS = [compress.rag_select, compress.compact_serialization, compress.position_reorder]


@pytest.mark.parametrize("lever", LEVERS)
def test_no_marked_context_skips_and_keeps_the_list(lever):
    messages = request("plain text") + [{"role": "assistant", "content": block(SCORED)}]
    out, outcome = lever(messages, "chat", chars)
    assert out is messages
    assert (outcome.applied, outcome.reason, outcome.lever) == (False, "no_marked_context", lever.__name__)


@pytest.mark.parametrize("lever", LEVERS)
def test_a_malformed_block_anywhere_skips_the_whole_list(lever):
    good = block(SCORED + [("j", "0.1", "json", '{ "x" : 1 }')])
    bad = block(SCORED).replace(' id="b"', ' id="a"')                # a duplicate id, in a later message
    messages = request(good, "between", bad)
    out, outcome = lever(messages, "chat", chars, max_chunks=1) if lever is compress.rag_select \
        else lever(messages, "chat", chars)
    assert out is messages and outcome.reason == "malformed_marked_context" and not outcome.applied
    assert outcome.detail.startswith("malformed at 3/content, line 8, column 20: duplicate chunk id")


@pytest.mark.parametrize("lever", LEVERS)
def test_too_large_marked_context_skips(lever):
    messages = request(block(SCORED[:1]) * 20, block(SCORED[:1]) * 13)
    out, outcome = lever(messages, "chat", chars)
    assert out is messages and outcome.reason == "marked_context_too_large"


# -- rag_select ------------------------------------------------------------

def test_rag_select_keeps_the_top_supplied_scores_in_their_original_order():
    text = "Before the block.\n" + block(SCORED) + "After it."
    messages = request(text)
    out, outcome = compress.rag_select(messages, "chat", chars, max_chunks=2, ranking="supplied")
    assert outcome.applied and outcome.reason == "applied"
    assert ids(out) == [["a", "c"]]
    assert out[1]["content"] == "Before the block.\n" + block([SCORED[0], SCORED[2]]) + "After it."
    assert marked.parse(out[1]["content"])[1].query == "alpha beta"          # the query stays
    assert out[0] is messages[0] and messages[1]["content"] == text          # input untouched
    assert (outcome.tokens_before, outcome.tokens_after) == (len(text), len(out[1]["content"]))


def test_lexical_scores_are_tfidf_cosines():
    scores = compress.lexical_scores("alpha beta", ["alpha", "beta beta gamma", "delta", ""])
    # N = 4, every term in one chunk: one idf for all, so it cancels in the cosine.
    assert scores[0] == pytest.approx(1 / math.sqrt(2))
    assert scores[1] == pytest.approx((1 / math.sqrt(2)) * (2 / math.sqrt(5)))
    assert scores[2:] == [0.0, 0.0]
    # A term in more chunks weighs less: alpha (df 2) counts for less than beta (df 1).
    two = compress.lexical_scores("alpha beta", ["alpha x", "beta y", "alpha z"])
    assert two[1] > two[0] == two[2]


def test_rag_select_lexical_ranks_by_the_query_and_breaks_ties_by_order():
    chunks = [("p", None, "text", "delta"), ("q", None, "text", "alpha"), ("r", None, "text", "alpha"),
              ("s", None, "text", "beta beta gamma")]
    # idf: alpha (in 2 of 4 chunks) ln(5/3) + 1, beta and gamma ln(5/2) + 1.  Cosines: q = r = 0.619,
    # s = 0.785 * 2 / sqrt(5) = 0.702 (beta twice outweighs the extra gamma), p = 0.
    out, outcome = compress.rag_select(request(block(chunks)), "chat", chars, max_chunks=2, ranking="lexical")
    assert outcome.applied and ids(out) == [["q", "s"]]       # s and then q (the earlier of the tie)
    out, _ = compress.rag_select(request(block(chunks[:3])), "chat", chars, max_chunks=1, ranking="lexical")
    assert ids(out) == [["q"]]                                # q and r tie: the earlier chunk wins
    # Lexical ranking ignores supplied scores.
    scored = [("p", "1", "text", "delta"), ("q", "0", "text", "alpha")]
    out, _ = compress.rag_select(request(block(scored)), "chat", chars, max_chunks=1, ranking="lexical")
    assert ids(out) == [["q"]]


def test_rag_select_auto_uses_scores_only_where_every_chunk_has_one():
    scored = [("p", "1", "text", "delta"), ("q", "0", "text", "alpha")]
    unscored = [("p", "1", "text", "delta"), ("q", None, "text", "alpha")]
    messages = request(block(scored), block(unscored))
    out, _ = compress.rag_select(messages, "chat", chars, max_chunks=1)
    assert ids(out, 1) == [["p"]] and ids(out, 2) == [["q"]]
    out, outcome = compress.rag_select(messages, "chat", chars, max_chunks=1, ranking="supplied")
    assert out is messages and outcome.reason == "missing_relevance_score"


def test_rag_select_min_relevance_and_drop_empty():
    chunks = SCORED + [("e", "0.95", "text", None), ("f", "0.9", "text", "  ")]
    out, _ = compress.rag_select(request(block(chunks)), "chat", chars, min_relevance_percent=50)
    assert ids(out) == [["a", "c", "e", "f"]]                 # 0.9, 0.6, 0.95, 0.9 >= 0.5
    out, _ = compress.rag_select(request(block(chunks)), "chat", chars, drop_empty=True)
    assert ids(out) == [["a", "b", "c", "d"]]                 # "" and blank bodies go
    out, _ = compress.rag_select(request(block(chunks)), "chat", chars, drop_empty=True, max_chunks=1)
    assert ids(out) == [["a"]]                                # e ranks first but is empty


def test_rag_select_no_selected_chunks_leaves_such_a_block_whole():
    messages = request(block(SCORED))
    out, outcome = compress.rag_select(messages, "chat", chars, min_relevance_percent=99)
    assert out is messages and outcome.reason == "no_selected_chunks"
    # Another block can still be trimmed; the empty-selected one stays as it was.
    low = [("x", "0.1", "text", "x"), ("y", "0.2", "text", "y")]
    messages = request(block(SCORED) + block(low))
    out, outcome = compress.rag_select(messages, "chat", chars, min_relevance_percent=50)
    assert outcome.applied and ids(out) == [["a", "c"], ["x", "y"]]


def test_rag_select_not_needed_and_no_savings():
    text = block(SCORED)
    out, outcome = compress.rag_select(request(text), "chat", chars, min_tokens=len(text) + 1, max_chunks=1)
    assert outcome.reason == "not_needed" and outcome.tokens_before == len(text)
    out, outcome = compress.rag_select(request(text), "chat", chars, max_chunks=4)
    assert outcome.reason == "no_savings"                     # nothing to drop
    messages = request(text)
    out, outcome = compress.rag_select(messages, "chat", lambda t: 7, max_chunks=1)
    assert out is messages and outcome.reason == "no_savings" and outcome.tokens_after == 7  # no strict drop


def test_rag_select_in_each_api_shape():
    b = block(SCORED)
    anthropic = [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": b}]}]
    out, outcome = compress.rag_select(anthropic, "messages", chars, max_chunks=1)
    assert outcome.applied and marked.parse(out[0]["content"][0]["content"])[1].chunks[0].id == "a"
    assert anthropic[0]["content"][0]["content"] == b
    out, outcome = compress.rag_select(b, "responses", chars, max_chunks=1)   # a bare string input
    assert outcome.applied and out == block(SCORED[:1])
    items = [{"type": "function_call_output", "call_id": "c", "output": b}]
    out, _ = compress.rag_select(items, "responses", chars, max_chunks=1)
    assert out[0]["output"] == block(SCORED[:1])
    out, _ = compress.rag_select(request(b, role="tool"), "ollama_chat", chars, max_chunks=1)
    assert ids(out) == [["a"]]


def test_arguments_are_checked():
    messages = request(block(SCORED))
    for kwargs in ({"ranking": "dense"}, {"max_chunks": 0}, {"max_chunks": True}, {"min_relevance_percent": 101},
                   {"min_relevance_percent": -1}, {"min_tokens": -1}, {"max_chunks": "5"}):
        with pytest.raises(ValueError):
            compress.rag_select(messages, "chat", chars, **kwargs)
    with pytest.raises(ValueError):
        compress.position_reorder(messages, "chat", chars, ranking="dense")
    with pytest.raises(ValueError):
        compress.compact_serialization(messages, "chat", chars, tabular_min_rows=0)


# -- position_reorder ------------------------------------------------------

def test_edge_order():
    assert compress.edge_order([1, 2, 3, 4, 5, 6]) == [1, 3, 5, 6, 4, 2]
    assert compress.edge_order([1, 2, 3, 4, 5]) == [1, 3, 5, 4, 2]
    assert compress.edge_order([]) == [] and compress.edge_order([1]) == [1]


def test_position_reorder_puts_the_best_at_the_edges_and_keeps_every_chunk_byte_for_byte():
    text = "x\n" + block(SCORED, nl="\r\n") + "y"
    messages = request(text)
    out, outcome = compress.position_reorder(messages, "chat", chars)
    # Ranks: a .9, c .6, d .4, b .2 -> a, d, b, c.
    assert outcome.applied and ids(out) == [["a", "d", "b", "c"]]
    assert outcome.tokens_before == outcome.tokens_after == len(text)
    before = {c.id: (c.tag(), c.body) for c in marked.parse(text)[1].chunks}
    after = {c.id: (c.tag(), c.body) for c in marked.parse(out[1]["content"])[1].chunks}
    assert before == after
    assert compress.position_reorder(messages, "chat", chars)[0] == out      # deterministic


def test_position_reorder_already_ordered_missing_score_and_no_savings():
    ordered = [("a", "0.9", "text", "1"), ("b", "0.5", "text", "2"), ("c", "0.7", "text", "3")]
    messages = request(block(ordered), block(ordered[:1]))
    out, outcome = compress.position_reorder(messages, "chat", chars)
    assert out is messages and outcome.reason == "already_ordered"
    partial = [("a", "0.9", "text", "1"), ("b", None, "text", "2")]
    out, outcome = compress.position_reorder(request(block(partial)), "chat", chars, ranking="supplied")
    assert outcome.reason == "missing_relevance_score"
    original = block(SCORED)
    messages = request(original)
    out, outcome = compress.position_reorder(messages, "chat", lambda t: 10 if t == original else 11)
    assert out is messages and outcome.reason == "no_savings"           # it would expand the estimate
    out, outcome = compress.position_reorder(messages, "chat", lambda t: 10)
    assert outcome.applied                                              # equal is allowed


def test_position_reorder_lexical():
    chunks = [("p", None, "text", "delta"), ("q", None, "text", "alpha"), ("s", None, "text", "beta beta gamma")]
    out, outcome = compress.position_reorder(request(block(chunks)), "chat", chars)
    assert outcome.applied and ids(out) == [["q", "p", "s"]]            # ranks q, s, p -> q, p, s


# -- compact_serialization -------------------------------------------------

def test_compact_serialization_writes_canonical_json_keeping_numbers_as_written():
    body = '{ "b": 1, "a": [1.50, "x\\u00e9", 1e400, -0, true, null],\n  "c": {"z": {}, "y": []} }'
    messages = request(block([("j", "0.5", "json", body), ("t", None, "text", '{ "kept": 1 }')]))
    out, outcome = compress.compact_serialization(messages, "chat", chars)
    assert outcome.applied and outcome.tokens_after < outcome.tokens_before
    chunks = marked.parse(out[1]["content"])[1].chunks
    assert chunks[0].text == '{"a":[1.50,"x\u00e9",1e400,-0,true,null],"b":1,"c":{"y":[],"z":{}}}'
    assert chunks[0].format == "json" and chunks[0].score_text == "0.5"
    assert chunks[1].text == '{ "kept": 1 }'                            # text chunks are not touched
    assert json.loads(chunks[0].text.replace("1e400", "1")) == json.loads(body.replace("1e400", "1"))


def test_compact_serialization_keeps_lone_surrogates_escaped():
    out, outcome = compress.compact_serialization(request(block([("j", None, "json", '[ "\\ud800" ]')])), "chat", chars)
    assert outcome.applied and marked.parse(out[1]["content"])[1].chunks[0].text == '["\\ud800"]'


def test_duplicate_member_names_at_any_depth_stay_byte_for_byte():
    dup = '{"a": [ {"k": 1, "k": 2} ]}'
    messages = request(block([("d", None, "json", dup), ("j", None, "json", '{ "a" : 1 }')]))
    out, outcome = compress.compact_serialization(messages, "chat", chars)
    chunks = marked.parse(out[1]["content"])[1].chunks
    assert outcome.applied and chunks[0].text == dup and chunks[1].text == '{"a":1}'
    for unsafe in (dup, "not json", "[NaN]", '{"a": Infinity}', "", "[" * 100000 + "]" * 100000):
        only = request(block([("d", None, "json", unsafe)]))
        out, outcome = compress.compact_serialization(only, "chat", chars)
        assert out is only and outcome.reason == "unsafe_structured_shape"


def test_compact_serialization_reasons():
    canonical = request(block([("j", None, "json", '{"a":1}')]))
    out, outcome = compress.compact_serialization(canonical, "chat", chars)
    assert out is canonical and outcome.reason == "no_savings"
    text_only = request(block(SCORED))
    assert compress.compact_serialization(text_only, "chat", chars)[1].reason == "no_structured_chunks"
    loose = block([("j", None, "json", '{ "a" : 1 }')])
    out, outcome = compress.compact_serialization(request(loose), "chat", chars, min_tokens=len(loose) + 1)
    assert outcome.reason == "not_needed"
    out, outcome = compress.compact_serialization(request(loose), "chat", lambda t: 3)
    assert outcome.reason == "no_savings"                               # the estimate does not drop


ROWS = '[{"name": "a", "n": 1}, {"n": 2.5, "name": "b\\tc"}, {"name": null, "n": true}]'


def test_a_uniform_array_becomes_a_table_when_that_is_cheaper():
    messages = request(block([("t", "1", "json", ROWS)], nl="\r\n"))
    out, outcome = compress.compact_serialization(messages, "chat", chars)
    chunk = marked.parse(out[1]["content"])[1].chunks[0]
    assert outcome.applied and chunk.format == "sbproxy_table_v1"
    assert chunk.body == '["n","name"]\r\n1\t"a"\r\n2.5\t"b\\tc"\r\ntrue\tnull\r\n'
    assert compress.decode_table(chunk.body) == json.loads(ROWS)
    # Off, or too few rows: canonical JSON instead.
    for kwargs in ({"tabular": False}, {"tabular_min_rows": 4}):
        out, _ = compress.compact_serialization(messages, "chat", chars, **kwargs)
        chunk = marked.parse(out[1]["content"])[1].chunks[0]
        assert chunk.format == "json" and json.loads(chunk.text) == json.loads(ROWS)
    # A table costing no fewer tokens than the JSON is not used.
    out, _ = compress.compact_serialization(messages, "chat", lambda t: 0 if t.startswith("[{") else len(t))
    assert marked.parse(out[1]["content"])[1].chunks[0].format == "json"


def test_only_same_key_scalar_objects_make_a_table():
    assert compress.table_columns(json.loads(ROWS)) == ["n", "name"]
    for value in ([{"a": 1}, {"b": 1}], [{"a": 1}, {"a": [1]}], [{"a": 1}, 2], [{}, {}], {"a": 1}, [{"a": {}}] * 2):
        assert compress.table_columns(value) is None
    assert compress.table_columns([{"a": 1}]) is None and compress.table_columns([{"a": 1}], 1) == ["a"]


def test_decode_table_rejects_what_is_not_a_table():
    for bad in ("", '["b","a"]', '["a","a"]', '[]', '["a"]\n1\t2', '["a"]\n[1]', '{"a":1}', '["a"]\nnot json'):
        with pytest.raises(ValueError):
            compress.decode_table(bad)


def _scalar(rng):
    kind = rng.randrange(6)
    if kind == 0:
        return rng.choice([None, True, False])
    if kind == 1:
        return rng.randrange(-10 ** 20, 10 ** 20)
    if kind == 2:
        return rng.choice([0.0, -0.0, 1e-300, 2.5e300, rng.random() * 10 ** rng.randrange(-5, 15)])
    alphabet = "ab\t\n\r\"\\ \u00e9\u4e2d\U0001f600\x00\x1f/"
    return "".join(rng.choice(alphabet) for _ in range(rng.randrange(0, 8)))


def strict(value):
    """Equality that tells True from 1 and 1.0 from 1."""
    return json.dumps(value, sort_keys=True) if not isinstance(value, list) else \
        [json.dumps(r, sort_keys=True) for r in value]


def test_property_decode_encode_table_is_exact():
    rng = random.Random(1818)
    for _ in range(500):
        columns = sorted({"".join(rng.choice("abc\t\"é") for _ in range(rng.randrange(0, 4)))
                          for _ in range(rng.randrange(1, 5))})
        rows = [{c: _scalar(rng) for c in rng.sample(columns, len(columns))} for _ in range(rng.randrange(1, 6))]
        encoded = compress.encode_table(rows)
        assert "\n" not in encoded.split("\n", 1)[0]
        assert strict(compress.decode_table(encoded)) == strict(rows)
        # And as the lever writes it into a chunk, from the JSON a client would send.
        text = json.dumps(rows, indent=1)
        value = compress.load_json(text)
        assert strict(compress.decode_table(compress.encode_table(value))) == strict(json.loads(text))
        assert strict(json.loads(compress.canonical_json(value))) == strict(json.loads(text))


# -- no partial rewrite, under fuzz ----------------------------------------

def _mutate(text, rng):
    k = rng.randrange(len(text) + 1)
    choice = rng.randrange(4)
    if choice == 0:
        return text[:k] + text[k + 1:]
    if choice == 1:
        return text[:k] + rng.choice(['"', "<", "\n", "\r\n", "<sbproxy-query>\n", " ", "x"]) + text[k:]
    if choice == 2:
        lines = text.split("\n")
        a = rng.randrange(len(lines))
        return "\n".join(lines[:a] + lines[a + 1:])
    return text


def test_fuzz_levers_either_keep_the_list_or_rewrite_it_whole():
    rng = random.Random(4096)
    base = [block(SCORED), block([("j", None, "json", ROWS), ("k", "0.3", "json", '{ "a": [1, 2] }'),
                                  ("t", "0.7", "text", "alpha beta gamma")])]
    rewrites = 0
    for _ in range(600):
        texts = [rng.choice(base) for _ in range(rng.randrange(1, 3))]
        texts = [_mutate(t, rng) for t in texts]
        messages = request(*texts)
        found = marked.parse_request(messages, "chat")
        for lever, kwargs in ((compress.rag_select, {"max_chunks": 2}), (compress.compact_serialization, {}),
                              (compress.position_reorder, {})):
            out, outcome = lever(messages, "chat", chars, **kwargs)
            assert outcome.reason in compress.REASONS
            if out is messages:
                assert not outcome.applied
                continue
            rewrites += 1
            assert found.status == "ok" and outcome.applied
            again = marked.parse_request(out, "chat")
            assert again.status == "ok"
            for (path, old), (_, new) in zip(found.texts, again.texts):     # text outside blocks kept exactly
                assert [s for s in old if isinstance(s, str)] == [s for s in new if isinstance(s, str)]
            assert [m for k, m in enumerate(out) if k not in {p[0] for p, _ in found.texts}] == \
                [m for k, m in enumerate(messages) if k not in {p[0] for p, _ in found.texts}]
    assert rewrites > 100
