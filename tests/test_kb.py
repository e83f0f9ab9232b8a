"""Knowledge bases (_ragproxy.kb): scanning, incremental indexing, search modes, failure handling.

In-process against folders under tmp_path, with the fake upstream (real
sockets) as the embedding server where dense search is tested; one test
SIGKILLs `ragproxy.py index` in a subprocess.  Fusion of the ranked lists is
test_fusion's; .gitignore and glob rules are test_sources's; the configured set
(KnowledgeBases: configuration, the indexer thread, the dense-scan slot) is
test_knowledgebases's.
"""
import os
import threading

import pytest

import ragproxy
from _ragproxy import docfolder
from fake_upstream import FakeUpstream


def make_kb(tmp_path, embedder=None, **spec):
    spec.setdefault("name", "kb")
    return ragproxy.KnowledgeBase(ragproxy.KBSpec(**spec), str(tmp_path), embedder=embedder)


def write(path, text):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)


@pytest.fixture
def docs(tmp_path):
    root = tmp_path / "documents" / "kb"
    write(str(root / "a.md"), "# Alpha\n\nThe alpha service listens on port 7000.\n")
    write(str(root / "b.md"), "# Beta\n\nBeta retries failed uploads three times.\n")
    write(str(root / "src" / "pool.py"), "def open_pool(size):\n    '''Open a connection pool.'''\n"
                                        "    return [connect() for _ in range(size)]\n")
    return root


def ids_by_source(kb):
    generation, _ = kb.current()
    return {s: tuple(e["chunk_ids"]) for s, e in generation.manifest.items()}


def test_index_and_search(tmp_path, docs):
    kb = make_kb(tmp_path)
    report = kb.index()
    assert (report.added, report.changed, report.deleted) == (3, 0, 0) and report.committed
    hits = kb.search("which port does alpha listen on", 2)
    assert hits[0].chunk["source"] == "kb/a.md" and "lexical" in hits[0].scores
    code = kb.search("open_pool connection", 1)[0]
    assert code.chunk["symbol"] == "open_pool" and code.chunk["line_start"] == 1


def test_an_upload_indexed_before_its_name_was_recorded_is_renamed_on_the_next_pass(tmp_path, docs):
    # Uploads move files in, then record their names in manifest.json; an
    # index pass in between sees only the stored uuid name.
    stored = "0123456789abcdef0123456789abcdef.md"
    write(str(docs / stored), "# Backups\n\nRestores are rehearsed every quarter.\n")
    kb = make_kb(tmp_path)
    kb.index()
    assert kb.search("who rehearses restores", 1)[0].chunk["source"] == "kb/" + stored
    docfolder.write_manifest(str(docs), {stored: {"name": "guides/backup.md", "size": 1, "sha256": "x",
                                                  "uploaded_at": 0}})
    report = kb.index()
    assert (report.changed, report.unchanged) == (1, 3)  # the file's bytes did not change, its name did
    assert kb.search("who rehearses restores", 1)[0].chunk["source"] == "kb/guides/backup.md"
    assert not kb.index().committed  # and from then on it stays put


def test_incremental_touches_only_changed_files(tmp_path, docs):
    kb = make_kb(tmp_path)
    kb.index()
    before = ids_by_source(kb)
    again = kb.index()
    assert not again.committed and again.unchanged == 3  # nothing to do, no new generation
    write(str(docs / "b.md"), "# Beta\n\nBeta retries failed uploads five times.\n")
    os.utime(str(docs / "b.md"), ns=(1, 2 * 10**9))
    report = kb.index()
    assert (report.added, report.changed, report.unchanged) == (0, 1, 2)
    after = ids_by_source(kb)
    assert after["kb/a.md"] == before["kb/a.md"] and after["kb/src/pool.py"] == before["kb/src/pool.py"]
    assert after["kb/b.md"] != before["kb/b.md"]
    assert "five" in kb.search("beta retries", 1)[0].chunk["text"]
    os.remove(str(docs / "a.md"))
    report = kb.index()
    assert report.deleted == 1 and "kb/a.md" not in ids_by_source(kb)
    assert all(h.chunk["source"] != "kb/a.md" for h in kb.search("alpha port 7000", 5))


def test_touch_without_content_change_reuses_chunks(tmp_path, docs):
    kb = make_kb(tmp_path)
    kb.index()
    os.utime(str(docs / "a.md"), ns=(5, 5 * 10**9))
    report = kb.index()
    assert report.changed == 0 and report.unchanged == 3


def test_oversized_file_is_skipped_with_reason(tmp_path, docs):
    kb = make_kb(tmp_path, max_file_bytes=30)
    report = kb.index()
    reasons = dict(report.skipped)
    assert "max_file_bytes" in reasons["kb/a.md"]


def test_last_indexed_is_the_current_generations_commit_time_after_a_restart(tmp_path, docs):
    ticks = iter(range(1700000000, 1700001000, 10))
    kb = ragproxy.KnowledgeBase(ragproxy.KBSpec(name="kb"), str(tmp_path), clock=lambda: float(next(ticks)))
    assert kb.stats()["last_indexed"] is None            # nothing committed yet
    kb.index()
    committed = kb.stats()["last_indexed"]
    assert committed is not None and kb.stats()["generation"] == "g000001"
    # A restart, or another process (the CLI): the first run commits nothing, the time is still known.
    later = ragproxy.KnowledgeBase(ragproxy.KBSpec(name="kb"), str(tmp_path), clock=lambda: 1800000000.0)
    assert later.stats()["last_indexed"] == committed
    assert not later.index().committed and later.stats()["last_indexed"] == committed
    assert later.status["last_indexed"] == committed


def test_a_source_named_like_its_kb_keeps_its_name_and_the_documents_folder_yields(tmp_path):
    write(str(tmp_path / "src" / "numpy" / "linalg" / "_linalg.py"), "def norm(x):\n    return x\n")
    stored = "0123456789abcdef0123456789abcdef.md"
    write(str(tmp_path / "documents" / "numpy" / stored), "# Guide\n\nRead the guide.\n")
    docfolder.write_manifest(str(tmp_path / "documents" / "numpy"),
                             {stored: {"name": "guide.md", "size": 1, "sha256": "x", "uploaded_at": 0}})
    kb = make_kb(tmp_path, name="numpy", sources=(str(tmp_path / "src" / "numpy"),))
    assert kb.documents_label == "documents"
    kb.index()
    assert kb.search("norm", 1)[0].chunk["source"] == "numpy/linalg/_linalg.py"   # no stray "numpy_"
    assert kb.search("read the guide", 1)[0].chunk["source"] == "documents/guide.md"   # the upload's name
    assert [label for label, _ in kb.source_roots()] == ["documents", "numpy"]
    # Without the collision the documents folder keeps the KB's name; two sources of one name still differ.
    other = make_kb(tmp_path, name="kb", sources=("src/numpy", str(tmp_path / "documents" / "numpy")))
    assert [label for label, _ in other.source_roots()] == ["kb", "numpy", "numpy_"]


def test_a_missing_or_unreadable_source_is_reported_everywhere_once(tmp_path, docs, caplog):
    caplog.set_level("INFO", logger="ragproxy")
    write(str(tmp_path / "elsewhere" / "notes.txt"), "gamma rays are measured in grays")
    os.mkfifo(str(tmp_path / "pipe"))
    missing = str(tmp_path / "srv" / "does-not-exist")
    kb = make_kb(tmp_path, sources=(missing, "elsewhere", "pipe", "nowhere/*.md", "elsewhere/*.md"))
    kb.index()
    kb.index()   # the next poll says nothing new
    said = [r for r in caplog.records if r.levelname == "WARNING"]
    assert [m for m in (r.getMessage() for r in said) if missing in m] == \
        [f"kb kb: source {missing!r} does not exist"]   # named as written; a relative one with its path too
    assert len(said) == 4   # the missing path, the pipe, and the two patterns that match nothing
    for view in (kb.stats(), make_kb(tmp_path, sources=kb.spec.sources).stats()):   # this process, another
        states = [(s["kind"], s["label"], s["state"], s["files"]) for s in view["sources"]]
        assert states == [("documents", "kb", "ok", 3), ("source", "does-not-exist", "missing", 0),
                          ("source", "elsewhere", "ok", 1), ("source", "pipe", "unreadable", 0),
                          ("source", "*.md", "missing", 0), ("source", "*.md_", "empty", 0)]
        assert view["sources"][1]["source"] == missing and view["sources"][0]["source"] == "documents/kb/"
        assert len(view["warnings"]) == 4 and missing in view["warnings"][0]
    assert kb.readable_source_count() == 2 and kb.source_status() == kb.stats()["sources"]


def test_a_kb_with_no_readable_source_at_all_says_so_and_recovers(tmp_path, caplog):
    caplog.set_level("INFO", logger="ragproxy")
    kb = make_kb(tmp_path, sources=("srv/docs",))
    assert kb.readable_source_count() == 0   # before any run: the CLI's `index` exits non-zero on this
    report = kb.index()
    assert report.added == 0 and kb.readable_source_count() == 0
    warnings = kb.stats()["warnings"]
    assert len(warnings) == 2 and "has no readable source" in warnings[1]
    assert [s["state"] for s in kb.stats()["sources"]] == ["empty", "missing"]
    assert kb.stats()["sources"][0]["message"].startswith("no documents yet: drop files in " + kb.documents_dir)
    os.makedirs(str(tmp_path / "srv" / "docs" / "sub"))   # there now, but holding no file
    caplog.clear()
    kb.index()
    assert [s["state"] for s in kb.stats()["sources"]] == ["empty", "empty"] and kb.readable_source_count() == 0
    assert [r.getMessage() for r in caplog.records if r.levelname == "WARNING"] == [
        f"kb kb: source 'srv/docs' ({tmp_path / 'srv' / 'docs'}) holds no file that include/exclude let through"]
    write(str(tmp_path / "srv" / "docs" / "a.md"), "# A\n\nalpha\n")
    caplog.clear()
    kb.index()
    assert kb.readable_source_count() == 1 and kb.stats()["warnings"] == []
    assert [r.getMessage() for r in caplog.records if "readable again" in r.getMessage()] == \
        ["kb kb: source 'srv/docs' is readable again (1 files)"]
    assert make_kb(tmp_path, sources=("srv/docs",)).stats()["warnings"] == []


def test_skipped_files_are_listed_by_their_uploaded_name_and_not_reread(tmp_path, docs, caplog):
    caplog.set_level("INFO", logger="ragproxy")
    big, blob = "0123456789abcdef0123456789abcdef.md", "fedcba9876543210fedcba9876543210.md"
    write(str(docs / big), "# Big\n\n" + "many words here " * 40)
    with open(str(docs / blob), "wb") as f:
        f.write(b"\x00\x01 not text " * 4)
    docfolder.write_manifest(str(docs), {
        big: {"name": "guides/huge.md", "size": 1, "sha256": "x", "uploaded_at": 0},
        blob: {"name": "notes/odd.md", "size": 1, "sha256": "x", "uploaded_at": 0}})
    kb = make_kb(tmp_path, max_file_bytes=200)
    report = kb.index()
    assert sorted(report.skipped) == [("kb/guides/huge.md", "larger than max_file_bytes (647 > 200)"),
                                      ("kb/notes/odd.md", "binary file (contains NUL bytes)")]
    logged = [r for r in caplog.records if "skipped" in r.getMessage()]
    assert {r.getMessage() for r in logged} == {
        "kb kb: skipped kb/guides/huge.md: larger than max_file_bytes (647 > 200)",
        "kb kb: skipped kb/notes/odd.md: binary file (contains NUL bytes)"}
    assert [r.levelname for r in sorted(logged, key=lambda r: r.getMessage())] == ["WARNING", "INFO"]
    assert not any(big in r.getMessage() for r in caplog.records)   # the stored name is nobody's business
    listed = make_kb(tmp_path, max_file_bytes=200).stats()["skipped"]   # another process reads it from disk
    assert sorted(d["file"] for d in listed) == ["kb/guides/huge.md", "kb/notes/odd.md"]
    # Same size and mtime: not read again (new bytes it never looked at stay unseen), but still listed.
    st = os.stat(str(docs / blob))
    with open(str(docs / blob), "wb") as f:
        f.write(b"# Odd\n\nzebra text" + b" " * (st.st_size - 17))
    os.utime(str(docs / blob), ns=(st.st_atime_ns, st.st_mtime_ns))
    caplog.clear()
    report = make_kb(tmp_path, max_file_bytes=200).index()   # a restart: the memory is on disk
    assert len(report.skipped) == 2 and not [r for r in caplog.records if "skipped" in r.getMessage()]
    assert not kb.search("zebra", 1)
    os.utime(str(docs / blob), ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))   # the file changed
    report = kb.index()
    assert report.skipped == [("kb/guides/huge.md", "larger than max_file_bytes (647 > 200)")]
    assert kb.search("zebra", 1)[0].chunk["source"] == "kb/notes/odd.md"
    assert make_kb(tmp_path, max_file_bytes=1000).index().added == 1   # a higher limit reads it again


def test_a_fifo_in_a_source_is_not_read(tmp_path, docs):
    os.mkfifo(str(docs / "pipe.md"))   # opening it would wait for a writer forever
    kb = make_kb(tmp_path)
    runner = threading.Thread(target=kb.index, daemon=True)
    runner.start()
    runner.join(60)
    assert not runner.is_alive() and "kb/pipe.md" not in kb.scan() and kb.stats()["files"] == 3


def test_a_damaged_state_file_is_ignored_in_part(tmp_path, docs):
    kb = make_kb(tmp_path)
    kb.index()
    write(os.path.join(kb.root, "index_state.json"), '{"skipped": "oops", "warnings": ["kept"], "skip_cache": []}')
    assert kb.stats()["skipped"] == [] and kb.stats()["warnings"] == ["kept"]
    assert kb.index().unchanged == 3 and kb.stats()["warnings"] == []


def test_status_counts_files_and_chunks_as_indexing_goes(tmp_path, docs):
    kb = make_kb(tmp_path)
    seen = []
    report = kb.index(progress=lambda done, total, source: seen.append((done, total, kb.status["chunks"])))
    assert [(d, t) for d, t, _ in seen] == [(1, 3), (2, 3), (3, 3)]
    chunks = [c for _, _, c in seen]
    assert chunks[0] == 0 and chunks == sorted(chunks) and chunks[-1] < report.chunks
    assert kb.status["chunks"] == report.chunks and kb.status["done"] == kb.status["total"] == 3
    assert kb.stats()["run_chunks"] == report.chunks
    kb.index()   # nothing new: no chunk made in this run, and the KB's own count is not touched
    assert kb.status["chunks"] == kb.stats()["run_chunks"] == 0 and kb.stats()["chunks"] == report.chunks


def test_stats_show_the_status_source_where_another_process_indexes(tmp_path, docs):
    kb = make_kb(tmp_path)
    kb.index()
    own = kb.stats()
    store = {"type": "chroma_http", "role": "indexer"}
    kb.status_source = lambda k: {**k.status, "state": "indexing", "done": 1, "total": 9, "chunks": 4,
                                  "last_error": "slow disk", "store": store}
    seen = kb.stats()
    assert (seen["state"], seen["done"], seen["total"], seen["run_chunks"], seen["last_error"]) == \
        ("indexing", 1, 9, 4, "slow disk")
    assert seen["store"] == store and seen["chunks"] == own["chunks"] and seen["generation"] == own["generation"]
    assert kb.status["state"] == "idle"   # this process's own status is left as it was
    kb.status_source = None
    assert kb.stats() == own


def test_extra_sources_and_globs(tmp_path, docs):
    other = tmp_path / "elsewhere"
    write(str(other / "notes.txt"), "gamma rays are measured in grays")
    kb = make_kb(tmp_path, sources=("elsewhere", "elsewhere/*.txt"))
    assert {"elsewhere/notes.txt"} <= set(kb.scan())


class _SlowEmbedder:
    """Embeds with the fake upstream's function; can block to hold an index run open."""

    def __init__(self):
        self.gate = threading.Event()
        self.gate.set()
        self.calls = 0

    def embed(self, texts):
        from fake_upstream import embed_text
        self.calls += 1
        self.gate.wait(10)
        return [embed_text(t) for t in texts]

    def embed_query(self, text):
        from fake_upstream import embed_text
        return embed_text(text)


def test_queries_are_served_while_indexing(tmp_path, docs):
    embedder = _SlowEmbedder()
    kb = make_kb(tmp_path, embedder=embedder, retrieval="hybrid")
    kb.index()
    write(str(docs / "c.md"), "# Gamma\n\nGamma is new.\n")
    embedder.gate.clear()
    worker = threading.Thread(target=kb.index)
    worker.start()
    try:
        while kb.status["state"] != "indexing":
            pass
        hits = kb.search("alpha port", 1, mode="hybrid")  # the last committed generation answers
        assert hits[0].chunk["source"] == "kb/a.md"
    finally:
        embedder.gate.set()
        worker.join(10)
    assert any(h.chunk["source"] == "kb/c.md" for h in kb.search("gamma new", 3))


def test_dense_search_with_real_embedding_client(tmp_path, docs):
    with FakeUpstream() as fake:
        provider = ragproxy.Provider(name="emb", type="openai", base_url=fake.url + "/v1", model="m")
        client = ragproxy.EmbeddingClient(provider, ragproxy.make_http_pool(), str(tmp_path / "cache"))
        kb = make_kb(tmp_path, embedder=client, retrieval="dense")
        kb.index()
        hits = kb.search("beta retries failed uploads", 1)
        assert hits[0].chunk["source"] == "kb/b.md" and set(hits[0].scores) == {"dense"}
        assert -1.0 <= hits[0].score <= 1.0


def test_transient_embedding_failure_defers_file_and_keeps_old_version(tmp_path, docs):
    with FakeUpstream() as fake:
        provider = ragproxy.Provider(name="emb", type="openai", base_url=fake.url + "/v1", model="m")
        client = ragproxy.EmbeddingClient(provider, ragproxy.make_http_pool(), str(tmp_path / "cache"))
        kb = make_kb(tmp_path, embedder=client, retrieval="hybrid")
        kb.index()
        before = ids_by_source(kb)
        write(str(docs / "b.md"), "# Beta\n\nBeta now retries nine times.\n")
        os.utime(str(docs / "b.md"), ns=(1, 3 * 10**9))
        fake.fail_next(503, path="/v1/embeddings", count=10)
        report = kb.index()
        assert [s for s, _ in report.deferred] == ["kb/b.md"]
        assert ids_by_source(kb)["kb/b.md"] == before["kb/b.md"]  # untouched, not half-indexed
        deferred = make_kb(tmp_path, embedder=client, retrieval="hybrid").stats()["deferred"]  # another process
        assert [d["file"] for d in deferred] == ["kb/b.md"] and "503" in deferred[0]["reason"]
        fake.reset_faults()
        report = kb.index()
        assert report.changed == 1 and "nine" in kb.search("beta retries", 1)[0].chunk["text"]
        assert kb.stats()["deferred"] == []


def test_rate_limit_aborts_the_run(tmp_path, docs):
    with FakeUpstream() as fake:
        provider = ragproxy.Provider(name="emb", type="openai", base_url=fake.url + "/v1", model="m")
        client = ragproxy.EmbeddingClient(provider, ragproxy.make_http_pool(), str(tmp_path / "cache"))
        kb = make_kb(tmp_path, embedder=client, retrieval="dense")
        fake.fail_next(429, headers={"retry-after": "30"}, path="/v1/embeddings", count=10)
        with pytest.raises(ragproxy.EmbeddingRateLimited):
            kb.index()
        assert kb.current() == (None, None)  # nothing committed


def test_hybrid_top_k_is_a_prefix_of_a_deeper_search(tmp_path, fake):
    import random
    rng = random.Random(7)
    words = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu".split()
    docs = tmp_path / "documents" / "kb"
    docs.mkdir(parents=True)
    for i in range(300):
        (docs / f"d{i}.txt").write_text(" ".join(rng.choice(words) for _ in range(30)))
    provider = ragproxy.Provider(name="emb", type="openai", base_url=fake.url + "/v1", model="m")
    embedder = ragproxy.EmbeddingClient(provider, ragproxy.make_http_pool())
    kb = ragproxy.KnowledgeBase(ragproxy.KBSpec(name="kb", retrieval="hybrid", embedding="emb", chunk_size=64),
                                str(tmp_path), embedder=embedder)
    kb.index()
    deep = [h.id for h in kb.search("gamma delta kappa", top_k=250)]
    for k in (1, 5, 20, 100):
        assert [h.id for h in kb.search("gamma delta kappa", top_k=k)] == deep[:k]


def test_sigkill_during_indexing_never_leaves_a_broken_kb(tmp_path):
    """Kill `ragproxy.py index` at random moments of a run; every time the KB must load and answer.

    The kill waits for the run's own progress lines on stderr (a handshake,
    not a guess at how long Python takes to start): after the first line it
    lands while files are read, after the last one while the generation is
    written and committed.
    """
    import random
    import signal
    import subprocess
    import sys
    import time

    script = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "ragproxy.py")
    config = tmp_path / "config.yaml"
    config.write_text("providers:\n  llm:\n    o: {type: ollama, base_url: 'http://127.0.0.1:1'}\n"
                      "models:\n  - {name: '*', upstream: o}\napi_key_auth: false\n"
                      "knowledge_bases:\n  kb: {retrieval: lexical}\n")
    docs = tmp_path / "documents" / "kb"
    rng = random.Random(7)
    for i in range(120):
        write(str(docs / f"d{i:03d}.md"), f"# Doc {i}\n\n" + " ".join(f"word{rng.randrange(500)}"
                                                                   for _ in range(400)) + "\n")
    env = {k: v for k, v in os.environ.items() if k != "RAGPROXY_LOG_LEVEL"}
    index = [sys.executable, script, "index", "--data-dir", str(tmp_path), "--config", str(config)]
    subprocess.run(index, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, timeout=120)
    killed = []
    for round_ in range(12):
        for i in rng.sample(range(120), 10):  # change some files before every run
            write(str(docs / f"d{i:03d}.md"), f"# Doc {i} v{round_}\n\nmarker{round_}x{i} " +
                  " ".join(f"word{rng.randrange(500)}" for _ in range(300)) + "\n")
        proc = subprocess.Popen(index, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env,
                                universal_newlines=True)
        while_writing = round_ % 2 == 1
        for line in proc.stderr:   # "[kb] 1/120 files" when reading starts, "[kb] 120/120 files" when done
            if "/120 files" in line and (not while_writing or "120/120" in line):
                break
        time.sleep(rng.uniform(0.0, 0.05 if while_writing else 0.2))
        proc.send_signal(signal.SIGKILL)
        killed.append(proc.wait() == -signal.SIGKILL)
        proc.stderr.close()
        kb = make_kb(tmp_path)  # a fresh process's view: nothing cached
        generation, bm25 = kb.current()
        assert generation is not None   # the previous generation, or the one the killed run committed
        manifest = generation.manifest
        assert len(generation) == sum(len(e["chunk_ids"]) for e in manifest.values())
        stored = [c["id"] for c in generation.chunks]  # every line parses as a chunk
        assert sorted(stored) == sorted(cid for e in manifest.values() for cid in e["chunk_ids"])
        assert len(bm25) == len(generation)
        assert kb.search("word1 word2", 3)
    # A run left alone finishes, and finds the newest edits.
    subprocess.run([sys.executable, script, "index", "--data-dir", str(tmp_path), "--config", str(config)],
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, timeout=120)
    kb = make_kb(tmp_path)
    newest = [p for p in os.listdir(str(docs)) if "v11" in (docs / p).read_text()]
    hit = kb.search("marker11x" + newest[0][1:4].lstrip("0"), 1)
    assert hit and hit[0].chunk["source"] == "kb/" + newest[0]
    assert killed.count(True) >= 6   # the kills did land inside the runs


def test_changed_chunking_settings_rebuild_every_file(tmp_path, docs):
    kb = make_kb(tmp_path)
    kb.index()
    before = len(kb.current()[0])
    smaller = make_kb(tmp_path, chunk_size=16, chunk_overlap=0)
    report = smaller.index()
    assert report.committed and report.added == 3  # all files re-read, not just changed ones
    generation, _ = smaller.current()
    assert len(generation) > before
    assert not smaller.index().committed  # and the next run with the same settings has nothing to do


def test_stats_of_a_committed_generation_with_no_chunks_name_it(tmp_path, docs):
    kb = make_kb(tmp_path)
    kb.index()
    for path in ("a.md", "b.md", "src/pool.py"):
        os.unlink(str(docs / path))
    assert kb.index().committed
    stats = kb.stats()
    assert (stats["generation"], stats["chunks"], stats["files"]) == ("g000002", 0, 0)
    assert stats["last_indexed"] is not None


def test_a_store_built_by_an_older_analyzer_or_chunker_is_rebuilt_once(tmp_path, docs):
    import json

    kb = make_kb(tmp_path)
    kb.index()
    generation, _ = kb.current()
    settings = json.loads(generation.read_file("settings.json"))
    assert {"analyzer", "chunking"} <= set(settings)
    # What a store written before the versions were recorded holds: "C++" was indexed as "c".
    old = {k: v for k, v in settings.items() if k not in ("analyzer", "chunking")}
    with open(generation.path("settings.json"), "w") as f:
        json.dump(old, f)
    report = make_kb(tmp_path).index()
    assert report.committed and report.added == 3
    assert not make_kb(tmp_path).index().committed


UNDECLARED = """
providers:
  llm: {o: {type: ollama, base_url: "http://127.0.0.1:1"}}
models: [{name: "*", upstream: o, kb: [kb]}]
"""


# -- guardrails.redact at: index ---------------------------------------------------------------

CONTACT = "alice.ops@example.com"
AWS_KEY = "AKIAIOSFODNN7EXAMPLE"   # AWS's documented example access key id


def _stored_bytes(root):
    out = b""
    for folder, _, files in os.walk(str(root)):
        for name in files:
            with open(os.path.join(folder, name), "rb") as f:
                out += f.read()
    return out


def test_redaction_at_index_keeps_secrets_out_of_the_store_and_toggling_it_reindexes(tmp_path, docs):
    write(str(docs / "ops.md"), f"# On call\n\nPage the on-call lead at {CONTACT}; the deploy key is {AWS_KEY}.\n")
    rails = "guardrails:\n  redact: {enabled: true, at: index, categories: [email, cloud_token]}\n"
    kbs = ragproxy.KnowledgeBases(ragproxy.Config.from_text(UNDECLARED + rails, environ={}), str(tmp_path))
    kb = kbs.get("kb")
    assert kb.spec.redact == ("cloud_token", "email")
    report = kbs.index_all()[0]
    assert report.redactions == {"email": 1, "cloud_token": 1} and "2 redactions" in report.summary()
    hit = kb.search("who do I page on call", 1)[0]
    assert "[REDACTED:email]" in hit.chunk["text"] and "[REDACTED:cloud_token]" in hit.chunk["text"]
    stored = _stored_bytes(tmp_path / "vectordb")
    assert CONTACT.encode() not in stored and AWS_KEY.encode() not in stored and b"alice" not in stored
    assert all(CONTACT not in h.chunk["text"] for h in kb.search("alice ops example", 5))
    import json
    settings = json.loads(kb.current()[0].read_file("settings.json"))
    assert settings["redact"] == ["cloud_token", "email"]
    assert not kb.index().committed   # nothing changed: nothing to do
    # Turned off, every file is indexed again, as written.
    kbs.configure(ragproxy.Config.from_text(UNDECLARED, environ={}))
    plain = kbs.get("kb")
    assert plain is not kb and plain.spec.redact == ()
    report = kbs.index_all()[0]
    assert report.committed and report.added == 4 and report.redactions == {}
    assert CONTACT in plain.search("who do I page on call", 1)[0].chunk["text"]
    assert "redact" not in json.loads(plain.current()[0].read_file("settings.json"))


def test_redaction_at_inject_leaves_the_store_as_written(tmp_path, docs):
    write(str(docs / "ops.md"), f"# On call\n\nPage the on-call lead at {CONTACT}.\n")
    rails = "guardrails:\n  redact: {enabled: true}\n"
    kbs = ragproxy.KnowledgeBases(ragproxy.Config.from_text(UNDECLARED + rails, environ={}), str(tmp_path))
    assert kbs.get("kb").spec.redact == ()
    kbs.index_all()
    assert CONTACT in kbs.get("kb").search("who do I page on call", 1)[0].chunk["text"]


def test_a_builtin_kb_reports_its_store(tmp_path, docs):
    kb = make_kb(tmp_path, embedder=_SlowEmbedder(), retrieval="hybrid")
    assert kb.store_status() == {"type": "simple", "collection": None, "reachable": None, "error": None,
                                 "role": None, "vectors": 0, "checked_at": None}
    assert kb.test_store()["message"] == "built-in store: nothing indexed yet"
    kb.index()
    chunks = len(kb.current()[0])
    assert kb.stats()["store"]["vectors"] == chunks
    test = kb.test_store()
    assert test["ok"] and test["vectors"] == chunks and test["collection"] is None and test["latency_ms"] >= 0
    assert not kb.sync()   # only a KB on Chroma has a commit to follow

