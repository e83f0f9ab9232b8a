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
