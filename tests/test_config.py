"""Configuration: schema validation with line numbers, env substitution, defaults, reload."""
import collections
import inspect
import json
import os
import random

import pytest

import ragproxy
from conftest import openai_for, proxy_config

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


def test_the_default_config_file_states_the_schemas_defaults():
    """The written file shows values for people to edit; each one must be the default
    the schema applies without it (one source of truth, shown twice)."""
    from _ragproxy.yamlish import parse_yaml
    text = ragproxy.DEFAULT_CONFIG_TEMPLATE.replace("@@API_KEY@@", "rp-0123456789")
    written = ragproxy.Config.from_text(text, environ={}).raw
    shown, _ = parse_yaml(text)
    bare = ragproxy.Config.from_text(MINIMAL, environ={}).raw
    for section in ("server", "rag", "admin", "uploads", "security"):
        for key, value in shown[section].items():
            assert written[section][key] == bare[section][key], (section, key, value)


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


def test_several_errors_are_listed_in_file_order():
    # Found in schema order (server before rag, a section's unknown keys before its known ones, the
    # cross-field checks last); listed as the file reads, top to bottom.
    text = ("rag:\n  top_k: 0\nserver:\n  port: eighty\n  prot: 1\n"
            "providers:\n  llm:\n    o: {type: ollama, base_url: 'http://127.0.0.1:9'}\n"
            "models:\n  - {name: '*', upstream: nowhere}\n  - {name: m, upstream: o, inject_mode: sideways}\n"
            "bogus: 1\nsecurity:\n  log_query: maybe\n")
    errs = errors_of(text, environ={})
    assert [(path, line) for path, line, _ in errs] == [
        ("rag.top_k", 2), ("server.port", 4), ("server.prot", 5), ("models[0].upstream", 10),
        ("models[1].inject_mode", 11), ("bogus", 12), ("security.log_query", 14)]
    with pytest.raises(ragproxy.ConfigError) as info:
        ragproxy.Config.from_text(text, source="c.yaml", environ={})
    assert [line.split(":")[1] for line in str(info.value).splitlines()] == ["2", "4", "5", "10", "11", "12", "14"]
    # Errors with no line (a file that cannot be read) come after those with one.
    assert [e[1] for e in ragproxy.ConfigError([("b", None, "x"), ("a", 3, "y"), ("c", 1, "z")]).errors] == \
        [1, 3, None]


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
    # a {key, name} entry as written before scopes existed: every KB and model, as before
    assert config.api_keys == [{"key": "abcdefgh12", "name": "alice", "kbs": "*", "models": ["*"],
                                "explicit": False}]


SCOPED_KEYS = """api_keys:
  - plain-key-0001
  - {key: docs-key-0002, name: docs-team, kbs: docs, models: "gpt-*"}
  - {key: none-key-0003, name: outsider, kbs: [], models: []}
  - {key: star-key-0004, kbs: "*", models: ["*"]}
  - {key: half-key-0005, name: half, kbs: [docs, code, docs]}
"""


def test_api_key_scopes_are_normalised():
    config = ragproxy.Config.from_text(MINIMAL + SCOPED_KEYS, environ={})
    assert [(k["name"], k["kbs"], k["models"], k["explicit"]) for k in config.api_keys] == [
        ("key1", "*", ["*"], False),                     # a plain string: every KB and model, as before
        ("docs-team", ["docs"], ["gpt-*"], True),
        ("outsider", [], [], True),                      # no KB (pass-through) and no model
        ("key4", "*", ["*"], True),
        ("half", ["docs", "code"], ["*"], False)]        # a missing models means every one


def test_require_acl_refuses_keys_without_an_explicit_scope_naming_their_lines():
    text = MINIMAL + "security:\n  require_acl: true\n" + SCOPED_KEYS
    errs = errors_of(text, environ={})
    lines = text.splitlines()
    assert [(path, lines[line - 1].strip()[:18]) for path, line, _ in errs] == [
        ("api_keys[0]", "- plain-key-0001"), ("api_keys[4]", "- {key: half-key-0")]
    assert all("require_acl" in message and "kbs" in message and "models" in message for _, _, message in errs)
    assert all("key-000" not in message for _, _, message in errs)   # the key itself is never shown
    ragproxy.Config.from_text(MINIMAL + SCOPED_KEYS, environ={})     # off by default: the same file loads
    errs = errors_of(MINIMAL + "api_key_auth: false\nsecurity: {require_acl: true}\n", environ={})
    assert [e[0] for e in errs] == ["security.require_acl"] and "api_key_auth: true" in errs[0][2]


@pytest.mark.parametrize("entry, where, says", [
    ("{key: abcdefgh12, kbz: [docs]}", "api_keys[0].kbz", "did you mean 'kbs'?"),
    ("{key: abcdefgh12, kbs: {docs: 1}}", "api_keys[0].kbs", 'expected "*" or a list of knowledge base names'),
    ("{key: abcdefgh12, models: [1, 2]}", "api_keys[0].models", "model names or globs"),
    ("{key: abcdefgh12, kbs: [docs, ../etc]}", "api_keys[0].kbs[1]", "is not a knowledge base name"),
    ("{key: abcdefgh12, kbs: [docs, '*']}", "api_keys[0].kbs[1]", "is not a knowledge base name"),
])
def test_bad_key_scopes_are_errors_with_their_line(entry, where, says):
    errs = errors_of(MINIMAL + f"api_keys:\n  - {entry}\n", environ={})
    assert [(e[0], e[1]) for e in errs] == [(where, MINIMAL.count("\n") + 2)] and says in errs[0][2]


def test_keys_and_their_names_are_unique():
    errs = errors_of(MINIMAL + "api_keys:\n  - abcdefgh12\n  - {key: abcdefgh12, name: ci}\n"
                     "  - {key: other-key-1, name: key1}\n", environ={})
    assert [(e[0], e[2]) for e in errs] == [
        ("api_keys[1]", "the same key as api_keys[0]: each key must be different"),
        ("api_keys[2].name", "name 'key1' is already used by api_keys[0]")]


def test_a_scope_naming_a_kb_the_proxy_does_not_serve_is_a_warning():
    text = MINIMAL + "knowledge_bases: {docs: {}}\napi_keys:\n  - {key: abcdefgh12, kbs: [docs, dosc]}\n"
    config = ragproxy.Config.from_text(text, environ={})
    [(path, line, message)] = config.warnings
    assert path == "api_keys[0].kbs[1]" and line == text.count("\n") and "did you mean 'docs'?" in message


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


def test_kb_null_means_no_retrieval():
    for spelling in ("kb: null", "kb: ~", "kb:"):
        config = ragproxy.Config.from_text(MINIMAL + f"    {spelling}\n", environ={})
        assert config.models[0].kb == () and config.raw["models"][0]["kb"] == []
    errs = errors_of(MINIMAL.replace("upstream: local", "upstream: null"), environ={})
    assert errs[0][0] == "models[0].upstream"   # null is no shorthand where a value is required


def test_a_kb_that_models_name_without_declaring_gets_the_defaults():
    text = MINIMAL + "    kb: [team-notes, docs]\nknowledge_bases:\n  docs: {retrieval: lexical}\n"
    config = ragproxy.Config.from_text(text, environ={})
    assert config.undeclared_kbs == {"team-notes": ("models[0].kb[0]", 8, None)}
    assert list(config.knowledge_bases) == ["docs", "team-notes"] and list(config.raw["knowledge_bases"]) == ["docs"]
    assert config.knowledge_bases["team-notes"] == ragproxy.Config.from_text(
        MINIMAL + "knowledge_bases:\n  team-notes: {}\n", environ={}).knowledge_bases["team-notes"]
    assert config.warnings == ()


@pytest.mark.parametrize("name, hint", [("../etc", None), ("doc s", "docs"), (".hidden", None), ("x" * 65, None)])
def test_kb_names_that_cannot_be_directories_are_still_errors(name, hint):
    text = MINIMAL + f'    kb: [docs, "{name}"]\nknowledge_bases:\n  docs: {{}}\n'
    errs = errors_of(text, environ={})
    assert [(e[0], e[1]) for e in errs] == [("models[0].kb[1]", 8)]
    assert f"{name!r} is not a knowledge base name" in errs[0][2]
    assert (f"did you mean {hint!r}?" in errs[0][2]) if hint else "did you mean" not in errs[0][2]


def test_rerank_without_a_rerank_provider_is_a_warning_logged_once_per_load(tmp_path, caplog):
    path = tmp_path / "config.yaml"
    path.write_text(MINIMAL + "    rerank: true\n")
    config = ragproxy.Config.load(str(path), environ={})
    assert config.warnings == (("models[0].rerank", 8, "rerank is on but there is no rerank provider configured "
                                "(providers.rerank is empty): '*' is served without reranking"),)
    assert config.rerank_status(config.models[0]) == {
        "requested": True, "active": False, "provider": None,
        "reason": "no rerank provider configured (providers.rerank is empty)"}
    logged = [r for r in caplog.records if "without reranking" in r.getMessage()]
    assert len(logged) == 1 and logged[0].levelname == "WARNING" and f"{path}:8" in logged[0].getMessage()
    ragproxy.Config.from_text(path.read_text(), environ={})   # validating (the admin API's) is not a load
    assert len([r for r in caplog.records if "without reranking" in r.getMessage()]) == 1
    with_provider = ragproxy.Config.from_text(path.read_text().replace(
        "  llm:", "  rerank:\n    r: {type: tei, base_url: 'http://127.0.0.1:1'}\n  llm:"), environ={})
    assert with_provider.warnings == () and with_provider.rerank_status(with_provider.models[0])["active"] is True


CHROMA_HTTP = """
vectorstore:
  type: "chroma_http"
  chroma_http:
    base_url: "http://chroma:8000"
    tenant: "default_tenant"
    database: "default_database"
    collection_prefix: "ragproxy_"
"""


def test_the_chroma_http_block_from_the_issue_loads_as_written_with_no_warning():
    config = ragproxy.Config.from_text(MINIMAL + CHROMA_HTTP, environ={})
    assert config.raw["vectorstore"] == {"type": "chroma_http", "chroma_http": {
        "base_url": "http://chroma:8000", "tenant": "default_tenant", "database": "default_database",
        "collection_prefix": "ragproxy_", "indexer": "auto", "timeout": 10.0, "sync_interval": 1.0,
        "lease_ttl": 30.0, "token": ""}}
    assert config.warnings == ()
    assert config.vectorstore_status() == {
        "configured": "chroma_http", "active": "chroma_http", "reason": None, "set_by": "vectorstore.type",
        "chroma_http": {"base_url": "http://chroma:8000", "tenant": "default_tenant", "database": "default_database",
                        "collection_prefix": "ragproxy_", "indexer": "auto", "timeout": 10.0, "sync_interval": 1.0,
                        "lease_ttl": 30.0, "has_token": False}}
    assert ragproxy.Config.from_text(MINIMAL, environ={}).vectorstore_status() == {
        "configured": "simple", "active": "simple", "reason": None, "set_by": "vectorstore.type"}


def test_the_vectorstore_defaults_are_the_store_specs():
    from _ragproxy.vectorstore import StoreSpec
    block = ragproxy.Config.from_text(MINIMAL, environ={}).raw["vectorstore"]
    spec = StoreSpec()
    assert spec.type == block["type"]
    assert {key: getattr(spec, key) for key in block["chroma_http"]} == block["chroma_http"]


PER_KB = """
knowledge_bases:
  small: {}
  big: {vectorstore: chroma_http}
  pinned: {vectorstore: simple}
"""


def test_each_knowledge_base_may_choose_its_store():
    server = CHROMA_HTTP.replace('type: "chroma_http"', "type: simple")
    config = ragproxy.Config.from_text(MINIMAL + server + PER_KB, environ={})
    assert [config.vectorstore_type(kb) for kb in ("small", "big", "pinned")] == ["simple", "chroma_http", "simple"]
    assert config.vectorstore_status("big")["set_by"] == "knowledge_bases.big.vectorstore"
    assert config.vectorstore_status("big")["configured"] == "chroma_http"
    assert "chroma_http" not in config.vectorstore_status("small")
    assert config.vectorstore_status()["configured"] == "simple"
    assert config.vectorstore_status()["chroma_http"]["base_url"] == "http://chroma:8000"   # for KBs that pick it
    assert config.vectorstore_status("small")["set_by"] == "vectorstore.type"
    # The global type is what a KB without its own choice follows; an explicit simple stays built in.
    on_chroma = ragproxy.Config.from_text(MINIMAL + CHROMA_HTTP + PER_KB, environ={})
    assert [on_chroma.vectorstore_type(kb) for kb in ("small", "big", "pinned")] == [
        "chroma_http", "chroma_http", "simple"]
    assert on_chroma.knowledge_bases["small"]["vectorstore"] == ""
    assert ragproxy.Config.from_text(MINIMAL, environ={}).vectorstore_type("undeclared") == "simple"


def test_a_knowledge_base_on_chroma_needs_the_servers_address_at_its_own_line():
    errs = errors_of(MINIMAL + PER_KB, environ={})
    assert errs == [("knowledge_bases.big.vectorstore", 11,
                     "vectorstore chroma_http needs vectorstore.chroma_http.base_url, the Chroma server's address "
                     "(http://chroma:8000)")]
    errs = errors_of(MINIMAL + PER_KB.replace("{}", "{vectorstore: chroma}"), environ={})
    assert [(path, line) for path, line, _ in errs] == [("knowledge_bases.small.vectorstore", 10),
                                                         ("knowledge_bases.big.vectorstore", 11)]
    assert "use chroma_http" in errs[0][2]
    [(path, line, message)] = errors_of(MINIMAL + PER_KB.replace("chroma_http", "qdrant"), environ={})
    assert (path, line) == ("knowledge_bases.big.vectorstore", 11) and "expected one of" in message


def test_the_chroma_token_is_taken_from_the_environment_and_never_shown():
    text = MINIMAL + CHROMA_HTTP + "    token: ${CHROMA_TOKEN}\n"
    config = ragproxy.Config.from_text(text, environ={"CHROMA_TOKEN": "ck-very-secret-token"})
    assert config.raw["vectorstore"]["chroma_http"]["token"] == "ck-very-secret-token"
    status = config.vectorstore_status()
    assert status["chroma_http"]["has_token"] is True and "ck-very-secret-token" not in json.dumps(status)
    # An error about the block names the key, not the token's value.
    errs = errors_of(text.replace("ragproxy_", "rag/proxy"), environ={"CHROMA_TOKEN": "ck-very-secret-token"})
    assert errs and "ck-very-secret-token" not in json.dumps(errs)
    [(path, line, message)] = errors_of(text.replace("${CHROMA_TOKEN}", "[ck-very-secret-token]"), environ={})
    assert path == "vectorstore.chroma_http.token" and "ck-very-secret-token" not in message


def test_credentials_in_the_chroma_base_url_are_masked_in_the_status():
    config = ragproxy.Config.from_text(MINIMAL + CHROMA_HTTP.replace("http://chroma", "http://me:pw@chroma"),
                                       environ={})
    assert config.vectorstore_status()["chroma_http"]["base_url"] == "http://***@chroma:8000"


@pytest.mark.parametrize("change, path, fragment", [
    (('"http://chroma:8000"', '"chroma:8000"'), "vectorstore.chroma_http.base_url", "http:// or https:// URL"),
    (('base_url: "http://chroma:8000"', 'base_url: [a]'), "vectorstore.chroma_http.base_url", "expected a string"),
    (('    base_url: "http://chroma:8000"\n', ""), "vectorstore.chroma_http.base_url", "needs base_url"),
    (('tenant: "default_tenant"', 'tenant: ""'), "vectorstore.chroma_http.tenant", "empty"),
    (('database: "default_database"', 'database: {a: 1}'), "vectorstore.chroma_http.database", "expected a string"),
    (('"ragproxy_"', '"rag/proxy"'), "vectorstore.chroma_http.collection_prefix", "letters, digits"),
    (('tenant:', 'tennant:'), "vectorstore.chroma_http.tennant", "did you mean 'tenant'"),
    (('type: "chroma_http"', 'type: chroma'), "vectorstore.type", "not supported: for a Chroma server use chroma_http"),
    (('"ragproxy_"', '"ragproxy_"\n    indexer: sometimes'), "vectorstore.chroma_http.indexer",
     "expected one of auto, always, never, got 'sometimes'"),
    (('"ragproxy_"', '"ragproxy_"\n    indexer: true'), "vectorstore.chroma_http.indexer", "expected a string"),
    (('"ragproxy_"', '"ragproxy_"\n    timeout: 0'), "vectorstore.chroma_http.timeout", "greater than 0, got 0.0"),
    (('"ragproxy_"', '"ragproxy_"\n    timeout: -2'), "vectorstore.chroma_http.timeout", "greater than 0"),
    (('"ragproxy_"', '"ragproxy_"\n    timeout: soon'), "vectorstore.chroma_http.timeout", "expected a number"),
    (('"ragproxy_"', '"ragproxy_"\n    sync_interval: 0'), "vectorstore.chroma_http.sync_interval",
     "greater than 0"),
    (('"ragproxy_"', '"ragproxy_"\n    sync_interval: .nan'), "vectorstore.chroma_http.sync_interval",
     "greater than 0"),
    (('"ragproxy_"', '"ragproxy_"\n    lease_ttl: 0'), "vectorstore.chroma_http.lease_ttl", "greater than 0"),
    (('type: "chroma_http"', 'type: qdrant'), "vectorstore.type", "expected one of simple, chroma, chroma_http"),
])
def test_the_vectorstore_block_is_checked(change, path, fragment):
    errs = errors_of(MINIMAL + CHROMA_HTTP.replace(*change), environ={})
    assert [e[0] for e in errs] == [path] and errs[0][1] is not None and fragment in errs[0][2], errs


@pytest.mark.parametrize("kind, spec, fix", [
    ("llm", "{type: ollama, base_url: 'http://127.0.0.1:11434/v1'}", "http://127.0.0.1:11434/v1/v1/chat/completions"),
    ("llm", "{type: ollama, base_url: 'http://127.0.0.1:11434/v1/'}", "http://127.0.0.1:11434/v1/v1/chat/completions"),
    ("llm", "{type: anthropic, base_url: 'https://api.anthropic.com/v1'}", "https://api.anthropic.com/v1/v1/messages"),
    ("embedding", "{type: ollama, base_url: 'http://127.0.0.1:11434/v1', model: m}",
     "http://127.0.0.1:11434/v1/api/embed"),
])
def test_a_v1_on_a_server_root_base_url_is_an_error_with_the_fix(kind, spec, fix):
    text = MINIMAL.replace("models:", f"  embedding:\n    extra: {spec}\nmodels:") if kind == "embedding" else \
        MINIMAL.replace("    local:", f"    extra: {spec}\n    local:")
    [(path, line, message)] = errors_of(text, environ={})
    assert path == f"providers.{kind}.extra.base_url" and line == (4 if kind == "llm" else 6)
    assert f"requests would go to {fix}" in message
    assert "drop the /v1 (base_url: " + fix.split("/v1")[0] + ")" in message


def test_a_v1_where_it_belongs_is_fine():
    text = MINIMAL.replace("    local:", "    oa: {type: openai, base_url: 'http://127.0.0.1:8000/v1'}\n"
                                         "    gw: {type: ollama, base_url: 'http://gw.example/ollama'}\n    local:")
    assert ragproxy.Config.from_text(text, environ={}).providers["llm"]["oa"].base_url.endswith("/v1")


def test_a_config_copied_from_the_modelled_projects_readme_loads_and_serves(make_proxy, fake, tmp_path, caplog,
                                                                           chroma_server, chroma_prefix):
    """kb: null, a KB only its documents folder declares, rerank with no reranker and the
    chroma_http block (pointed at a real Chroma server), all in one file: it loads, retrieves
    from the folder, kept in Chroma, and passes the null one through."""
    notes = tmp_path / "documents" / "team-notes"
    notes.mkdir(parents=True)
    (notes / "oncall.md").write_text("# On call\n\nThe zebrafinch pager rotates every Tuesday at noon.\n")
    text = proxy_config(fake.url).replace(
        '  - {name: "*", upstream: [ol, oa]}',
        '  - {name: "notes", upstream: oa, kb: [team-notes], rerank: true}\n'
        '  - {name: "*", upstream: [ol, oa], kb: null}') + CHROMA_HTTP.replace(
        "http://chroma:8000", chroma_server.url).replace('"ragproxy_"', chroma_prefix)
    proxy = make_proxy(text, data_dir=tmp_path)
    proxy.app.knowledge_bases.index_all()
    client = openai_for(proxy)
    client.chat.completions.create(model="notes", messages=[{"role": "user", "content": "when does the zebrafinch"
                                                                                          " pager rotate?"}])
    assert "every Tuesday at noon" in json.dumps(fake.last.json["messages"])
    store = proxy.app.knowledge_bases.get("team-notes").store_status()
    assert store["type"] == "chroma_http" and store["collection"] == chroma_prefix + "team-notes"
    assert store["reachable"] is True and store["vectors"] is not None
    assert all("rerank" not in hit.scores for hit in proxy.app.retriever.search(
        ["team-notes"], "zebrafinch pager", proxy.app.config.models[0]))
    client.chat.completions.create(model="other", messages=[{"role": "user", "content": "zebrafinch pager?"}])
    assert fake.last.json["messages"] == [{"role": "user", "content": "zebrafinch pager?"}]


# -- what must never be applied, and a watcher that must never die ------------

@pytest.mark.parametrize("text", ["", "\n  \n", "# everything commented out\n#api_keys: [x]\n", "---\n"],
                         ids=["empty", "blank", "comments", "marker"])
def test_an_empty_config_file_is_an_error_naming_the_file(tmp_path, text):
    path = tmp_path / "config.yaml"
    path.write_text(text)
    with pytest.raises(ragproxy.ConfigError) as info:
        ragproxy.Config.load(str(path), environ={})
    assert str(info.value).startswith(f"{path}: the file is empty")
    assert "default config" in str(info.value)


def test_fuzzed_configs_give_a_config_or_a_config_error():
    from test_yamlish import mutate

    rng = random.Random(1402)
    seeds = [open(path, encoding="utf-8").read() for path in _example_configs()]
    seeds.append(ragproxy.DEFAULT_CONFIG_TEMPLATE.replace("@@API_KEY@@", "rp-0123456789"))
    outcomes = collections.Counter()
    environ = {"RAGPROXY_TEAM_KEY": "team-key-123", "ANTHROPIC_API_KEY": "a", "GATEWAY_KEY": "g"}
    for _ in range(300):
        text = mutate(rng, rng.choice(seeds), [])
        try:
            ragproxy.Config.from_text(text, environ=environ)
            outcomes["config"] += 1
        except ragproxy.ConfigError as exc:
            assert exc.errors and all(isinstance(m, str) and m for _, _, m in exc.errors), text[:2000]
            outcomes["error"] += 1
    assert outcomes["config"] >= 10 and outcomes["error"] >= 100, outcomes


def test_credentials_in_a_base_url_are_masked_where_the_models_are_logged():
    from _ragproxy.config import describe_models, loggable_url
    config = ragproxy.Config.from_text(MINIMAL.replace('"http://127.0.0.1:11434"', '"http://me:s3cret@gw.corp:8080"'),
                                       environ={})
    line = describe_models(config)
    assert "s3cret" not in line and "local http://***@gw.corp:8080" in line
    assert loggable_url("https://gw.corp/v1") == "https://gw.corp/v1"
    assert loggable_url("https://ghp_token@gw.corp/v1?x=@") == "https://***@gw.corp/v1?x=@"
