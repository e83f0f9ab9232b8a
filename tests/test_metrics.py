"""The Prometheus metrics registry (_ragproxy.metrics): counters, gauges, histograms and collectors, in-process.

Observations are the request log's entry dicts (test_reqlog's entry());
the rendered text is checked both as strings and through prometheus_client's
own parser.  The /metrics endpoint of a running proxy is test_reqlog's
(wired into the proxy).
"""
import gc
import math
import sys
import threading
import time

import pytest
from test_reqlog import entry

from _ragproxy.metrics import Metrics

TRICKY = 'we"ird\\model\nname'


def observe_sample_requests(metrics):
    metrics.observe_request(entry(model="gpt-4o", outcome="retrieved", status=200, retrieval_ms=30.0,
                                  context_tokens=300, upstream="oa", upstream_ms=800.0,
                                  retrieval_stages={"lexical": 0.004, "embed": 0.02}))
    metrics.observe_request(entry(model="gpt-4o", outcome="retrieved", status=200, retrieval_ms=3.0,
                                  context_tokens=1500, upstream="oa", upstream_ms=2000.0, retrieval_stages=None))
    metrics.observe_request(entry(model=TRICKY, outcome="skipped", status=502, retrieval_ms=None,
                                  context_tokens=None, upstream="an", upstream_ms=100.0))


def test_render_text_escapes_label_values():
    m = Metrics()
    observe_sample_requests(m)
    text = m.render()
    assert text.endswith("\n")
    assert '# TYPE ragproxy_requests_total counter' in text
    assert 'ragproxy_requests_total{model="we\\"ird\\\\model\\nname",outcome="skipped",status="502"} 1\n' in text
    assert 'ragproxy_requests_total{model="gpt-4o",outcome="retrieved",status="200"} 2\n' in text
    assert 'ragproxy_context_tokens_bucket{le="+Inf"} 2\n' in text


def test_render_parses_with_prometheus_client_and_matches_observations():
    from prometheus_client import parser  # requirements-test.txt: never skipped
    m = Metrics()
    observe_sample_requests(m)
    m.observe_index("docs", indexed=5, skipped=2, deferred=1, errors=3)
    families = {f.name: f for f in parser.text_string_to_metric_families(m.render())}

    requests = {(s.labels["model"], s.labels["outcome"], s.labels["status"]): s.value
                for s in families["ragproxy_requests"].samples}
    assert families["ragproxy_requests"].type == "counter"
    assert requests == {("gpt-4o", "retrieved", "200"): 2.0, (TRICKY, "skipped", "502"): 1.0}

    retrieval = families["ragproxy_retrieval_seconds"]
    assert retrieval.type == "histogram"
    by_stage = {}
    for s in retrieval.samples:
        by_stage.setdefault(s.labels["stage"], {})[(s.name, s.labels.get("le"))] = s.value
    assert set(by_stage) == {"lexical", "embed", "total"}
    total = by_stage["total"]          # from retrieval_ms: 0.030 and 0.003 seconds
    assert total[("ragproxy_retrieval_seconds_count", None)] == 2
    assert total[("ragproxy_retrieval_seconds_sum", None)] == pytest.approx(0.033)
    buckets = sorted(((float(le), v) for (name, le), v in total.items() if name.endswith("_bucket")))
    assert buckets[-1] == (math.inf, 2)
    assert [v for _, v in buckets] == sorted(v for _, v in buckets)     # cumulative
    assert {le: v for le, v in buckets if le in (0.001, 0.0025, 0.005, 0.025, 0.05)} == {
        0.001: 0, 0.0025: 0, 0.005: 1, 0.025: 1, 0.05: 2}
    assert by_stage["lexical"][("ragproxy_retrieval_seconds_bucket", "0.005")] == 1
    assert by_stage["lexical"][("ragproxy_retrieval_seconds_bucket", "0.0025")] == 0

    tokens = {(s.name, s.labels.get("le")): s.value for s in families["ragproxy_context_tokens"].samples}
    assert tokens[("ragproxy_context_tokens_count", None)] == 2          # the skipped request is not counted
    assert tokens[("ragproxy_context_tokens_sum", None)] == 1800
    assert tokens[("ragproxy_context_tokens_bucket", "250")] == 0
    assert tokens[("ragproxy_context_tokens_bucket", "500")] == 1
    assert tokens[("ragproxy_context_tokens_bucket", "2000")] == 2

    upstream = {(s.name, s.labels["provider"], s.labels.get("le")): s.value
                for s in families["ragproxy_upstream_seconds"].samples}
    assert upstream[("ragproxy_upstream_seconds_count", "oa", None)] == 2
    assert upstream[("ragproxy_upstream_seconds_sum", "oa", None)] == pytest.approx(2.8)
    assert upstream[("ragproxy_upstream_seconds_bucket", "oa", "1")] == 1
    assert upstream[("ragproxy_upstream_seconds_bucket", "an", "0.1")] == 1

    files = {(s.labels["kb"], s.labels["result"]): s.value for s in families["ragproxy_index_files"].samples}
    assert files == {("docs", "indexed"): 5, ("docs", "skipped"): 2, ("docs", "deferred"): 1}
    assert [(s.labels, s.value) for s in families["ragproxy_index_errors"].samples] == [({"kb": "docs"}, 3)]


def test_collectors_set_gauges_at_render_time_and_a_broken_one_is_ignored():
    m = Metrics()
    chunks = {"docs": 10}
    m.add_collector(lambda: [("ragproxy_kb_chunks", {"kb": kb}, n) for kb, n in chunks.items()]
                    + [("ragproxy_indexing_progress", {"kb": "docs"}, 0.25)])
    m.add_collector(lambda: 1 / 0)
    m.add_collector(lambda: [("ragproxy_no_such_metric", {}, 1)])
    assert 'ragproxy_kb_chunks{kb="docs"} 10\n' in m.render()
    chunks["docs"] = 12
    chunks['a"b'] = 3
    text = m.render()
    assert 'ragproxy_kb_chunks{kb="docs"} 12\n' in text
    assert 'ragproxy_kb_chunks{kb="a\\"b"} 3\n' in text
    assert 'ragproxy_indexing_progress{kb="docs"} 0.25\n' in text
    from prometheus_client import parser  # requirements-test.txt: never skipped
    gauges = {f.name: f for f in parser.text_string_to_metric_families(text)}
    assert {s.labels["kb"]: s.value for s in gauges["ragproxy_kb_chunks"].samples} == {"docs": 12, 'a"b': 3}


def test_the_garbage_collectors_runs_and_thresholds_are_read_at_each_render():
    from prometheus_client import parser  # requirements-test.txt: never skipped

    def gc_values(text):
        families = {f.name: f for f in parser.text_string_to_metric_families(text)}
        return ({s.labels["generation"]: s.value for s in families["ragproxy_python_gc_collections"].samples},
                {s.labels["generation"]: s.value for s in families["ragproxy_python_gc_threshold"].samples})

    m = Metrics()
    runs, thresholds = gc_values(m.render())
    assert thresholds == {str(n): t for n, t in enumerate(gc.get_threshold())}
    gc.collect()
    again, _ = gc_values(m.render())
    assert again["2"] >= runs["2"] + 1 and again["0"] >= runs["0"]


def test_the_thread_switch_interval_is_read_at_each_render():
    from prometheus_client import parser  # requirements-test.txt: never skipped

    def interval(text):
        families = {f.name: f for f in parser.text_string_to_metric_families(text)}
        return [s.value for s in families["ragproxy_python_switch_interval_seconds"].samples]

    m = Metrics()
    before = sys.getswitchinterval()
    try:
        assert interval(m.render()) == [before]
        sys.setswitchinterval(before / 2)
        assert interval(m.render()) == [sys.getswitchinterval()] != [before]
    finally:
        sys.setswitchinterval(before)


def test_metric_labels_are_checked():
    m = Metrics()
    with pytest.raises(ValueError, match="takes labels"):
        m["ragproxy_requests_total"].inc(model="x")
    with pytest.raises(ValueError, match="only go up"):
        m["ragproxy_index_errors_total"].inc(-1, kb="docs")
    with pytest.raises(ValueError, match="reserved"):
        m.histogram("my_seconds", "help", ("le",))
    with pytest.raises(ValueError, match="already registered"):
        m.counter("ragproxy_requests_total", "other", ("model",))
    assert m.counter("ragproxy_requests_total", "same", ("model", "outcome", "status")) \
        is m["ragproxy_requests_total"]


def test_custom_registry_renders_unlabelled_families_and_help_escapes():
    m = Metrics(predefined=False)
    c = m.counter("jobs_total", "Jobs done.\nSecond line \\ backslash.")
    h = m.histogram("wait_seconds", "Wait.", buckets=(1, 0.5))
    c.inc(2)
    h.observe(0.5)
    h.observe(3)
    assert m.render() == (
        "# HELP jobs_total Jobs done.\\nSecond line \\\\ backslash.\n"
        "# TYPE jobs_total counter\n"
        "jobs_total 2\n"
        "# HELP wait_seconds Wait.\n"
        "# TYPE wait_seconds histogram\n"
        'wait_seconds_bucket{le="0.5"} 1\n'
        'wait_seconds_bucket{le="1"} 1\n'
        'wait_seconds_bucket{le="+Inf"} 2\n'
        "wait_seconds_sum 3.5\n"
        "wait_seconds_count 2\n")


def test_metrics_are_thread_safe():
    m = Metrics()
    errors = m["ragproxy_index_errors_total"]
    hist = m["ragproxy_upstream_seconds"]

    def work():
        for _ in range(2000):
            errors.inc(kb="docs")
            hist.observe(0.3, provider="oa")

    pool = [threading.Thread(target=work) for _ in range(8)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    assert errors.value(kb="docs") == 16000
    cumulative, total, count = hist.snapshot(provider="oa")
    assert count == 16000 and cumulative[-1] == 16000 and total == pytest.approx(0.3 * 16000)


def test_guardrail_families_count_findings_drops_denials_redactions_and_cuts():
    from prometheus_client import parser  # requirements-test.txt: never skipped
    m = Metrics()
    finding = {"rule_id": "override.ignore_previous", "category": "instruction_override", "action": "drop"}
    m.observe_request(entry(findings=2, dropped=2, redactions={"email": 3, "jwt": 0},
                            guard_findings=[finding, dict(finding, category="exfiltration")],
                            budget={"limit": 100, "request_tokens": 50, "cut": 2, "over": False}))
    m.observe_request(entry(findings=1, denied="input", guard_findings=[dict(finding, action="deny")]))
    # What neither guard nor redact reports cannot grow a label set.
    m.observe_request(entry(denied="elsewhere", redactions={"surname": 1},
                            guard_findings=[{"category": "made_up", "action": "explode"}]))
    m.observe_index("docs", redactions={"cloud_token": 4})
    families = {f.name: f for f in parser.text_string_to_metric_families(m.render())}

    def samples(name):
        return {tuple(sorted(s.labels.items())): s.value for s in families[name].samples if s.name.endswith("_total")}

    assert samples("ragproxy_guard_findings") == {
        (("action", "drop"), ("category", "instruction_override")): 1, (("action", "drop"), ("category", "exfiltration")): 1,
        (("action", "deny"), ("category", "instruction_override")): 1, (("action", "other"), ("category", "other")): 1}
    assert samples("ragproxy_guard_chunks_dropped") == {(): 2}
    assert samples("ragproxy_guard_requests_denied") == {(("where", "input"),): 1, (("where", "other"),): 1}
    assert samples("ragproxy_redactions") == {(("at", "inject"), ("category", "email")): 3,
                                              (("at", "inject"), ("category", "other")): 1,
                                              (("at", "index"), ("category", "cloud_token")): 4}
    assert samples("ragproxy_context_chunks_cut") == {(): 2}


def test_the_vector_store_gauges_say_up_down_and_nothing_while_unknown():
    from prometheus_client import parser  # requirements-test.txt: never skipped
    from _ragproxy.metrics import store_samples
    statuses = {
        "big": {"type": "chroma_http", "collection": "ragproxy_big", "reachable": True, "error": None,
                "role": "indexer", "vectors": 1200, "checked_at": 5.0},
        "shared": {"type": "chroma_http", "collection": "ragproxy_shared", "reachable": False,
                   "error": "the Chroma server does not answer", "role": "replica", "vectors": None,
                   "checked_at": 6.0, "errors": 3},
        "fresh": {"type": "chroma_http", "collection": "ragproxy_fresh", "reachable": None, "error": None,
                  "role": None, "vectors": None, "checked_at": None},
        "small": {"type": "simple", "collection": None, "reachable": None, "error": None, "role": None,
                  "vectors": 40, "checked_at": None},
    }
    m = Metrics()
    m.add_collector(lambda: [s for kb, status in statuses.items() for s in store_samples(kb, status)])
    families = {f.name: f for f in parser.text_string_to_metric_families(m.render())}
    assert families["ragproxy_vectorstore_up"].type == "gauge"
    assert {s.labels["kb"]: s.value for s in families["ragproxy_vectorstore_up"].samples} == {"big": 1, "shared": 0}
    assert {s.labels["kb"]: s.value for s in families["ragproxy_vectorstore_vectors"].samples} == {
        "big": 1200, "small": 40}
    errors = families["ragproxy_vectorstore_errors"]
    assert errors.type == "counter"
    assert {s.labels["kb"]: s.value for s in errors.samples if s.name.endswith("_total")} == {"shared": 3}
    statuses["shared"] = dict(statuses["shared"], reachable=True, errors=4)   # back up; the count stays
    text = m.render()
    assert 'ragproxy_vectorstore_up{kb="shared"} 1\n' in text
    assert 'ragproxy_vectorstore_errors_total{kb="shared"} 4\n' in text
    assert store_samples("x", None) == []


def test_metrics_of_a_running_proxy_show_its_chroma_store_up_then_down(make_admin_proxy, fake, chroma_server,
                                                                        chroma_prefix):
    import socket
    import urllib.request

    from prometheus_client import parser  # requirements-test.txt: never skipped
    from conftest import multipart_body, proxy_config
    text = proxy_config(fake.url, extra=(
        "vectorstore:\n  chroma_http:\n"
        f"    base_url: {chroma_server.url}\n    collection_prefix: {chroma_prefix}\n    timeout: 3\n"
        "knowledge_bases:\n  small: {retrieval: lexical}\n"
        "  big: {retrieval: dense, embedding: em, vectorstore: chroma_http}\n")).replace(
        "providers:\n", f"providers:\n  embedding:\n    em: {{type: openai, base_url: '{fake.url}/v1', model: emb}}\n", 1)
    proxy = make_admin_proxy(text)
    admin = proxy.admin()
    body, ctype = multipart_body([("a.md", b"# Pager\n\nThe pager rotates on Tuesdays.\n"),
                                  ("b.md", b"# Backups\n\nBackups run nightly.\n")])
    assert admin.request("POST", "/admin/api/kbs/big/upload", raw=body, headers={"Content-Type": ctype})[0] == 201

    def gauges():
        with urllib.request.urlopen(proxy.url + "/metrics", timeout=10) as resp:
            families = {f.name: f for f in parser.text_string_to_metric_families(resp.read().decode())}
        return ({s.labels["kb"]: s.value for s in families["ragproxy_vectorstore_up"].samples},
                {s.labels["kb"]: s.value for s in families["ragproxy_vectorstore_vectors"].samples})

    deadline = time.monotonic() + 30
    while admin.get("/admin/api/kbs/big")[2]["files"] != 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    up, vectors = gauges()
    chunks = admin.get("/admin/api/kbs/big")[2]["chunks"]
    assert up == {"big": 1} and vectors["big"] == chunks >= 2, (up, vectors)   # the built-in KB has no up series

    with socket.socket() as sock:   # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{sock.getsockname()[1]}"
    settings = admin.get("/admin/api/settings")[2]["text"]
    assert admin.put("/admin/api/settings", {"text": settings.replace(chroma_server.url, dead)})[0] == 200
    assert admin.post("/admin/api/kbs/big/store/test")[2]["ok"] is False
    up, _ = gauges()
    assert up == {"big": 0}, up


def test_compression_families_count_each_lever_by_outcome_and_reason_and_the_tokens_it_saved():
    from prometheus_client import parser  # requirements-test.txt: never skipped
    m = Metrics()
    levers = [{"lever": "rag_select", "outcome": "applied", "reason": "applied", "tokens_before": 900,
               "tokens_after": 300},
              {"lever": "window_fit", "outcome": "skipped", "reason": "not_needed", "tokens_before": 50,
               "tokens_after": 50}]
    m.observe_request(entry(levers=levers))
    m.observe_request(entry(levers=levers[:1]))
    # A name or reason from outside the code's closed sets cannot grow a label set.
    m.observe_request(entry(levers=[{"lever": "made_up", "outcome": "applied", "reason": "Bad Reason!",
                                     "tokens_before": 10, "tokens_after": 4}]))
    m.observe_request(entry())
    families = {f.name: f for f in parser.text_string_to_metric_families(m.render())}

    def samples(name):
        return {tuple(sorted(s.labels.items())): s.value for s in families[name].samples if s.name.endswith("_total")}

    assert samples("ragproxy_compression_lever") == {
        (("lever", "rag_select"), ("outcome", "applied"), ("reason", "applied")): 2,
        (("lever", "window_fit"), ("outcome", "skipped"), ("reason", "not_needed")): 1,
        (("lever", "other"), ("outcome", "applied"), ("reason", "other")): 1}
    assert samples("ragproxy_compression_tokens_saved") == {(("lever", "rag_select"),): 1200, (("lever", "other"),): 6}


def test_the_compression_lever_label_set_is_the_configs_levers():
    # metrics cannot import config (one layer): the closed label set is written there and checked here.
    from _ragproxy import metrics, schema
    assert metrics.COMPRESSION_LEVERS == tuple(schema.LEVER_SCHEMAS)


# -- several workers answering as one (metricsshare) ---------------------------

def worker(directory, slot, metrics=None):
    """A worker's registry in ``slot`` of the shared ``directory``, wired as `serve --workers N` does."""
    from _ragproxy.metricsshare import MetricsShare
    metrics = metrics or Metrics()
    metrics.share = MetricsShare(str(directory), slot)
    return metrics


def parsed(text):
    from prometheus_client import parser  # requirements-test.txt: never skipped
    return {f.name: f for f in parser.text_string_to_metric_families(text)}


def values(families, name, suffix="_total"):
    return {tuple(sorted(s.labels.items())): s.value for s in families[name].samples if s.name == name + suffix}


def some_levers(before, after):
    return [{"lever": "rag_select", "outcome": "applied", "reason": "applied", "tokens_before": before,
             "tokens_after": after}]


def test_two_workers_sharing_a_directory_each_answer_the_sum_of_both(tmp_path):
    a, b = worker(tmp_path, 0), worker(tmp_path, 1)
    observe_sample_requests(a)   # gpt-4o retrieved 200 twice, TRICKY skipped 502 once
    a.observe_request(entry(model="gpt-4o", outcome="retrieved", status=200, retrieval_ms=30.0, context_tokens=300,
                            upstream="oa", upstream_ms=800.0, levers=some_levers(900, 300)))
    b.observe_request(entry(model="gpt-4o", outcome="retrieved", status=200, retrieval_ms=3.0, context_tokens=3000,
                            upstream="oa", upstream_ms=50000.0, levers=some_levers(100, 40)))
    b.observe_request(entry(model="claude", outcome="none", status=200, upstream="an", upstream_ms=100.0))
    b.observe_tool_call("search", "ok", 0.02)
    assert a.share.flush() and b.share.flush()
    for m in (a, b):
        families = parsed(m.render())
        assert values(families, "ragproxy_requests") == {
            (("model", "gpt-4o"), ("outcome", "retrieved"), ("status", "200")): 4,
            (("model", TRICKY), ("outcome", "skipped"), ("status", "502")): 1,
            (("model", "claude"), ("outcome", "none"), ("status", "200")): 1}
        tokens = {(s.name, s.labels.get("le")): s.value for s in families["ragproxy_context_tokens"].samples}
        assert tokens[("ragproxy_context_tokens_count", None)] == 4
        assert tokens[("ragproxy_context_tokens_sum", None)] == 300 + 1500 + 300 + 3000
        assert tokens[("ragproxy_context_tokens_bucket", "500")] == 2
        assert tokens[("ragproxy_context_tokens_bucket", "2000")] == 3
        assert tokens[("ragproxy_context_tokens_bucket", "4000")] == 4
        upstream = {(s.name, s.labels["provider"], s.labels.get("le")): s.value
                    for s in families["ragproxy_upstream_seconds"].samples}
        assert upstream[("ragproxy_upstream_seconds_count", "oa", None)] == 4
        assert upstream[("ragproxy_upstream_seconds_bucket", "oa", "30")] == 3
        assert upstream[("ragproxy_upstream_seconds_bucket", "oa", "60")] == 4
        assert upstream[("ragproxy_upstream_seconds_count", "an", None)] == 2
        assert values(families, "ragproxy_mcp_tool_calls") == {(("outcome", "ok"), ("tool", "search")): 1}
        assert m.compression_counts() == {
            "levers": [{"lever": "rag_select", "outcome": "applied", "reason": "applied", "count": 2}],
            "tokens_saved": {"rag_select": 660}}
    # Its own slot's file is never read: the live values are newer, and adding both would count twice.
    a["ragproxy_index_errors_total"].inc(kb="docs")
    assert 'ragproxy_index_errors_total{kb="docs"} 1\n' in a.render()
    assert "ragproxy_index_errors_total{" not in b.render()   # until a flushes again
    assert a.share.flush()
    assert 'ragproxy_index_errors_total{kb="docs"} 1\n' in b.render()


def test_the_shared_files_are_private_json_replaced_whole(tmp_path):
    import json
    import os
    import stat
    a = worker(tmp_path, 3)
    a["ragproxy_kb_chunks"].set(-2.5, kb="docs")
    a["ragproxy_index_files_total"].inc(float("inf"), kb="docs", result="indexed")
    assert a.share.flush() and a.share.flush()
    assert sorted(os.listdir(tmp_path)) == ["worker-3.json"]   # no temporary file left beside it
    assert stat.S_IMODE(os.stat(tmp_path / "worker-3.json").st_mode) == 0o600
    state = json.loads((tmp_path / "worker-3.json").read_text())
    assert state == json.loads(json.dumps(a.export_state()))
    assert Metrics().parse_state(state)["ragproxy_kb_chunks"] == {("docs",): -2.5}
    assert 'ragproxy_index_files_total{kb="docs",result="indexed"} +Inf\n' in worker(tmp_path, 0).render()


def test_stored_gauges_are_summed_and_collector_samples_come_from_the_answering_worker(tmp_path):
    a, b = worker(tmp_path, 0), worker(tmp_path, 1)
    for m, dropped in ((a, 2), (b, 5)):
        # Both read the same knowledge base on disk: its chunks must not count twice.
        m.add_collector(lambda dropped=dropped: [("ragproxy_kb_chunks", {"kb": "docs"}, 10),
                                                 ("ragproxy_request_log_dropped_total", {}, dropped)])
    b["ragproxy_kb_chunks"].set(7, kb="docs")   # a collector's reading replaces the sum for its label set
    a["ragproxy_vectorstore_vectors"].set(2, kb="mine")   # set in-process: each worker holds its part
    b["ragproxy_vectorstore_vectors"].set(3, kb="mine")
    assert a.share.flush() and b.share.flush()
    text_a, text_b = a.render(), b.render()
    for text in (text_a, text_b):
        assert 'ragproxy_kb_chunks{kb="docs"} 10\n' in text
        assert 'ragproxy_vectorstore_vectors{kb="mine"} 5\n' in text
    assert "ragproxy_request_log_dropped_total 2\n" in text_a
    assert "ragproxy_request_log_dropped_total 5\n" in text_b


def test_a_worker_restarted_into_a_slot_continues_from_its_predecessors_counts(tmp_path):
    old, peer = worker(tmp_path, 0), worker(tmp_path, 1)
    old["ragproxy_index_errors_total"].inc(3, kb="docs")
    old["ragproxy_retrieval_seconds"].observe(0.004, stage="lexical")
    old["ragproxy_kb_bytes"].set(100, kb="docs")
    peer["ragproxy_index_errors_total"].inc(kb="docs")
    assert old.share.flush() and peer.share.flush()
    before = values(parsed(peer.render()), "ragproxy_index_errors")
    assert before == {(("kb", "docs"),): 4}

    new = worker(tmp_path, 0)   # the old worker died; nothing observed in the new one yet
    assert new["ragproxy_index_errors_total"].value(kb="docs") == 3
    assert new["ragproxy_retrieval_seconds"].snapshot(stage="lexical") == ([0, 0, 1] + [1] * 11, 0.004, 1)
    assert "ragproxy_kb_bytes{" not in new.render()   # the dead process's gauge is not carried over
    assert values(parsed(new.render()), "ragproxy_index_errors") == before
    new["ragproxy_index_errors_total"].inc(kb="docs")
    assert new.share.flush()
    assert values(parsed(peer.render()), "ragproxy_index_errors") == {(("kb", "docs"),): 5}
    assert values(parsed(new.render()), "ragproxy_index_errors") == {(("kb", "docs"),): 5}


def test_an_unreadable_predecessor_file_starts_the_slot_from_zero_with_a_warning(tmp_path, caplog):
    (tmp_path / "worker-0.json").write_text('{"format": 1, "families": {"ragproxy_index_errors_total": ')
    m = worker(tmp_path, 0)
    assert m["ragproxy_index_errors_total"].value(kb="docs") == 0
    assert [r.getMessage() for r in caplog.records if "starts from 0" in r.getMessage()]


def test_a_corrupt_or_partial_peer_file_is_left_out_with_one_warning(tmp_path, caplog):
    import json
    good, broken = worker(tmp_path, 1), worker(tmp_path, 2)
    good["ragproxy_index_errors_total"].inc(2, kb="docs")
    broken["ragproxy_index_errors_total"].inc(100, kb="docs")
    assert good.share.flush() and broken.share.flush()
    whole = (tmp_path / "worker-2.json").read_text()
    state = json.loads(whole)
    state["families"]["ragproxy_context_tokens"]["series"] = [[[], [1, 2], 3.0, 3]]   # too few buckets
    bad_files = {
        "worker-2.json": whole[:len(whole) // 2],        # cut short
        "worker-3.json": json.dumps(state),
        "worker-4.json": "\x00\xff not json",
        "worker-5.json": json.dumps({"format": 1, "families": {"ragproxy_index_errors_total": {
            "kind": "counter", "labels": ["kb"], "series": [[["docs"], -7]]}}}),   # a counter going down
        "worker-6.json": json.dumps({"format": 99, "families": {}}),
        "worker-7.json": json.dumps([1, 2]),
        "worker-9.json": json.dumps({"format": 1, "families": {"ragproxy_context_tokens": {
            "kind": "histogram", "labels": [], "buckets": [float(b) for b in (0, 100, 250, 500, 1000, 2000, 4000,
                                                                               8000, 16000, 32000)],
            "series": [[[], [1] + [0] * 10, 3.0, 5]]}}}),   # a count that is not its buckets'
    }
    for name, text in bad_files.items():
        (tmp_path / name).write_text(text)
    (tmp_path / "worker-8.json").mkdir()
    (tmp_path / "worker-03.json").write_text(whole)   # not a slot's name: not read at all
    me = worker(tmp_path, 0)
    me["ragproxy_index_errors_total"].inc(kb="docs")
    caplog.clear()
    for _ in range(3):
        assert 'ragproxy_index_errors_total{kb="docs"} 3\n' in me.render()
        assert me.compression_counts() == {"levers": [], "tokens_saved": {}}
    warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warned) == 8 and all("left out" in w for w in warned), warned
    assert {w.split("worker ")[1].split("'")[0] for w in warned} == {"2", "3", "4", "5", "6", "7", "8", "9"}

    # A file that reads again is counted; should it break once more, that is warned again.
    assert broken.share.flush()
    caplog.clear()
    assert 'ragproxy_index_errors_total{kb="docs"} 103\n' in me.render()
    (tmp_path / "worker-2.json").write_text("{")
    assert 'ragproxy_index_errors_total{kb="docs"} 3\n' in me.render()
    assert len([r for r in caplog.records if "worker 2's" in r.getMessage()]) == 1


def test_metrics_of_a_worker_whose_peers_files_are_broken_still_answer_200(tmp_path):
    import ragproxy
    app = ragproxy.App(ragproxy.Config.from_text("api_key_auth: false"))
    worker(tmp_path, 0, app.metrics)
    peer = worker(tmp_path, 1)
    peer["ragproxy_index_errors_total"].inc(4, kb="docs")
    assert peer.share.flush()
    response = app.handle(ragproxy.Request("GET", "/metrics"))
    assert response.status == 200 and b'ragproxy_index_errors_total{kb="docs"} 4\n' in response.body
    (tmp_path / "worker-1.json").write_text("[")
    response = app.handle(ragproxy.Request("GET", "/metrics"))
    assert response.status == 200 and b"ragproxy_index_errors_total{" not in response.body
    import shutil
    shutil.rmtree(tmp_path)   # the directory itself is gone
    response = app.handle(ragproxy.Request("GET", "/metrics"))
    assert response.status == 200 and b"# TYPE ragproxy_index_errors_total counter\n" in response.body
    assert app.metrics.share.flush() is False   # cannot write either: a warning, not an exception


def test_a_render_without_a_share_is_what_it_was_before_shares_existed(tmp_path):
    def registry():
        m = Metrics(predefined=False)
        c = m.counter("jobs_total", "Jobs.", ("kind",))
        g = m.gauge("queue_depth", "Depth.", ("queue",))
        h = m.histogram("wait_seconds", "Wait.", ("queue",), buckets=(0.5, 1))
        m.counter("plain_total", "Plain.")
        c.inc(2, kind="a")
        c.inc(0.5, kind='b"')
        g.set(3, queue="q")
        g.inc(-1, queue="r")
        h.observe(0.25, queue="q")
        h.observe(7, queue="q")
        h.observe(1, queue="r")
        return m

    # The text the registry rendered before MetricsShare existed, to the byte.
    before = ('# HELP jobs_total Jobs.\n# TYPE jobs_total counter\njobs_total{kind="a"} 2\n'
              'jobs_total{kind="b\\""} 0.5\n'
              '# HELP plain_total Plain.\n# TYPE plain_total counter\nplain_total 0\n'
              '# HELP queue_depth Depth.\n# TYPE queue_depth gauge\nqueue_depth{queue="q"} 3\n'
              'queue_depth{queue="r"} -1\n# HELP wait_seconds Wait.\n# TYPE wait_seconds histogram\n'
              'wait_seconds_bucket{queue="q",le="0.5"} 1\nwait_seconds_bucket{queue="q",le="1"} 1\n'
              'wait_seconds_bucket{queue="q",le="+Inf"} 2\nwait_seconds_sum{queue="q"} 7.25\n'
              'wait_seconds_count{queue="q"} 2\nwait_seconds_bucket{queue="r",le="0.5"} 0\n'
              'wait_seconds_bucket{queue="r",le="1"} 1\nwait_seconds_bucket{queue="r",le="+Inf"} 1\n'
              'wait_seconds_sum{queue="r"} 1\nwait_seconds_count{queue="r"} 1\n')
    m = registry()
    assert m.share is None and m.render() == before
    alone = worker(tmp_path, 0, registry())   # a share with no peers yet, only its own file
    assert alone.share.flush()
    assert alone.render() == before
    # A peer's family this registry does not have is left out, and the rest still adds up.
    other = Metrics(predefined=False)
    other.counter("elsewhere_total", "Not here.").inc()
    other.counter("jobs_total", "Jobs.", ("kind",)).inc(kind="a")
    worker(tmp_path, 1, other).share.flush()
    assert alone.render() == before.replace('jobs_total{kind="a"} 2\n', 'jobs_total{kind="a"} 3\n')


class ScriptedStop:
    """A stop event whose wait() runs one scripted step per interval; the last step comes with the stop."""

    def __init__(self, steps):
        self.steps, self.waits = list(steps), []

    def wait(self, timeout=None):
        self.waits.append(timeout)
        self.steps.pop(0)()
        return not self.steps


def test_run_flushes_each_interval_only_while_something_changed_and_once_more_at_the_end(tmp_path):
    m = worker(tmp_path, 0)
    peer = worker(tmp_path, 1)
    flushes = []
    share = m.share
    real_flush = share.flush
    share.flush = lambda: flushes.append(m["ragproxy_index_errors_total"].value(kb="docs")) or real_flush()
    errors = m["ragproxy_index_errors_total"]
    steps = [lambda: None,                      # first tick: the file is written even with nothing new
             lambda: None,                      # nothing changed: no write
             lambda: errors.inc(kb="docs"),
             lambda: (errors.inc(kb="docs"), errors.inc(kb="docs")),
             lambda: None,
             lambda: m["ragproxy_kb_chunks"].set(1, kb="docs"),   # a stored gauge is a change too
             lambda: None,
             lambda: errors.inc(kb="docs")]     # with the stop, before another tick: the last flush writes it
    stop = ScriptedStop(steps)
    share.run(stop, interval=0.5)
    assert stop.waits == [0.5] * 8
    assert flushes == [0, 1, 3, 3, 4]
    assert 'ragproxy_index_errors_total{kb="docs"} 4\n' in peer.render()


def test_run_stops_when_its_event_is_set(tmp_path):
    m = worker(tmp_path, 0)
    stop = threading.Event()
    thread = threading.Thread(target=m.share.run, args=(stop, 0.01))
    thread.start()
    m["ragproxy_index_errors_total"].inc(kb="docs")
    stop.set()
    thread.join(10)
    assert not thread.is_alive()
    assert 'ragproxy_index_errors_total{kb="docs"} 1\n' in worker(tmp_path, 1).render()


def test_the_supervisor_clears_an_earlier_runs_files_and_a_share_serves_one_registry(tmp_path):
    import os
    import stat
    from _ragproxy.metricsshare import MetricsShare
    directory = tmp_path / "run" / "metrics"
    earlier = worker(directory, 0)   # the share makes its directory, private
    assert stat.S_IMODE(os.stat(directory).st_mode) == 0o700
    earlier["ragproxy_index_errors_total"].inc(5, kb="docs")
    assert earlier.share.flush() and worker(directory, 3).share.flush()
    (directory / ".worker-0.json.abc.tmp").write_text("{")   # a write a kill cut short
    (directory / "notes.txt").write_text("not ours")
    MetricsShare.clear(str(directory))
    assert sorted(os.listdir(directory)) == ["notes.txt"]
    MetricsShare.clear(str(tmp_path / "never-made"))   # nothing to clear: no error
    fresh = worker(directory, 0)
    assert fresh["ragproxy_index_errors_total"].value(kb="docs") == 0
    assert "ragproxy_index_errors_total{" not in fresh.render()

    share = MetricsShare(str(directory), 1)
    with pytest.raises(RuntimeError, match="no registry's share"):
        share.flush()
    first = Metrics()
    first.share = share
    first.share = share   # the same registry again: nothing happens twice
    with pytest.raises(ValueError, match="one registry"):
        Metrics().share = share
    with pytest.raises(ValueError, match="slot"):
        MetricsShare(str(directory), -1)
