"""Prometheus metrics for /metrics, in the text exposition format.

A small registry (counters, gauges, histograms with bounded label sets) fed
by the same entry dicts as the request log and by the MCP server's tool
calls, plus collectors that read gauges (chunks, bytes, indexing progress)
when /metrics is scraped.

Several worker processes serving one socket (``serve --workers N``) answer
as one: each registry's ``export_state()`` is shared with the others
(a metricsshare.MetricsShare, set as ``Metrics.share``), and ``render()`` and
``compression_counts()`` add the other workers' states to the live registry:
counters, histograms and stored gauges summed per label set.  Collector
samples are the exception: they come from the answering process only.

May import: guard, redact, reqlog.
"""
from __future__ import annotations

import bisect
import collections
import gc
import itertools
import logging
import math
import re
import sys
import threading

from .guard import CATEGORIES as GUARD_CATEGORIES
from .redact import CATEGORIES as REDACT_CATEGORIES
from .reqlog import RETRIEVAL_ATTEMPTED

log = logging.getLogger("ragproxy")


# -- Prometheus metrics -------------------------------------------------------

#: The compression levers (their reasons are compress.REASONS, closed words: checked by shape here).
COMPRESSION_LEVERS = ("rag_select", "compact_serialization", "position_reorder", "window_fit", "summary_buffer")
_REASON = re.compile(r"[a-z_]{1,40}\Z")
_METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*\Z")
_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*\Z")
_METRICS_MAX_SERIES = 1000   # per family: a flood of odd model names must not eat memory


def _prom_number(value):
    value = float(value)
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if value.is_integer() and abs(value) < 2 ** 53:
        return str(int(value))
    return repr(value)


def _prom_label_value(value):
    return str(value).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _prom_labels(pairs):
    pairs = list(pairs)
    if not pairs:
        return ""
    return "{" + ",".join(f'{k}="{_prom_label_value(v)}"' for k, v in pairs) + "}"


class _MetricFamily:
    kind = ""

    def __init__(self, name, help_text, labelnames=()):
        if not _METRIC_NAME.match(name):
            raise ValueError(f"invalid metric name {name!r}")
        for label in labelnames:
            if not _LABEL_NAME.match(label) or label.startswith("__"):
                raise ValueError(f"invalid label name {label!r} for {name}")
        self.name, self.help, self.labelnames = name, help_text, tuple(labelnames)
        self._lock = threading.Lock()
        self._series = {}
        self.overflow = 0   # observations refused because the family hit _METRICS_MAX_SERIES
        self.changes = 0    # grows with every stored change: a MetricsShare writes only when it moved

    def _key(self, labels):
        if len(labels) == len(self.labelnames):
            try:
                return tuple([str(labels[n]) for n in self.labelnames])
            except KeyError:
                pass
        raise ValueError(f"{self.name} takes labels {list(self.labelnames)}, got {sorted(labels)}")

    def _header(self):
        help_text = self.help.replace("\\", "\\\\").replace("\n", "\\n")
        return [f"# HELP {self.name} {help_text}", f"# TYPE {self.name} {self.kind}"]

    def _shape(self):
        return {"kind": self.kind, "labels": list(self.labelnames)}

    def _parse(self, data):
        """Another process's ``_export()`` of this family as ``{key: value}``; ValueError if it does not fit."""
        shape = self._shape()
        if not isinstance(data, dict) or {k: data.get(k) for k in shape} != shape:
            raise ValueError(f"{self.name} is registered differently there")
        out = {}
        for item in data.get("series"):
            key = item[0]
            if not isinstance(key, list) or len(key) != len(self.labelnames) or \
                    not all(isinstance(v, str) for v in key):
                raise ValueError(f"{self.name}: a label set that is not one")
            out[tuple(key)] = self._parse_value(item[1:])
        return out


class _PromCounter(_MetricFamily):
    """A monotonically increasing value per label set."""

    kind = "counter"

    def inc(self, amount=1.0, /, **labels):
        if amount < 0:
            raise ValueError(f"{self.name}: counters only go up (got {amount})")
        self._add(self._key(labels), amount)

    def _add(self, key, amount):
        """inc() for a label tuple already made and an amount known not to be negative."""
        with self._lock:
            if key not in self._series and len(self._series) >= _METRICS_MAX_SERIES:
                self.overflow += 1
                return
            self._series[key] = self._series.get(key, 0.0) + amount
            self.changes += 1

    def value(self, **labels):
        with self._lock:
            return self._series.get(self._key(labels), 0.0)

    def _export(self):
        with self._lock:
            series = sorted(self._series.items())
        return dict(self._shape(), series=[[list(key), value] for key, value in series])

    def _parse_value(self, rest):
        value, = rest
        if type(value) not in (int, float) or (self.kind == "counter" and not value >= 0):
            raise ValueError(f"{self.name}: {value!r} is not a {self.kind}'s value")
        return float(value)

    def _absorb(self, series):
        with self._lock:
            for key, value in series.items():
                if key not in self._series and len(self._series) >= _METRICS_MAX_SERIES:
                    self.overflow += 1
                    continue
                self._series[key] = self._series.get(key, 0.0) + value
            self.changes += 1

    def _merged(self, peers):
        with self._lock:
            series = dict(self._series)
        for other in peers:
            for key, value in other.items():
                series[key] = series.get(key, 0.0) + value
        return series

    def _samples(self, overrides, peers=()):
        series = self._merged(peers)
        series.update(overrides)
        if not series and not self.labelnames:
            series[()] = 0.0
        return [f"{self.name}{_prom_labels(zip(self.labelnames, key))} {_prom_number(v)}"
                for key, v in sorted(series.items())]


class _PromGauge(_PromCounter):
    """A value that goes up and down; usually reported by a collector at render time."""

    kind = "gauge"

    def inc(self, amount=1.0, /, **labels):
        key = self._key(labels)
        with self._lock:
            self._series[key] = self._series.get(key, 0.0) + amount
            self.changes += 1

    def set(self, value, /, **labels):
        key = self._key(labels)
        with self._lock:
            self._series[key] = float(value)
            self.changes += 1


class _PromHistogram(_MetricFamily):
    """Observations counted into cumulative ``le`` buckets, plus their sum and count."""

    kind = "histogram"

    def __init__(self, name, help_text, labelnames=(), buckets=()):
        if "le" in labelnames:
            raise ValueError(f"{name}: 'le' is reserved for histogram buckets")
        super().__init__(name, help_text, labelnames)
        bounds = sorted(float(b) for b in buckets if not math.isinf(float(b)))
        if not bounds or len(set(bounds)) != len(bounds):
            raise ValueError(f"{name}: buckets must be distinct and non-empty")
        self.buckets = tuple(bounds)

    def observe(self, value, /, **labels):
        self._observe(self._key(labels), value)

    def _observe(self, key, value):
        """observe() for a label tuple already made (observe_request's own stage names)."""
        value = float(value)
        # bisect_left: the first bound >= value, since a bucket counts value <= le.
        slot = bisect.bisect_left(self.buckets, value)
        with self._lock:
            state = self._series.get(key)
            if state is None:
                if len(self._series) >= _METRICS_MAX_SERIES:
                    self.overflow += 1
                    return
                state = self._series[key] = [[0] * (len(self.buckets) + 1), 0.0, 0]
            state[0][slot] += 1
            state[1] += value
            state[2] += 1
            self.changes += 1

    def snapshot(self, **labels):
        """``(cumulative bucket counts incl. +Inf, sum, count)`` for one label set."""
        with self._lock:
            state = self._series.get(self._key(labels))
            if state:
                counts, total, n = list(state[0]), state[1], state[2]
            else:
                counts, total, n = [0] * (len(self.buckets) + 1), 0.0, 0
        return list(itertools.accumulate(counts)), total, n

    def _shape(self):
        return dict(super()._shape(), buckets=list(self.buckets))

    def _export(self):
        with self._lock:
            series = sorted((key, (list(v[0]), v[1], v[2])) for key, v in self._series.items())
        return dict(self._shape(), series=[[list(key), counts, total, n] for key, (counts, total, n) in series])

    def _parse_value(self, rest):
        counts, total, n = rest
        if not isinstance(counts, list) or len(counts) != len(self.buckets) + 1 or \
                not all(type(c) is int and c >= 0 for c in counts) or type(n) is not int or n != sum(counts) or \
                type(total) not in (int, float):
            raise ValueError(f"{self.name}: a series that is not this histogram's")
        return counts, float(total), n

    def _absorb(self, series):
        with self._lock:
            for key, (counts, total, n) in series.items():
                state = self._series.get(key)
                if state is None:
                    if len(self._series) >= _METRICS_MAX_SERIES:
                        self.overflow += 1
                        continue
                    state = self._series[key] = [[0] * (len(self.buckets) + 1), 0.0, 0]
                state[0] = [a + b for a, b in zip(state[0], counts)]
                state[1] += total
                state[2] += n
            self.changes += 1

    def _samples(self, overrides, peers=()):
        with self._lock:
            series = {k: (list(v[0]), v[1], v[2]) for k, v in self._series.items()}
        for other in peers:
            for key, (counts, total, n) in other.items():
                mine = series.get(key, ([0] * len(counts), 0.0, 0))
                series[key] = ([a + b for a, b in zip(mine[0], counts)], mine[1] + total, mine[2] + n)
        if not series and not self.labelnames:
            series[()] = ([0] * (len(self.buckets) + 1), 0.0, 0)
        bounds = [_prom_number(b) for b in self.buckets] + ["+Inf"]
        lines = []
        for key, (counts, total, n) in sorted(series.items()):
            pairs = list(zip(self.labelnames, key))
            for le, cumulative in zip(bounds, itertools.accumulate(counts)):
                lines.append(f"{self.name}_bucket{_prom_labels(pairs + [('le', le)])} {cumulative}")
            lines.append(f"{self.name}_sum{_prom_labels(pairs)} {_prom_number(total)}")
            lines.append(f"{self.name}_count{_prom_labels(pairs)} {n}")
        return lines


_SECONDS_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)
_UPSTREAM_BUCKETS = (0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
_TOKEN_BUCKETS = (0, 100, 250, 500, 1000, 2000, 4000, 8000, 16000, 32000)

# ragproxy's metric families, all in one place: (kind, name, help, labels[, buckets]).
_METRIC_FAMILIES = (
    ("counter", "ragproxy_requests_total", "Proxied requests by model, retrieval outcome and HTTP status.",
     ("model", "outcome", "status")),
    ("histogram", "ragproxy_retrieval_seconds", "Retrieval time per stage in seconds.", ("stage",),
     _SECONDS_BUCKETS),
    ("histogram", "ragproxy_context_tokens", "Tokens of context injected per request that attempted retrieval.",
     (), _TOKEN_BUCKETS),
    ("histogram", "ragproxy_upstream_seconds", "Upstream response time in seconds by provider.", ("provider",),
     _UPSTREAM_BUCKETS),
    ("counter", "ragproxy_index_files_total", "Files seen by the indexer by result (indexed, skipped, deferred).",
     ("kb", "result")),
    ("counter", "ragproxy_index_errors_total", "Indexing errors by knowledge base.", ("kb",)),
    ("counter", "ragproxy_request_log_dropped_total", "Request-log entries dropped because its queue was full.",
     ()),
    ("gauge", "ragproxy_kb_chunks", "Chunks in the knowledge base's current generation.", ("kb",)),
    ("gauge", "ragproxy_kb_bytes", "Bytes of the knowledge base's current generation on disk.", ("kb",)),
    ("gauge", "ragproxy_indexing_progress", "Fraction of the running indexing pass done (0 to 1).", ("kb",)),
    ("counter", "ragproxy_mcp_tool_calls_total", "MCP tool calls by tool and outcome (ok, error, denied).",
     ("tool", "outcome")),
    ("histogram", "ragproxy_mcp_tool_seconds", "MCP tool call time in seconds by tool.", ("tool",),
     _SECONDS_BUCKETS),
    ("counter", "ragproxy_guard_findings_total",
     "Guardrail findings (poisoning rules and deny patterns) by category and the action taken (drop, deny, flag).",
     ("category", "action")),
    ("counter", "ragproxy_guard_chunks_dropped_total", "Retrieved chunks dropped as suspected prompt injections.",
     ()),
    ("counter", "ragproxy_guard_requests_denied_total",
     "Requests refused by the guardrails, by where the finding was (retrieved context, input tool results).",
     ("where",)),
    ("counter", "ragproxy_redactions_total",
     "Secrets and personal data redacted, by category and where (inject: retrieved context; index: stored chunks).",
     ("category", "at")),
    ("counter", "ragproxy_context_chunks_cut_total",
     "Retrieved chunks left out so that the enriched request fits the model's max_input_tokens.", ()),
    ("counter", "ragproxy_compression_lever_total",
     "Compression levers run, by lever, outcome (applied, skipped) and reason (applied, not_needed, no_savings, ...).",
     ("lever", "outcome", "reason")),
    ("counter", "ragproxy_compression_tokens_saved_total",
     "Estimated tokens the compression levers took out of requests, by lever.", ("lever",)),
    ("gauge", "ragproxy_vectorstore_up",
     "Whether the knowledge base's vector store answered its last call (1) or not (0); absent until known.",
     ("kb",)),
    ("gauge", "ragproxy_vectorstore_vectors", "Vectors in the knowledge base's vector store collection.", ("kb",)),
    ("counter", "ragproxy_vectorstore_errors_total", "Failed calls to the knowledge base's vector store.", ("kb",)),
    ("counter", "ragproxy_python_gc_collections_total",
     "Runs of Python's cyclic garbage collector in this process, by generation.", ("generation",)),
    ("gauge", "ragproxy_python_gc_threshold",
     "The collector's thresholds (gc.get_threshold()), by generation: raised by the serve command.",
     ("generation",)),
    ("gauge", "ragproxy_python_switch_interval_seconds",
     "How long a thread may hold the GIL while another waits for it (sys.getswitchinterval()): "
     "lowered by the serve command.", ()),
    ("gauge", "ragproxy_serving_cpu",
     "The CPU this process's connection threads are placed on (server.cpu_pinning); -1: not placed.", ()),
    ("counter", "ragproxy_serving_cpu_moves_total",
     "Times this process's connection threads moved to a less busy CPU.", ()),
)
#: The closed label sets of the MCP families: the MCP server's tools, and what a call came to
#: ("denied": it named a knowledge base the caller's key may not read).
MCP_TOOLS = ("search", "list_knowledge_bases", "read_source")
MCP_OUTCOMES = ("ok", "error", "denied")
#: The closed label sets of the guardrail families (categories: guard.CATEGORIES, redact.CATEGORIES;
#: anything else, which neither module reports, counts as "other").
GUARD_ACTIONS = ("drop", "deny", "flag")
GUARD_WHERE = ("retrieved", "input")
_STATE_FORMAT = 1   # export_state()'s layout: a worker reads only its own release's files
_FAMILY_CLASSES = {"counter": _PromCounter, "gauge": _PromGauge, "histogram": _PromHistogram}


def interpreter_samples():
    """Collector samples of the interpreter: its cyclic garbage collector's runs and thresholds,
    and its thread switch interval (the serve command sets both)."""
    out = [("ragproxy_python_gc_collections_total", {"generation": str(n)}, stats["collections"])
           for n, stats in enumerate(gc.get_stats())]
    out += [("ragproxy_python_gc_threshold", {"generation": str(n)}, threshold)
            for n, threshold in enumerate(gc.get_threshold())]
    out.append(("ragproxy_python_switch_interval_seconds", {}, sys.getswitchinterval()))
    return out


def store_samples(kb, status):
    """Collector samples for knowledge base ``kb``'s vector store from its store_status() dict.

    The built-in store, or one not called yet (``reachable`` None), reports no
    ``up`` sample: an absent series is "unknown", where a 0 would page someone.
    """
    if not isinstance(status, dict):
        return []
    out = []
    if status.get("reachable") is not None:
        out.append(("ragproxy_vectorstore_up", {"kb": kb}, 1 if status["reachable"] else 0))
    if status.get("vectors") is not None:
        out.append(("ragproxy_vectorstore_vectors", {"kb": kb}, status["vectors"]))
    if status.get("errors") is not None:
        out.append(("ragproxy_vectorstore_errors_total", {"kb": kb}, status["errors"]))
    return out


class Metrics:
    """A small thread-safe Prometheus registry rendering text exposition format 0.0.4.

    ``Metrics()`` holds ragproxy's families (see ``_METRIC_FAMILIES``);
    ``Metrics(predefined=False)`` starts empty.  Families are reached with
    ``metrics["name"]``.  Collectors added with ``add_collector(fn)`` run at each
    render; ``fn()`` returns ``[(name, labels_dict, value)]`` for counter or gauge
    families, and those values replace stored ones for that render.

    ``share`` (None, or this worker's metricsshare.MetricsShare) adds the other
    workers' stored values to what ``render()`` and ``compression_counts()``
    answer; collector samples still come from this process alone.  Setting it
    attaches the share, which first adds its slot's file, the values of the
    worker this one replaces, to the registry.
    """

    CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

    def __init__(self, predefined=True):
        self._families = {}
        self._collectors = []
        self._lock = threading.Lock()
        self._share = None
        if predefined:
            for kind, name, help_text, labels, *rest in _METRIC_FAMILIES:
                self._register(_FAMILY_CLASSES[kind](name, help_text, labels, *rest))
            self._collectors.append(interpreter_samples)

    @property
    def share(self):
        return self._share

    @share.setter
    def share(self, share):
        if share is not None:
            share.attach(self)
        self._share = share

    def _register(self, family):
        with self._lock:
            old = self._families.get(family.name)
            if old is not None:
                if (old.kind, old.labelnames, getattr(old, "buckets", None)) != \
                        (family.kind, family.labelnames, getattr(family, "buckets", None)):
                    raise ValueError(f"metric {family.name} is already registered differently")
                return old
            self._families[family.name] = family
            return family

    def counter(self, name, help_text, labelnames=()):
        return self._register(_PromCounter(name, help_text, labelnames))

    def gauge(self, name, help_text, labelnames=()):
        return self._register(_PromGauge(name, help_text, labelnames))

    def histogram(self, name, help_text, labelnames=(), buckets=_SECONDS_BUCKETS):
        return self._register(_PromHistogram(name, help_text, labelnames, buckets))

    def __getitem__(self, name):
        return self._families[name]

    def __contains__(self, name):
        return name in self._families

    def add_collector(self, fn):
        with self._lock:
            self._collectors.append(fn)

    def observe_request(self, entry):
        """Update the request families from one request-log entry dict (see REQUEST_LOG_FIELDS)."""
        outcome = entry.get("outcome") or "none"
        status = entry.get("status")
        # Label tuples made here, not by inc() and observe(): this runs on every request.
        self._families["ragproxy_requests_total"]._add(
            (str(entry.get("model") or ""), str(outcome), "" if status is None else str(status)), 1.0)
        if outcome in RETRIEVAL_ATTEMPTED:
            retrieval = self._families["ragproxy_retrieval_seconds"]
            stages = entry.get("retrieval_stages") or {}
            for stage, seconds in stages.items():
                if seconds is not None:
                    retrieval._observe((str(stage),), seconds)
            if "total" not in stages and entry.get("retrieval_ms") is not None:
                retrieval._observe(("total",), float(entry["retrieval_ms"]) / 1000.0)
            if entry.get("context_tokens") is not None:
                self._families["ragproxy_context_tokens"]._observe((), entry["context_tokens"])
        self._observe_guardrails(entry)
        if entry.get("upstream_ms") is not None and entry.get("upstream"):
            self._families["ragproxy_upstream_seconds"]._observe(
                (str(entry["upstream"]),), float(entry["upstream_ms"]) / 1000.0)

    def _observe_guardrails(self, entry):
        findings = self._families["ragproxy_guard_findings_total"]
        for finding in entry.get("guard_findings") or ():
            category, action = finding.get("category"), finding.get("action")
            findings.inc(category=category if category in GUARD_CATEGORIES else "other",
                         action=action if action in GUARD_ACTIONS else "other")
        if entry.get("dropped"):
            self._families["ragproxy_guard_chunks_dropped_total"].inc(entry["dropped"])
        if entry.get("denied"):
            where = entry["denied"]
            self._families["ragproxy_guard_requests_denied_total"].inc(where=where if where in GUARD_WHERE else "other")
        redactions = self._families["ragproxy_redactions_total"]
        for category, n in (entry.get("redactions") or {}).items():
            if n:
                redactions.inc(n, category=category if category in REDACT_CATEGORIES else "other", at="inject")
        cut = (entry.get("budget") or {}).get("cut")
        if cut:
            self._families["ragproxy_context_chunks_cut_total"].inc(cut)
        self._observe_levers(entry.get("levers"))

    def _observe_levers(self, levers):
        runs, saved = self._families["ragproxy_compression_lever_total"], \
            self._families["ragproxy_compression_tokens_saved_total"]
        for item in levers or ():
            lever = item.get("lever") if item.get("lever") in COMPRESSION_LEVERS else "other"
            reason = item.get("reason") if _REASON.match(str(item.get("reason"))) else "other"
            outcome = "applied" if item.get("outcome") == "applied" else "skipped"
            runs.inc(lever=lever, outcome=outcome, reason=reason)
            before, after = item.get("tokens_before") or 0, item.get("tokens_after") or 0
            if outcome == "applied" and before > after:
                saved.inc(before - after, lever=lever)

    def compression_counts(self):
        """What the compression families hold: ``{"levers": [{lever, outcome, reason, count}], "tokens_saved":
        {lever: tokens}}`` (the panel's Compression card), with the other workers' counts."""
        runs, saved = self._families["ragproxy_compression_lever_total"], \
            self._families["ragproxy_compression_tokens_saved_total"]
        peers = self._peers()
        series = sorted(runs._merged([p[runs.name] for p in peers if runs.name in p]).items())
        tokens = saved._merged([p[saved.name] for p in peers if saved.name in p])
        return {"levers": [{"lever": lever, "outcome": outcome, "reason": reason, "count": int(n)}
                           for (lever, outcome, reason), n in series],
                "tokens_saved": {lever: int(n) for (lever,), n in sorted(tokens.items())}}

    def observe_tool_call(self, tool, outcome, seconds):
        """Count one MCP tool call; ``tool`` and ``outcome`` must be from MCP_TOOLS and MCP_OUTCOMES."""
        if tool not in MCP_TOOLS or outcome not in MCP_OUTCOMES:
            raise ValueError(f"unknown MCP tool or outcome: {tool!r}, {outcome!r}")
        self._families["ragproxy_mcp_tool_calls_total"].inc(tool=tool, outcome=outcome)
        self._families["ragproxy_mcp_tool_seconds"].observe(seconds, tool=tool)

    def observe_index(self, kb, indexed=0, skipped=0, deferred=0, errors=0, redactions=None):
        """Count one indexing pass's files (e.g. from an IndexReport) for knowledge base ``kb``,
        and what it redacted (``{category: n}``, guardrails.redact at: index)."""
        files = self._families["ragproxy_index_files_total"]
        for result, n in (("indexed", indexed), ("skipped", skipped), ("deferred", deferred)):
            if n:
                files.inc(n, kb=kb, result=result)
        if errors:
            self._families["ragproxy_index_errors_total"].inc(errors, kb=kb)
        for category, n in (redactions or {}).items():
            if n:
                self._families["ragproxy_redactions_total"].inc(
                    n, category=category if category in REDACT_CATEGORIES else "other", at="index")

    def _collect(self):
        overrides = collections.defaultdict(dict)
        with self._lock:
            collectors = list(self._collectors)
        for fn in collectors:
            try:
                for name, labels, value in fn() or ():
                    family = self._families.get(name)
                    if family is None or family.kind == "histogram":
                        raise ValueError(f"collector reported unknown or histogram metric {name!r}")
                    overrides[name][family._key(dict(labels or {}))] = float(value)
            except Exception as exc:   # a broken collector must not take /metrics down
                log.warning("metrics collector %r failed: %s", fn, exc)
        return overrides

    def render(self):
        """The whole registry in Prometheus text format 0.0.4, with the other workers' stored values."""
        overrides = self._collect()
        peers = self._peers()
        with self._lock:
            families = sorted(self._families.values(), key=lambda f: f.name)
        lines = []
        for family in families:
            lines += family._header()
            # Stored gauges are summed like counters.  Every gauge ragproxy defines is a collector's,
            # which replaces the sum below with the answering process's reading (chunks, bytes, store
            # state: the same disk seen by every worker, so a sum would count it N times); a gauge set
            # with set()/inc() holds what one process holds (say, requests in flight), so the whole
            # server's value is the sum.
            lines += family._samples(overrides.get(family.name, {}),
                                     [p[family.name] for p in peers if family.name in p])
        return "\n".join(lines) + "\n"

    def changes(self):
        """A number that grows whenever a stored value changes (collector samples are not stored)."""
        with self._lock:
            families = list(self._families.values())
        return sum(f.changes for f in families)

    def export_state(self):
        """A JSON-able snapshot of every family's stored values (not collector samples), per label set:
        what a MetricsShare writes, and ``parse_state`` reads back."""
        with self._lock:
            families = sorted(self._families.values(), key=lambda f: f.name)
        return {"format": _STATE_FORMAT, "families": {f.name: f._export() for f in families}}

    def parse_state(self, state):
        """``export_state()`` of another process checked against this registry, as ``{name: {key: value}}``
        (a histogram's value: ``(bucket counts, sum, count)``); ValueError if it does not fit.  Families
        this registry lacks are left out: there is nothing to render them under."""
        try:
            if state.get("format") != _STATE_FORMAT:
                raise ValueError(f"not a metrics state of format {_STATE_FORMAT}")
            return {name: self._families[name]._parse(data) for name, data in state["families"].items()
                    if name in self._families}
        except (TypeError, KeyError, AttributeError) as exc:
            raise ValueError(f"not a metrics state: {exc!r}") from None

    def add_state(self, parsed):
        """Add ``parse_state()``'s counters and histograms to this registry's.  Gauges are left out:
        a gauge set in a process describes that process, which is gone."""
        for name, series in parsed.items():
            family = self._families[name]
            if family.kind != "gauge":
                family._absorb(series)

    def _peers(self):
        if self._share is None:
            return []
        try:
            return self._share.peers()
        except Exception as exc:   # the other workers' counts must not take /metrics down
            log.warning("metrics: the other workers' counts are left out: %s", exc)
            return []
