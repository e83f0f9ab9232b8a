"""The configured knowledge bases (_ragproxy.knowledgebases): config to KBs, reloads, the indexer thread.

KnowledgeBases in-process against folders under tmp_path: each KB's spec made
from its knowledge_bases entry (and the vectorstore block), KBs only a model
names served from their documents folder, the folders made at start, one
dense-scan slot shared by every KB of the process (dense_scan_slots), numpy
imported by a serving process before any search.  One KB's indexing and
search are test_kb's, whose folder fixture and embedder these tests borrow.
"""
import importlib.util
import os
import subprocess
import sys
import threading

import pytest
import test_kb
from test_kb import UNDECLARED, _SlowEmbedder, write

import ragproxy
from _ragproxy import deps
from _ragproxy.knowledgebases import _kb_spec, dense_scan_slots
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
