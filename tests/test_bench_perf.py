"""bench/perf.py's chroma part on tiny inputs: the built-in store beside a real Chroma server.

Run as a user runs it, as a process, on the ragproxy.py under test; no timing
is asserted.  (The lexical and dense parts are driven by tests/test_bench.py.)
"""
import json
import os
import subprocess
import sys

import pytest

import ragproxy

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH = os.path.join(ROOT, "bench")
sys.path.insert(0, BENCH)

import perf  # noqa: E402


def run_perf(*args, timeout=600):
    cmd = [sys.executable, os.path.join(BENCH, "perf.py"), "--only", "chroma", "--json"] + list(args) + [
        "--ragproxy", ragproxy.__file__]
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads([line for line in proc.stdout.splitlines() if line.startswith("{")][-1])["chroma"]


def check_dense_size(size, n):
    assert size["n"] == n and size["chroma"]["count"] == n
    sides = {s["side"].split(":")[0]: s for s in size["sides"]}
    assert set(sides) == {"built-in", "chroma"}
    assert sides["built-in"]["recall@10"] == 1.0   # exact search
    assert 0.0 <= sides["chroma"]["recall@10"] <= 1.0   # HNSW: approximate
    assert all(s["p50_ms"] > 0 and s["p99_ms"] >= s["p50_ms"] for s in sides.values())
    assert size["builtin"]["vectors_per_s"] > 0 and size["chroma"]["vectors_per_s"] > 0
    for side in ("builtin", "chroma"):
        assert size[side]["serve"]["rss_mib"] > 0, size[side]["serve"]


def test_chroma_dense_on_a_server_it_starts_itself():
    pytest.importorskip("numpy")
    if perf.find_chroma_bin() is None:
        if os.environ.get("RAGPROXY_REQUIRE_CHROMA") == "1":
            pytest.fail("RAGPROXY_REQUIRE_CHROMA=1 but no `chroma` command ($RAGPROXY_CHROMA_BIN, beside "
                        "this Python, PATH)")
        pytest.skip("no `chroma` command: pip install chromadb, or set RAGPROXY_CHROMA_BIN")
    report = run_perf("--chroma-sizes", "300", "--chroma-queries", "5")
    size = report["sizes"]["300"]
    check_dense_size(size, 300)
    # Its own server: its pid is known, so its memory is read, and it grew with the upsert.
    assert size["chroma"]["server_queried"]["rss_mib"] > 0
    assert report["server"].startswith("started here")


def test_chroma_dense_on_a_given_server(chroma_server):
    pytest.importorskip("numpy")
    report = run_perf("--chroma-url", chroma_server.url, "--chroma-sizes", "200", "--chroma-queries", "4")
    size = report["sizes"]["200"]
    check_dense_size(size, 200)
    assert size["chroma"]["server_queried"] == {"rss_mib": None, "peak_mib": None}   # not ours: not read


def tiny_beir(path):
    """Eight documents on distinct topics, four judged queries (BEIR layout)."""
    topics = ["volcano lava eruption magma", "penguin antarctic colony ice", "violin orchestra bow string",
              "bitcoin ledger block mining", "tomato garden soil compost", "glacier moraine valley ice",
              "telescope galaxy nebula star", "sourdough yeast flour bread"]
    path.mkdir()
    (path / "qrels").mkdir()
    with open(str(path / "corpus.jsonl"), "w") as f:
        for i, words in enumerate(topics):
            f.write(json.dumps({"_id": f"d{i}", "title": words.split()[0], "text": f"A note on {words}."}) + "\n")
    queries = {"q0": "magma eruption", "q1": "penguin colony", "q2": "glacier valley ice", "q3": "bread yeast"}
    with open(str(path / "queries.jsonl"), "w") as f:
        for qid, text in queries.items():
            f.write(json.dumps({"_id": qid, "text": text}) + "\n")
    (path / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\nq0\td0\t1\nq1\td1\t1\nq2\td5\t2\n"
                                             "q2\td1\t1\nq3\td7\t1\n")


def test_scifact_part_scores_both_stores_alike(tmp_path, fake, chroma_server):
    tiny_beir(tmp_path / "beir")
    report = run_perf("--chroma-url", chroma_server.url, "--chroma-sizes", "", "--scifact", str(tmp_path / "beir"),
                      "--embed-url", fake.url + "/v1", "--embed-model", "fake-embedding",
                      "--scifact-data-dir", str(tmp_path / "kbs"))
    assert report["sizes"] == {}
    sci = report["scifact"]
    simple, chroma = sci["simple"], sci["chroma_http"]
    assert set(simple["modes"]) == set(chroma["modes"]) == {"lexical", "dense", "hybrid"}
    assert simple["chunks"] == chroma["chunks"] == 8
    assert chroma["store_status"]["type"] == "chroma_http"
    assert simple["modes"]["lexical"]["ndcg@10"] > 0.5   # the queries name their documents' words
    for mode in ("lexical", "dense", "hybrid"):
        assert sci["match_3_decimals"][mode] is True, (mode, simple["modes"][mode], chroma["modes"][mode])
    # The second side took the first side's embeddings from its cache.
    assert os.path.isdir(str(tmp_path / "kbs" / "chroma_http" / "cache" / "embedding"))
