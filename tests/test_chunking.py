"""Chunking: chunk_document() per strategy (code symbols, headings, paragraphs, token windows), in-process.

Documents come from extract() over the files in data/docs (test_documents
tests extraction itself); every test checks the chunks' line ranges, sizes,
heading paths or ids against hand-worked expectations.
"""
import re

import pytest
from test_documents import chunks_of, read

from ragproxy import Document, chunk_document, count_tokens, extract


def layout(chunks):
    return [(c.symbol, c.line_start, c.line_end) for c in chunks]


def source_lines(name):
    return read(name).decode("utf-8").split("\n")


def assert_text_matches_lines(chunks, lines):
    for c in chunks:
        assert c.text == "\n".join(lines[c.line_start - 1:c.line_end]), (c.symbol, c.line_start)


# ---------------------------------------------------------------- Python code

# The definitions found, one chunk each (pack_symbols=False); how small ones
# then share chunks is tested under "packing small definitions".

def test_python_symbols_and_line_ranges():
    chunks = chunks_of("sample.py", pack_symbols=False)
    assert layout(chunks) == [
        ("", 1, 8),                          # module docstring, imports, constant
        ("retry", 11, 23),                   # nested functions stay inside
        ("Config", 26, 29),                  # class header: docstring and attributes
        ("Config.__init__", 31, 33),
        ("Config.load", 35, 42),             # comment and decorator above included
        ("Config.size", 44, 46),
        ("Config.Error", 48, 49),            # nested class
        ("Config.Error.describe", 51, 52),
        ("fetch", 55, 56),                   # async def
        ("", 59, 60),                        # if __name__ == "__main__"
    ]
    assert_text_matches_lines(chunks, source_lines("sample.py"))
    load = chunks[4]
    assert load.text.startswith("    # Loading touches the disk")
    assert "@retry(3)" in load.text
    assert load.context == "sample.py: Config.load"
    assert load.index_text() == "sample.py: Config.load\n" + load.text
    assert chunks[0].text.startswith('"""Sample module') and "import os" in chunks[0].text
    assert all(c.title == "sample.py" and c.source == "sample.py" for c in chunks)


def test_python_big_function_splits_on_statement_boundaries():
    body = []
    for i in range(60):
        body.append("    value_%d = compute(%d,\n                       offset=%d)" % (i, i, i * 2))
    src = "def big():\n    \"\"\"Many statements.\"\"\"\n" + "\n".join(body) + "\n    return value_0\n"
    doc = Document(src, "big.py", "code", "big.py", "python")
    chunks = chunk_document(doc, chunk_size=64)
    lines = src.split("\n")
    assert len(chunks) > 3
    assert all(c.symbol == "big" for c in chunks)
    assert chunks[0].line_start == 1 and chunks[-1].line_end == len(lines) - 1
    for prev, cur in zip(chunks, chunks[1:]):
        assert cur.line_start == prev.line_end + 1          # no gaps, no overlap
        # never cut inside the two-line call: pieces start at a statement
        assert re.match(r"    (value_\d+ =|return)", lines[cur.line_start - 1])
    assert all(count_tokens(c.text) <= 64 for c in chunks)
    assert_text_matches_lines(chunks, lines)


def test_python_syntax_error_falls_back_to_heuristic():
    src = (
        "import os\n\n\n"
        "def good(a):\n    return a + 1\n\n\n"
        "class Broken:\n    def method(self:\n        pass\n\n\n"
        "def after():\n    return 2\n"
    )
    doc = Document(src, "broken.py", "code", "broken.py", "python")
    chunks = chunk_document(doc, pack_symbols=False)
    symbols = [c.symbol for c in chunks]
    assert "good" in symbols and "after" in symbols
    good = chunks[symbols.index("good")]
    assert (good.line_start, good.line_end) == (4, 5)


def test_python_defs_inside_top_level_if_and_try():
    src = (
        "import sys\n\n"
        "if sys.platform == 'win32':\n"
        "    def path_sep():\n        return '\\\\'\n"
        "else:\n"
        "    def path_sep():\n        return '/'\n\n"
        "try:\n    import fast\nexcept ImportError:\n"
        "    def fast_sum(xs):\n        return sum(xs)\n"
    )
    chunks = chunk_document(Document(src, "p.py", "code", "p.py", "python"), pack_symbols=False)
    defs = [(c.symbol, c.line_start, c.line_end) for c in chunks if c.symbol]
    assert defs == [("path_sep", 4, 5), ("path_sep", 7, 8), ("fast_sum", 13, 14)]
    assert len({c.id for c in chunks}) == len(chunks)


# ---------------------------------------------------------------- other languages

def test_go_symbols_and_line_ranges():
    chunks = chunks_of("server.go", pack_symbols=False)
    assert layout(chunks) == [
        ("", 1, 7),                   # package and imports
        ("Server", 9, 13),            # doc comment attached
        ("NewServer", 15, 18),
        ("Server.Handle", 20, 27),    # method qualified by its receiver type
        ("Server.String", 29, 31),
    ]
    assert_text_matches_lines(chunks, source_lines("server.go"))


def test_javascript_class_methods_and_functions():
    chunks = chunks_of("widget.js", pack_symbols=False)
    assert layout(chunks) == [
        ("", 1, 4),
        ("Widget", 6, 9),             # JSDoc block attached to the class line
        ("Widget.constructor", 10, 13),
        ("Widget.draw", 15, 18),      # braces inside a template string are ignored
        ("Widget.fromJSON", 20, 22),
        ("makeWidgets", 25, 27),
        ("sumSizes", 29, 35),         # arrow function bound to a const
    ]
    assert_text_matches_lines(chunks, source_lines("widget.js"))


@pytest.mark.parametrize("name, src, expected", [
    ("lib.rs",
     "use std::fmt;\n\n/// A point.\n#[derive(Debug)]\npub struct Point<'a> {\n    name: &'a str,\n}\n\n"
     "impl<'a> Point<'a> {\n    pub fn new(name: &'a str) -> Self {\n        let c = '{';\n"
     "        Point { name }\n    }\n}\n\npub fn origin() -> Point<'static> {\n    Point::new(\"o\")\n}\n",
     [("Point", 3, 7), ("Point", 9, 9), ("Point.new", 10, 13), ("origin", 16, 18)]),
    ("App.java",
     "package a;\n\npublic class App {\n    private int n;\n\n    @Override\n"
     "    public String toString() {\n        return \"App\";\n    }\n}\n",
     [("App", 3, 4), ("App.toString", 6, 9)]),
    ("util.c",
     "#include <stdio.h>\n\nint add(int a, int b);\n\n/* Adds. */\nint add(int a, int b)\n{\n"
     "    return a + b;\n}\n\nstatic int\ntwice (int x)\n{\n    return add(x, x);\n}\n",
     [("add", 5, 9), ("twice", 11, 15)]),
    ("tool.rb",
     "module Tools\n  class Runner\n    def self.run(cmd)\n      new(cmd).call\n    end\n  end\nend\n",
     [("Tools", 1, 1), ("Tools.Runner", 2, 2), ("Tools.Runner.run", 3, 5)]),
    ("deploy.sh",
     "#!/bin/sh\nset -e\n\nusage() {\n  echo \"${#1}\"\n}\n\nusage \"$@\"\n",
     [("usage", 4, 6)]),
])
def test_heuristic_languages(name, src, expected):
    (doc,) = extract(name, src.encode())
    chunks = chunk_document(doc, pack_symbols=False)
    assert [(c.symbol, c.line_start, c.line_end) for c in chunks if c.symbol] == expected
    assert_text_matches_lines(chunks, src.split("\n"))


def test_functions_inside_a_big_wrapper_block_are_found():
    body = "".join("  function f%d(a) {\n%s  }\n\n" % (i, "    a = a + %d;\n" % i * 3) for i in range(8))
    js = "(function () {\n  'use strict';\n\n" + body + "  window.f0 = f0;\n})();\n"
    (doc,) = extract("iife.js", js.encode())
    chunks = chunk_document(doc, chunk_size=64)
    assert [(c.symbol, c.line_start, c.line_end) for c in chunks if c.symbol] == [
        ("f%d" % i, 4 + 6 * i, 8 + 6 * i) for i in range(8)]


def test_big_yaml_keys_split_into_dotted_symbols():
    steps = "".join("      - name: step %d\n        run: echo %s\n" % (i, "word " * 8) for i in range(6))
    yaml_text = ("name: CI\njobs:\n  build:\n    runs-on: ubuntu\n    steps:\n" + steps
                 + "  test:\n    runs-on: ubuntu\n    steps:\n" + steps)
    (doc,) = extract("ci.yml", yaml_text.encode())
    chunks = chunk_document(doc, chunk_size=120)
    assert chunks[-1].symbol == "jobs.test" and chunks[-1].line_start == 18
    assert all(count_tokens(c.text) <= 120 for c in chunks)


def test_decorated_class_starts_at_its_decorator():
    src = "import dataclasses\n\n\n@dataclasses.dataclass\nclass Point:\n    x: int = 0\n    y: int = 0\n"
    chunks = chunk_document(Document(src, "p.py", "code", "p.py", "python"), pack_symbols=False)
    assert layout(chunks) == [("", 1, 1), ("Point", 4, 7)]


def test_config_files_pack_sections_and_name_common_keys():
    (doc,) = extract("settings.yaml", read("settings.yaml"))
    assert doc.kind == "config"
    (chunk,) = chunk_document(doc)
    assert (chunk.line_start, chunk.line_end) == (1, 8)
    # many sections: packed into chunks that stay below the size limit
    toml = "".join("[tool.t%d]\nkey = \"%s\"\n\n" % (i, "word " * 12) for i in range(40))
    (doc,) = extract("pyproject.toml", toml.encode())
    chunks = chunk_document(doc, chunk_size=64)
    assert 5 < len(chunks) < 40
    assert all(c.text.startswith("[tool.t") for c in chunks)
    assert all(c.symbol == "tool" for c in chunks if c.text.count("[tool.") > 1)


def test_oversized_block_without_structure_is_split_by_lines():
    src = "var table = [\n" + "".join("  %d, %d, %d,\n" % (i, i, i) for i in range(300)) + "];\n"
    (doc,) = extract("table.js", src.encode())
    chunks = chunk_document(doc, chunk_size=100)
    assert len(chunks) > 5
    assert all(count_tokens(c.text) <= 100 for c in chunks)
    assert chunks[0].line_start == 1 and chunks[-1].line_end == src.count("\n")


# ---------------------------------------------------------------- packing small definitions

def stub_module(classes=6, methods=10, overloads=3, functions=40):
    """A .pyi like numpy's __init__.pyi: classes of overloaded one-line stubs, then functions."""
    out = ["from typing import Any, overload", ""]
    for c in range(classes):
        out.append("class Array%d:" % c)
        for m in range(methods):
            for o in range(overloads):
                out += ["    @overload", "    def method_%d(self, key: Index%d, /) -> Array%d: ..." % (m, o, c)]
        out.append("")
    out += ["def function_%d(a: ArrayLike, b: int = ...) -> NDArray[Any]: ..." % f for f in range(functions)]
    return "\n".join(out) + "\n"


def names_in(unpacked, chunk):
    return list(dict.fromkeys(u.symbol for u in unpacked
                              if chunk.line_start <= u.line_start <= chunk.line_end and u.symbol))


def test_small_stubs_share_chunks_of_up_to_chunk_size():
    src = stub_module()
    doc = Document(src, "stubs.pyi", "code", "stubs.pyi", "python")
    lines = src.split("\n")
    unpacked = chunk_document(doc, pack_symbols=False)
    chunks = chunk_document(doc)
    total = count_tokens(src)
    assert len(unpacked) == 6 * (1 + 10 * 3) + 40 + 1          # one per stub: what numpy's .pyi got
    assert total / 256 <= len(chunks) <= 1.5 * total / 256     # 25 from 227
    assert all(count_tokens(c.text) <= 256 for c in chunks)
    assert_text_matches_lines(chunks, lines)
    # Every stub is in exactly one chunk, in order.
    assert [u for u in unpacked if not any(c.line_start <= u.line_start <= u.line_end <= c.line_end
                                           for c in chunks)] == []
    assert all(a.line_end < b.line_start for a, b in zip(chunks, chunks[1:]))
    # A chunk is named by the definitions it holds, and overloads of one method stay together.
    for c in chunks:
        names = names_in(unpacked, c)
        assert c.symbol == ", ".join(names[:6]) + (", ..." if len(names) > 6 else "")
        assert c.context == "stubs.pyi: " + c.symbol
    seen = [n for c in chunks for n in names_in(unpacked, c) if n.count(".") == 1]
    assert len(seen) == len(set(seen)) == 6 * 10


def test_a_file_of_one_line_definitions_gives_about_its_size_in_chunks():
    js = "".join("export function handler%d(req) { return route(req, %d); }\n" % (i, i) for i in range(300))
    (doc,) = extract("handlers.js", js.encode())
    chunks = chunk_document(doc, chunk_size=128)
    total = count_tokens(js)
    assert len(chunk_document(doc, chunk_size=128, pack_symbols=False)) == 300
    assert total / 128 <= len(chunks) <= 1.25 * total / 128
    assert all(count_tokens(c.text) <= 128 for c in chunks)
    assert chunks[0].symbol == "handler0, handler1, handler2, handler3, handler4, handler5, ..."
    assert chunks[0].line_start == 1 and chunks[-1].line_end == 300
    assert all(b.line_start == a.line_end + 1 for a, b in zip(chunks, chunks[1:]))


def test_a_definition_of_half_a_chunk_or_more_keeps_its_own_chunk():
    body = "".join("    total += weight_%d * value_%d\n" % (i, i) for i in range(20))
    src = ("def _solve_dispatcher(a, b):\n    return (a, b)\n\n\n"
           "def solve(a, b):\n    total = 0\n" + body + "    return total\n\n\n"
           "def _helper(x):\n    return x\n\n\n"
           "def _other(y):\n    return y\n")
    doc = Document(src, "m.py", "code", "m.py", "python")
    assert 128 <= count_tokens("\n".join(src.split("\n")[4:27])) <= 256
    assert layout(chunk_document(doc)) == [("_solve_dispatcher", 1, 2), ("solve", 5, 27), ("_helper, _other", 30, 35)]


def test_packed_golden_files():
    """The data/docs sources, packed at the default size: the layouts above, merged."""
    assert layout(chunks_of("sample.py")) == [
        ("retry, Config, Config.__init__, Config.load, Config.size", 1, 46),
        ("Config.Error, Config.Error.describe, fetch", 48, 60),
    ]
    assert layout(chunks_of("server.go")) == [("Server, NewServer, Server.Handle, Server.String", 1, 31)]
    assert layout(chunks_of("widget.js")) == [
        ("Widget, Widget.constructor, Widget.draw, Widget.fromJSON, makeWidgets, sumSizes", 1, 35)]
    for name in ("sample.py", "server.go", "widget.js"):
        assert_text_matches_lines(chunks_of(name), source_lines(name))


# ---------------------------------------------------------------- stable ids

@pytest.mark.parametrize("packed, edited_chunk", [
    (False, "Config.size"), (True, "retry, Config, Config.__init__, Config.load, Config.size")])
def test_ids_are_stable_and_only_edited_chunk_changes(packed, edited_chunk):
    original = read("sample.py").decode()
    first = chunk_document(extract("sample.py", original.encode())[0], pack_symbols=packed)
    again = chunk_document(extract("sample.py", original.encode())[0], pack_symbols=packed)
    assert [c.id for c in first] == [c.id for c in again]
    assert len({c.id for c in first}) == len(first) > 1

    # The same size: packed chunks keep their boundaries (an edit that grows a
    # chunk past chunk_size may move one, and so change a neighbour's id too).
    edited = original.replace("        return len(self.values)", "        return len(self.entries)")
    assert edited != original
    after = chunk_document(extract("sample.py", edited.encode())[0], pack_symbols=packed)
    assert layout(after) == layout(first)
    changed = [b.symbol for b, a in zip(first, after) if b.id != a.id]
    assert changed == [edited_chunk]


def test_ids_survive_line_shifts_and_depend_on_source():
    original = read("sample.py").decode()
    shifted = original.replace("import os\n", "import os\nimport sys\n\n\n")

    def chunks(text, name="sample.py"):
        return chunk_document(extract(name, text.encode())[0], pack_symbols=False)

    a = {c.symbol: c for c in chunks(original)}
    b = {c.symbol: c for c in chunks(shifted)}
    assert a["Config.load"].id == b["Config.load"].id
    assert a["Config.load"].line_start + 3 == b["Config.load"].line_start
    assert chunks(original)[0].id != chunks(shifted)[0].id   # the import block itself changed
    moved = {c.symbol: c for c in chunks(original, "lib/sample.py")}
    assert moved["Config.load"].id != a["Config.load"].id


def test_identical_chunks_get_distinct_ids_by_ordinal():
    same_text = "Same paragraph text here, repeated on purpose."
    text = "\n\n".join([same_text] * 3 + ["A different paragraph, long enough to stand alone."])
    doc = Document(text, "", "text", "dup.txt")
    chunks = chunk_document(doc, strategy="paragraph", chunk_size=16, chunk_overlap=0)
    same = [c for c in chunks if c.text == same_text]
    assert len(same) == 3
    assert len({c.hash for c in same}) == 1
    assert len({c.id for c in same}) == 3


def test_renamed_heading_changes_ids_of_its_section_only():
    a = "# Guide\n\n## Alpha\n\n" + "Alpha text. " * 20 + "\n\n## Beta\n\n" + "Beta text. " * 20 + "\n"
    b = a.replace("## Beta", "## Gamma")
    ca = chunk_document(Document(a, "Guide", "markdown", "g.md"))
    cb = chunk_document(Document(b, "Guide", "markdown", "g.md"))
    assert [c.headings for c in cb] == [["Guide", "Alpha"], ["Guide", "Gamma"]]
    assert ca[0].id == cb[0].id and ca[1].id != cb[1].id


# ---------------------------------------------------------------- headings

def test_markdown_heading_paths_and_ranges():
    (doc,) = extract("guide.md", read("guide.md"))
    assert doc.kind == "markdown" and doc.title == "User Guide"
    chunks = chunk_document(doc)
    assert [(c.headings, c.line_start, c.line_end) for c in chunks] == [
        (["Installation"], 1, 9),              # front matter merged into the first section
        (["Installation", "From source"], 11, 18),
        (["Installation", "Upgrading"], 20, 22),
        (["Configuration"], 24, 32),            # setext heading; tiny child merged in
    ]
    assert chunks[1].context == "User Guide > Installation > From source"
    assert "# not a heading" in chunks[1].text    # code fence content is not a heading
    assert_text_matches_lines(chunks, source_lines("guide.md"))


def test_big_section_is_split_and_keeps_its_path():
    para = " ".join("Sentence number %d explains one more detail." % i for i in range(80))
    text = "# Top\n\n## Details\n\n" + para + "\n\n## End\n\nShort closing words for the end.\n"
    chunks = chunk_document(Document(text, "Top", "markdown", "t.md"), chunk_size=64, chunk_overlap=8)
    details = [c for c in chunks if c.headings == ["Top", "Details"]]
    assert len(details) > 4
    assert all(count_tokens(c.text) <= 64 for c in details)
    assert all(c.line_start in (3, 5) and c.line_end == 5 for c in details)
    assert chunks[-1].headings == ["Top", "End"]
    assert details[1].index_text().startswith("Top > Details\n")


def test_rst_sections():
    (doc,) = extract("manual.rst", read("manual.rst"))
    assert doc.kind == "rst" and doc.title == "Proxy Manual"
    chunks = chunk_document(doc)
    assert [(c.headings, c.line_start, c.line_end) for c in chunks] == [
        (["Proxy Manual"], 1, 5),
        (["Proxy Manual", "Overview"], 7, 15),
        (["Proxy Manual", "Overview", "Streaming"], 17, 20),
        (["Proxy Manual", "Operations"], 22, 25),
    ]
    assert chunks[2].context == "Proxy Manual > Overview > Streaming"


# ---------------------------------------------------------------- token and paragraph

PROSE = " ".join("The %s stage takes the input, checks it, and hands it on." % w for w in (
    "first second third fourth fifth sixth seventh eighth ninth tenth eleventh twelfth "
    "thirteenth fourteenth fifteenth sixteenth seventeenth eighteenth nineteenth twentieth").split())


def test_token_strategy_sizes_overlap_and_sentence_cuts():
    doc = Document(PROSE, "", "text", "p.txt")
    chunks = chunk_document(doc, strategy="token", chunk_size=48, chunk_overlap=16)
    assert len(chunks) > 3
    for c in chunks:
        assert count_tokens(c.text) <= 48
        assert c.text.startswith("The ") and c.text.endswith("on.")    # whole sentences
        assert (c.line_start, c.line_end) == (1, 1)
    for prev, cur in zip(chunks, chunks[1:]):
        first_sentence = cur.text.split(". ")[0]
        assert first_sentence in prev.text                           # overlap
    covered = " ".join(c.text for c in chunks)
    for sentence in re.findall(r"The \w+ stage", PROSE):
        assert sentence in covered


def test_token_strategy_line_ranges_across_lines():
    lines = ["Line %d has a few words in it." % i if i % 5 else "" for i in range(1, 61)]
    doc = Document("\n".join(lines), "", "text", "l.txt")
    chunks = chunk_document(doc, strategy="token", chunk_size=40, chunk_overlap=0)
    for c in chunks:
        first = lines[c.line_start - 1]
        last = lines[c.line_end - 1]
        assert c.text.startswith(first) and c.text.endswith(last)
        assert c.text.count("has a few words") == sum(1 for ln in lines[c.line_start - 1:c.line_end] if ln)
    assert chunks[0].line_start == 1 and chunks[-1].line_end == 59


def test_token_strategy_hard_splits_text_without_boundaries():
    words = " ".join("w%d" % i for i in range(1000))
    chunks = chunk_document(Document(words, "", "text", "w.txt"), chunk_size=100, chunk_overlap=0)
    assert all(count_tokens(c.text) <= 100 for c in chunks)
    assert " ".join(c.text for c in chunks).split() == words.split()
    cjk = "\u6f22\u5b57" * 400
    chunks = chunk_document(Document(cjk, "", "text", "c.txt"), chunk_size=100, chunk_overlap=0)
    assert len(chunks) >= 8 and "".join(c.text for c in chunks) == cjk


def test_paragraph_strategy_keeps_paragraphs_whole():
    paras = ["Paragraph %d: " % i + "word " * 10 for i in range(12)]
    text = "\n\n".join(p.strip() for p in paras)
    chunks = chunk_document(Document(text, "", "text", "p.txt"), strategy="paragraph", chunk_size=50)
    assert len(chunks) > 2
    for c in chunks:
        assert count_tokens(c.text) <= 50
        for block in c.text.split("\n\n"):
            assert block.startswith("Paragraph ") and block.endswith("word")


def test_auto_strategy_by_kind_and_notes_txt():
    chunks = chunks_of("notes.txt")
    assert len(chunks) == 1 and chunks[0].title == "notes" and chunks[0].context == "notes"
    assert (chunks[0].line_start, chunks[0].line_end) == (1, 5)


def test_crlf_and_bom_line_numbers():
    src = "\ufeffdef a():\r\n    return 1\r\n\r\n\r\ndef b():\r\n    return 2\r\n"
    (doc,) = extract("m.py", src.encode("utf-8"))
    assert "\r" not in doc.text and not doc.text.startswith("\ufeff")
    assert layout(chunk_document(doc, pack_symbols=False)) == [("a", 1, 2), ("b", 5, 6)]
    assert layout(chunk_document(doc)) == [("a, b", 1, 6)]


def test_bad_parameters():
    doc = Document("text", "", "text", "x.txt")
    with pytest.raises(ValueError, match="strategy"):
        chunk_document(doc, strategy="sentences")
    with pytest.raises(ValueError, match="chunk_overlap"):
        chunk_document(doc, chunk_size=100, chunk_overlap=80)
    with pytest.raises(ValueError, match="chunk_size"):
        chunk_document(doc, chunk_size=0)


def test_empty_document_has_no_chunks():
    (doc,) = extract("empty.md", b"  \n\n")
    assert chunk_document(doc) == []
