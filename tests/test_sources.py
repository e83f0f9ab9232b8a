"""Which files of a knowledge base's sources are indexed (_ragproxy.sources): .gitignore rules and globs.

In-process, on real folders under tmp_path: through KnowledgeBase.scan()
as the indexer walks them (test_kb's helpers), and GitIgnore and glob_match
on their own.
"""
import test_kb
from test_kb import make_kb, write

from _ragproxy.sources import GitIgnore, glob_match, scan_roots, source_roots

docs = test_kb.docs   # the fixture: a KB's documents folder with a.md, b.md, src/pool.py


def test_gitignore_include_exclude_and_skips(tmp_path, docs):
    write(str(docs / ".gitignore"), "build/\n*.log\n!keep.log\n")
    write(str(docs / "build" / "out.md"), "# built\n")
    write(str(docs / "x.log"), "noise")
    write(str(docs / "keep.log"), "kept log line")
    write(str(docs / "node_modules" / "m.md"), "# dep\n")
    with open(str(docs / "blob.bin"), "wb") as f:
        f.write(b"\x00\x01\x02" * 100)
    kb = make_kb(tmp_path, exclude=("*.py",))
    sources = set(kb.scan())
    assert sources == {"kb/a.md", "kb/b.md", "kb/keep.log", "kb/blob.bin"}
    report = kb.index()
    assert [s for s, _ in report.skipped] == ["kb/blob.bin"]
    assert make_kb(tmp_path, name="kb", include=("*.py",)).scan().keys() == {"kb/src/pool.py"}


def test_glob_match_names_paths_and_double_star():
    assert glob_match("docs/a.md", ["*.md"])             # no "/" in the pattern: the file name counts
    assert not glob_match("docs/a.md", ["docs/*.txt"])
    assert not glob_match("x/docs/a.md", ["docs/*.md"])  # with a "/": the whole relative path
    assert glob_match("a/b/c.py", ["a/**/*.py"])
    assert glob_match("a/c.py", ["a/**/*.py"])           # "**/" spans zero folders too
    assert glob_match("a/c.py", ["*.txt", "*.py"])       # any of the patterns
    assert not glob_match("a/c.py", [])


def test_gitignore_anchors_negates_dir_only_and_inherits(tmp_path):
    write(str(tmp_path / ".gitignore"), "# comment\n/top.txt\n*.log\n!keep.log\nbuild/\n")
    write(str(tmp_path / "sub" / ".gitignore"), "local.md\n")
    root = GitIgnore().child(str(tmp_path), "")
    sub = root.child(str(tmp_path / "sub"), "sub")
    assert root.ignored("top.txt", False) and not root.ignored("sub/top.txt", False)  # "/" anchors
    assert root.ignored("x.log", False) and root.ignored("sub/x.log", False)         # unanchored: any depth
    assert not root.ignored("keep.log", False)                                        # "!" re-includes
    assert root.ignored("build", True) and not root.ignored("build", False)          # "build/": folders only
    assert root.ignored("sub/build/out.md", False)                                   # ...and what is below one
    assert not root.ignored("# comment", False)
    # A folder's own .gitignore adds rules for what is below it; its parent's still hold.
    assert sub.ignored("sub/local.md", False) and not sub.ignored("local.md", False)
    assert not root.ignored("sub/local.md", False)
    assert sub.ignored("sub/x.log", False) and not sub.ignored("sub/keep.log", False)
    assert GitIgnore().child(str(tmp_path / "sub" / "none"), "sub/none").rules == []  # no file: no rules


def test_include_and_exclude_follow_gitignore_rules_at_any_depth(tmp_path):
    # numpy's layout: tests/ folders at the root and at several depths, stubs beside the code.
    src = tmp_path / "src" / "numpy"
    for rel in ("__init__.py", "__init__.pyi", "linalg/_linalg.py", "linalg/tests/test_linalg.py",
                "tests/test_public.py", "core/sub/tests/test_deep.py", "core/sub/impl.py", "tests_helper.py",
                "build/gen.py", "core/build/keep.py", "doc/notes.md", "doc/tests.md"):
        write(str(src / rel), "x = 1\n")
    kb = make_kb(tmp_path, sources=("src/numpy",), exclude=("tests/", "*.pyi", "/build"))
    assert sorted(kb.scan()) == ["numpy/__init__.py", "numpy/core/build/keep.py", "numpy/core/sub/impl.py",
                                 "numpy/doc/notes.md", "numpy/doc/tests.md", "numpy/linalg/_linalg.py",
                                 "numpy/tests_helper.py"]
    # An inner slash anchors to the source root; "**" spans folders; "!" takes a match back.
    kb = make_kb(tmp_path, sources=("src/numpy",), include=("linalg/*.py", "**/tests/*.py", "!core/**"))
    assert sorted(kb.scan()) == ["numpy/linalg/_linalg.py", "numpy/linalg/tests/test_linalg.py",
                                 "numpy/tests/test_public.py"]
    # A trailing slash matches folders only: "doc/" keeps nothing under doc/, "tests.md" the file itself.
    kb = make_kb(tmp_path, sources=("src/numpy",), include=("doc/",), exclude=("tests.md/",))
    assert sorted(kb.scan()) == ["numpy/doc/notes.md", "numpy/doc/tests.md"]


def test_glob_match_gitignore_semantics():
    assert glob_match("pkg/sub/tests", ["tests/"], is_dir=True)       # no inner slash: any depth
    assert glob_match("pkg/sub/tests/", ["tests/"])                   # a trailing "/" on rel: a folder
    assert glob_match("pkg/sub/tests/test_x.py", ["tests/"])          # ...and everything below it
    assert not glob_match("pkg/tests", ["tests/"], is_dir=False)      # a file named tests is no folder
    assert glob_match("a/b/__init__.pyi", ["*.pyi"])
    assert glob_match("build/x.py", ["/build"]) and not glob_match("a/build/x.py", ["/build"])
    assert not glob_match("x/docs/a.md", ["docs/*.md"]) and not glob_match("docs/sub/a.md", ["docs/*.md"])
    assert glob_match("a/x/y/b.py", ["a/**/b.py"]) and glob_match("a/b.py", ["a/**/b.py"])
    assert glob_match("a/x/y", ["a/**"]) and not glob_match("a", ["a/**"], is_dir=False)
    assert not glob_match("a/keep.log", ["*.log", "!keep.log"]) and glob_match("a/x.log", ["*.log", "!keep.log"])
    assert not glob_match("a.md", ["", "/", "!"])                     # empty patterns match nothing


def test_scan_roots_states_and_labels_on_their_own(tmp_path):
    write(str(tmp_path / "repo" / "numpy" / "core.py"), "x = 1\n")
    write(str(tmp_path / "repo" / "numpy" / "tests" / "test_core.py"), "x = 2\n")
    write(str(tmp_path / "documents" / "numpy" / "manifest.json"), "{}")
    (tmp_path / "only-binaries").mkdir()
    roots = source_roots("numpy", str(tmp_path), str(tmp_path / "documents" / "numpy"),
                         ["repo/numpy", "/nowhere/at/all", "only-binaries", "repo/numpy/*.md"])
    assert [r["label"] for r in roots] == ["documents", "numpy", "all", "only-binaries", "*.md"]
    found, states = scan_roots(roots, exclude=("tests/",), skip={"manifest.json"})
    assert sorted(found) == ["numpy/core.py"]
    assert [(s["state"], s["files"]) for s in states] == [
        ("empty", 0), ("ok", 1), ("missing", 0), ("empty", 0), ("empty", 0)]
    assert "/nowhere/at/all" in states[2]["message"] and "does not exist" in states[2]["message"]

