"""Marked retrieval context (_ragproxy.marked): the <sbproxy-retrieval> grammar, in-process.

Golden files in data/marked/ (valid/ and malformed/, with the expected parses
and error positions written by hand in expected.json), the limits, which texts
of a request are eligible in each API, and a seeded fuzz over mutated blocks.
"""
import json
import os
import random

import pytest

from _ragproxy import marked

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "marked")
with open(os.path.join(DATA, "expected.json"), encoding="utf-8") as f:
    EXPECTED = json.load(f)


def read(kind, name):
    with open(os.path.join(DATA, kind, name), encoding="utf-8", newline="") as f:
        return f.read()


def as_plain(segments):
    out = []
    for s in segments:
        if isinstance(s, str):
            out.append(s)
        else:
            out.append({"query": s.query, "newline": s.newline, "final_newline": s.final_newline,
                        "chunks": [{"id": c.id, "score": c.score, "format": c.format, "body": c.body}
                                   for c in s.chunks]})
    return out


def block(n_chunks=2, nl="\n", query="Why did the deployment fail?", scores=None, final=True):
    lines = ["<sbproxy-retrieval>", "<sbproxy-query>", query, "</sbproxy-query>"]
    for k in range(n_chunks):
        score = "" if scores is None else ' score="%s"' % scores[k]
        lines += ['<sbproxy-chunk id="c%d"%s format="text">' % (k, score), "chunk %d text" % k, "</sbproxy-chunk>"]
    lines.append("</sbproxy-retrieval>")
    return nl.join(lines) + (nl if final else "")


def test_golden_files_are_all_listed():
    for kind in ("valid", "malformed"):
        assert sorted(os.listdir(os.path.join(DATA, kind))) == sorted(EXPECTED[kind])


@pytest.mark.parametrize("name", sorted(EXPECTED["valid"]))
def test_valid_golden_file_parses_as_expected_and_renders_to_its_own_bytes(name):
    text = read("valid", name)
    segments = marked.parse(text)
    assert as_plain(segments) == EXPECTED["valid"][name]
    assert marked.render(segments) == text
    # Strings and blocks alternate, starting and ending with a string.
    assert [isinstance(s, str) for s in segments] == [k % 2 == 0 for k in range(len(segments))]


@pytest.mark.parametrize("name", sorted(EXPECTED["malformed"]))
def test_malformed_golden_file_names_line_column_and_what(name):
    text = read("malformed", name)
    with pytest.raises(marked.MalformedMarkedContext) as caught:
        marked.parse(text)
    line, column, what = EXPECTED["malformed"][name]
    assert (caught.value.line, caught.value.column, caught.value.what) == (line, column, what)
    assert str(caught.value) == "line %d, column %d: %s" % (line, column, what)
    assert "log s" not in str(caught.value) and "xml" not in str(caught.value)  # never quotes the request


def test_score_syntax():
    for good in ("0", "1", "0.5", "1.0", "0.000", "5e-1", "0E0"):
        assert marked.parse(block(1, scores=[good]))[1].chunks[0].score == float(good)
    for bad in ("", "1.5", "-0.1", "inf", "NaN", ".5", "0.", "+0.5", "0x1", " 0.5", "2e-1x", "1e400"):
        with pytest.raises(marked.MalformedMarkedContext, match="score"):
            marked.parse(block(1, scores=[bad]))


def test_ids_are_1_to_64_of_the_allowed_characters():
    text = block(1)
    assert marked.parse(text.replace('id="c0"', 'id="%s"' % ("A" * 64)))[1].chunks[0].id == "A" * 64
    for bad in ("", "a" * 65, "a b", "a/b", "é", "a:b"):
        with pytest.raises(marked.MalformedMarkedContext, match="chunk id"):
            marked.parse(text.replace('id="c0"', 'id="%s"' % bad))


def test_a_block_may_end_the_text_and_text_around_it_is_kept():
    text = "x\r\n" + block(1, final=False)
    segments = marked.parse(text)
    assert segments[0] == "x\r\n" and segments[-1] == "" and not segments[1].final_newline
    assert marked.render(segments) == text
    crlf = block(2, nl="\r\n")
    assert marked.parse(crlf)[1].newline == "\r\n" and marked.render(marked.parse(crlf)) == crlf


def test_an_edited_block_renders_in_its_own_line_endings_and_parses_again():
    segments = marked.parse("a\n" + block(3, nl="\r\n") + "b")
    edited = [s if isinstance(s, str) else s.with_chunks(reversed(s.chunks)) for s in segments]
    again = marked.parse(marked.render(edited))
    assert [c.id for c in again[1].chunks] == ["c2", "c1", "c0"] and again[0] == "a\n" and again[2] == "b"


def test_limits_blocks_and_chunks():
    assert len(marked.parse(block(1) * marked.MAX_BLOCKS)) == 2 * marked.MAX_BLOCKS + 1
    with pytest.raises(marked.MarkedContextTooLarge) as caught:
        marked.parse(block(1) * (marked.MAX_BLOCKS + 1))
    assert caught.value.line == marked.MAX_BLOCKS * 8 + 1  # a one-chunk block is 8 lines
    assert len(marked.parse(block(marked.MAX_CHUNKS_PER_BLOCK))[1].chunks) == marked.MAX_CHUNKS_PER_BLOCK
    with pytest.raises(marked.MarkedContextTooLarge, match="one block"):
        marked.parse(block(marked.MAX_CHUNKS_PER_BLOCK + 1))
    with pytest.raises(marked.MarkedContextTooLarge, match="in the request"):
        marked.parse(block(3), max_chunks=2)


def test_request_limits_count_across_messages():
    full = [{"role": "user", "content": block(marked.MAX_CHUNKS_PER_BLOCK)} for _ in range(4)]
    assert marked.parse_request(full, "chat").status == "ok"                 # exactly 4,096 chunks
    over = full + [{"role": "tool", "content": block(1)}]
    found = marked.parse_request(over, "chat")
    assert found.status == "too_large" and found.where == (4, "content") and "4096" in found.describe()
    blocks = [{"role": "user", "content": block(0) * 16}, {"role": "user", "content": block(0) * 17}]
    assert marked.parse_request(blocks, "chat").status == "too_large"
    assert marked.parse_request(blocks[:1] * 2, "chat").status == "ok"


def test_eligible_texts_per_api():
    b = block(1)
    chat = [{"role": "system", "content": b}, {"role": "developer", "content": b},
            {"role": "user", "content": b}, {"role": "assistant", "content": b},
            {"role": "tool", "content": b, "tool_call_id": "t"},
            {"role": "user", "content": [{"type": "text", "text": b}]}, "junk", {"role": "user", "content": 3}]
    assert [p for p, _ in marked.eligible_texts(chat, "chat")] == [(2, "content"), (4, "content")]
    assert [p for p, _ in marked.eligible_texts(chat, "ollama_chat")] == [(2, "content"), (4, "content")]
    anthropic = [{"role": "user", "content": b}, {"role": "assistant", "content": b},
                 {"role": "user", "content": [{"type": "text", "text": b},
                                              {"type": "tool_result", "tool_use_id": "t", "content": b},
                                              {"type": "tool_result", "content": [{"type": "text", "text": b}]}]}]
    assert [p for p, _ in marked.eligible_texts(anthropic, "messages")] == [(0, "content"), (2, "content", 1, "content")]
    responses = [{"role": "developer", "content": b}, {"role": "user", "content": b},
                 {"type": "message", "role": "user", "content": b}, {"type": "function_call", "arguments": b},
                 {"type": "function_call_output", "call_id": "c", "output": b},
                 {"type": "reasoning", "role": "user", "content": b}]
    assert [p for p, _ in marked.eligible_texts(responses, "responses")] == [(1, "content"), (2, "content"),
                                                                               (4, "output")]
    assert marked.eligible_texts(b, "responses") == [((), b)]
    assert marked.eligible_texts(b, "chat") == [] and marked.eligible_texts(None, "chat") == []
    with pytest.raises(ValueError):
        marked.eligible_texts([], "completions")


def test_parse_request_statuses_and_where():
    plain = [{"role": "user", "content": "no blocks"}]
    assert marked.parse_request(plain, "chat").status == "none"
    ignored = [{"role": "system", "content": "</sbproxy-chunk>\n"}, {"role": "assistant", "content": block(1)}]
    assert marked.parse_request(ignored, "chat").status == "none"
    good = [{"role": "user", "content": "hi"}, {"role": "user", "content": block(2)}]
    found = marked.parse_request(good, "chat")
    assert found.status == "ok" and [p for p, _ in found.texts] == [(1, "content")]
    bad = good + [{"role": "user", "content": "x\n" + block(1).replace("<sbproxy-query>", "<sbproxy-QUERY>")}]
    found = marked.parse_request(bad, "chat")
    assert found.status == "malformed" and found.where == (2, "content") and found.error.line == 3
    assert found.describe() == "malformed at 2/content, line 3, column 1: tags are lower-case"


def test_replaced_copies_only_the_containers_on_the_path():
    messages = [{"role": "user", "content": "a"},
                {"role": "user", "content": [{"type": "text", "text": "t"}, {"type": "tool_result", "content": "b"}]}]
    out = marked.replaced(messages, (1, "content", 1, "content"), "B")
    assert out[1]["content"][1]["content"] == "B" and messages[1]["content"][1]["content"] == "b"
    assert out[0] is messages[0] and out[1]["content"][0] is messages[1]["content"][0]
    assert marked.replaced("old", (), "new") == "new"


_NOISE = ["<", ">", "/", '"', "=", " ", "\r", "\n", "\r\n", "a", "A", "-", "1", ".", "<sbproxy-chunk", "\t"]


def mutate(text, rng):
    lines = text.split("\n")
    kind = rng.randrange(7)
    if kind == 0 and text:                                  # delete a character
        k = rng.randrange(len(text))
        return text[:k] + text[k + 1:]
    if kind == 1:                                           # insert some noise
        k = rng.randrange(len(text) + 1)
        return text[:k] + rng.choice(_NOISE) + text[k:]
    if kind == 2:                                           # duplicate a line
        k = rng.randrange(len(lines))
        return "\n".join(lines[:k + 1] + lines[k:])
    if kind == 3 and len(lines) > 1:                        # swap two lines
        a, b = rng.randrange(len(lines)), rng.randrange(len(lines))
        lines[a], lines[b] = lines[b], lines[a]
        return "\n".join(lines)
    if kind == 4:                                           # drop a line
        del lines[rng.randrange(len(lines))]
        return "\n".join(lines)
    if kind == 5 and text:                                  # change the case of a stretch
        k = rng.randrange(len(text))
        return text[:k] + text[k:k + 12].swapcase() + text[k + 12:]
    k = rng.randrange(len(text) + 1)                        # cut the text short
    return text[:k]


def seeds():
    return [block(3), block(2, nl="\r\n", scores=["0.5", "1"]), "pre\n" + block(1) + "mid\n" + block(0, final=False),
            block(2).replace("chunk 1 text", "line\n\nline")]


def test_fuzz_the_parser_raises_only_its_own_errors_and_what_it_accepts_renders_back():
    rng = random.Random(18)
    accepted = rejected = 0
    for _ in range(4000):
        text = rng.choice(seeds())
        for _ in range(rng.randrange(1, 4)):
            text = mutate(text, rng)
        try:
            segments = marked.parse(text)
        except marked.MarkedContextError as exc:
            assert exc.line >= 1 and exc.column >= 1 and exc.line <= text.count("\n") + 1
            rejected += 1
            continue
        accepted += 1
        assert marked.render(segments) == text
        for s in segments:
            if not isinstance(s, str):
                assert s.query.strip() and len({c.id for c in s.chunks}) == len(s.chunks)
                assert all(c.format in marked.FORMATS for c in s.chunks)
    assert accepted > 300 and rejected > 300   # the mutations reach both sides
