"""The compression rewriter: picks a request's levers (Selector) and runs them in declared order (Runner).

The Selector runs before retrieval: it reads the ``X-Compression`` header
(exactly one value, ``on``, ``off`` or a ``compression.profiles`` name; a
malformed or undeclared one is a 400 in the API's own shape), else the
model's ``compression`` setting, and sets ``exchange.compression`` to the
profile (a Profile) or None.  Retrieval asks the profile which of its own
chunks to render (Profile.own_context) and keys its turn cache with
Profile.key.  The Runner runs after retrieval: each lever of the profile, in
declared order, over one working list (the payload's ``messages``, or a
Responses ``input`` list), and records each one's Outcome on
``exchange.compression_outcomes`` for the request log and the metrics.  A
lever that changes the list has only that member of the body encoded again.

The levers are compress's (rag_select, compact_serialization,
position_reorder), window's window_fit and summary's summary_buffer.
window_fit gets the model's window (its ``context_window``, else
an Ollama chat's ``options.num_ctx``, else window.KNOWN_WINDOWS by the
upstream model's name) and the estimated tokens
of the rest of the body (tools, system, instructions).  summary_buffer gets
the session id header, the session state (opened once per state spec,
closed with the App) and a summarizer that asks the configured provider
through the App's upstream pool.  Everything is deterministic.

May import: api, compress, inject, sessionstate, summary, upstream, window.
"""
from __future__ import annotations

import hashlib
import json
import logging
import threading

from . import compress, sessionstate, summary, window
from .api import ClientError, Request
from .inject import estimate_tokens_text
from .upstream import MAX_UPSTREAM_BODY, upstream_url

log = logging.getLogger("ragproxy")

HEADER = "x-compression"
#: The endpoints the levers run on, and the marked-context API name of each.
API_OF_ENDPOINT = {"chat": "chat", "responses": "responses", "messages": "messages",
                   "count_tokens": "messages", "ollama_chat": "ollama_chat"}
_FIELD_OF_API = {"chat": "messages", "ollama_chat": "messages", "messages": "messages", "responses": "input"}
# What window_fit must leave room for besides the list: every other member of the body but these.
_NOT_FIXED = frozenset(("model", "stream", "messages", "input"))
ERROR_REASON = "lever_error"   # a lever raised: the list is left as it was (a bug, logged with its traceback)
#: Seconds a summarizer that failed is not asked again.  Without a pause a dead
#: or hung summarizer would make every request past min_tokens wait its full
#: timeout; with it, one request in this interval pays, the rest skip at once.
SUMMARIZER_BACKOFF = 30.0


class SummarizerBackingOff(summary.SummarizerFailed):
    """Not asked: the summarizer failed less than SUMMARIZER_BACKOFF seconds ago."""


class Profile:
    """One set of levers with their parameters (``[{"name", params...}]`` as config checked them)."""

    def __init__(self, name, levers):
        self.name = name
        self.levers = tuple(levers)
        text = json.dumps(self.levers, sort_keys=True, separators=(",", ":"))
        self.key = "compression:" + hashlib.sha256(text.encode("utf-8")).hexdigest()[:20]

    def lever(self, name):
        return next((lever for lever in self.levers if lever["name"] == name), None)

    def own_context(self, query, hits):
        """Indexes of ``hits`` (``{"text", "score"}`` in retrieval order) to render, in render order.

        rag_select's keep rules and position_reorder's edge order, in the
        profile's order, over ragproxy's own chunks: scores are divided by the
        best one (all None when any is missing, or none is above 0), and
        ranking ``auto`` falls back to lexical similarity to ``query``.
        """
        texts = [str(hit.get("text") or "") for hit in hits]
        raw = [hit.get("score") for hit in hits]
        top = max(raw) if raw and all(isinstance(s, (int, float)) for s in raw) else None
        scores = [s / top for s in raw] if top and top > 0 else [None] * len(hits)
        order = list(range(len(hits)))
        for lever in self.levers:
            if lever["name"] == "rag_select":
                order = _select(order, query, texts, scores, lever)
            elif lever["name"] == "position_reorder" and len(order) > 1:
                ranked = compress.rank(query, [texts[k] for k in order], [scores[k] for k in order],
                                       lever["ranking"])
                if ranked is not None:
                    order = [order[i] for i in compress.edge_order(ranked[0])]
        return order


def _select(order, query, texts, scores, lever):
    """rag_select's rules (compress.rank, compress.select) over the chunks in ``order``."""
    if not order or sum(estimate_tokens_text(texts[k]) for k in order) < lever["min_tokens"]:
        return order
    kept_texts = [texts[k] for k in order]
    ranked = compress.rank(query, kept_texts, [scores[k] for k in order], lever["ranking"])
    if ranked is None:
        return order
    keep = compress.select(ranked[0], ranked[1], kept_texts, lever["drop_empty"], lever["min_relevance_percent"],
                           lever["max_chunks"])
    return [order[i] for i in keep] if keep else order   # dropping every chunk is not a trim


def profiles_of(config):
    """``{name: Profile}``: ``on`` (compression.levers) and every declared profile."""
    section = config.raw["compression"]
    out = {"on": Profile("on", section["levers"])}
    for name, spec in section["profiles"].items():
        out[name] = Profile(name, spec["levers"])
    return out


def header_choice(headers):
    """The X-Compression value of a request (None without one); a ClientError when it is not one value."""
    value = headers.get(HEADER)
    if value is None:
        return None
    choice = value.strip(" \t")
    # Repeated headers arrive joined by ", ": a comma is never one value.
    if not choice or "," in choice or any(ch in choice for ch in " \t") or not choice.isprintable():
        raise ClientError(400, "X-Compression takes exactly one value: on, off or a profile name",
                          "invalid_compression_header")
    return choice


class Selector:
    """Before retrieval: which profile (if any) this request gets, on ``exchange.compression``."""

    def __init__(self, app):
        self.app = app
        self._profiles = (None, {})
        self._lock = threading.Lock()

    def profiles(self):
        config = self.app.config
        with self._lock:
            if self._profiles[0] is not config:
                self._profiles = (config, profiles_of(config))
            return self._profiles[1]

    def __call__(self, exchange):
        exchange.compression = None
        choice = header_choice(exchange.request.headers)
        if choice is None:
            choice = exchange.route.compression
        elif choice not in ("on", "off") and choice not in self.profiles():
            raise ClientError(400, "X-Compression: no such profile (declared: on, off%s)"
                              % "".join(", " + n for n in self.profiles() if n != "on"),
                              "invalid_compression_header")
        if choice != "off":   # also where only retrieval uses it (/api/generate): its own chunks' selection
            exchange.compression = self.profiles().get(choice)


class Runner:
    """After retrieval: the profile's levers over the working list, in order."""

    def __init__(self, app):
        self.app = app
        self._state = (None, None)   # (the state spec it was opened for, SessionState or None)
        self._lock = threading.Lock()
        self._summarizer_down = {}   # (provider, model) -> app clock time until which it is not asked

    def close(self):
        with self._lock:
            _, state = self._state
            self._state = (None, None)
        if state is not None:
            state.close()

    def state(self):
        """The session state for the config's compression.state (opened on first use, again when it changes)."""
        spec = dict(self.app.config.raw["compression"]["state"])
        with self._lock:
            opened_for, state = self._state
            if opened_for == spec:
                return state
            old, state = state, None
            try:
                state = sessionstate.open_state(spec, self.app.data_dir, clock=self.app.clock)
            except (ValueError, OSError, sessionstate.StateUnavailable) as exc:
                log.warning("compression state (%s) unavailable: %s", spec["backend"], type(exc).__name__)
            self._state = (spec, state)
        if old is not None:
            old.close()
        return state

    def __call__(self, exchange):
        profile = getattr(exchange, "compression", None)
        if profile is None or not profile.levers or exchange.endpoint.name not in API_OF_ENDPOINT:
            return
        api = API_OF_ENDPOINT[exchange.endpoint.name]
        field = _FIELD_OF_API[api]
        payload = exchange.payload
        original = payload.get(field)
        current = original
        outcomes = []
        for lever in profile.levers:
            try:
                current, outcome = self._run(lever, current, api, exchange)
            except Exception:   # noqa: BLE001 - a lever's bug must not cost the request
                log.exception("compression lever %s failed; the request goes on without it", lever["name"])
                outcome = compress.Outcome(lever["name"], False, ERROR_REASON)
            outcomes.append(outcome)
        exchange.compression_outcomes = outcomes
        if current is not original:
            payload[field] = current
            # Only this member is encoded again; retrieval's edits inside it are in the new value.
            exchange.edits = tuple(p for p in exchange.edits if p[0] != field) + ((field,),)

    def _run(self, lever, messages, api, exchange):
        name = lever["name"]
        if isinstance(messages, str) or not isinstance(messages, list):
            return messages, compress.Outcome(name, False, "not_eligible")
        if name == "rag_select":
            return compress.rag_select(messages, api, estimate_tokens_text, min_tokens=lever["min_tokens"],
                                       ranking=lever["ranking"], max_chunks=lever["max_chunks"],
                                       min_relevance_percent=lever["min_relevance_percent"],
                                       drop_empty=lever["drop_empty"])
        if name == "compact_serialization":
            return compress.compact_serialization(messages, api, estimate_tokens_text, min_tokens=lever["min_tokens"],
                                                  tabular=lever["tabular"]["enabled"],
                                                  tabular_min_rows=lever["tabular"]["min_rows"])
        if name == "position_reorder":
            return compress.position_reorder(messages, api, estimate_tokens_text, ranking=lever["ranking"])
        if name == "window_fit":
            model = exchange.route.upstream_model or exchange.model
            size = window.model_window(model, exchange.route.context_window or _num_ctx(exchange))
            return window.window_fit(messages, api, estimate_tokens_text, window=size,
                                     fixed_tokens=fixed_tokens(exchange.payload),
                                     completion_reserve_tokens=lever["completion_reserve_tokens"],
                                     input_budget_tokens=lever["input_budget_tokens"])
        if name == "summary_buffer":
            if exchange.endpoint.name == "count_tokens":
                # Counting must not call a model nor move a session's state: the lever runs on the send.
                return messages, compress.Outcome(name, False, "not_eligible")
            settings = lever["summarizer"]
            summarize = self._guarded(summary.make_summarizer(self._caller(settings["provider"]),
                                                              settings["model"], settings["timeout"]),
                                      settings["provider"])
            key = exchange.key
            return summary.summary_buffer(
                messages, api, estimate_tokens_text,
                session_id=exchange.request.headers.get(summary.SESSION_HEADER), state=self.state(),
                summarize=summarize, min_tokens=lever["min_tokens"],
                retain_recent_messages=lever["retain_recent_messages"],
                target_summary_tokens=lever["target_summary_tokens"],
                scope="%s\x1f%s" % (key["name"] if key else "", exchange.model))
        raise ValueError("unknown lever %r" % name)

    def _guarded(self, summarize, provider_name):
        """``summarize``, refusing at once while its provider and model are in their back-off after a failure."""
        which = (provider_name, summarize.model)

        def guarded(messages, previous_summary, target_tokens):
            if self.app.clock() < self._summarizer_down.get(which, 0.0):
                raise SummarizerBackingOff("summarizer failed recently")
            try:
                text = summarize(messages, previous_summary, target_tokens)
            except summary.SummarizerFailed as exc:
                self._summarizer_down[which] = self.app.clock() + SUMMARIZER_BACKOFF
                log.warning("summarizer %s (provider %s) failed: %s; summary_buffer skips it for %.0f s",
                            which[1], which[0], exc, SUMMARIZER_BACKOFF)
                raise
            self._summarizer_down.pop(which, None)
            return text

        guarded.timeout, guarded.model = summarize.timeout, summarize.model
        return guarded

    def _caller(self, provider_name):
        """call_json(path, payload, timeout) -> dict, to ``provider_name`` through the App's pool."""
        app = self.app

        def call_json(path, payload, timeout):
            provider = app.config.providers["llm"][provider_name]
            body = json.dumps(payload, separators=(",", ":")).encode("utf-8")
            headers = app.upstream_headers(Request("POST", path), provider)
            headers.update({"content-type": "application/json", "content-length": str(len(body))})
            response = app.http.request("POST", upstream_url(provider, path, ""), headers, body,
                                        min(provider.connect_timeout, timeout), min(provider.read_timeout, timeout),
                                        provider.tls)
            data = response.read_all(MAX_UPSTREAM_BODY)
            if response.status != 200:
                raise summary.SummarizerFailed("summarizer answered HTTP %d" % response.status)
            return json.loads(data)
        return call_json


def _num_ctx(exchange):
    """An Ollama chat's own ``options.num_ctx``: the window Ollama will really use (it truncates past it)."""
    if exchange.endpoint.name != "ollama_chat" or exchange.provider.type != "ollama":
        return None
    options = exchange.payload.get("options")
    value = options.get("num_ctx") if isinstance(options, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def fixed_tokens(payload):
    """Estimated tokens of the body outside its conversation list (tools, system, instructions, ...)."""
    rest = {k: v for k, v in payload.items() if k not in _NOT_FIXED}
    if not rest:
        return 0
    return estimate_tokens_text(json.dumps(rest, sort_keys=True, separators=(",", ":"), ensure_ascii=False))


def outcome_fields(outcome):
    """An Outcome as the request log and the admin API show it."""
    return {"lever": outcome.lever, "outcome": "applied" if outcome.applied else "skipped",
            "reason": outcome.reason, "tokens_before": outcome.tokens_before, "tokens_after": outcome.tokens_after}
