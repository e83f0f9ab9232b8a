"""Which files of a knowledge base's sources are indexed (_ragproxy.sources): .gitignore rules and globs.

In-process, on real folders under tmp_path, through KnowledgeBase.scan()
as the indexer walks them (test_kb's helpers).
"""
import test_kb
from test_kb import make_kb, write

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

