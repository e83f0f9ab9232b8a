"""Configuration: schema validation with line numbers, env substitution, defaults, reload."""
import inspect
import os

import pytest

import ragproxy

MINIMAL = """
providers:
  llm:
    local: {type: ollama, base_url: "http://127.0.0.1:11434"}
models:
  - name: "*"
    upstream: local
"""


def errors_of(text, **kw):
    with pytest.raises(ragproxy.ConfigError) as info:
        ragproxy.Config.from_text(text, **kw)
    return info.value.errors


def test_default_config_is_valid_and_complete():
    text = ragproxy.DEFAULT_CONFIG_TEMPLATE.replace("@@API_KEY@@", "rp-0123456789")
    config = ragproxy.Config.from_text(text, environ={})
    assert config.server["port"] == 8100 and config.server["host"] == "127.0.0.1"
    assert config.api_key_auth is True and config.api_keys[0]["key"] == "rp-0123456789"
    assert config.providers["llm"]["ollama"].base_url == "http://127.0.0.1:11434"
    assert [m.name for m in config.models] == ["*"]


def test_defaults_fill_missing_sections():
    config = ragproxy.Config.from_text(MINIMAL, environ={})
    assert config.rag["top_k"] == 5 and config.raw["security"]["log_query"] is False
    assert config.server["max_body_bytes"] == 32 * 1024 * 1024


def test_schema_defaults_are_the_ones_the_code_uses_without_a_config():
    config = ragproxy.Config.from_text(MINIMAL + "knowledge_bases:\n  x: {}\n", environ={})
    raw, spec = config.knowledge_bases["x"], ragproxy.KBSpec(name="x")
    assert (spec.chunk_size, spec.chunk_overlap) == (raw["chunking"]["chunk_size"], raw["chunking"]["chunk_overlap"])
    assert (spec.k1, spec.b) == (raw["bm25"]["k1"], raw["bm25"]["b"])
    assert spec.max_file_bytes == raw["max_file_bytes"]
    chunk_document = inspect.signature(ragproxy.chunk_document).parameters
    assert (chunk_document["strategy"].default, chunk_document["chunk_size"].default) == \
        (raw["chunking"]["strategy"], raw["chunking"]["chunk_size"])
    uploads = config.raw["uploads"]
    assert set(uploads) == {"max_file_bytes", "max_files", "max_total_bytes", "max_ratio"}
    assert ragproxy.UploadLimits(**uploads) == ragproxy.UploadLimits()


def test_unknown_key_names_path_line_and_suggestion():
    errs = errors_of(MINIMAL + "rag:\n  top_kk: 3\n", environ={})
    assert errs == [("rag.top_kk", 9, "unknown key (did you mean 'top_k'?)")]


def test_bad_values_name_their_key_path_and_line():
    text = MINIMAL.replace("upstream: local", "upstream: local\n    inject_mode: sideways") + \
        "server:\n  port: eighty\n"
    errs = errors_of(text, environ={})
    paths = {e[0]: (e[1], e[2]) for e in errs}
    assert paths["models[0].inject_mode"][0] == 8 and "before_last_user" in paths["models[0].inject_mode"][1]
    assert paths["server.port"] == (10, "expected an integer, got 'eighty'")


def test_missing_required_and_unknown_provider():
    text = """
providers:
  llm:
    a: {base_url: "http://x"}
models:
  - {name: m, upstream: b}
"""
    msgs = [f"{p}: {m}" for p, _, m in errors_of(text, environ={})]
    assert "providers.llm.a.type: required key is missing" in msgs
    assert any(m.startswith("models[0].upstream: no provider 'b'") for m in msgs)


def test_bad_url_and_short_key():
    text = MINIMAL.replace("http://127.0.0.1:11434", "ftp://x") + "api_keys: [short]\n"
    msgs = " | ".join(m for _, _, m in errors_of(text, environ={}))
    assert "http:// or https:// URL" in msgs and "at least 8 characters" in msgs


def test_yaml_syntax_error_has_line():
    errs = errors_of("server:\n  port: [1, 2\n", environ={})
    assert errs[0][1] is not None and errs[0][1] >= 2


def test_env_substitution_with_defaults_and_escape():
    text = MINIMAL + 'api_keys: ["${KEY}"]\nrag:\n  inject_template: "$${literal} ${MISSING:-fallback}"\n'
    config = ragproxy.Config.from_text(text, environ={"KEY": "from-the-env"})
    assert config.api_keys[0]["key"] == "from-the-env"
    assert config.rag["inject_template"] == "${literal} fallback"


def test_env_substitution_missing_variable_is_an_error():
    errs = errors_of(MINIMAL + 'api_keys: ["${NOPE}"]\n', environ={})
    assert errs[0][0] == "api_keys[0]" and "NOPE is not set" in errs[0][2]


def test_non_loopback_host_needs_auth_and_keys():
    errs = errors_of(MINIMAL + "server: {host: 0.0.0.0}\napi_key_auth: false\n", environ={})
    assert errs[0][0] == "server.host" and "api_keys" in errs[0][2]
    ok = ragproxy.Config.from_text(MINIMAL + "server: {host: 0.0.0.0}\napi_keys: [abcdefgh12]\n", environ={})
    assert ok.server["host"] == "0.0.0.0"


def test_overrides_beat_the_file():
    config = ragproxy.Config.from_text(MINIMAL + "server: {port: 9000}\n", environ={},
                                       overrides={"server.port": 9100, "server.host": None})
    assert config.server["port"] == 9100 and config.server["host"] == "127.0.0.1"


def test_duplicate_model_names_rejected():
    text = MINIMAL + '  - name: "*"\n    upstream: local\n'
    assert any("already defined" in m for _, _, m in errors_of(text, environ={}))


def test_api_keys_may_be_named():
    config = ragproxy.Config.from_text(MINIMAL + "api_keys:\n  - {key: abcdefgh12, name: alice}\n", environ={})
    assert config.api_keys == [{"key": "abcdefgh12", "name": "alice"}]


def test_watcher_reloads_and_keeps_old_config_on_error(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text(MINIMAL)
    app = ragproxy.App(ragproxy.Config.load(str(path), environ={}))
    watcher = ragproxy.ConfigWatcher(app, ragproxy.ConfigFile(str(path), environ={}))
    assert watcher.check() is False  # unchanged
    path.write_text(MINIMAL + "rag: {top_k: 9}\n")
    os.utime(path, ns=(1, 10**9))  # a new mtime even on coarse filesystems
    assert watcher.check() is True and app.config.rag["top_k"] == 9
    path.write_text(MINIMAL + "rag: {top_k: nine}\n")
    os.utime(path, ns=(2, 2 * 10**9))
    assert watcher.check() is False and app.config.rag["top_k"] == 9  # still the good one
    assert watcher.check(force=True) is False


def test_write_default_config_creates_a_loadable_file(tmp_path):
    path = str(tmp_path / "config.yaml")
    key = ragproxy.write_default_config(path)
    config = ragproxy.Config.load(path, environ={})
    assert config.api_keys[0]["key"] == key and key.startswith("rp-")


EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples")


def _example_configs(root=EXAMPLES):
    """The config files the examples ship; not what running one writes into its data directory."""
    found = []
    for dirpath, dirnames, names in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d != "data")   # examples/*/data: made by a run, gitignored
        found += [os.path.join(dirpath, n) for n in sorted(names) if n.endswith((".yaml", ".yml"))]
    return found


def test_running_an_example_first_adds_no_config_to_validate(tmp_path):
    (tmp_path / "quickstart" / "data" / "config").mkdir(parents=True)
    (tmp_path / "quickstart" / "config.yaml").write_text("models: []\n")
    (tmp_path / "quickstart" / "data" / "config" / "secret_key.yaml").write_text("secret_key: x\n")
    (tmp_path / "quickstart" / "data" / "config" / "config.yaml").write_text("written: by a run\n")
    assert _example_configs(str(tmp_path)) == [str(tmp_path / "quickstart" / "config.yaml")]


@pytest.mark.parametrize("path", _example_configs(), ids=os.path.basename)
def test_example_configs_validate_and_parse_the_same_both_ways(path):
    text = open(path, encoding="utf-8").read()
    env = {"RAGPROXY_TEAM_KEY": "team-key-123", "ANTHROPIC_API_KEY": "a", "GATEWAY_KEY": "g"}
    config = ragproxy.Config.from_text(text, source=path, environ=env)
    assert config.models
    ours, _ = ragproxy.parse_yaml(text)
    yaml = pytest.importorskip("yaml")
    assert ours == yaml.safe_load(text)


def test_config_file_write_validates_backs_up_and_detects_outside_changes(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text(MINIMAL)
    config_file = ragproxy.ConfigFile(str(path), environ={})
    assert config_file.load().rag["top_k"] == 5 and config_file.changed() is False
    with pytest.raises(ragproxy.ConfigError) as err:
        config_file.write(MINIMAL + "rag: {top_k: nine}\n")
    assert err.value.errors[0][0] == "rag.top_k" and path.read_text() == MINIMAL
    assert not (tmp_path / "config.yaml.bak").exists()
    config = config_file.write(MINIMAL + "rag: {top_k: 9}\n")
    assert config.rag["top_k"] == 9 and (tmp_path / "config.yaml.bak").read_text() == MINIMAL
    assert config_file.changed() is False  # our own write is not news
    path.write_text(MINIMAL)
    os.utime(path, ns=(3, 3 * 10**9))
    assert config_file.changed() is True and config_file.changed() is False


def test_config_file_update_keeps_env_references_and_rejects_bad_changes(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text(MINIMAL + 'api_keys: ["${TEAM_KEY}"]\n')
    config_file = ragproxy.ConfigFile(str(path), environ={"TEAM_KEY": "team-key-123"})
    config = config_file.update(lambda data: data.setdefault("rag", {}).update(top_k=3))
    assert config.rag["top_k"] == 3 and config.api_keys[0]["key"] == "team-key-123"
    assert "${TEAM_KEY}" in path.read_text() and "team-key-123" not in path.read_text()
    written = path.read_text()
    with pytest.raises(ragproxy.ConfigError):
        config_file.update(lambda data: data.update(models="not a list"))
    assert path.read_text() == written
