"""levers: the X-Compression header, profiles from config, own_context's selection, config errors."""
from __future__ import annotations

import pytest

from _ragproxy import levers
from _ragproxy.api import ClientError
from _ragproxy.config import Config, ConfigError

BASE = """api_key_auth: false
providers:
  llm:
    local: {type: openai, base_url: "http://127.0.0.1:9/v1"}
    claude: {type: anthropic, base_url: "http://127.0.0.1:9"}
models:
  - {name: m, upstream: local}
"""


def config(extra=""):
    return Config.from_text(BASE + extra)


def errors_of(extra):
    with pytest.raises(ConfigError) as raised:
        config(extra)
    return [(path, line, message) for path, line, message in raised.value.errors]


@pytest.mark.parametrize("value, choice", [("on", "on"), (" off\t", "off"), ("top2", "top2"), ("Top2", "Top2")])
def test_the_header_gives_one_trimmed_case_kept_value(value, choice):
    assert levers.header_choice({"x-compression": value}) == choice


@pytest.mark.parametrize("value", ["", "  ", "on, off", "on,on", "a b", "on\x00"])
def test_a_header_that_is_not_exactly_one_value_is_a_client_error(value):
    with pytest.raises(ClientError) as raised:
        levers.header_choice({"x-compression": value})
    assert raised.value.status == 400 and raised.value.code == "invalid_compression_header"


def test_no_header_is_no_choice():
    assert levers.header_choice({}) is None


def test_profiles_keep_the_declared_order_and_their_keys_name_levers_and_parameters():
    c = config("""compression:
  levers: [position_reorder, {name: rag_select, max_chunks: 3}]
  profiles:
    a: {levers: [{name: rag_select, max_chunks: 3}]}
    b: {levers: [{name: rag_select, max_chunks: 4}]}
    c: {levers: [{name: rag_select, max_chunks: 3}]}
""")
    profiles = levers.profiles_of(c)
    assert [lv["name"] for lv in profiles["on"].levers] == ["position_reorder", "rag_select"]
    assert profiles["a"].key == profiles["c"].key != profiles["b"].key != profiles["on"].key
    assert profiles["a"].key == levers.profiles_of(config("""compression:
  profiles: {a: {levers: [{name: rag_select, max_chunks: 3}]}}
"""))["a"].key   # stable across loads


def test_the_default_on_profile_is_the_levers_that_need_no_settings():
    assert [lv["name"] for lv in levers.profiles_of(config())["on"].levers] == [
        "rag_select", "compact_serialization", "position_reorder", "window_fit"]


def profile(levers_yaml):
    return levers.profiles_of(config("compression:\n  levers: %s\n" % levers_yaml))["on"]


HITS = [{"text": "alpha", "score": 2.0}, {"text": "beta", "score": 8.0}, {"text": "gamma", "score": 4.0},
        {"text": "delta", "score": 1.0}, {"text": "  ", "score": 6.0}]


def test_own_context_keeps_the_best_in_retrieval_order_then_puts_them_at_the_edges():
    assert profile("[{name: rag_select, max_chunks: 3}]").own_context("q", HITS) == [1, 2, 4]
    # Best (1) first, second (4) last, third (2) second.
    assert profile("[{name: rag_select, max_chunks: 3}, position_reorder]").own_context("q", HITS) == [1, 2, 4]
    assert profile("[position_reorder]").own_context("q", HITS) == [1, 2, 3, 0, 4]


def test_own_context_normalises_scores_by_the_best_for_the_relevance_floor():
    # 8 is 100%, 4 is 50%, 6 is 75%: a 50% floor keeps 1, 2 and 4; drop_empty drops the blank one.
    assert profile("[{name: rag_select, min_relevance_percent: 50}]").own_context("q", HITS) == [1, 2, 4]
    assert profile("[{name: rag_select, min_relevance_percent: 50, drop_empty: true}]").own_context(
        "q", HITS) == [1, 2]


def test_own_context_ranks_lexically_without_scores_and_never_drops_everything():
    hits = [{"text": "the cat sat", "score": None}, {"text": "deployment failed: disk full", "score": 0.1},
            {"text": "weather today", "score": None}]
    assert profile("[{name: rag_select, max_chunks: 1}]").own_context("why did the deployment fail", hits) == [1]
    assert profile("[{name: rag_select, max_chunks: 1, ranking: supplied}]").own_context("x", hits) == [0, 1, 2]
    assert profile("[{name: rag_select, min_relevance_percent: 100}]").own_context("zzz", hits) == [0, 1, 2]
    assert profile("[{name: rag_select, max_chunks: 1, min_tokens: 10000}]").own_context("x", HITS) == \
        [0, 1, 2, 3, 4]   # under min_tokens: nothing to do
    assert profile("[rag_select]").own_context("q", []) == []


def test_own_context_is_deterministic_with_ties_broken_by_retrieval_order():
    hits = [{"text": str(i), "score": 0.5} for i in range(6)]
    p = profile("[{name: rag_select, max_chunks: 4}, position_reorder]")
    assert p.own_context("q", hits) == p.own_context("q", hits) == [0, 2, 3, 1]


# -- config -----------------------------------------------------------------

def test_unknown_levers_fields_and_out_of_range_numbers_name_their_key_and_line():
    found = errors_of("""compression:
  levers:
    - {name: rag_select, max_chunks: 0, min_relevance_percent: 101}
    - {name: rag_selct}
    - {name: window_fit, completion_reserve_tokens: -1, budget: 5}
    - {name: compact_serialization, tabular: {enabled: maybe, min_rows: 0}}
    - position_reorder
    - position_reorder
""")
    assert [(path, line) for path, line, _ in found] == [
        ("compression.levers[0].max_chunks", 10), ("compression.levers[0].min_relevance_percent", 10),
        ("compression.levers[1].name", 11), ("compression.levers[2].budget", 12),
        ("compression.levers[2].completion_reserve_tokens", 12), ("compression.levers[3].tabular.enabled", 13),
        ("compression.levers[3].tabular.min_rows", 13), ("compression.levers[5]", 15)]
    assert "did you mean 'rag_select'" in found[2][2]


def test_a_model_names_on_off_or_a_declared_profile_and_a_bare_yaml_on_counts():
    c = config("compression:\n  profiles: {tight: {levers: [window_fit]}}\n")
    assert c.models[0].compression == "off" and c.models[0].context_window is None
    text = BASE.replace("{name: m, upstream: local}", "{name: m, upstream: local, compression: on, "
                        "context_window: 32768}\n  - {name: n, upstream: local, compression: tight}")
    c = Config.from_text(text + "compression:\n  profiles: {tight: {levers: [window_fit]}}\n")
    assert [(r.compression, r.context_window) for r in c.models] == [("on", 32768), ("tight", None)]
    with pytest.raises(ConfigError) as raised:
        Config.from_text(text + "compression:\n  profiles: {tigth: {levers: []}}\n")
    assert raised.value.errors[0][:2] == ("models[1].compression", 8) and "did you mean 'tigth'" in \
        raised.value.errors[0][2]
    with pytest.raises(ConfigError) as raised:
        Config.from_text(text.replace("32768", "0") + "compression:\n  profiles: {tight: {levers: []}}\n")
    assert raised.value.errors[0][:2] == ("models[0].context_window", 7)


def test_profile_names_and_the_summarizer_provider_and_the_state_are_checked():
    found = errors_of("""compression:
  profiles:
    "off": {levers: []}
    "bad name": {levers: []}
    s1: {levers: [{name: summary_buffer, summarizer: {provider: nope, model: x}}]}
    s2: {levers: [{name: summary_buffer, summarizer: {provider: claude, model: x}}]}
    s3: {levers: [{name: summary_buffer, summarizer: {provider: local, model: x, timeout: 0}}]}
    s4: {levers: [{name: summary_buffer}]}
  state: {backend: redis, ttl: 0}
""")
    paths = [path for path, _, _ in found]
    assert paths == ["compression.profiles.off", "compression.profiles.bad name",
                     "compression.profiles.s1.levers[0].summarizer.provider",
                     "compression.profiles.s2.levers[0].summarizer.provider",
                     "compression.profiles.s3.levers[0].summarizer.timeout",
                     "compression.profiles.s4.levers[0].summarizer.provider",
                     "compression.profiles.s4.levers[0].summarizer.model",
                     "compression.state.ttl", "compression.state.backend"]


def test_a_redis_url_that_is_refused_is_never_quoted():
    found = errors_of('compression:\n  state: {backend: redis, redis_url: "http://:hunter2@cache:6379/0"}\n')
    assert found[0][0] == "compression.state.redis_url" and "hunter2" not in found[0][2]
    c = config('compression:\n  state: {backend: redis, redis_url: "redis://:hunter2@cache:6379/0"}\n')
    assert c.raw["compression"]["state"]["redis_url"] == "redis://:hunter2@cache:6379/0"


# -- the runner's session state -------------------------------------------------

def test_the_session_state_opens_once_per_spec_reopens_on_a_change_and_closes_with_the_app(tmp_path):
    from _ragproxy.proxy import App
    app = App(config(), data_dir=str(tmp_path))
    first = app.compression.state()
    assert first is not None and app.compression.state() is first
    assert (tmp_path / "compression-state.sqlite3").exists()
    app.reload(config("compression:\n  state: {path: %s}\n" % (tmp_path / "other.sqlite3")))
    second = app.compression.state()
    assert second is not first and (tmp_path / "other.sqlite3").exists()
    app.close()
    third = app.compression.state()   # closing dropped it: asked again, it is opened anew
    assert third is not second
    third.close()


def test_state_that_cannot_open_is_none_and_logged_without_the_url(tmp_path, caplog):
    from _ragproxy.proxy import App
    app = App(config("compression:\n  state: {path: %s}\n" % tmp_path), data_dir=str(tmp_path))   # a directory
    try:
        assert app.compression.state() is None
        assert "compression state (sqlite) unavailable" in caplog.text
    finally:
        app.close()


def test_a_lever_that_raises_is_recorded_and_the_list_is_left_as_it_was(tmp_path, caplog):
    import dataclasses

    from _ragproxy.api import ENDPOINTS, Request
    from _ragproxy.proxy import App, Exchange
    app = App(config("compression:\n  levers: [{name: rag_select, max_chunks: 1}, window_fit]\n"))
    messages = [{"role": "user", "content": "hi"}]
    route = dataclasses.replace(app.config.models[0], context_window=-5)   # window_fit refuses it: ValueError
    exchange = Exchange(Request("POST", "/v1/chat/completions", headers={"x-compression": "on"}),
                        ENDPOINTS[("POST", "/v1/chat/completions")], {"model": "m", "messages": messages},
                        route, app.config.providers["llm"]["local"], "m")
    for rewrite in app.rewriters:
        rewrite(exchange)
    app.close()
    assert exchange.payload["messages"] is messages and not exchange.edits
    assert [(o.lever, o.reason) for o in exchange.compression_outcomes] == [
        ("rag_select", "no_marked_context"), ("window_fit", levers.ERROR_REASON)]
    assert "compression lever window_fit failed" in caplog.text
