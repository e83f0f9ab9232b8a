"""bench/compression.py run as a user runs it, on tiny slices: the shape of what it prints.

A made-up BEIR collection drives the rag_select part (and the SciFact
slice when ../shared/eval holds it); the window_fit part runs on three
generated transcripts per shape.  No timing is asserted.
"""
import json
import os
import subprocess
import sys

import pytest

import ragproxy

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "bench", "compression.py")
SCIFACT = os.path.join(os.path.dirname(ROOT), "shared", "eval", "scifact")


def run(*args):
    proc = subprocess.run([sys.executable, SCRIPT] + list(args) + ["--ragproxy", ragproxy.__file__],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True, timeout=300)
    rows = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    return proc, rows


def tiny_collection(path):
    topics = ["insulin resistance in muscle", "vitamin d and bone density", "smoking and lung cancer risk",
              "sleep deprivation and memory", "statins lower cholesterol"]
    os.makedirs(os.path.join(path, "qrels"))
    with open(os.path.join(path, "corpus.jsonl"), "w") as f:
        for n in range(40):
            topic = topics[n % len(topics)]
            f.write(json.dumps({"_id": "d%d" % n, "title": "study %d" % n,
                                "text": "A study of %s. Finding number %d about %s in adults." % (topic, n, topic)})
                    + "\n")
    with open(os.path.join(path, "queries.jsonl"), "w") as f:
        for q, topic in enumerate(topics):
            f.write(json.dumps({"_id": "q%d" % q, "text": "does %s matter in adults" % topic}) + "\n")
    with open(os.path.join(path, "qrels", "test.tsv"), "w") as f:
        f.write("query-id\tcorpus-id\tscore\n")
        for q in range(len(topics)):
            f.write("q%d\td%d\t1\n" % (q, q))
            f.write("q%d\td%d\t1\n" % (q, q + len(topics)))


def check_rag(rows, queries):
    rag = {r["ranking"]: r for r in rows if r["part"] == "rag_select"}
    assert sorted(rag) == ["all 20", "lexical", "supplied"]
    for name, r in rag.items():
        assert r["queries"] == queries and r["top_chunks"] == 20 and r["max_chunks"] == 5
        assert 0 <= r["ndcg@10"] <= 1 and 0 <= r["recall@5"] <= r["recall@20"] <= 1
        assert r["tokens_before"] == rag["all 20"]["tokens_before"] > 0
    assert rag["all 20"]["saved_percent"] == 0 and 5 < rag["all 20"]["chunks_kept"] <= 20
    for name in ("supplied", "lexical"):
        assert rag[name]["applied"] == queries and rag[name]["chunks_kept"] == 5
        assert 0 < rag[name]["tokens_after"] < rag[name]["tokens_before"] and rag[name]["saved_percent"] > 50
        # Five of the twenty can only find fewer of the relevant documents than all twenty.
        assert rag[name]["recall@20"] <= rag["all 20"]["recall@20"]
    return rag


def test_rag_select_part_on_a_tiny_collection(tmp_path):
    tiny_collection(str(tmp_path / "tiny"))
    proc, rows = run("--part", "rag", "--collection", str(tmp_path / "tiny"))
    assert proc.returncode == 0, proc.stderr
    rag = check_rag(rows, 5)
    assert rag["all 20"]["chunks_kept"] == 20          # "adults" is in every document
    # Every query's two relevant documents are in its top 20, so all 20 recall them all.
    assert rag["all 20"]["recall@20"] == 1.0
    assert "rag_select on SciFact test: 5 queries" in proc.stdout


def test_window_part_three_transcripts():
    proc, rows = run("--part", "window", "--transcripts", "3", "--budgets", "8000,32000")
    assert proc.returncode == 0, proc.stderr
    win = [r for r in rows if r["part"] == "window_fit"]
    assert sorted((r["api"], r["budget"], r["low_water"]) for r in win) == sorted(
        (api, budget, low) for api in ("chat", "messages") for budget in (8000, 32000) for low in (0.75, 1.0))
    for r in win:
        assert r["transcripts"] == 3 and r["invalid"] == 0
        assert sum(r["reasons"].values()) == r["rounds"] == r["valid"] >= 3 * 20
        assert set(r["reasons"]) <= {"applied", "not_needed", "not_eligible"}
        if r["reasons"].get("applied"):
            assert 0 < r["kept_share_min"] <= r["kept_share_mean"] <= r["kept_share_max"] <= 1
        assert 0 <= r["prefix_changes_per_100_rounds"] <= 100
    by = {(r["api"], r["budget"], r["low_water"]): r for r in win}
    for api in ("chat", "messages"):
        # A smaller budget cuts more often; the low-water mark changes the prefix less often than cutting
        # only what must go.
        assert by[api, 8000, 0.75]["reasons"]["applied"] > by[api, 32000, 0.75]["reasons"].get("applied", 0)
        assert by[api, 8000, 0.75]["prefix_changes_per_100_rounds"] < by[api, 8000, 1.0][
            "prefix_changes_per_100_rounds"]
    assert "window_fit on generated agent transcripts (3 per shape" in proc.stdout


@pytest.mark.skipif(not os.path.isdir(SCIFACT), reason="../shared/eval/scifact is not there")
def test_both_parts_on_a_scifact_slice():
    proc, rows = run("--queries", "5", "--transcripts", "1", "--budgets", "16000")
    assert proc.returncode == 0, proc.stderr
    check_rag(rows, 5)
    assert len([r for r in rows if r["part"] == "window_fit"]) == 4


def test_bad_arguments_exit_2():
    for args in (["--budgets", "8k"], ["--budgets", "0"], ["--part", "nope"]):
        proc, _ = run(*args)
        assert proc.returncode == 2 and "usage" in proc.stderr
