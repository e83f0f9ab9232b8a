"""The configured knowledge bases (_ragproxy.knowledgebases): config to KBs, reloads, the indexer thread.

KnowledgeBases in-process against folders under tmp_path: each KB's spec made
from its knowledge_bases entry (and the vectorstore block), KBs only a model
names served from their documents folder, the folders made at start, one
dense-scan slot shared by every KB of the process (dense_scan_slots), numpy
imported by a serving process before any search.  Two KnowledgeBases on one
data and run directory stand for two serve workers sharing one indexer
(share_indexer): a request left by the one that does not index is indexed by
the owner, whose live status it shows, or "unknown" when that is stale or
absent; it starts no thread and never calls Chroma.  One KB's indexing and
search are test_kb's, whose folder fixture and embedder these tests borrow.
"""
import importlib.util
import json
import os
import socket
import subprocess
import sys
import threading
import time

import pytest
import test_kb
from test_kb import UNDECLARED, _SlowEmbedder, write

import ragproxy
from _ragproxy import deps
from _ragproxy.knowledgebases import HEARTBEAT, REQUESTS_DIR, STALE_AFTER, STATUS_FILE, _kb_spec, dense_scan_slots
from _ragproxy.vectorstore import StoreSpec
from fake_upstream import FakeUpstream

docs = test_kb.docs   # the fixture: a KB's documents folder with a.md, b.md, src/pool.py


def test_the_vectorstore_keys_make_each_kbs_store_spec():
    config = ragproxy.Config.from_text("""
providers:
  llm: {o: {type: ollama, base_url: "http://127.0.0.1:1"}}
models: [{name: "*", upstream: o}]
vectorstore:
  type: chroma_http
  chroma_http: {base_url: "http://chroma:8000", tenant: t, database: d, collection_prefix: team_, indexer: never,
                timeout: 4, sync_interval: 2, token: s3cret}
knowledge_bases:
  big: {}
  small: {vectorstore: simple}
""", environ={})
    stores = config.raw["vectorstore"]
    big = _kb_spec("big", config.knowledge_bases["big"], stores=stores).store
    assert (big.type, big.base_url, big.tenant, big.database, big.collection_prefix, big.indexer, big.timeout,
            big.sync_interval, big.token) == ("chroma_http", "http://chroma:8000", "t", "d", "team_", "never", 4, 2,
                                              "s3cret")
    assert _kb_spec("small", config.knowledge_bases["small"], stores=stores).store == StoreSpec()
    assert _kb_spec("big", config.knowledge_bases["big"]).store == StoreSpec()   # no vectorstore block given


@pytest.mark.parametrize("compact", ["int8", "float16", "binary"])
def test_compact_vectors_from_config(tmp_path, docs, compact):
    config = ragproxy.Config.from_text(f"""
providers:
  llm: {{o: {{type: ollama, base_url: "http://127.0.0.1:1"}}}}
  embedding: {{e: {{type: openai, base_url: "http://127.0.0.1:1/v1", model: m}}}}
models: [{{name: "*", upstream: o}}]
knowledge_bases:
  kb: {{retrieval: dense, embedding: e, compact: {compact}}}
""", environ={})
    spec = _kb_spec("kb", config.knowledge_bases["kb"])
    kb = ragproxy.KnowledgeBase(spec, str(tmp_path), embedder=_SlowEmbedder())
    kb.index()
    generation, _ = kb.current()
    assert generation.compact_kind == {"int8": "i8", "float16": "f16", "binary": "b1"}[compact]
    assert kb.search("beta retries failed uploads", 1)[0].chunk["source"] == "kb/b.md"


def test_a_kb_a_model_names_without_declaring_serves_its_documents_folder(tmp_path, docs, caplog):
    # The panel of the project ragproxy models its config on creates KBs without a
    # knowledge_bases entry; their documents are in DATA_DIR/documents/<kb>/.
    caplog.set_level("INFO", logger="ragproxy")
    kbs = ragproxy.KnowledgeBases(ragproxy.Config.from_text(UNDECLARED, environ={}), str(tmp_path))
    kb = kbs.get("kb")
    assert kb.documents_dir == str(docs) and kb.spec == ragproxy.KBSpec(name="kb")   # default settings
    kbs.index_all()
    assert kb.search("beta retries failed uploads", 1)[0].chunk["source"] == "kb/b.md"
    said = [r for r in caplog.records if "not declared" in r.getMessage()]
    assert len(said) == 1 and "'kb'" in said[0].getMessage() and str(docs) + os.sep in said[0].getMessage()
    assert "models[0].kb[0], line 4" in said[0].getMessage()
    kbs.configure(ragproxy.Config.from_text(UNDECLARED, environ={}))   # a reload of the same file
    declared = ragproxy.Config.from_text(UNDECLARED + "knowledge_bases:\n  kb: {}\n", environ={})
    assert declared.undeclared_kbs == {}
    kbs.configure(declared)   # declared with its defaults, as the panel's Declare button writes it
    assert kbs.get("kb") is kb and len([r for r in caplog.records if "not declared" in r.getMessage()]) == 1


def test_an_undeclared_kb_close_to_a_declared_name_is_a_warning(tmp_path, caplog):
    text = UNDECLARED.replace("kb: [kb]", "kb: [handbok]") + "knowledge_bases:\n  handbook: {}\n"
    ragproxy.KnowledgeBases(ragproxy.Config.from_text(text, environ={}), str(tmp_path))
    said = [r for r in caplog.records if "not declared" in r.getMessage()]
    assert len(said) == 1 and said[0].levelname == "WARNING" and "did you mean 'handbook'?" in said[0].getMessage()


def test_start_creates_every_configured_kbs_documents_folder(tmp_path):
    text = UNDECLARED + "knowledge_bases:\n  docs: {}\n  handbook: {sources: [elsewhere]}\n"
    kbs = ragproxy.KnowledgeBases(ragproxy.Config.from_text(text, environ={}), str(tmp_path))
    assert not (tmp_path / "documents").exists()   # constructing them (the CLI) creates nothing
    assert not kbs.indexer_running()
    kbs.start()
    assert kbs.indexer_running()
    try:
        for name in ("docs", "handbook", "kb"):
            assert (tmp_path / "documents" / name).is_dir()
        kbs.configure(ragproxy.Config.from_text(text + "  added: {}\n", environ={}))   # a reload while serving
        assert (tmp_path / "documents" / "added").is_dir()
    finally:
        kbs.stop(wait=30)
    assert not kbs.indexer_running()   # what a stopping server waits for (cli.INDEXER_STOP_WAIT)


def test_the_kbs_of_a_process_scan_their_vectors_one_at_a_time(tmp_path):
    """Dense scans run on numpy's BLAS threads, shared by the whole process: two at once oversubscribe
    them, so every KB of one KnowledgeBases waits for the one lock (the bench figures are knowledgebases.py's)."""
    with FakeUpstream() as fake:
        text = UNDECLARED.replace("kb: [kb]", "kb: [a, b]").replace(
            "providers:\n", f'providers:\n  embedding: {{e: {{type: openai, base_url: "{fake.url}/v1", model: m}}}}\n')
        text += "knowledge_bases:\n  a: {retrieval: dense, embedding: e}\n  b: {retrieval: hybrid, embedding: e}\n"
        for name in ("a", "b"):
            write(str(tmp_path / "documents" / name / "x.md"), f"# {name}\n\nThe {name} service retries uploads.\n")
        kbs = ragproxy.KnowledgeBases(ragproxy.Config.from_text(text, environ={}), str(tmp_path), environ={})
        kbs.index_all()
        a, b = kbs.get("a"), kbs.get("b")
        assert a.dense_scoring is b.dense_scoring
        found = []
        searcher = threading.Thread(target=lambda: found.extend(b.search("which service retries uploads", 1)))
        with a.dense_scoring:   # a's scan under way
            searcher.start()
            searcher.join(0.5)
            assert searcher.is_alive() and not found   # b's scan waits for it
        searcher.join(30)
        assert not searcher.is_alive() and found[0].chunk["source"] == "b/x.md"
        assert ragproxy.KnowledgeBase(b.spec, str(tmp_path)).dense_scoring is not a.dense_scoring   # a lone KB: its own


def test_dense_scans_at_once_are_the_cpus_over_the_blas_threads_each_takes(tmp_path):
    assert dense_scan_slots({}, 8) == 1   # BLAS left to itself takes every CPU
    assert dense_scan_slots({"OPENBLAS_NUM_THREADS": "1"}, 8) == 8
    assert dense_scan_slots({"OMP_NUM_THREADS": "2"}, 8) == 4
    assert dense_scan_slots({"OPENBLAS_NUM_THREADS": "4", "OMP_NUM_THREADS": "1"}, 2) == 1
    assert dense_scan_slots({"MKL_NUM_THREADS": "0", "OMP_NUM_THREADS": "x"}, None) == 1
    kbs = ragproxy.KnowledgeBases(ragproxy.Config.from_text(UNDECLARED, environ={}), str(tmp_path),
                                  environ={"OPENBLAS_NUM_THREADS": "1"})
    slots = kbs.get("kb").dense_scoring
    assert all(slots.acquire(blocking=False) for _ in range(os.cpu_count() or 1))
    assert not slots.acquire(blocking=False)


def test_a_serving_kbs_imports_numpy_before_any_search_and_a_command_never(tmp_path):
    """start() (the server's) imports numpy off the request path, so no first search runs on a
    loaded index's pure path; constructing them (a one-shot CLI command) imports nothing."""
    code = (
        "import sys, ragproxy\n"
        "kbs = ragproxy.KnowledgeBases(ragproxy.Config.from_text(sys.argv[1], environ={}), sys.argv[2])\n"
        "before = 'numpy' in sys.modules\n"
        "kbs.start()\n"
        "kbs.stop(wait=30)\n"
        "print(before, 'numpy' in sys.modules)\n")
    text = UNDECLARED + "knowledge_bases:\n  docs: {}\n"
    write(str(tmp_path / "documents" / "docs" / "a.md"), "# Install\n\nRun the installer, then restart.\n")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    for _ in ("index", "restart"):   # the restart finds the index current: nothing for numpy to build
        out = subprocess.run([sys.executable, "-c", code, text, str(tmp_path)], cwd=root, capture_output=True,
                             text=True, timeout=120)
        assert out.returncode == 0, out.stderr
    numpy_usable = importlib.util.find_spec("numpy") is not None and not deps.pure_mode()
    assert out.stdout.split() == ["False", str(numpy_usable)]


# -- workers sharing one indexer (share_indexer) ---------------------------------------------

QUIET = UNDECLARED + "rag: {index_interval: 3600}\n"   # nothing but a request or start-up makes the owner index


def workers(tmp_path, text=QUIET, clock=time.time):
    """The owner and another worker on one data directory and one run directory, as serve --workers makes them."""
    run = tmp_path / "run"
    run.mkdir(exist_ok=True)
    owner = ragproxy.KnowledgeBases(ragproxy.Config.from_text(text, environ={}), str(tmp_path), clock=clock)
    other = ragproxy.KnowledgeBases(ragproxy.Config.from_text(text, environ={}), str(tmp_path), clock=clock)
    owner.share_indexer(str(run), owner=True)
    other.share_indexer(str(run), owner=False)
    return owner, other


def pending(tmp_path):
    return sorted(n for n in os.listdir(str(tmp_path / "run" / REQUESTS_DIR)) if not n.startswith("."))


def wait_for(condition, what, limit=30.0):
    deadline = time.monotonic() + limit
    while not condition():
        assert time.monotonic() < deadline, f"gave up waiting for {what}"
        time.sleep(0.02)


def test_an_index_request_left_by_another_worker_is_indexed_by_the_owner(tmp_path, docs):
    owner, other = workers(tmp_path)
    threads = set(threading.enumerate())
    other.start()
    assert set(threading.enumerate()) <= threads and not other.indexer_running()   # no indexer, no relay
    owner.start()
    try:
        assert owner.indexer_running()
        wait_for(lambda: other.get("kb").stats()["files"] == 3 and other.get("kb").stats()["state"] == "idle",
                 "the owner's start-up run, seen by the other worker")
        write(str(docs / "c.md"), "# Gamma\n\nGamma rays are measured at dawn.\n")
        other.request_index("kb")
        wait_for(lambda: "kb/c.md" in other.get("kb").current()[0].manifest, "the requested run's commit")
        assert other.get("kb").search("when are gamma rays measured", 1)[0].chunk["source"] == "kb/c.md"
        assert pending(tmp_path) == []   # taken, not left to be taken again
    finally:
        owner.stop(wait=30)
        other.stop(wait=30)
    assert not owner.indexer_running() and not other.indexer_running()


def test_the_other_worker_shows_the_owners_status_while_it_indexes(tmp_path, docs):
    text = QUIET.replace("providers:\n", 'providers:\n  embedding: {e: {type: openai, base_url: '
                                           '"http://127.0.0.1:1/v1", model: m}}\n')
    text += "knowledge_bases:\n  kb: {retrieval: dense, embedding: e}\n"
    owner, other = workers(tmp_path, text)
    embedder = owner.get("kb").embedder = _SlowEmbedder()
    embedder.gate.clear()   # the owner's run holds at its first batch of vectors
    other.start()
    assert other.get("kb").stats()["state"] == "unknown"   # nothing published yet
    owner.start()
    try:
        # Held at its first batch, the run has been through every file: its progress must show it.
        wait_for(lambda: (other.get("kb").stats()["done"], other.get("kb").stats()["total"]) == (3, 3),
                 "the owner's run, as published")
        seen = other.get("kb").stats()
        assert (seen["state"], seen["done"], seen["generation"]) == ("indexing", 3, None)
        assert "state_reason" not in seen and embedder.calls == 1
        embedder.gate.set()
        wait_for(lambda: other.get("kb").stats()["state"] == "idle", "the end of the run, as published")
        seen = other.get("kb").stats()
        assert seen["last_report"].startswith("kb: 3 added") and seen["files"] == 3 and seen["chunks"] > 0
    finally:
        embedder.gate.set()
        owner.stop(wait=30)


def test_the_other_worker_says_unknown_when_the_owners_status_is_stale_or_absent(tmp_path):
    now = [1000.0]
    owner, other = workers(tmp_path, clock=lambda: now[0])
    seen = other.get("kb").stats()
    assert seen["state"] == "unknown" and "no status" in seen["state_reason"]
    owner.get("kb").status.update(state="indexing", done=2, total=5, chunks=7, last_error="disk full")
    assert owner.relay()
    seen = other.get("kb").stats()
    assert (seen["state"], seen["done"], seen["total"], seen["run_chunks"], seen["last_error"]) == \
        ("indexing", 2, 5, 7, "disk full")
    now[0] += 1
    assert not owner.relay()   # unchanged: not written again before the heartbeat is due
    now[0] += HEARTBEAT
    assert owner.relay()   # the heartbeat
    now[0] += STALE_AFTER - 1
    assert other.get("kb").stats()["state"] == "indexing"
    now[0] += 2   # the owner stopped publishing: dead or hung
    seen = other.get("kb").stats()
    assert seen["state"] == "unknown" and "16 s ago" in seen["state_reason"] and seen["last_error"] is None
    assert owner.relay()
    with pytest.raises(RuntimeError):
        other.relay()   # its idle status would hide the owner's
    owner.get("kb").status.update(state="idle", last_error=None)
    owner.relay()
    other.request_index("kb")   # left, not yet taken: queued, as a lone process shows it
    assert other.get("kb").stats()["state"] == "queued"
    (tmp_path / "run" / STATUS_FILE).write_text("{not json")
    seen = other.get("kb").stats()
    assert seen["state"] == "unknown" and "unreadable" in seen["state_reason"]
    (tmp_path / "run" / STATUS_FILE).write_text(json.dumps({"format": 1, "at": now[0], "kbs": {}}))
    seen = other.get("kb").stats()   # an owner whose config does not have it yet
    assert seen["state"] == "unknown" and "does not serve" in seen["state_reason"]


def test_a_kb_name_with_odd_characters_round_trips_through_a_request_file(tmp_path, caplog):
    odd = "../we ird/:*?\"<>|\\\x00\u00e9\u540d\n" + "x" * 300   # no file system would take it as a name
    owner, other = workers(tmp_path)
    other.request_index(odd, full=True)
    other.request_index(odd, full=True)   # left again before it was taken: the same request
    other.request_index(odd)
    other.request_index()
    assert len(pending(tmp_path)) == 3
    (tmp_path / "run" / REQUESTS_DIR / "junk").write_bytes(b"\xff")
    taken = []
    owner.request_index = lambda name=None, full=False: taken.append((name, full))
    assert owner.take_requests() == 3
    assert sorted(taken, key=repr) == sorted([(odd, True), (odd, False), (None, False)], key=repr)
    assert pending(tmp_path) == [] and os.listdir(str(tmp_path / "run" / REQUESTS_DIR)) == []
    assert any("unreadable index request" in r.getMessage() for r in caplog.records)


def test_a_worker_that_does_not_index_never_calls_chroma_and_the_owner_does(tmp_path):
    """The other worker takes no lease and syncs no mirror: the owner does both, into the shared data
    directory, and the other reads the mirror as it reads a local store.  A listener stands for Chroma."""
    with socket.socket() as chroma:
        chroma.bind(("127.0.0.1", 0))
        chroma.listen(8)
        text = QUIET + (f"vectorstore:\n  type: chroma_http\n  chroma_http: {{base_url: "
                        f"\"http://127.0.0.1:{chroma.getsockname()[1]}\", indexer: auto, timeout: 1}}\n"
                        "knowledge_bases:\n  big: {}\n")
        owner, other = workers(tmp_path, text)
        threads = set(threading.enumerate())
        other.start()
        other.request_index("big", full=True)
        seen = other.get("big").stats()
        assert seen["state"] == "unknown" and seen["store"]["role"] is None
        other.stop(wait=30)
        assert set(threading.enumerate()) <= threads and not other.indexer_running()
        chroma.settimeout(0)
        with pytest.raises(BlockingIOError):
            chroma.accept()   # no connection was ever made
        chroma.settimeout(30)
        owner.start()
        try:
            conn, _ = chroma.accept()   # the owner asks for the lease
            conn.close()
        finally:
            chroma.close()
            owner.stop(wait=30)
        assert not owner.indexer_running()
