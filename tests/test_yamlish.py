"""YAML subset parser: golden files, positions, errors, and agreement with PyYAML.

Every test that needs PyYAML imports it itself (and skips without it), so the
in-house parser is checked against it even when RAGPROXY_PURE=1 switches
ragproxy itself to the fallback.
"""
import collections
import datetime
import glob
import json
import math
import os
import random
import sys

import pytest

import ragproxy
from _ragproxy import deps, yamlish

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "yaml")
GOLDEN = sorted(glob.glob(os.path.join(DATA, "*.yaml")))


def read(path):
    with open(path, encoding="utf-8", newline="") as f:
        return f.read()


def expected(path):
    with open(path[:-len(".yaml")] + ".json", encoding="utf-8") as f:
        return json.load(f)


@pytest.fixture
def pyyaml():
    return pytest.importorskip("yaml")


@pytest.fixture(params=["in-house", "pyyaml"])
def load(request, monkeypatch):
    """ragproxy.load_yaml with each backend, whatever RAGPROXY_PURE says."""
    if request.param == "pyyaml":
        monkeypatch.setattr(deps, "yaml", pytest.importorskip("yaml"))
    else:
        monkeypatch.setattr(deps, "yaml", None)
    return ragproxy.load_yaml


def test_there_are_enough_golden_files():
    assert len(GOLDEN) >= 12


@pytest.mark.parametrize("path", GOLDEN, ids=os.path.basename)
def test_golden_in_house(path):
    data, _ = ragproxy.parse_yaml(read(path))
    assert data == expected(path)


@pytest.mark.parametrize("path", GOLDEN, ids=os.path.basename)
def test_golden_pyyaml_agrees(path, pyyaml):
    assert pyyaml.safe_load(read(path)) == expected(path)


@pytest.mark.parametrize("path", GOLDEN, ids=os.path.basename)
def test_golden_load_yaml_both_backends(path, load):
    data, positions = load(read(path))
    assert data == expected(path)
    assert positions == ragproxy.parse_yaml(read(path))[1]


def test_full_config_positions():
    _, positions = ragproxy.parse_yaml(read(os.path.join(DATA, "full_config.yaml")))
    assert positions[()] == (4, 1)                     # the first key, after "---"
    assert positions[("server",)] == (4, 1)
    assert positions[("server", "allow_origins", 1)] == (8, 44)
    assert positions[("models", 0)] == (28, 5)         # a mapping item starts at its first key
    assert positions[("models", 0, "name")] == (28, 5)
    assert positions[("models", 1, "knowledge_bases", 0)] == (35, 9)
    assert positions[("models", 2, "top_k")] == (40, 5)
    assert positions[("knowledge_bases", 0, "paths", 1)] == (46, 5)
    assert positions[("retrieval", "query_template")] == (57, 3)
    assert positions[("tags", "on_call")] == (73, 45)


def test_positions_of_items(load):
    text = "a:\n- x\n-\n- - y\n-\n  k: v\nb: [1, {c: 2}, [3]]\n"
    data, positions = load(text)
    assert data == {"a": ["x", None, ["y"], {"k": "v"}], "b": [1, {"c": 2}, [3]]}
    assert positions[("a", 0)] == (2, 3)
    assert positions[("a", 1)] == (3, 2)          # an empty entry: just after its dash
    assert positions[("a", 2)] == (4, 3)          # a nested sequence: its first dash
    assert positions[("a", 2, 0)] == (4, 5)
    assert positions[("a", 3)] == (6, 3)          # content on the next line
    assert positions[("b", 1)] == (7, 8)
    assert positions[("b", 1, "c")] == (7, 9)
    assert positions[("b", 2, 0)] == (7, 17)


def test_empty_documents(load):
    for text in ("", "# only a comment\n", "---\n", "---\n...\n", "\n\n"):
        assert load(text) == (None, {})


def test_crlf_and_bom(load):
    data, positions = load("\ufeffa: 1\r\nb: |\r\n  x\r\n  y\r\n")
    assert data == {"a": 1, "b": "x\ny\n"}
    assert positions[("b",)] == (2, 1)


def test_error_str_and_attributes():
    with pytest.raises(ragproxy.YAMLError) as info:
        ragproxy.parse_yaml("a: 1\nserver:\n  port: 1\n  host\n")
    err = info.value
    assert (err.line, err.col, err.msg) == (4, 7, "expected ':' after mapping key")
    assert str(err) == "line 4, column 7: expected ':' after mapping key"
    assert isinstance(err, ValueError)


# text, in-house (line, col), a fragment of the in-house message, PyYAML (line, col)
MALFORMED = [
    ("a:\n  b: 1\n c: 2\n", (3, 2), "bad indentation", (3, 2)),
    ("a:\n    b: 1\n  c: 2\n", (3, 3), "bad indentation", (3, 3)),
    ("a: 1\n  b: 2\n", (2, 4), "mapping values are not allowed", (2, 4)),
    ("a:\n  - x\n  b: 1\n", (3, 3), "sequence entry", (3, 3)),
    ("- a\nb: 1\n", (2, 1), "sequence entry", (2, 1)),
    ("a: |\n  x\n y\n", (3, 2), "bad indentation", (3, 2)),
    ('a: "abc\nb: 1\n', (1, 4), "unclosed quoted string", (3, 1)),
    ("a: 'abc\n", (1, 4), "unclosed quoted string", (2, 1)),
    ("a: [1, 2\n", (1, 4), "unclosed '['", (2, 1)),
    ("x: {a: 1, b: 2\ny: 3\n", (2, 2), "expected ',' or '}'", (2, 2)),
    ("a: {b: c]\n", (1, 9), "expected ',' or '}'", (1, 9)),
    ("a:\n\tb: 1\n", (2, 1), "tab", (2, 1)),
    ("a:\tb\n", (1, 3), "tab", (1, 3)),
    ("a: &x 1\n", (1, 4), "anchors ('&') are not supported", (1, 4)),
    ("a: 1\nb: *x\n", (2, 4), "aliases ('*') are not supported", (2, 4)),
    ("a: !!str 1\n", (1, 4), "tags ('!') are not supported", (1, 4)),
    ("? a\n: b\n", (1, 1), "complex keys ('? ') are not supported", (1, 1)),
    ("%YAML 1.1\n---\na: 1\n", (1, 1), "directives", (1, 1)),
    ("base: {a: 1}\nother:\n  <<: {b: 2}\n", (3, 3), "merge keys", (3, 3)),
    ("a: 1\nb: 2\na: 3\n", (3, 1), "duplicate key 'a'", (3, 1)),
    ("{a: 1, a: 2}\n", (1, 8), "duplicate key 'a'", (1, 8)),
    ("a: 1\nfoo\nb: 2\n", (2, 4), "expected ':' after mapping key", (3, 1)),
    ("a: 1\n---\nb: 2\n", (2, 1), "multiple documents", (2, 1)),
    ('a: "x" y\n', (1, 8), "unexpected text", (1, 8)),
    ("a: b: c\n", (1, 5), "mapping values are not allowed", (1, 5)),
    ("a: - b\n", (1, 4), "sequence entries are not allowed", (1, 4)),
    ('a: "\\q"\n', (1, 5), "unknown escape sequence '\\q'", (1, 6)),
    ('a: "\\x4"\n', (1, 5), "hexadecimal digits", (1, 7)),
    ('a: "\\U00110000"\n', (1, 5), "beyond the last Unicode character", (1, 7)),
    ('a: "\\Ub001F600"\n', (1, 5), "beyond the last Unicode character", (1, 7)),
    ("a: \x01\n", (1, 4), "U+0001", (1, 4)),
    ("a: \u2028\n", (1, 4), "U+2028", (1, 4)),
    ("a: |0\n  x\n", (1, 5), "1-9", (1, 5)),
    (": 1\n", (1, 1), "empty mapping keys", (1, 1)),
    ("a: [b]: c\n", (1, 4), "collections as mapping keys", (1, 7)),
    ("a: 0b_\n", (1, 4), "cannot read '0b_'", (1, 4)),
    ("d: 2024-02-30\n", (1, 4), "cannot read '2024-02-30'", (1, 4)),
]
MALFORMED_IDS = [repr(case[0]) for case in MALFORMED]


@pytest.mark.parametrize("text, where, fragment, pyyaml_where", MALFORMED, ids=MALFORMED_IDS)
def test_malformed_in_house(text, where, fragment, pyyaml_where):
    with pytest.raises(ragproxy.YAMLError) as info:
        ragproxy.parse_yaml(text)
    assert (info.value.line, info.value.col) == where
    assert fragment in info.value.msg


@pytest.mark.parametrize("text, where, fragment, pyyaml_where", MALFORMED, ids=MALFORMED_IDS)
def test_malformed_through_pyyaml(text, where, fragment, pyyaml_where, monkeypatch):
    monkeypatch.setattr(deps, "yaml", pytest.importorskip("yaml"))
    with pytest.raises(ragproxy.YAMLError) as info:
        ragproxy.load_yaml(text)
    assert (info.value.line, info.value.col) == pyyaml_where
    if where == pyyaml_where and fragment.endswith("not supported"):
        assert fragment in info.value.msg    # refusals read the same on both paths


def test_load_yaml_uses_pyyaml_only_when_present(monkeypatch, pyyaml):
    calls = []
    real = ragproxy.parse_yaml
    monkeypatch.setattr(yamlish, "parse_yaml", lambda text: calls.append(text) or real(text))
    monkeypatch.setattr(deps, "yaml", None)
    assert ragproxy.load_yaml("a: 1")[0] == {"a": 1} and calls == ["a: 1"]
    monkeypatch.setattr(deps, "yaml", pyyaml)
    assert ragproxy.load_yaml("b: 2")[0] == {"b": 2} and calls == ["a: 1"]


PLAIN_SCALARS = [
    ("~", None), ("null", None), ("NULL", None), ("nUll", "nUll"),
    ("yes", True), ("On", True), ("TRUE", True), ("off", False), ("No", False), ("y", "y"),
    ("0", 0), ("-0", 0), ("+12", 12), ("1_000", 1000), ("0x1F", 31), ("-0x1f", -31), ("017", 15),
    ("0b101", 5), ("08", "08"), ("0o17", "0o17"), ("1:30", 90), ("-1:00:00", -3600),
    ("1.5", 1.5), ("1.", 1.0), (".5", 0.5), ("1.0e+3", 1000.0), ("1.5E-2", 0.015),
    ("1e3", "1e3"), ("1.0e3", "1.0e3"), ("-.5", "-.5"), ("1:30.5", 90.5),
    (".inf", math.inf), ("-.Inf", -math.inf), ("+.INF", math.inf),
    ("2024-01-31", datetime.date(2024, 1, 31)), ("2024-1-31", "2024-1-31"),
    ("2024-1-31 9:05:00", datetime.datetime(2024, 1, 31, 9, 5)),
    ("2001-12-14t21:59:43.10Z",
     datetime.datetime(2001, 12, 14, 21, 59, 43, 100000, tzinfo=datetime.timezone.utc)),
    ("2001-12-14 21:59:43.1234567 -5",
     datetime.datetime(2001, 12, 14, 21, 59, 43, 123456,
                       tzinfo=datetime.timezone(datetime.timedelta(hours=-5)))),
    ("claude-*", "claude-*"), ("${HOME}/x", "${HOME}/x"), ("a #b", "a"), ("a#b", "a#b"),
]


@pytest.mark.parametrize("text, value", PLAIN_SCALARS, ids=[c[0] for c in PLAIN_SCALARS])
def test_plain_scalar_resolution(text, value, load):
    got = load("v: " + text)[0]["v"]
    assert got == value and type(got) is type(value)


def test_nan(load):
    assert math.isnan(load("v: .NaN")[0]["v"])


def test_non_string_keys_and_values_match_pyyaml(pyyaml, load):
    text = "2: int\n1.5: float\n~: null\nyes: bool\n2024-01-02: date\nlist: [on, 0x10, '1']\n"
    assert load(text)[0] == pyyaml.safe_load(text)
    assert list(load(text)[0]) == [2, 1.5, None, True, datetime.date(2024, 1, 2), "list"]


def test_key_path_uses_resolved_keys():
    _, positions = ragproxy.parse_yaml("ports:\n  80: http\n  on: yes\n")
    assert positions[("ports", 80)] == (2, 3)
    assert positions[("ports", True)] == (3, 3)


def test_duplicate_keys_that_resolve_equal(load):
    with pytest.raises(ragproxy.YAMLError) as info:
        load("1: a\n0x1: b\n")
    assert (info.value.line, info.value.col) == (2, 1)


def test_block_scalar_header_in_the_parents_column(load):
    # Not valid YAML, but PyYAML reads it, so the fallback must too.
    assert load("a:\n|\n x\nb: 1\n")[0] == {"a": "x\n", "b": 1}
    assert load("- x\n-\n>-\n y\n z\n")[0] == ["x", "y z"]


def test_document_markers(load):
    assert load("--- |\n  text\n")[0] == "text\n"
    assert load("--- [1, 2]\n...\n...\n")[0] == [1, 2]
    with pytest.raises(ragproxy.YAMLError):
        load("--- a: 1\n")
    with pytest.raises(ragproxy.YAMLError):
        load("a: 1\n...\nb: 2\n")


# -- round trips through PyYAML's emitter --------------------------------------

TEXT_CHARS = "abcxyz  -_:#'\"\\/*&!?|>{}[],.%@`~=<0123\t\n\r\u00e9\U0001F600"
TRICKY = ["yes", "No", "on", "null", "~", "1.5", "1e3", "0x1F", "017", "1:30", "2001-12-14",
          ".inf", "-", "---", "...", "a: b", "- x", "#c", " lead", "trail ", "", "<<", "=",
          "claude-*", "${ENV}", "'", '"']


def random_text(rng, max_len=12):
    if rng.random() < 0.3:
        return rng.choice(TRICKY)
    length = rng.randint(0, max_len) if rng.random() < 0.9 else rng.randint(60, 160)
    return "".join(rng.choice(TEXT_CHARS) for _ in range(length))


def random_key(rng):
    # PyYAML writes long, empty or multi-line keys as "? " complex keys, which are refused.
    return rng.choice([random_text(rng).replace("\n", " ").replace("\r", " ")[:40] or "k",
                       rng.randint(-99, 99), rng.choice([True, None, 2.5])])


def random_node(rng, depth=0):
    roll = rng.random()
    if depth >= 4 or roll < 0.4:
        return rng.choice([random_text(rng), random_text(rng), rng.randint(-10 ** 9, 10 ** 9),
                           rng.choice([0.5, -1.25, 1e20, 3.0, 1e-7, math.inf, -math.inf]),
                           rng.choice([True, False, None])])
    if roll < 0.7:
        return {random_key(rng): random_node(rng, depth + 1) for _ in range(rng.randint(0, 5))}
    return [random_node(rng, depth + 1) for _ in range(rng.randint(0, 5))]


@pytest.mark.parametrize("flow_style", [False, True])
def test_reads_back_what_pyyaml_writes(pyyaml, flow_style, monkeypatch):
    monkeypatch.setattr(deps, "yaml", pyyaml)
    rng = random.Random(20240611 + flow_style)
    exact = 0
    for _ in range(250):
        data = random_node(rng)
        text = pyyaml.safe_dump(data, default_flow_style=flow_style,
                                allow_unicode=rng.random() < 0.5,
                                width=rng.choice([20, 80, 1000]), indent=rng.choice([2, 4]))
        parsed, positions = ragproxy.parse_yaml(text)
        # PyYAML's emitter sometimes garbles a double-quoted string it wraps deep
        # inside narrow flow output; then the text, not `data`, is the reference.
        assert parsed == pyyaml.safe_load(text), text
        assert ragproxy.load_yaml(text) == (parsed, positions), text
        exact += parsed == data
    assert exact >= 240


@pytest.mark.parametrize("style", ["|", ">", "'", '"'])
def test_reads_back_every_scalar_style(pyyaml, style):
    rng = random.Random(7)
    for _ in range(150):
        data = {"k": [random_text(rng, 40) for _ in range(3)]}
        text = pyyaml.safe_dump(data, default_style=style, allow_unicode=True, width=30)
        assert ragproxy.parse_yaml(text)[0] == pyyaml.safe_load(text), text


# -- dump_yaml: what the admin API writes must read back identically ----------

_DUMP_ATOMS = ["a", "Z", "0", "1", " ", ":", "#", "-", "\n", "\t", '"', "'", "\\", "\u00e9", "\u2028", "\x00",
               "\x7f", "\x85", "[", "{", "*", "&", "!", "%", "@", "`", "|", ">", "?", ",", "\U0001f600",
               "\ufeff", "yes", "null", "1e3", ".5", "0x1F", "~", "${HOME}", "http://h:1/v1"]


def _random_value(rng, depth=0):
    roll = rng.random()
    if depth < 3 and roll < 0.2:
        return {_random_text(rng) or "k": _random_value(rng, depth + 1) for _ in range(rng.randint(0, 3))}
    if depth < 3 and roll < 0.4:
        return [_random_value(rng, depth + 1) for _ in range(rng.randint(0, 3))]
    if roll < 0.5:
        return rng.randint(-10**6, 10**6)
    if roll < 0.6:
        return rng.choice([True, False, None, 1.5, -0.25, 1e20, 3.0, 1e-7])
    return _random_text(rng)


def _random_text(rng):
    return "".join(rng.choice(_DUMP_ATOMS) for _ in range(rng.randint(0, 6)))


def test_dump_yaml_round_trips_through_both_parsers():
    pyyaml = pytest.importorskip("yaml") if deps.yaml is not None else None
    rng = random.Random(20261129)
    for _ in range(1500):
        data = {_random_text(rng) or "k": _random_value(rng) for _ in range(rng.randint(1, 4))}
        text = ragproxy.dump_yaml(data, header="written by a test\n\nsecond paragraph")
        assert ragproxy.parse_yaml(text)[0] == data, text
        if pyyaml is not None:
            assert pyyaml.safe_load(text) == data, text


def test_dump_yaml_of_a_real_config_is_readable_and_loads_the_same():
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples", "config-full.yaml")
    with open(path, encoding="utf-8") as f:
        data, _ = ragproxy.load_yaml(f.read())
    text = ragproxy.dump_yaml(data, header="ragproxy configuration")
    assert text.startswith("# ragproxy configuration\n")
    assert "  - name: " in text and "\n  llm:\n" in text  # block style, as a person would write it
    assert ragproxy.load_yaml(text)[0] == data
    environ = {name: "secret-value-123" for name in ("RAGPROXY_TEAM_KEY", "ANTHROPIC_API_KEY", "GATEWAY_KEY",
                                                      "OPENAI_API_KEY")}
    with open(path, encoding="utf-8") as f:
        before = ragproxy.Config.from_text(f.read(), environ=environ)
    after = ragproxy.Config.from_text(text, environ=environ)
    assert after.raw == before.raw
    assert '"${GATEWAY_KEY}"' in text  # references are kept, never replaced by their values


# -- nesting: however deep, a YAML error with a line, never RecursionError ----

INVALID = sorted(glob.glob(os.path.join(DATA, "invalid", "*.yaml")))


def depth(value):
    if isinstance(value, dict):
        return 1 + max(map(depth, value.values()), default=0)
    if isinstance(value, list):
        return 1 + max(map(depth, value), default=0)
    return 0


def test_the_nesting_limit_golden_file_is_at_the_limit(load):
    data, _ = load(read(os.path.join(DATA, "nesting_limit.yaml")))
    assert depth(data) == yamlish.MAX_NESTING == 64


@pytest.mark.parametrize("path", INVALID, ids=os.path.basename)
def test_invalid_golden_files(path, load):
    with pytest.raises(ragproxy.YAMLError) as info:
        load(read(path))
    want = expected(path)
    assert (info.value.line, info.value.col, info.value.msg) == (want["line"], want["column"], want["message"])


def deep_document(kind, levels):
    """``levels`` collections of one kind nested in each other (and closed), and the
    (line, col) where the collection one level past MAX_NESTING starts."""
    limit = yamlish.MAX_NESTING + 1
    if kind == "flow sequences":     # "k: [[[x]]]": the root mapping is level 1
        return "k: " + "[" * (levels - 1) + "x" + "]" * (levels - 1) + "\n", (1, 4 + (limit - 2))
    if kind == "flow mappings":
        return "k: " + "{a: " * (levels - 1) + "x" + "}" * (levels - 1) + "\n", (1, 4 + 4 * (limit - 2))
    if kind == "one-key mappings":   # "[a: ...]": a sequence holding a one-key mapping, two levels each
        pairs = (levels - 1) // 2
        return "k: " + "[a: " * pairs + "x" + "]" * pairs + "\n", (1, 5 + 4 * ((limit - 1) // 2 - 1))
    if kind == "block mappings":     # one space of indentation per level
        lines = [" " * i + f"k{i + 1}:" for i in range(levels)]
        return "\n".join(lines) + " leaf\n", (limit, limit)
    if kind == "block sequences":    # "- " on its own line, one space of indentation per level
        lines = [" " * i + "-" for i in range(levels)]
        return "\n".join(lines) + " leaf\n", (limit, limit)
    assert kind == "compact sequences"   # "- - - leaf"
    return "- " * levels + "leaf\n", (1, 2 * limit - 1)


DEEP_KINDS = ["flow sequences", "flow mappings", "one-key mappings", "block mappings", "block sequences",
              "compact sequences"]


@pytest.mark.parametrize("kind", DEEP_KINDS)
def test_deep_nesting_is_a_yaml_error_where_it_goes_past_the_limit(kind, load):
    # Both parsers used to raise RecursionError (in-house at about 330 levels), which killed
    # the config watcher.  Block indentation costs levels squared in bytes, so 500 there.
    levels = 500 if kind.startswith("block") else 2000
    text, where = deep_document(kind, levels)
    with pytest.raises(ragproxy.YAMLError) as info:
        load(text)
    assert (info.value.line, info.value.col) == where
    assert "nested more than 64 levels deep" in info.value.msg
    unclosed = text.rstrip("]}\n") + "\n"
    with pytest.raises(ragproxy.YAMLError) as info:
        load(unclosed)
    assert (info.value.line, info.value.col) == where


@pytest.mark.parametrize("kind", DEEP_KINDS)
def test_nesting_up_to_the_limit_is_read(kind, load):
    levels = yamlish.MAX_NESTING - (kind == "one-key mappings")   # its levels come in pairs
    data, _ = load(deep_document(kind, levels)[0])
    assert depth(data) == levels
    with pytest.raises(ragproxy.YAMLError):
        load(deep_document(kind, yamlish.MAX_NESTING + 2)[0])


def _stack_depth():
    frame, n = sys._getframe(), 0
    while frame is not None:
        frame, n = frame.f_back, n + 1
    return n


def test_a_caller_deep_in_its_own_stack_gets_a_yaml_error_too(load):
    text, _ = deep_document("block mappings", 60)   # within the limit, but not within this stack
    old = sys.getrecursionlimit()
    sys.setrecursionlimit(_stack_depth() + 60)
    try:
        with pytest.raises(ragproxy.YAMLError) as info:
            load(text)
    finally:
        sys.setrecursionlimit(old)
    assert "recursion limit" in info.value.msg and 1 <= info.value.line <= 60


# -- fuzzing: mutated config documents ----------------------------------------

_FUZZ_ATOMS = list("-?:,[]{}#&*!|>'\"%@`~=< \n\t\\") + [
    "\n  ", "\n- ", ": ", "- ", "---\n", "...\n", "\r\n", "\r", "\ufeff", "\x85", "\x00", "\u2028", "0x",
    "1e3", "\u00e9", "\U0001F600", "yes", "null", "<<", "${X}", "|\n", ">-\n", '"\\', "'"]


def _fuzz_seeds():
    examples = os.path.join(os.path.dirname(DATA), "..", "..", "examples")
    paths = GOLDEN + sorted(glob.glob(os.path.join(examples, "**", "*.yaml"), recursive=True))
    return [read(p) for p in paths] + [ragproxy.DEFAULT_CONFIG_TEMPLATE]


def _deep_fragment(rng):
    levels = rng.choice([10, 63, 64, 65, 66, 200, 1000, 2000])
    kind = rng.choice(DEEP_KINDS)
    if kind.startswith("block"):
        levels = min(levels, 400)
    text = deep_document(kind, levels)[0]
    return kind, (text if rng.random() < 0.5 else text.rstrip("]}\n"))


def mutate(rng, text, deep_kinds):
    """A few random edits of ``text``: characters in, out or replaced, lines copied or
    re-indented, a cut, or a deeply nested fragment spliced in (its kind goes to deep_kinds)."""
    for _ in range(rng.randint(1, 6)):
        roll, pos = rng.random(), rng.randint(0, len(text))
        if roll < 0.3:
            text = text[:pos] + rng.choice(_FUZZ_ATOMS) + text[pos:]
        elif roll < 0.45:
            text = text[:pos] + text[pos + rng.randint(1, 8):]
        elif roll < 0.55:
            text = text[:pos] + rng.choice(_FUZZ_ATOMS) + text[pos + 1:]
        elif roll < 0.75:
            lines = text.split("\n")
            i = rng.randrange(len(lines))
            if roll < 0.65:
                lines.insert(rng.randrange(len(lines) + 1), lines[i])
            else:
                lines[i] = " " * rng.randint(0, 7) + lines[i].lstrip(" ")
            text = "\n".join(lines)
        elif roll < 0.8:
            text = text[:pos]
        else:
            kind, fragment = _deep_fragment(rng)
            deep_kinds.append(kind)
            text = text[:pos] + fragment + text[pos:]
    return text


def test_fuzzed_config_documents_give_data_or_a_yaml_error_with_a_line(load):
    rng = random.Random(20260214)
    seeds = _fuzz_seeds()
    outcomes = collections.Counter()
    for _ in range(500):
        deep_kinds = []
        text = mutate(rng, rng.choice(seeds), deep_kinds)
        try:
            load(text)
            outcomes["data"] += 1
        except ragproxy.YAMLError as exc:
            breaks = text.count("\n") + text.count("\r") + text.count("\x85") + text.count("\u2028")
            assert 1 <= exc.line <= breaks + 1 and exc.col >= 1, (exc, text[:2000])
            outcomes["error"] += 1
            if "nested more than" in exc.msg:
                outcomes.update(deep_kinds)
    assert outcomes["data"] >= 50 and outcomes["error"] >= 50, outcomes
    assert all(outcomes[kind] >= 2 for kind in DEEP_KINDS), outcomes   # every kind met the limit
